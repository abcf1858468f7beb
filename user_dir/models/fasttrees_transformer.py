"""FastTrees Transformers (Pung & Chan, arXiv 2111.14031, Sec. 3 "FastTrees in Transformers").

Every block is fairseq's Transformer block with the FastTrees sublayer placed
right after self-attention; the sublayer, the paper's equations and the
reconstruction decisions are in :mod:`user_dir.modules.fasttrees_layer`.
Three fairseq models:

* ``fasttrees_transformer``: encoder-decoder for translation (presets
  ``fasttrees_transformer_iwslt_en_vi`` = Transformer-base as the paper's
  Tensor2Tensor setup, ``fasttrees_transformer_conv_iwslt_en_vi`` = Conv.
  FastTrees, ``fasttrees_transformer_multi30k`` = 3+3 layers, d 256);
* ``fasttrees_transformer_lm``: decoder-only language model (fairseq
  ``language_modeling`` task), in :mod:`.fasttrees_transformer_lm`;
* ``fasttrees_roberta``: a RoBERTa-style encoder whose classification heads
  serve fairseq's ``sentence_prediction`` task (sentence and sentence-pair
  classification, e.g. the logical-inference recipe).

Decoders decode incrementally (decision 9 of :mod:`user_dir.modules.fasttrees_layer`).
"""
import argparse

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.models.transformer.transformer_legacy import base_architecture as transformer_base_architecture
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr, safe_hasattr
from omegaconf import OmegaConf

from ..modules.fasttrees_layer import FastTreesConfig, FastTreesDecoderLayer, FastTreesEncoderLayer
from ..tasks.kinds import check_task_kind


def _as_namespace(args):
    """A Namespace *copy* of flat fairseq args (Namespace or DictConfig): extra keys survive
    TransformerConfig, and the caller's config (saved in checkpoints) is never mutated."""
    if OmegaConf.is_config(args):
        try:
            return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        except Exception:  # unresolvable interpolation on a detached config
            return argparse.Namespace(**OmegaConf.to_container(args, resolve=False))
    return argparse.Namespace(**vars(args))


def fasttrees_transformer_config(args):
    """fairseq's ``TransformerConfig`` for ``args`` plus ``.fasttrees``: the :class:`FastTreesConfig` in ``args``."""
    if isinstance(args, TransformerConfig) and "fasttrees" in vars(args):
        return args
    ns = _as_namespace(args)
    ns.fasttrees = FastTreesConfig.of(ns)
    return TransformerConfig.from_namespace(ns)


def add_fasttrees_args(parser):
    """The FastTrees flags (``--chunk-size``, ``--fasttrees-master`` ...) on a legacy model's parser."""
    gen_parser_from_dataclass(parser, FastTreesConfig(), delete_default=True)


def check_fasttrees_args(args, embed_dims, bidirectional=False):
    """Validates the FastTrees flags early, with the flag names in the message."""
    opts = FastTreesConfig.of(args)
    for d in embed_dims:
        opts.validate(d, bidirectional)


def _maybe_checkpoint(layer, cfg):
    """``--checkpoint-activations`` as fairseq's own encoder/decoder layers."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return layer


class FastTreesTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder with :class:`FastTreesEncoderLayer` blocks."""

    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        self.args = args
        super().__init__(fasttrees_transformer_config(args), dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        cfg = fasttrees_transformer_config(cfg)
        return _maybe_checkpoint(FastTreesEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class FastTreesTransformerDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder with :class:`FastTreesDecoderLayer` blocks (incremental decoding)."""

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.args = args
        super().__init__(fasttrees_transformer_config(args), dictionary, embed_tokens,
                         no_encoder_attn=no_encoder_attn, output_projection=output_projection)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        cfg = fasttrees_transformer_config(cfg)
        return _maybe_checkpoint(FastTreesDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("fasttrees_transformer")
class FastTreesTransformerModel(TransformerModel):
    """Encoder-decoder FastTrees Transformer for translation (fairseq ``translation`` task)."""

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_fasttrees_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_task_kind("translation", args, task)
        args = _as_namespace(args)
        base_architecture(args)
        check_fasttrees_args(args, [args.encoder_embed_dim], bidirectional=bool(args.fasttrees_bidirectional))
        check_fasttrees_args(args, [args.decoder_embed_dim])
        args.fasttrees = FastTreesConfig.of(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return FastTreesTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return FastTreesTransformerDecoder(args, tgt_dict, embed_tokens,
                                           no_encoder_attn=safe_getattr(args, "no_cross_attention", False))


def default_sizes(args, side, layers, dim, ffn, heads):
    """Preset helper: ``--{side}-layers/-embed-dim/-ffn-embed-dim/-attention-heads`` unless given."""
    for key, value in (("layers", layers), ("embed_dim", dim), ("ffn_embed_dim", ffn), ("attention_heads", heads)):
        setattr(args, f"{side}_{key}", safe_getattr(args, f"{side}_{key}", value))


def _fasttrees_defaults(args):
    """Sets each FastTrees flag that ``args`` lacks to its :class:`FastTreesConfig` default."""
    for name, value in FastTreesConfig.flags(args).items():
        setattr(args, name, value)


@register_model_architecture("fasttrees_transformer", "fasttrees_transformer")
def base_architecture(args):
    _fasttrees_defaults(args)
    transformer_base_architecture(args)


@register_model_architecture("fasttrees_transformer", "fasttrees_transformer_iwslt_en_vi")
def fasttrees_transformer_iwslt_en_vi(args):
    """Transformer-base sizes (the paper's Tensor2Tensor ``transformer_base``): 6+6 layers, d 512, FFN 2048, 8 heads."""
    default_sizes(args, "encoder", 6, 512, 2048, 8)
    default_sizes(args, "decoder", 6, args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads)
    args.dropout = safe_getattr(args, "dropout", 0.1)
    base_architecture(args)


@register_model_architecture("fasttrees_transformer", "fasttrees_transformer_conv_iwslt_en_vi")
def fasttrees_transformer_conv_iwslt_en_vi(args):
    """Conv. FastTrees at Transformer-base sizes: causal conv (kernel 3) + position-wise layer for F_f, F_i."""
    args.fasttrees_master = safe_getattr(args, "fasttrees_master", "conv")
    fasttrees_transformer_iwslt_en_vi(args)


@register_model_architecture("fasttrees_transformer", "fasttrees_transformer_multi30k")
def fasttrees_transformer_multi30k(args):
    """Small model for Multi30k: 3+3 layers, d 256, FFN 1024, 4 heads, shared embeddings."""
    default_sizes(args, "encoder", 3, 256, 1024, 4)
    default_sizes(args, "decoder", 3, 256, 1024, 4)
    args.share_all_embeddings = safe_getattr(args, "share_all_embeddings", True)
    args.dropout = safe_getattr(args, "dropout", 0.3)
    base_architecture(args)


# --------------------------------------------------------------------------- classification
class FastTreesRobertaEncoder(RobertaEncoder):
    """RoBERTa's encoder (embeddings, LM head) around a FastTrees Transformer encoder."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = FastTreesTransformerEncoder(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


class WhitespaceText:
    """The hub's ``bpe`` for data binarized as whitespace tokens (no BPE): text passes unchanged."""

    @staticmethod
    def encode(text: str) -> str:
        return " ".join(text.split())

    @staticmethod
    def decode(text: str) -> str:
        return text


@register_model("fasttrees_roberta")
class FastTreesRobertaModel(RobertaModel):
    """RoBERTa with FastTrees blocks: classification heads for ``sentence_prediction``, LM head for ``masked_lm``."""

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", bpe=None,
                        **kwargs):
        """RoBERTa's hub interface (``encode(a, b)``, ``predict``, ``extract_features``), without BPE by default:
        the recipes binarize whitespace-tokenized text (propositional logic, SST).  RoBERTa's default,
        ``bpe="gpt2"``, would download GPT-2's BPE and split the words; pass it (or another fairseq BPE) for data
        encoded with one.  ``encode`` writes RoBERTa's layout, ``<s> a </s> </s> b </s>``: the data of
        ``sentence_prediction --init-token 0 --separator-token 2``."""
        from fairseq import hub_utils
        from fairseq.models.roberta import RobertaHubInterface

        x = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                      archive_map=cls.hub_models(), bpe=bpe, load_checkpoint_heads=True, **kwargs)
        hub = RobertaHubInterface(x["args"], x["task"], x["models"][0])
        if hub.bpe is None:
            hub.bpe = WhitespaceText()
        return hub

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_fasttrees_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_task_kind("classification", args, task)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        fasttrees_roberta_base(args)
        check_fasttrees_args(args, [args.encoder_embed_dim], bidirectional=bool(args.fasttrees_bidirectional))
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        encoder = FastTreesRobertaEncoder(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, encoder)


@register_model_architecture("fasttrees_roberta", "fasttrees_roberta")
def fasttrees_roberta_base(args):
    _fasttrees_defaults(args)
    roberta_base_architecture(args)


@register_model_architecture("fasttrees_roberta", "fasttrees_roberta_logic")
def fasttrees_roberta_logic(args):
    """Small encoder for logical inference / SST: 2 layers, d 128, FFN 512, 4 heads, chunk 8, dropout 0.2."""
    default_sizes(args, "encoder", 2, 128, 512, 4)
    args.dropout = safe_getattr(args, "dropout", 0.2)
    args.attention_dropout = safe_getattr(args, "attention_dropout", 0.1)
    fasttrees_roberta_base(args)


@register_model_architecture("fasttrees_roberta", "fasttrees_roberta_conv_logic")
def fasttrees_roberta_conv_logic(args):
    """Conv. FastTrees version of :func:`fasttrees_roberta_logic` (the paper's best logic model)."""
    args.fasttrees_master = safe_getattr(args, "fasttrees_master", "conv")
    fasttrees_roberta_logic(args)
