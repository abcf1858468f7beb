"""Star-Transformer encoder + fairseq's Transformer decoder for translation (``star_transformer_nmt``).

Beyond the paper and both reference implementations (fastNLP issue #388 asked for it; no
implementation existed): the source is encoded by the Star-Transformer
(:mod:`user_dir.modules.star_transformer_layer`), and fairseq's own ``TransformerDecoder``
cross-attends to the satellites H^T and — by default — to the relay s^T, which is
prepended to the encoder states as one extra, never-padded memory slot
(``--no-decoder-attends-relay`` leaves it out).  ``reorder_encoder_out`` makes
``fairseq-generate`` beam search work; the decoder brings incremental decoding.  The attention
the decoder returns (``--print-alignment``) covers the source tokens only:
the relay's column is left out (the weights on the tokens then sum to less than 1).
"""
from argparse import Namespace
from dataclasses import dataclass, field

import torch
from fairseq.models import FairseqEncoderDecoderModel, register_model, register_model_architecture
from fairseq.models.transformer import TransformerDecoder
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from torch import nn

from .star_transformer import StarTransformerConfig, StarTransformerEncoder
from ..tasks.kinds import check_task_kind


@dataclass
class StarTransformerNMTConfig(StarTransformerConfig):
    decoder_embed_dim: int = field(default=512)
    decoder_ffn_embed_dim: int = field(default=2048)
    decoder_layers: int = field(default=6)
    decoder_attention_heads: int = field(default=8)
    decoder_normalize_before: bool = field(default=False)
    decoder_learned_pos: bool = field(default=False)
    share_decoder_input_output_embed: bool = field(default=False)
    share_all_embeddings: bool = field(default=False, metadata={"help": "needs a joined dictionary"})
    activation_fn: str = field(default="relu", metadata={"help": "decoder FFN activation"})
    activation_dropout: float = field(default=0.0)
    max_target_positions: int = field(default=1024)
    no_decoder_attends_relay: bool = field(default=False, metadata={
        "help": "do not give the decoder the relay s^T as an extra memory slot"})


class StarTransformerNMTEncoder(StarTransformerEncoder):
    """Star encoder whose ``encoder_out`` is [s^T; H^T] (the relay first) unless told otherwise."""

    def forward(self, src_tokens=None, src_lengths=None, **kwargs):
        out = super().forward(src_tokens, src_lengths)
        if not self.cfg.no_decoder_attends_relay:
            relay = out["encoder_relay"][0]
            pad = out["encoder_padding_mask"][0]
            out["encoder_out"] = [torch.cat([relay.unsqueeze(0), out["encoder_out"][0]], 0)]
            out["encoder_padding_mask"] = [torch.cat([pad.new_zeros(pad.shape[0], 1), pad], 1)]
        return out


class StarTransformerNMTDecoder(TransformerDecoder):
    """fairseq's ``TransformerDecoder``; its returned attention drops the ``relay_slots`` memory slots
    prepended to the source (alignments index source tokens, and the relay is none)."""

    def __init__(self, args, dictionary, embed_tokens, relay_slots: int):
        super().__init__(args, dictionary, embed_tokens)
        self.relay_slots = relay_slots

    def extract_features(self, *args, **kwargs):
        x, extra = super().extract_features(*args, **kwargs)
        attn = extra.get("attn")
        if self.relay_slots and attn and attn[0] is not None:
            extra["attn"] = [attn[0][..., self.relay_slots:]]
        return x, extra


@register_model("star_transformer_nmt", dataclass=StarTransformerNMTConfig)
class StarTransformerNMTModel(FairseqEncoderDecoderModel):
    @classmethod
    def build_model(cls, cfg, task):
        check_task_kind("translation", cfg, task)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if cfg.word_embed_dim and cfg.word_embed_dim != cfg.encoder_embed_dim and cfg.share_all_embeddings:
            raise ValueError("--share-all-embeddings needs --word-embed-dim equal to --encoder-embed-dim")
        encoder = StarTransformerNMTEncoder(cfg, src_dict)
        if cfg.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings requires a joined dictionary (fairseq-preprocess --joined-dictionary)")
            if cfg.decoder_embed_dim != cfg.encoder_embed_dim:
                raise ValueError("--share-all-embeddings requires --encoder-embed-dim == --decoder-embed-dim")
            dec_embed = encoder.embed_tokens
        else:
            dec_embed = nn.Embedding(len(tgt_dict), cfg.decoder_embed_dim, padding_idx=tgt_dict.pad())
            nn.init.normal_(dec_embed.weight, 0, cfg.decoder_embed_dim ** -0.5)
            nn.init.zeros_(dec_embed.weight[tgt_dict.pad()])
        decoder = StarTransformerNMTDecoder(cls.decoder_args(cfg), tgt_dict, dec_embed,
                                            relay_slots=0 if cfg.no_decoder_attends_relay else 1)
        return cls(encoder, decoder)

    @staticmethod
    def decoder_args(cfg):
        """The namespace fairseq's ``TransformerDecoder`` expects, filled with transformer defaults."""
        ns = Namespace(
            decoder_embed_dim=cfg.decoder_embed_dim, decoder_ffn_embed_dim=cfg.decoder_ffn_embed_dim,
            decoder_layers=cfg.decoder_layers, decoder_attention_heads=cfg.decoder_attention_heads,
            decoder_normalize_before=cfg.decoder_normalize_before, decoder_learned_pos=cfg.decoder_learned_pos,
            share_decoder_input_output_embed=cfg.share_decoder_input_output_embed or cfg.share_all_embeddings,
            encoder_embed_dim=cfg.encoder_embed_dim, dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
            activation_dropout=cfg.activation_dropout, activation_fn=cfg.activation_fn,
            max_target_positions=cfg.max_target_positions, max_source_positions=cfg.max_positions,
        )
        transformer_base_architecture(ns)
        return ns

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


@register_model_architecture("star_transformer_nmt", "star_transformer_nmt_small")
def star_transformer_nmt_small(args):
    """A small model for IWSLT/Multi30k-sized data: d = 256, 4 star cycles, 3 decoder layers."""
    for name, value in (("encoder_embed_dim", 256), ("encoder_layers", 4), ("encoder_attention_heads", 4),
                        ("encoder_ffn_embed_dim", 1024), ("star_residual", True), ("init_std", 0.02),
                        ("decoder_embed_dim", 256), ("decoder_ffn_embed_dim", 1024), ("decoder_layers", 3),
                        ("decoder_attention_heads", 4), ("dropout", 0.3), ("max_positions", 1024)):
        setattr(args, name, getattr(args, name, value))
