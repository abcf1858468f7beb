"""``fasttrees_transformer_lm``: decoder-only FastTrees Transformer language model.

fairseq's ``transformer_lm`` (same flags, same dataclass config) whose blocks
are self-attention → FastTrees → FFN (:mod:`user_dir.modules.fasttrees_layer`).
The master forget gates of its layers give the syntactic distances from
which :mod:`user_dir.modules.fasttrees_trees` induces binary trees.
"""
from dataclasses import dataclass, field

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
)
from fairseq.utils import safe_getattr
from omegaconf import II

from ..modules.fasttrees_layer import FastTreesConfig
from ..tasks.kinds import check_task_kind
from .fasttrees_transformer import (
    FastTreesTransformerDecoder,
    _as_namespace,
    _fasttrees_defaults,
    check_fasttrees_args,
    default_sizes,
)


@dataclass
class FastTreesLanguageModelConfig(TransformerLanguageModelConfig, FastTreesConfig):
    """``transformer_lm``'s options plus the FastTrees flags (``--chunk-size`` ...).

    Unlike ``transformer_lm`` (whose input/output dims default to 512 whatever
    ``--decoder-embed-dim`` is), they follow ``--decoder-embed-dim`` unless given.
    """

    decoder_input_dim: int = field(default=II("model.decoder_embed_dim"), metadata={"help": "decoder input dimension"})
    decoder_output_dim: int = field(default=II("model.decoder_embed_dim"),
                                    metadata={"help": "decoder output dimension"})


@register_model("fasttrees_transformer_lm", dataclass=FastTreesLanguageModelConfig)
class FastTreesLanguageModel(TransformerLanguageModel):
    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def build_model(cls, args, task):
        check_task_kind("lm", args, task)
        args = _as_namespace(args)
        base_lm_architecture(args)
        _fasttrees_defaults(args)
        if safe_getattr(args, "character_embeddings", False) or safe_getattr(args, "adaptive_input", False):
            raise ValueError("fasttrees_transformer_lm supports neither --character-embeddings nor --adaptive-input")
        if args.fasttrees_bidirectional:
            raise ValueError("--fasttrees-bidirectional is for encoders; a language model must be causal")
        check_fasttrees_args(args, [args.decoder_embed_dim])
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", 1024)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        decoder = FastTreesTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True)
        return cls(decoder)


@register_model_architecture("fasttrees_transformer_lm", "fasttrees_transformer_lm_ptb")
def fasttrees_transformer_lm_ptb(args):
    """Small word-level LM for PTB: 3 layers, d 256, FFN 1024, 4 heads, chunk 8, dropout 0.3, tied embeddings."""
    default_sizes(args, "decoder", 3, 256, 1024, 4)
    args.dropout = safe_getattr(args, "dropout", 0.3)
    args.share_decoder_input_output_embed = safe_getattr(args, "share_decoder_input_output_embed", True)
    base_lm_architecture(args)
    _fasttrees_defaults(args)
