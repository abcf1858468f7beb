"""Star-Transformer encoder models (Guo et al., NAACL 2019) for fairseq.

``--arch star_transformer`` is an encoder-only model with RoBERTa's head interface, so it
runs with fairseq's own ``sentence_prediction`` task and criterion, and with the plugin's
``sentence_pair_classification``, ``sequence_tagging`` and ``masked_summation`` tasks:

* sentence classification (paper Sec. 3.3 / 5.2): r = s^T + max_i(h_i^T) -> MLP
  (:func:`sentence_vector`, :class:`StarClassificationHead`);
* NLI as a sentence-vector model (paper Sec. 5.3): premise and hypothesis encoded
  separately, pair features -> MLP (``pair_tokens`` in ``net_input``);
* sequence labelling (paper Sec. 5.4): h_i^T -> linear (optionally a CRF);
* masked summation (paper Sec. 5.1): continuous inputs (``src_features``) -> regression
  (the task is :mod:`user_dir.tasks.masked_summation`).

``--encoder-type transformer | lstm | bilstm`` puts the paper's baselines behind the same heads
(:class:`BaselineTransformerEncoder`, :class:`BaselineLSTMEncoder`).

The encoder itself, with the paper's update equations and the encoder's reconstruction decisions, lives in
:mod:`user_dir.modules.star_transformer_layer`.

Reconstruction decisions of the heads
-------------------------------------
1. *Sentence vector* (``--sentence-pooling``): ``sum`` = the paper's s^T + max_i h_i^T, the max over real
   tokens only (an all-pad row pools to 0); ``mean`` halves it (fastNLP).
2. *NLI features* (``--nli-features``): ``paper`` (default) = [r1; r2; |r1 − r2|; r1 − r2], as the paper's
   text (Sec. 5.3) gives it; ``mult`` = [r1; r2; |r1 − r2|; r1 ∗ r2], the usual sentence-encoder features.
   A checkpoint whose configuration has no ``nli_features`` was trained with ``mult`` and is loaded so,
   with a warning (:meth:`StarTransformerModel.load_state_dict`).
3. *Word vectors* (Sec. 5): ``--pretrained-embeddings FILE`` (GloVe or word2vec text) fills the embedding
   table and ``--freeze-embeddings`` keeps it fixed, as the paper.  The file is read only when a model is
   built for training; a trained checkpoint holds the vectors, so loading it (``fairseq-validate``, hub
   ``from_pretrained``) does not need the file (:func:`fill_pretrained_embeddings`).
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum
from fairseq.models import FairseqEncoder, FairseqEncoderModel, register_model, register_model_architecture
from torch import nn

from ..fairseq_fixes import building_from_checkpoint
from ..modules.star_transformer_layer import FASTNLP, StarTransformer, StarTransformerOptions
from ..tasks.kinds import check_task_kind

logger = logging.getLogger(__name__)

ENCODER_CHOICES = ChoiceEnum(["star", "transformer", "lstm", "bilstm"])
POOLING_CHOICES = ChoiceEnum(["sum", "mean"])
NLI_FEATURE_CHOICES = ChoiceEnum(["paper", "mult"])


@dataclass
class StarTransformerConfig(StarTransformerOptions):
    """The Star-Transformer stack's options (:class:`StarTransformerOptions`), then the embeddings and heads."""

    encoder_type: ENCODER_CHOICES = field(default="star", metadata={
        "help": "star, or a baseline behind the same heads: 'transformer' (fairseq's TransformerEncoder of equal "
                "d/heads/layers, FFN --encoder-ffn-embed-dim, default 4d), 'lstm' or 'bilstm' (recurrent layers "
                "of width d, the paper's masked-summation baselines)"})
    word_embed_dim: int = field(default=0, metadata={
        "help": "word-vector size; 0 = encoder_embed_dim, otherwise a linear map to d (fastNLP StarTransEnc)"})
    pretrained_embeddings: Optional[str] = field(default=None, metadata={
        "help": "GloVe / word2vec text file loaded into the embedding table"})
    freeze_embeddings: bool = field(default=False, metadata={"help": "keep the word embeddings fixed (paper)"})
    normalize_pretrained: bool = field(default=False, metadata={"help": "L2-normalise loaded vectors (fastNLP)"})
    input_features: int = field(default=0, metadata={
        "help": ">0: continuous inputs of this size (src_features) instead of tokens (masked summation)"})
    sentence_pooling: POOLING_CHOICES = field(default="sum", metadata={
        "help": "sum: s^T + max(H^T) (paper); mean: 0.5 (s^T + max(H^T)) (fastNLP)"})
    classifier_hidden_dim: int = field(default=0, metadata={"help": "MLP hidden size; 0 = encoder_embed_dim"})
    pooler_activation_fn: ChoiceEnum(["leaky_relu", "relu", "tanh", "gelu"]) = field(default="leaky_relu", metadata={
        "help": "MLP activation (fastNLP: leaky_relu)"})
    pooler_dropout: float = field(default=0.1)
    nli_features: NLI_FEATURE_CHOICES = field(default="paper", metadata={
        "help": "NLI pair features: paper: [r1; r2; |r1-r2|; r1-r2] (Sec. 5.3); mult: [r1; r2; |r1-r2|; r1*r2]"})


def fill_pretrained_embeddings(cfg, dictionary, embedding: nn.Embedding):
    """``--pretrained-embeddings`` into ``embedding``, unless the model is being built to load a trained
    checkpoint: its embedding table, vectors included, comes from the checkpoint (the file, GloVe 840B being
    5.6 GB, need not be there nor be read again)."""
    if not cfg.pretrained_embeddings:
        return
    if building_from_checkpoint():
        logger.info(f"--pretrained-embeddings {cfg.pretrained_embeddings}: not read, the checkpoint holds the vectors")
        return
    load_word_vectors(cfg.pretrained_embeddings, dictionary, embedding, normalize=cfg.normalize_pretrained)


def load_word_vectors(path, dictionary, embedding: nn.Embedding, normalize=False):
    """Fills ``embedding`` rows of words found in a GloVe/word2vec text file; returns #found.

    Raises ``ValueError`` naming the file and line when a vector's size is not the table's.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"--pretrained-embeddings: file not found: {path}")
    dim = embedding.embedding_dim
    found, first = 0, True
    with open(path, encoding="utf-8", errors="replace") as f, torch.no_grad():
        for lineno, line in enumerate(f, 1):
            parts = line.rstrip().split(" ")
            if lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                if int(parts[1]) != dim:
                    raise ValueError(f"{path}:1: word2vec header says dimension {parts[1]}, but the "
                                     f"embedding table has dimension {dim} (--word-embed-dim/--encoder-embed-dim)")
                continue  # word2vec header "count dim"
            if len(parts) < 2:
                continue
            if len(parts) - 1 < dim or (first and len(parts) - 1 != dim):
                raise ValueError(f"{path}:{lineno}: vector for {parts[0]!r} has dimension {len(parts) - 1}, but the "
                                 f"embedding table has dimension {dim} (--word-embed-dim/--encoder-embed-dim)")
            first = False
            if len(parts) - 1 > dim:  # GloVe 840B has a few words containing spaces
                parts = [" ".join(parts[: len(parts) - dim])] + parts[len(parts) - dim:]
            idx = dictionary.index(parts[0])
            if idx == dictionary.unk() and parts[0] != dictionary.unk_word:
                continue
            try:
                vec = torch.tensor([float(x) for x in parts[1:]])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: non-numeric value in the vector for {parts[0]!r}") from None
            if normalize:
                vec = vec / vec.norm().clamp(min=1e-12)
            embedding.weight[idx] = vec
            found += 1
        if embedding.padding_idx is not None:
            embedding.weight[embedding.padding_idx].zero_()
    logger.info(f"loaded {found} of {len(dictionary)} word vectors from {path}")
    return found


class InputEncoder(FairseqEncoder):
    """The encoders' common input layer: tokens through an embedding table (``--pretrained-embeddings`` filled,
    ``--freeze-embeddings`` fixed; a linear map to d when ``--word-embed-dim`` differs), or continuous inputs
    (``--input-features``, masked summation) through a linear map; :meth:`embed` gives B x T x d and the
    padding mask."""

    def __init__(self, cfg, dictionary):
        super().__init__(dictionary)
        d = cfg.encoder_embed_dim
        self.cfg = cfg
        self.padding_idx = dictionary.pad() if dictionary is not None else 1
        if cfg.input_features > 0:
            self.embed_tokens = None
            self.input_proj = nn.Linear(cfg.input_features, d)
        else:
            wdim = cfg.word_embed_dim or d
            self.embed_tokens = nn.Embedding(len(dictionary), wdim, padding_idx=self.padding_idx)
            nn.init.normal_(self.embed_tokens.weight, 0.0, wdim ** -0.5)
            nn.init.zeros_(self.embed_tokens.weight[self.padding_idx])
            fill_pretrained_embeddings(cfg, dictionary, self.embed_tokens)
            if cfg.freeze_embeddings:
                self.embed_tokens.weight.requires_grad = False
            self.input_proj = nn.Linear(wdim, d) if wdim != d else None

    def embed(self, src_tokens=None, src_lengths=None, src_features=None):
        if src_features is not None:
            if self.input_proj is None or self.embed_tokens is not None:
                raise ValueError("src_features given, but the model was built for tokens (--input-features 0)")
            B, n, _ = src_features.shape
            x = self.input_proj(src_features)
            if src_lengths is not None:
                pad_mask = torch.arange(n, device=x.device)[None, :] >= src_lengths.to(x.device)[:, None]
            else:
                pad_mask = torch.zeros(B, n, dtype=torch.bool, device=x.device)
            return x, pad_mask
        if self.embed_tokens is None:
            raise ValueError("this model takes continuous inputs (src_features), not src_tokens")
        x = self.embed_tokens(src_tokens)
        return (self.input_proj(x) if self.input_proj is not None else x), src_tokens.eq(self.padding_idx)

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out, new_order):
        """Selects the beam's batch rows of every tensor in ``encoder_out`` (beam search)."""
        out = {}
        for key, values in encoder_out.items():
            dim = 1 if key == "encoder_out" else 0
            out[key] = [v.index_select(dim, new_order) for v in values]
        return out

    def max_positions(self):
        return self.cfg.max_positions if self.cfg.max_positions > 0 else int(1e6)


class StarTransformerEncoder(InputEncoder):
    """Token (or feature) embeddings -> Star-Transformer; fairseq encoder_out layout (T x B x C).

    Besides the satellites H^T in ``encoder_out``, the relay s^T is returned as
    ``encoder_relay`` (B x C).
    """

    def __init__(self, cfg, dictionary):
        super().__init__(cfg, dictionary)
        self.star = StarTransformer(StarTransformerOptions.of(cfg))  # options older checkpoints lack: defaults

    def forward(self, src_tokens=None, src_lengths=None, src_features=None, **kwargs):
        x, pad_mask = self.embed(src_tokens, src_lengths, src_features)
        nodes, relay = self.star(x, pad_mask)
        return {
            "encoder_out": [nodes.transpose(0, 1)],  # T x B x C
            "encoder_padding_mask": [pad_mask],  # B x T
            "encoder_relay": [relay],  # B x C
            "encoder_embedding": [x],
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [src_lengths] if src_lengths is not None else [],
        }


class BaselineLSTMEncoder(InputEncoder):
    """The paper's recurrent baselines of the masked summation (Sec. 5.1, Fig. 3a), behind the same heads:
    ``--encoder-type lstm`` (left to right) or ``bilstm`` (both directions, d/2 each), ``--encoder-layers`` layers
    of width d, dropout on the inputs and after every layer; ``encoder_relay`` is the mean of the outputs over
    real tokens, so the sentence vector is mean + max pooling.  Each row's real tokens are read in their order
    (and, backwards, in reverse) wherever its padding sits, so a sequence gives the same output alone and in a
    left- or right-padded batch."""

    def __init__(self, cfg, dictionary):
        super().__init__(cfg, dictionary)
        d, directions = cfg.encoder_embed_dim, 2 if cfg.encoder_type == "bilstm" else 1
        if d % directions:
            raise ValueError(f"--encoder-type bilstm splits --encoder-embed-dim between two directions: {d} is odd")
        self.layers = nn.ModuleList(nn.ModuleList(nn.LSTM(d, d // directions, batch_first=True)
                                                  for _ in range(directions)) for _ in range(cfg.encoder_layers))
        self.dropout = nn.Dropout(cfg.dropout)

    @staticmethod
    def reading_orders(pad_mask, directions):
        """Per row, the positions in reading order, real tokens first (then the pads): left to right, and for a
        second direction right to left."""
        n = pad_mask.size(1)
        t = torch.arange(n, device=pad_mask.device).expand_as(pad_mask)
        orders = [torch.where(pad_mask, n + t, t).argsort(1)]
        if directions == 2:
            orders.append(torch.where(pad_mask, n + t, n - 1 - t).argsort(1))
        return orders

    def forward(self, src_tokens=None, src_lengths=None, src_features=None, **kwargs):
        x, pad_mask = self.embed(src_tokens, src_lengths, src_features)
        x = self.dropout(x)
        orders = self.reading_orders(pad_mask, len(self.layers[0]))
        for layer in self.layers:
            outputs = []
            for lstm, order in zip(layer, orders):
                read, _ = lstm(x.gather(1, order.unsqueeze(-1).expand_as(x)))  # pads last: they reach no token
                outputs.append(torch.empty_like(read).scatter_(1, order.unsqueeze(-1).expand_as(read), read))
            x = self.dropout(torch.cat(outputs, -1))
        x = x.masked_fill(pad_mask.unsqueeze(-1), 0.0)
        return {"encoder_out": [x.transpose(0, 1)], "encoder_padding_mask": [pad_mask],
                "encoder_relay": [mean_over_real_tokens(x, pad_mask)],
                "encoder_embedding": [], "encoder_states": [], "src_tokens": [], "src_lengths": []}


class BaselineTransformerEncoder(FairseqEncoder):
    """fairseq's ``TransformerEncoder`` (learned positions, post-norm, FFN 4d unless set) for A/B runs.

    Returns the Star encoder's layout; ``encoder_relay`` is the mean of the outputs over real
    tokens, so the sentence vector is mean + max pooling.  Continuous inputs (``--input-features``,
    masked summation) enter through a linear map, as in the Star encoder, in place of the token embeddings.
    """

    def __init__(self, cfg, dictionary):
        super().__init__(dictionary)
        from argparse import Namespace

        from fairseq.models.transformer import TransformerEncoder, base_architecture

        d = cfg.encoder_embed_dim
        self.input_proj = None
        if cfg.input_features > 0:  # no vocabulary: the embedding table only gives the encoder its padding index
            self.input_proj = nn.Linear(cfg.input_features, d)
            dictionary = self.dictionary = Dictionary()
        args = Namespace(encoder_embed_dim=d, encoder_ffn_embed_dim=cfg.encoder_ffn_embed_dim or 4 * d,
                         encoder_layers=cfg.encoder_layers, encoder_attention_heads=cfg.encoder_attention_heads,
                         max_source_positions=cfg.max_positions, dropout=cfg.dropout,
                         attention_dropout=cfg.attention_dropout, encoder_learned_pos=True)
        base_architecture(args)
        emb = nn.Embedding(len(dictionary), d, padding_idx=dictionary.pad())
        nn.init.normal_(emb.weight, 0.0, d ** -0.5)
        nn.init.zeros_(emb.weight[dictionary.pad()])
        fill_pretrained_embeddings(cfg, dictionary, emb)
        if cfg.freeze_embeddings or self.input_proj is not None:
            emb.weight.requires_grad = False
        self.cfg = cfg
        self.inner = TransformerEncoder(args, dictionary, emb)

    def forward(self, src_tokens=None, src_lengths=None, src_features=None, **kwargs):
        features = None
        if src_features is not None or self.input_proj is not None:
            if self.input_proj is None or src_features is None:
                raise ValueError("--input-features > 0 takes continuous inputs (src_features), not src_tokens, and "
                                 "--input-features 0 the reverse")
            positions = torch.arange(src_features.size(1), device=src_features.device)
            pad = positions.unsqueeze(0) >= src_lengths.to(positions.device).unsqueeze(1)
            # placeholder tokens (any symbol, or pad) for the encoder's padding mask and positions
            src_tokens = pad.long().masked_fill(~pad, self.dictionary.unk()).masked_fill(pad, self.dictionary.pad())
            features = self.input_proj(src_features)
        out = self.inner(src_tokens, src_lengths=src_lengths, token_embeddings=features)
        x, pad = out["encoder_out"][0], src_tokens.eq(self.dictionary.pad())
        return {"encoder_out": [x], "encoder_padding_mask": [pad],
                "encoder_relay": [mean_over_real_tokens(x.transpose(0, 1), pad)],
                "encoder_embedding": [], "encoder_states": [], "src_tokens": [], "src_lengths": []}

    def reorder_encoder_out(self, encoder_out, new_order):
        return InputEncoder.reorder_encoder_out(self, encoder_out, new_order)

    def max_positions(self):
        return self.cfg.max_positions


def mean_over_real_tokens(x, pad_mask):
    """The baselines' ``encoder_relay``: the mean of B x T x C outputs over each row's real tokens (an all-pad
    row gives 0)."""
    real = (~pad_mask).unsqueeze(-1).to(x.dtype)
    return (x * real).sum(1) / real.sum(1).clamp(min=1)


def sentence_vector(encoder_out, pooling="sum"):
    """r = s^T + max_i h_i^T over real tokens (paper Sec. 3.3); ``mean`` halves it (fastNLP)."""
    nodes = encoder_out["encoder_out"][0].transpose(0, 1)  # B T C
    pad = encoder_out["encoder_padding_mask"][0]
    pooled = nodes.masked_fill(pad.unsqueeze(-1), float("-inf")).max(1).values
    pooled = pooled.masked_fill(pad.all(1, keepdim=True), 0.0)  # an all-pad row: no max, not -inf
    r = encoder_out["encoder_relay"][0] + pooled
    return 0.5 * r if pooling == "mean" else r


class StarClassificationHead(nn.Module):
    """MLP classifier on the sentence vector: dropout -> Linear -> act -> dropout -> Linear (fastNLP's ``_Cls``
    with a dropout on its input as well)."""

    def __init__(self, input_dim, inner_dim, num_classes, activation_fn, pooler_dropout):
        super().__init__()
        self.dropout = nn.Dropout(pooler_dropout)
        self.dense = nn.Linear(input_dim, inner_dim)
        self.activation_fn = F.leaky_relu if activation_fn == "leaky_relu" else utils.get_activation_fn(activation_fn)
        self.out_proj = nn.Linear(inner_dim, num_classes)

    def forward(self, x):
        return self.out_proj(self.dropout(self.activation_fn(self.dense(self.dropout(x)))))


@register_model("star_transformer", dataclass=StarTransformerConfig)
class StarTransformerModel(FairseqEncoderModel):
    """Star-Transformer encoder with RoBERTa-style classification heads and a tagging head."""

    def __init__(self, cfg, encoder):
        super().__init__(encoder)
        self.cfg = cfg
        self.classification_heads = nn.ModuleDict()
        self.tagging_heads = nn.ModuleDict()

    @classmethod
    def build_model(cls, cfg, task):
        check_task_kind("classification", cfg, task)
        dictionary = getattr(task, "source_dictionary", None)
        if cfg.encoder_type == "transformer":
            return cls(cfg, BaselineTransformerEncoder(cfg, dictionary))
        if cfg.encoder_type in ("lstm", "bilstm"):
            return cls(cfg, BaselineLSTMEncoder(cfg, dictionary))
        return cls(cfg, StarTransformerEncoder(cfg, dictionary))

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
        """Loads a checkpoint directory (+ its binarised data) into a
        :class:`~user_dir.models.star_transformer_hub.StarTransformerHubInterface`
        (``encode``, ``predict``, ``predict_label``, ``extract_features``), as RoBERTa's does."""
        from fairseq import hub_utils

        from .star_transformer_hub import StarTransformerHubInterface

        x = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                      archive_map=cls.hub_models(), **kwargs)
        return StarTransformerHubInterface(x["args"], x["task"], x["models"][0])

    # ----------------------------------------------------------------- heads
    def register_classification_head(self, name, num_classes=None, inner_dim=None, input_multiplier=1, **kwargs):
        """RoBERTa's interface (used by fairseq's ``sentence_prediction`` task).

        ``input_multiplier=4`` builds the NLI head over the four pair features (``--nli-features``).
        """
        d = self.cfg.encoder_embed_dim
        inner = inner_dim or self.cfg.classifier_hidden_dim or d
        self.classification_heads[name] = StarClassificationHead(
            d * input_multiplier, inner, num_classes, self.cfg.pooler_activation_fn, self.cfg.pooler_dropout)

    def register_tagging_head(self, name, num_tags, crf=False):
        from ..modules.crf import TaggingHead

        self.tagging_heads[name] = TaggingHead(self.cfg.encoder_embed_dim, num_tags, crf=crf,
                                               dropout=self.cfg.pooler_dropout)

    # --------------------------------------------------------------- forward
    def sentence_vector(self, src_tokens=None, src_lengths=None, src_features=None):
        enc = self.encoder(src_tokens, src_lengths, src_features=src_features)
        return sentence_vector(enc, self.cfg.sentence_pooling), enc

    def forward(self, src_tokens=None, src_lengths=None, features_only=False, classification_head_name=None,
                pair_tokens=None, pair_lengths=None, src_features=None, **kwargs):
        """With ``classification_head_name``: ``(logits, extra)``; otherwise ``(H^T as B x T x C, extra)``.

        ``pair_tokens`` (NLI): the hypothesis, encoded separately by the same encoder.
        """
        r, enc = self.sentence_vector(src_tokens, src_lengths, src_features)
        extra = {"relay": enc["encoder_relay"][0], "padding_mask": enc["encoder_padding_mask"][0],
                 "sentence_vector": r}
        if classification_head_name is None:
            return enc["encoder_out"][0].transpose(0, 1), extra
        if pair_tokens is not None:
            r2, _ = self.sentence_vector(pair_tokens, pair_lengths)
            r = torch.cat([r, r2, (r - r2).abs(), r - r2 if self.cfg.nli_features == "paper" else r * r2], -1)
        return self.classification_heads[classification_head_name](r), extra

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """A checkpoint whose saved config predates ``--nli-features`` was trained on the
        ``mult`` features ([r1; r2; |r1-r2|; r1*r2]); its NLI head keeps reading them."""
        if (model_cfg is not None and "nli_features" not in model_cfg and self.cfg.nli_features != "mult"
                and len(self.classification_heads) > 0):
            logger.warning("checkpoint config has no nli_features (saved before --nli-features existed): "
                           "using --nli-features mult, the features it was trained with")
            self.cfg.nli_features = "mult"
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        # keep heads the task registered but the checkpoint lacks (and vice versa)
        prefix = name + "." if name else ""
        for attr in ("classification_heads", "tagging_heads"):
            current = getattr(self, attr)
            for k, v in current.state_dict().items():
                key = f"{prefix}{attr}.{k}"
                if key not in state_dict:
                    state_dict[key] = v

    def max_positions(self):
        return self.encoder.max_positions()


def _set(args, name, value):
    setattr(args, name, getattr(args, name, value))


@register_model_architecture("star_transformer", "star_transformer_base")
def star_transformer_base(args):
    """Paper-faithful defaults: d = 300, 2 cycles, 6 heads (fastNLP reproduction sizes)."""
    _set(args, "encoder_embed_dim", 300)
    _set(args, "encoder_layers", 2)
    _set(args, "encoder_attention_heads", 6)


@register_model_architecture("star_transformer", "star_transformer_sst")
def star_transformer_sst(args):
    """SST: d = 300 GloVe (frozen, as in the paper), 2 cycles x 6 heads x 50, MLP 200, dropout 0.4."""
    _set(args, "encoder_head_dim", 50)
    _set(args, "dropout", 0.4)
    _set(args, "pooler_dropout", 0.4)
    _set(args, "classifier_hidden_dim", 200)
    _set(args, "max_positions", 256)  # the paper truncates at 256
    star_transformer_base(args)


@register_model_architecture("star_transformer", "star_transformer_snli")
def star_transformer_snli(args):
    """SNLI (sentence-vector model): as SST, MLP 600."""
    _set(args, "classifier_hidden_dim", 600)
    star_transformer_sst(args)


@register_model_architecture("star_transformer", "star_transformer_tagging")
def star_transformer_tagging(args):
    """POS / NER: d = 300, 2 cycles x 6 heads x 50, dropout 0.3 (fastNLP POS reproduction)."""
    _set(args, "encoder_head_dim", 50)
    _set(args, "dropout", 0.3)
    _set(args, "pooler_dropout", 0.3)
    star_transformer_base(args)


@register_model_architecture("star_transformer", "star_transformer_fastnlp")
def star_transformer_fastnlp(args):
    """fastNLP 1.0.1 ``StarTransformer`` semantics (pre-norm, leaky ReLU, open zero-padded ring: ``FASTNLP``),
    with fastNLP's sentence pooling and initialisation, at the SST sizes."""
    for name, value in FASTNLP.items():
        _set(args, name, value)
    _set(args, "sentence_pooling", "mean")
    _set(args, "init_std", 0.05)
    star_transformer_sst(args)


@register_model_architecture("star_transformer", "star_transformer_deep")
def star_transformer_deep(args):
    """Deeper stack with the fastNLP author's advice: FFN, residual, small init (fastNLP issue #267)."""
    _set(args, "encoder_layers", 6)
    _set(args, "encoder_ffn_embed_dim", 1200)
    _set(args, "star_residual", True)
    _set(args, "init_std", 0.02)
    star_transformer_base(args)
