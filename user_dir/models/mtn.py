"""Multiresolution Transformer Networks (MTN) for query suggestion.

Garg, Dhillon, Yu: "Multiresolution Transformer Networks: Recurrence is Not
Essential for Modeling Hierarchical Structure", arXiv 1908.10408 (2019).
No public code exists; the design follows the paper's prose (Sec. 4, Fig. 1):

* encoder — :class:`user_dir.modules.mtn_session_encoder.MTNEncoder`: a shared
  query-level Transformer encoder, the query projection (linear map of each
  query's zero-padded token representations, P·d → d), positional embeddings
  over the query index, K − 1 masked session encoders (``--levels K``) and the
  skip connection that adds each query's session representation to its tokens;
* decoder — fairseq's standard ``TransformerDecoder`` ("MTN consists of a single
  Transformer decoder"), attending to the refined token representations of the
  whole session prefix; incremental decoding and beam search come with it.

The encoder's reconstruction decisions (source row, terminators, query length limit, the session layers'
deviation, levels, skip connection, positions) are stated in
:mod:`user_dir.modules.mtn_session_encoder`.  One more, here: the hyper-parameters of the paper's runs are
not in the available text, so the presets below (``mtn``, ``mtn_base``, ``mtn_3level``, ``mtn_tiny``) are
sized for this plugin, not copied.

Hub: ``MTNModel.from_pretrained(checkpoint_dir, checkpoint_file=..., data_name_or_path=...)`` gives
fairseq's generator interface, whose ``encode``/``sample``/``generate`` also take a session in the
``.ses`` layout (queries separated by TAB): ``hub.sample("cheap flights\tflights to paris", beam=5)``.
"""
from argparse import Namespace
from dataclasses import dataclass, field, fields

from fairseq import hub_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqEncoderDecoderModel, register_model, register_model_architecture
from fairseq.models.transformer import Embedding, TransformerConfig, TransformerDecoderBase
from fairseq.utils import get_available_activation_fns
from omegaconf import II

from ..modules.mtn_session_encoder import MTNEncoder
from ..modules.query_sessions import SEP, typed_session


@dataclass
class MTNConfig(FairseqDataclass):
    activation_fn: ChoiceEnum(get_available_activation_fns()) = field(default="relu")
    dropout: float = field(default=0.1)
    attention_dropout: float = field(default=0.0)
    activation_dropout: float = field(default=0.0)
    encoder_embed_dim: int = field(default=256, metadata={"help": "d, shared by all levels and the decoder"})
    encoder_ffn_embed_dim: int = field(default=1024, metadata={"help": "FFN dim of the query-level encoder"})
    encoder_layers: int = field(default=2, metadata={"help": "layers of the query-level (token) encoder"})
    encoder_attention_heads: int = field(default=4)
    encoder_normalize_before: bool = field(default=False)
    levels: int = field(default=2, metadata={"help": "K: a K-level MTN stacks K-1 masked session encoders"})
    session_layers: int = field(default=2, metadata={"help": "layers of each masked session encoder"})
    session_ffn_embed_dim: int = field(default=1024)
    session_attention_heads: int = field(default=4)
    decoder_embed_dim: int = field(default=256)
    decoder_ffn_embed_dim: int = field(default=1024)
    decoder_layers: int = field(default=2)
    decoder_attention_heads: int = field(default=4)
    decoder_normalize_before: bool = field(default=False)
    decoder_learned_pos: bool = field(default=False)
    share_decoder_input_output_embed: bool = field(default=False)
    share_all_embeddings: bool = field(default=False, metadata={"help": "one embedding for source, target, output"})
    no_scale_embedding: bool = field(default=False)
    checkpoint_activations: bool = field(default=False, metadata={
        "help": "recompute every layer (query, session and decoder levels) in the backward pass "
                "(fairseq's checkpoint_wrapper): less activation memory, about a third more compute"})
    offload_activations: bool = field(default=False, metadata={
        "help": "with --checkpoint-activations, keep the layer inputs in CPU memory"})
    max_query_length: int = II("task.max_query_length")
    max_source_positions: int = II("task.max_source_positions")
    max_target_positions: int = II("task.max_target_positions")


def _transformer_cfg(cfg, **overrides):
    """fairseq's TransformerConfig from the flat MTN config (legacy flag names), with overrides."""
    flat = {f.name: getattr(cfg, f.name) for f in fields(MTNConfig) if hasattr(cfg, f.name)}
    flat.update(decoder_input_dim=cfg.decoder_embed_dim, decoder_output_dim=cfg.decoder_embed_dim)
    flat.update(overrides)
    return TransformerConfig.from_namespace(Namespace(**flat))


class SessionHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's generator hub; ``encode`` also takes a TAB-separated session (each query through the
    tokenizer and BPE on its own, joined by ``</q>``: :func:`~user_dir.modules.query_sessions.typed_session`)."""

    def encode(self, sentence: str):
        return self.binarize(typed_session(sentence, lambda query: self.apply_bpe(self.tokenize(query))))


@register_model("mtn", dataclass=MTNConfig)
class MTNModel(FairseqEncoderDecoderModel):
    """MTN encoder + fairseq Transformer decoder (see the module docstring)."""

    def __init__(self, cfg, encoder, decoder):
        super().__init__(encoder, decoder)
        self.cfg = cfg

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
        """fairseq's hub loading; returns a :class:`SessionHubInterface`."""
        x = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                      archive_map=cls.hub_models(), **kwargs)
        return SessionHubInterface(x["args"], x["task"], x["models"])

    @classmethod
    def build_model(cls, cfg, task):
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        separator = src_dict.index(SEP)
        if separator == src_dict.unk():
            raise ValueError(f"the source dictionary has no query separator '{SEP}'; build the data with "
                             f"preprocess/query_suggestion_prepare.py (sessions are fed as queries joined by '{SEP}')")
        if cfg.encoder_embed_dim != cfg.decoder_embed_dim:
            raise ValueError(f"mtn needs --encoder-embed-dim ({cfg.encoder_embed_dim}) == --decoder-embed-dim "
                             f"({cfg.decoder_embed_dim}): the decoder attends to the refined token representations")
        if cfg.max_query_length < 1:
            raise ValueError(f"--max-query-length must be positive, got {cfg.max_query_length}")
        query_cfg = _transformer_cfg(cfg)
        session_cfg = _transformer_cfg(cfg, encoder_ffn_embed_dim=cfg.session_ffn_embed_dim,
                                       encoder_attention_heads=cfg.session_attention_heads)
        dim = cfg.encoder_embed_dim
        encoder_embed = Embedding(len(src_dict), dim, src_dict.pad())
        if cfg.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings needs a joined dictionary (fairseq-preprocess --joined-dictionary)")
            decoder_embed = encoder_embed
            query_cfg.share_decoder_input_output_embed = True
        else:
            decoder_embed = Embedding(len(tgt_dict), dim, tgt_dict.pad())
        encoder = MTNEncoder(query_cfg, session_cfg, src_dict, encoder_embed, separator, cfg.max_query_length,
                             cfg.levels, cfg.session_layers)
        decoder = TransformerDecoderBase(query_cfg, tgt_dict, decoder_embed)
        return cls(cfg, encoder, decoder)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, session_layout=None, **kwargs):
        """As fairseq's encoder-decoder forward; ``session_layout`` (from the collater) goes to the encoder only."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, session_layout=session_layout)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, **kwargs)

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


def _set(cfg, **defaults):
    for name, value in defaults.items():
        setattr(cfg, name, getattr(cfg, name, value))


def mtn_default(cfg):
    """Fills unset fields with the config defaults (``--arch mtn`` itself: 2-level MTN, d = 256)."""
    for f in fields(MTNConfig):
        if not isinstance(f.default, str) or not f.default.startswith("${"):
            _set(cfg, **{f.name: f.default})


@register_model_architecture("mtn", "mtn_base")
def mtn_base(cfg):
    """2-level MTN at Transformer-base width (d = 512, 8 heads, FFN 2048)."""
    _set(cfg, encoder_embed_dim=512, decoder_embed_dim=512, encoder_ffn_embed_dim=2048,
         session_ffn_embed_dim=2048, decoder_ffn_embed_dim=2048, encoder_attention_heads=8,
         session_attention_heads=8, decoder_attention_heads=8)
    mtn_default(cfg)


@register_model_architecture("mtn", "mtn_3level")
def mtn_3level(cfg):
    """3-level MTN: two masked session encoders over the query encoder."""
    _set(cfg, levels=3)
    mtn_default(cfg)


@register_model_architecture("mtn", "mtn_tiny")
def mtn_tiny(cfg):
    """A small MTN (d = 64, one layer per level) for CPU runs and the benchmarks."""
    _set(cfg, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=128, session_ffn_embed_dim=128,
         decoder_ffn_embed_dim=128, encoder_attention_heads=2, session_attention_heads=2,
         decoder_attention_heads=2, encoder_layers=1, session_layers=1, decoder_layers=1)
    mtn_default(cfg)
