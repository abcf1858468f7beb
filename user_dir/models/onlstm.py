"""``onlstm_lm`` and ``onlstm_classifier``: ON-LSTM (Shen et al., "Ordered Neurons", ICLR 2019).

The AWD-LSTM-style language model of the ON-LSTM paper (embedding → ON-LSTM layers → tied softmax, with
embedding, input, hidden, output dropout and weight drop), and a sentence encoder for fairseq's
``sentence_prediction`` (single sentences, e.g. SST) and the plugin's ``sentence_pair_classification``
(logic, NLI: both sentences encoded by the same encoder, an MLP on [u; v; u∘v; |u − v|]).
The cell is :mod:`user_dir.modules.ordered_neurons`; ``fasttrees_lstm_lm`` / ``fasttrees_lstm_classifier``
(:mod:`user_dir.models.fasttrees_lstm`) are the same models with FastTrees' master gates.

The language model is a fairseq incremental decoder (h, c of every layer as incremental state), so
``fairseq-generate``, ``fairseq-eval-lm`` and hub ``sample()`` work.  With the plugin's ``bptt_lm`` task it is
trained as both papers train it, by truncated backpropagation through time: each batch continues the
contiguous streams of the batch before, from the (detached) state that batch left, kept apart for training and
evaluation and saved with every checkpoint (``bptt_lm``'s checkpoint state); with fairseq's ``language_modeling``
each batch starts from a zero state.

*Embedding initialisation* (``--embed-init``; neither paper states it for its classifiers): the language models
draw the embeddings from U(−0.1, 0.1), AWD-LSTM's and ON-LSTM's language-model initialisation; the
classifier presets draw them from N(0, 1), torch's ``nn.Embedding`` default: on the logic data the small
uniform embeddings hold even a plain LSTM near the majority class for epochs (``docs/fasttrees.md``).
"""
import logging
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import (BaseFairseqModel, FairseqIncrementalDecoder, FairseqLanguageModel, register_model,
                            register_model_architecture)
from torch import Tensor

from ..modules.ordered_neurons import OrderedNeuronsStack, check_chunking, embedding_dropout, locked_dropout
from ..tasks.bptt_lm import StreamMemoryModel
from ..tasks.kinds import check_task_kind

logger = logging.getLogger(__name__)

EMBED_INIT_CHOICES = ChoiceEnum(["uniform", "normal"])


@dataclass
class ONLSTMConfig(FairseqDataclass):
    """Sizes and AWD-LSTM regularisation; the defaults are the ON-LSTM/FastTrees PTB language model."""

    embed_dim: int = field(default=400, metadata={"help": "word embedding size"})
    hidden_size: int = field(default=1150, metadata={"help": "hidden size of every layer but the last of a "
                                                             "language model with tied embeddings (embed dim)"})
    num_layers: int = field(default=3, metadata={"help": "recurrent layers"})
    chunk_size: int = field(default=10, metadata={"help": "neurons per master unit (C); divides every layer size"})
    dropout: float = field(default=0.45, metadata={"help": "locked dropout on the last layer's output"})
    hidden_dropout: float = field(default=0.3, metadata={"help": "locked dropout between layers (dropouth)"})
    input_dropout: float = field(default=0.5, metadata={"help": "locked dropout on the embeddings (dropouti)"})
    embed_dropout: float = field(default=0.1, metadata={"help": "drops whole word types (dropoute)"})
    weight_drop: float = field(default=0.45, metadata={"help": "DropConnect on the hidden-to-hidden weights"})
    untie_embeddings: bool = field(default=False, metadata={
        "help": "language model: an own output matrix instead of the softmax tied to the embeddings (tied, the "
                "last layer has --embed-dim units)"})
    classifier_hidden_dim: int = field(default=0, metadata={"help": "classifier MLP hidden size (0: hidden size)"})
    pooler_dropout: float = field(default=0.0, metadata={"help": "dropout in the classifier MLP"})
    embed_init: EMBED_INIT_CHOICES = field(default="uniform", metadata={
        "help": "word embedding initialisation: 'uniform' U(-0.1, 0.1), AWD-LSTM's language-model init; "
                "'normal' N(0, 1), torch's nn.Embedding default (the classifier presets)"})


def layer_sizes(cfg, tied_output):
    """Input size, then each layer's hidden size (the last one the embedding size when tied)."""
    sizes = [cfg.embed_dim] + [cfg.hidden_size] * cfg.num_layers
    if tied_output:
        sizes[-1] = cfg.embed_dim
    for n, size in enumerate(sizes[1:]):
        check_chunking(size, cfg.chunk_size, "--embed-dim" if n == cfg.num_layers - 1 and tied_output
                       else "--hidden-size")
    return sizes


def check_config(cfg):
    if cfg.num_layers < 1:
        raise ValueError(f"--num-layers must be >= 1, got {cfg.num_layers}")
    for name in ("dropout", "hidden_dropout", "input_dropout", "embed_dropout", "weight_drop", "pooler_dropout"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(cfg, name)}")


def master_options(cfg):
    """The master-gate kind of a model config: ON-LSTM's recurrent gates unless the config says otherwise."""
    return dict(master=getattr(cfg, "master", "recurrent"), master_hidden_dim=getattr(cfg, "master_hidden_dim", 0),
                conv_kernel_size=getattr(cfg, "conv_kernel_size", 2))


class OrderedNeuronsEncoder(nn.Module):
    """Embedding (with embedding and input dropout) → recurrent stack (→ output dropout), batch-first tokens
    in, time-major features out."""

    def __init__(self, cfg, dictionary, tied_output):
        super().__init__()
        check_config(cfg)
        self.cfg, self.padding_idx = cfg, dictionary.pad()
        self.embed_tokens = nn.Embedding(len(dictionary), cfg.embed_dim, self.padding_idx)
        if cfg.embed_init == "uniform":
            nn.init.uniform_(self.embed_tokens.weight, -0.1, 0.1)
        else:
            nn.init.normal_(self.embed_tokens.weight)
        self.rnn = OrderedNeuronsStack(layer_sizes(cfg, tied_output), cfg.chunk_size, weight_drop=cfg.weight_drop,
                                       hidden_dropout=cfg.hidden_dropout, **master_options(cfg))
        self.output_dim = self.rnn.layers[-1].hidden_size

    def forward(self, tokens: Tensor, states=None, windows=None):
        """tokens (B, T) → (features (T, B, H), final states, distances (layers, T, B), windows)."""
        x = embedding_dropout(self.embed_tokens, tokens, self.cfg.embed_dropout, self.training).transpose(0, 1)
        x = locked_dropout(x, self.cfg.input_dropout, self.training)
        keep = tokens.ne(self.padding_idx).t()
        x, _, finals, distances, windows = self.rnn(x, states, keep, windows)
        return locked_dropout(x, self.cfg.dropout, self.training), finals, distances, windows


class OrderedNeuronsDecoder(FairseqIncrementalDecoder):
    """The language model's decoder; incremental state: every layer's (h, c) and conv window."""

    def __init__(self, cfg, dictionary):
        super().__init__(dictionary)
        self.tied = not cfg.untie_embeddings
        self.encoder = OrderedNeuronsEncoder(cfg, dictionary, self.tied)
        if self.tied:
            self.output_projection = None
        else:
            self.output_projection = nn.Linear(self.encoder.output_dim, len(dictionary), bias=False)
        self.output_bias = nn.Parameter(torch.zeros(len(dictionary)))
        self._streams: Dict[str, dict] = {}  # slot ("train", "eval") -> the state a stream's next batch continues

    def forward(self, prev_output_tokens, incremental_state=None, features_only=False, stream_pos=None, **kwargs):
        """``stream_pos`` (from ``bptt_lm``): the batch's position in its contiguous streams; the state left by
        the batch before continues (truncated BPTT), position 0 starts from zeros."""
        cached = None if incremental_state is None else self.get_incremental_state(incremental_state, "rnn_state")
        if cached is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]  # the earlier tokens are in the state
        states = None if cached is None else [(cached[f"h{n}"], cached[f"c{n}"]) for n in range(self.num_layers)]
        windows = None if cached is None else [cached.get(f"w{n}") for n in range(self.num_layers)]
        slot = None
        if incremental_state is None and stream_pos is not None:
            slot = "train" if self.training else "eval"
            states, windows = self._stream_state(slot, int(stream_pos), prev_output_tokens.size(0))
        x, finals, distances, windows = self.encoder(prev_output_tokens, states, windows)
        if slot is not None:
            self._streams[slot] = {"next_pos": int(stream_pos) + 1, "states": [(h.detach(), c.detach()) for h, c in finals],
                                   "windows": [None if w is None else w.detach() for w in windows]}
        if incremental_state is not None:
            state: Dict[str, Optional[Tensor]] = {}
            for n, ((h, c), w) in enumerate(zip(finals, windows)):
                state[f"h{n}"], state[f"c{n}"] = h, c
                if w is not None:
                    state[f"w{n}"] = w
            self.set_incremental_state(incremental_state, "rnn_state", state)
        x = x.transpose(0, 1)
        extra = {"attn": [None], "distances": distances.transpose(1, 2)}  # (layers, B, T)
        return (x if features_only else self.output_layer(x)), extra

    # ------------------------------------------------ the state carried across the batches of a stream
    def _stream_state(self, slot, stream_pos, bsz):
        if stream_pos == 0:
            self._streams.pop(slot, None)
            return None, None
        saved = self._streams.get(slot)
        if saved is None or saved["next_pos"] != stream_pos or saved["states"][0][0].size(0) != bsz:
            logger.warning(f"{type(self).__name__}: no {slot} state continues stream position {stream_pos}; this "
                           f"segment starts from a zero state")
            return None, None
        return saved["states"], saved["windows"]

    def reset_memory(self, slot=None):
        """Forgets the carried state of ``slot`` ("train" or "eval"), or of both."""
        if slot is None:
            self._streams.clear()
        else:
            self._streams.pop(slot, None)

    def memory_state(self, slot="train"):
        """The carried state of ``slot`` as CPU tensors (``bptt_lm`` saves it with each checkpoint), or ``None``."""
        saved = self._streams.get(slot)
        if saved is None:
            return None
        return {"next_pos": saved["next_pos"], "states": [(h.cpu(), c.cpu()) for h, c in saved["states"]],
                "windows": [None if w is None else w.cpu() for w in saved["windows"]]}

    def load_memory_state(self, saved, slot="train"):
        """Restores a :meth:`memory_state` on the model's device."""
        if saved is None:
            self.reset_memory(slot)
            return
        device = self.output_bias.device
        self._streams[slot] = {
            "next_pos": int(saved["next_pos"]), "states": [(h.to(device), c.to(device)) for h, c in saved["states"]],
            "windows": [None if w is None else w.to(device) for w in saved["windows"]]}

    @property
    def num_layers(self):
        return len(self.encoder.rnn.layers)

    def output_layer(self, features):
        weight = self.encoder.embed_tokens.weight if self.tied else self.output_projection.weight
        return F.linear(features, weight, self.output_bias)

    def reorder_incremental_state(self, incremental_state, new_order):
        state = self.get_incremental_state(incremental_state, "rnn_state")
        if state is not None:
            state = {k: v.index_select(0, new_order) for k, v in state.items()}
            self.set_incremental_state(incremental_state, "rnn_state", state)

    def max_positions(self):
        return int(1e6)  # a recurrent model reads sequences of any length


@register_model("onlstm_lm", dataclass=ONLSTMConfig)
class ONLSTMLanguageModel(StreamMemoryModel, FairseqLanguageModel):
    """ON-LSTM language model (fairseq ``lstm_lm`` conventions; PTB preset ``onlstm_lm_ptb``)."""

    tree_label = "ON-LSTM"  # the parsers' name in examples/fasttrees/eval_parsing.py

    @classmethod
    def build_model(cls, cfg, task):
        check_task_kind("lm", cfg, task)
        return cls(OrderedNeuronsDecoder(cfg, task.target_dictionary))

    def syntactic_distances(self, tokens):
        """(layers, B, T): ``1 − mean(f̃_t)`` of every layer, for unsupervised parsing."""
        return self.decoder(tokens, features_only=True)[1]["distances"]


@register_model("onlstm_classifier", dataclass=ONLSTMConfig)
class ONLSTMClassifier(BaseFairseqModel):
    """Sentence encoder with RoBERTa-style classification heads (fairseq's ``sentence_prediction``).

    The sentence vector is the last layer's final hidden state (padding leaves the state unchanged).  With
    ``pair_tokens`` (``sentence_pair_classification``) both sentences are encoded alone by the same encoder
    (siamese) and the head reads [u; v; u∘v; |u − v|]."""

    def __init__(self, cfg, encoder):
        super().__init__()
        self.cfg, self.encoder = cfg, encoder
        self.classification_heads = nn.ModuleDict()

    @classmethod
    def build_model(cls, cfg, task):
        check_task_kind("classification", cfg, task)
        return cls(cfg, OrderedNeuronsEncoder(cfg, task.source_dictionary, tied_output=False))

    def register_classification_head(self, name, num_classes=None, inner_dim=None, input_multiplier=1, **kwargs):
        d = self.encoder.output_dim
        inner = inner_dim or self.cfg.classifier_hidden_dim or d
        self.classification_heads[name] = nn.Sequential(
            nn.Dropout(self.cfg.pooler_dropout), nn.Linear(d * input_multiplier, inner), nn.ReLU(),
            nn.Dropout(self.cfg.pooler_dropout), nn.Linear(inner, num_classes))

    def sentence_vector(self, tokens):
        _, finals, distances, _ = self.encoder(tokens)
        return finals[-1][0], distances

    def forward(self, src_tokens, src_lengths=None, features_only=False, classification_head_name=None,
                pair_tokens=None, pair_lengths=None, **kwargs):
        u, distances = self.sentence_vector(src_tokens)
        if pair_tokens is not None:
            v, _ = self.sentence_vector(pair_tokens)
            u = torch.cat([u, v, u * v, (u - v).abs()], -1)
        if classification_head_name is None:
            return u, {"distances": distances}
        return self.classification_heads[classification_head_name](u), {"distances": distances}

    def max_positions(self):
        return int(1e6)

    def upgrade_state_dict_named(self, state_dict, name):
        """Keeps the heads of a checkpoint that this model has not registered (as RoBERTa)."""
        prefix = name + "." if name else ""
        for key in state_dict:
            if key.startswith(prefix + "classification_heads."):
                head = key[len(prefix + "classification_heads."):].split(".")[0]
                if head not in self.classification_heads:
                    out = state_dict[f"{prefix}classification_heads.{head}.4.weight"]
                    inp = state_dict[f"{prefix}classification_heads.{head}.1.weight"]
                    self.register_classification_head(head, num_classes=out.size(0), inner_dim=inp.size(0),
                                                      input_multiplier=inp.size(1) // self.encoder.output_dim)


def preset(model, name, **values):
    """Registers arch ``name`` of ``model``: its values apply to every option not given on the command line."""

    def arch(args):
        for key, value in values.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)

    register_model_architecture(model, name)(arch)


# The ON-LSTM / FastTrees PTB language model: 3 layers, 1150 hidden, embedding 400, chunk 10, dropout
# 0.45 / 0.3 / 0.5 / 0.1 (output / hidden / input / embedding), weight drop 0.45, tied embeddings.
PTB = dict(embed_dim=400, hidden_size=1150, num_layers=3, chunk_size=10, dropout=0.45, hidden_dropout=0.3,
           input_dropout=0.5, embed_dropout=0.1, weight_drop=0.45, untie_embeddings=False)
# The FastTrees paper's logical-inference encoder: one layer, embedding 128, hidden 400, chunk 10, dropout 0.2;
# embeddings N(0, 1) (neither paper states the classifiers' initialisation; see the module docstring).
LOGIC = dict(embed_dim=128, hidden_size=400, num_layers=1, chunk_size=10, dropout=0.2, hidden_dropout=0.2,
             input_dropout=0.2, embed_dropout=0.0, weight_drop=0.2, pooler_dropout=0.2, embed_init="normal")

preset("onlstm_lm", "onlstm_lm_ptb", **PTB)
preset("onlstm_classifier", "onlstm_classifier_logic", **LOGIC)
