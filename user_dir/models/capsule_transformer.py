"""Capsule-Transformer (Duan, Cao & Zhao 2020, arXiv 2004.14649) on fairseq's transformer.

fairseq's ``transformer`` with the attention score path of chosen attention
modules replaced by capsule routing over the logit cube
(:mod:`user_dir.modules.capsule_routing`, which holds the paper's ideas and
the reconstruction decisions).  Everything else — embeddings, layers, FFN,
layer norms, incremental decoding, the hub interface — is fairseq's.

Flags (besides all of ``transformer``'s):

* ``--routing-iters r`` (default 3, paper Alg. 1);
* ``--capsule-routing {vertical,horizontal,both}`` (default ``both``, paper Fig. 3);
* ``--routed-attention`` comma list of ``enc_self``, ``dec_self``, ``enc_dec``
  (default ``enc_self,dec_self``); ``--routed-encoder-layers`` /
  ``--routed-decoder-layers`` restrict routing to some layer indices;
* ``--capsule-squash {l2,rms}`` (default ``l2``) and ``--horizontal-max-distance D``;
* ``--capsule-omega-gate``: a learned per-head scale on ``Ω``, initialised to 0
  (not in the paper; decision 7 in :mod:`user_dir.modules.capsule_routing`);
* ``--capsule-implementation {fast,reference}`` (default ``fast``): the same routing computed from
  Gram matrices and the query/key factors (:mod:`user_dir.modules.capsule_routing_fast`) or on
  explicit capsules as the paper states it (:mod:`user_dir.modules.capsule_routing`).

Presets: ``capsule_transformer`` (transformer_wmt_en_de sizes, = base),
``capsule_transformer_wmt_en_de_big`` and ``capsule_transformer_iwslt_de_en``.
"""
import logging
import re
from dataclasses import dataclass, field, fields

from fairseq.dataclass import ChoiceEnum
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    TransformerModelBase,
)
from fairseq.models.transformer.transformer_config import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    DEFAULT_MIN_PARAMS_TO_WRAP,
)
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de_big,
)
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from user_dir.modules.capsule_routing import (
    ROUTING_KINDS,
    SQUASH_MODES,
    CapsuleMultiheadAttention,
    CapsuleRouting,
)
from user_dir.modules.capsule_routing_fast import FastCapsuleMultiheadAttention, FastCapsuleRouting
from user_dir.tasks.kinds import check_task_kind

logger = logging.getLogger(__name__)

ATTENTION_MODULES = ("enc_self", "dec_self", "enc_dec")
ROUTING_SETTINGS = ("routing_iters", "capsule_routing", "routed_attention", "routed_encoder_layers",
                    "routed_decoder_layers", "capsule_squash", "horizontal_max_distance", "capsule_omega_gate",
                    "capsule_implementation")
# --capsule-implementation: (attention, routing) classes; both compute the same Ω, with the same parameters
IMPLEMENTATIONS = {"fast": (FastCapsuleMultiheadAttention, FastCapsuleRouting),
                   "reference": (CapsuleMultiheadAttention, CapsuleRouting)}


@dataclass
class CapsuleTransformerConfig(TransformerConfig):
    """fairseq's :class:`TransformerConfig` plus the capsule-routing settings."""

    routing_iters: int = field(default=3, metadata={"help": "dynamic routing iterations r (paper Alg. 1), >= 1"})
    capsule_routing: ChoiceEnum(ROUTING_KINDS) = field(
        default="both", metadata={"help": "vertical (head-wise), horizontal (token-wise) capsules or both"})
    routed_attention: str = field(
        default="enc_self,dec_self",
        metadata={"help": "comma list of routed attention modules: enc_self, dec_self, enc_dec"})
    routed_encoder_layers: str = field(
        default="all", metadata={"help": "encoder layer indices (0-based, comma list) to route, or 'all'"})
    routed_decoder_layers: str = field(
        default="all", metadata={"help": "decoder layer indices (0-based, comma list) to route, or 'all'"})
    capsule_squash: ChoiceEnum(SQUASH_MODES) = field(
        default="l2", metadata={"help": "l2: the paper's squash on the capsule's L2 norm; rms: on per-entry "
                                        "norms (length independent, stronger routing)"})
    horizontal_max_distance: int = field(
        default=8, metadata={"help": "relative distances clipped at D for horizontal initial routing logits"})
    capsule_omega_gate: bool = field(
        default=False, metadata={"help": "learned per-head scale on the routing output, initialised to 0 "
                                         "(not in the paper: training starts from the plain transformer)"})
    capsule_implementation: ChoiceEnum(tuple(IMPLEMENTATIONS)) = field(
        default="fast", metadata={"help": "fast: Gram matrices from the query/key factors (capsule_routing_fast); "
                                          "reference: the paper's routing on explicit capsules (capsule_routing), "
                                          "same outputs, slower"})


_DEFAULTS = {f.name: f.default for f in fields(CapsuleTransformerConfig) if f.name in ROUTING_SETTINGS}


def _parse_layers(spec, num_layers, flag):
    if spec is None or str(spec).strip() == "all":
        return set(range(num_layers))
    try:
        idx = {int(x) for x in str(spec).split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"{flag} must be 'all' or a comma list of layer indices, got {spec!r}") from None
    bad = sorted(i for i in idx if not 0 <= i < num_layers)
    if bad:
        raise ValueError(f"{flag} {spec!r}: the model has no layer {bad} (it has {num_layers} layers, "
                         f"indices 0..{num_layers - 1})")
    return idx


def routing_plan(cfg):
    """Validates the routing flags against the model and returns the routed modules.

    Returns a dict ``{"enc_self": set(layers), "dec_self": ..., "enc_dec": ...}``.
    """
    iters = cfg.routing_iters
    if not isinstance(iters, int) or isinstance(iters, bool) or iters <= 0:  # paper Alg. 1: r >= 1 iterations
        raise ValueError(f"--routing-iters must be a positive integer (got {iters!r}); "
                         "dynamic routing needs at least one iteration")
    if cfg.horizontal_max_distance < 0:
        raise ValueError(f"--horizontal-max-distance must be >= 0, got {cfg.horizontal_max_distance}")
    if str(cfg.capsule_routing) not in ROUTING_KINDS:
        raise ValueError(f"--capsule-routing must be one of {ROUTING_KINDS}, got {cfg.capsule_routing!r}")
    names = [x.strip() for x in str(cfg.routed_attention).split(",") if x.strip()]
    unknown = [x for x in names if x not in ATTENTION_MODULES]
    if unknown or not names:
        raise ValueError(f"--routed-attention {cfg.routed_attention!r}: unknown module(s) {unknown}; "
                         f"choose from {', '.join(ATTENTION_MODULES)}")
    if "enc_dec" in names and cfg.no_cross_attention:
        raise ValueError("--routed-attention enc_dec: the model has no encoder-decoder attention "
                         "(--no-cross-attention is set)")
    if "dec_self" in names and cfg.cross_self_attention:
        raise ValueError("--routed-attention dec_self is not supported with --cross-self-attention "
                         "(the decoder's self-attention then also attends to the source)")
    enc_layers = _parse_layers(cfg.routed_encoder_layers, cfg.encoder.layers, "--routed-encoder-layers")
    dec_layers = _parse_layers(cfg.routed_decoder_layers, cfg.decoder.layers, "--routed-decoder-layers")
    if str(cfg.routed_encoder_layers).strip() != "all" and "enc_self" not in names:
        raise ValueError("--routed-encoder-layers is set but --routed-attention routes no encoder module")
    if str(cfg.routed_decoder_layers).strip() != "all" and not {"dec_self", "enc_dec"} & set(names):
        raise ValueError("--routed-decoder-layers is set but --routed-attention routes no decoder module")
    return {n: (enc_layers if n == "enc_self" else dec_layers) if n in names else set()
            for n in ATTENTION_MODULES}


def _attention(cfg, embed_dim, heads, causal, **kwargs):
    """A capsule-routed attention module of the implementation ``--capsule-implementation`` selects."""
    attention, routing = IMPLEMENTATIONS[str(getattr(cfg, "capsule_implementation", "fast"))]
    capsule = routing(heads, routing=str(cfg.capsule_routing), iters=cfg.routing_iters, causal=causal,
                      squash=str(cfg.capsule_squash), max_distance=cfg.horizontal_max_distance,
                      omega_gate=cfg.capsule_omega_gate)
    return attention(embed_dim, heads, capsule, **kwargs)


class CapsuleEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer; its self-attention is capsule-routed when ``routed``."""

    def __init__(self, cfg, routed, return_fc=False):
        self._routed = routed
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        if not self._routed:
            return super().build_self_attention(embed_dim, cfg)
        return _attention(
            cfg, embed_dim, cfg.encoder.attention_heads, causal=False, dropout=cfg.attention_dropout, self_attention=True, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size)


class CapsuleDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer; self and/or encoder-decoder attention capsule-routed.

    Both are *causal* routings: a target position's routing only pools over
    target positions ≤ itself (see :mod:`user_dir.modules.capsule_routing`).
    """

    def __init__(self, cfg, route_self, route_cross, no_encoder_attn=False):
        self._route_self, self._route_cross = route_self, route_cross
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if not self._route_self:
            return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)
        return _attention(
            cfg, embed_dim, cfg.decoder.attention_heads, causal=True, dropout=cfg.attention_dropout, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
            self_attention=True, q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size)

    def build_encoder_attention(self, embed_dim, cfg):
        if not self._route_cross:
            return super().build_encoder_attention(embed_dim, cfg)
        return _attention(
            cfg, embed_dim, cfg.decoder.attention_heads, causal=True, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
            encoder_decoder_attention=True, q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size)


def _wrap(layer, cfg):
    """fairseq's activation checkpointing / FSDP wrapping of a layer (as in its encoder/decoder)."""
    from fairseq.distributed import fsdp_wrap
    from fairseq.modules.checkpoint_activations import checkpoint_wrapper

    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)


class CapsuleTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        index = getattr(self, "_capsule_layers_built", 0)
        self._capsule_layers_built = index + 1
        routed = index in routing_plan(cfg)["enc_self"]
        return _wrap(CapsuleEncoderLayer(cfg, routed, return_fc=self.return_fc), cfg)


class CapsuleTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index = getattr(self, "_capsule_layers_built", 0)
        self._capsule_layers_built = index + 1
        plan = routing_plan(cfg)
        layer = CapsuleDecoderLayer(cfg, index in plan["dec_self"], index in plan["enc_dec"], no_encoder_attn)
        return _wrap(layer, cfg)


@register_model("capsule_transformer")
class CapsuleTransformerModel(TransformerModel):
    """Capsule-Transformer: fairseq's transformer with capsule-routed attention logits.

    Hub use: ``CapsuleTransformerModel.from_pretrained(ckpt_dir, checkpoint_file=...,
    data_name_or_path=..., user_dir=...)`` then ``.translate(sentence, beam=5)``.
    """

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, CapsuleTransformerConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        check_task_kind("translation", args, task)
        capsule_base_architecture(args)
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if not args.share_all_embeddings:
            args.min_params_to_wrap = getattr(args, "min_params_to_wrap", DEFAULT_MIN_PARAMS_TO_WRAP)
        if getattr(args, "offload_activations", False):
            args.checkpoint_activations = True
        cfg = CapsuleTransformerConfig.from_namespace(args)
        routing_plan(cfg)  # fail early, before any layer is built
        return TransformerModelBase.build_model.__func__(cls, cfg, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return CapsuleTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return CapsuleTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Refuses, with the settings named, a checkpoint whose capsule routing differs."""
        check_routing_state(self, state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


_ROUTING_PARAM = re.compile(r"^(.*)\.capsule\.(vertical_logits|horizontal_logits|omega_gate)$")


def check_routing_state(model, state_dict):
    """Compares the routing parameters of a checkpoint with the model's; raises a clear ValueError."""
    def routed(sd):
        out = {}
        for name, value in sd.items():
            m = _ROUTING_PARAM.match(name)
            if m:
                out.setdefault(m.group(1), {})[m.group(2)] = tuple(value.shape)
        return out

    mine, theirs = routed(model.state_dict()), routed(state_dict)
    if mine == theirs:
        return
    problems = []
    if not theirs:
        problems.append("the checkpoint has no capsule routing parameters (trained without routing, "
                        "e.g. a plain transformer)")
    only_mine, only_theirs = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    if only_mine:
        problems.append(f"routed here but not in the checkpoint: {', '.join(only_mine)}")
    if only_theirs:
        problems.append(f"routed in the checkpoint but not here: {', '.join(only_theirs)}")
    for module in sorted(set(mine) & set(theirs)):
        if mine[module] != theirs[module]:
            problems.append(f"{module}: routing parameters {theirs[module]} in the checkpoint vs "
                            f"{mine[module]} here")
    raise ValueError(
        "checkpoint was trained with different capsule routing settings than the model being loaded: "
        + "; ".join(problems)
        + ". Do not override --capsule-routing / --routed-attention / --routed-*-layers / "
        "--horizontal-max-distance / --capsule-omega-gate / head counts when loading (e.g. in --model-overrides).")


# ---------------------------------------------------------------- presets


def _routing_defaults(args):
    for name, default in _DEFAULTS.items():
        setattr(args, name, getattr(args, name, default))


@register_model_architecture("capsule_transformer", "capsule_transformer")
def capsule_base_architecture(args):
    """Transformer-base (``transformer_wmt_en_de`` sizes: 6+6 layers, d 512, 8 heads, FFN 2048)."""
    _routing_defaults(args)
    base_architecture(args)


@register_model_architecture("capsule_transformer", "capsule_transformer_wmt_en_de_big")
def capsule_transformer_wmt_en_de_big(args):
    """Transformer-big (d 1024, 16 heads, FFN 4096, dropout 0.3 as in the paper)."""
    _routing_defaults(args)
    transformer_wmt_en_de_big(args)


@register_model_architecture("capsule_transformer", "capsule_transformer_iwslt_de_en")
def capsule_transformer_iwslt_de_en(args):
    """fairseq's IWSLT'14 De-En sizes (d 512, 4 heads, FFN 1024)."""
    _routing_defaults(args)
    transformer_iwslt_de_en(args)
