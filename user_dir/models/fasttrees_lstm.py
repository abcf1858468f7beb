"""``fasttrees_lstm_lm`` and ``fasttrees_lstm_classifier``: the recurrent FastTrees model (Pung & Chan,
arXiv 2111.14031, §3, Tables 1–4).

ON-LSTM's models (:mod:`user_dir.models.onlstm`: same sizes, regularisation, heads and presets) whose master
gates are computed from the input only, for the whole sequence before the time loop.  The cell, its
equations and its reconstruction decisions (``--master ffn|linear|conv``: decision 2; F's width: decision 3;
``--master none``, the LSTM ablation: decision 7)
are in :mod:`user_dir.modules.ordered_neurons`.
"""
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model

from .onlstm import LOGIC, PTB, ONLSTMClassifier, ONLSTMConfig, ONLSTMLanguageModel, preset

MASTER_CHOICES = ChoiceEnum(["ffn", "linear", "conv", "none"])


@dataclass
class FastTreesLSTMConfig(ONLSTMConfig):
    master: MASTER_CHOICES = field(default="ffn", metadata={
        "help": "master-gate network F: 'ffn' (two-layer position-wise FFN, the paper), 'linear' (the released "
                "code), 'conv' (causal 1-D conv + position-wise layer, Conv. FastTrees); 'none' (no master gates: the "
                "standard LSTM, an ablation)"})
    master_hidden_dim: int = field(default=0, metadata={
        "help": "hidden size of F (conv channels with --master conv); 0 = as many weights as ON-LSTM's "
                "master gates"})
    conv_kernel_size: int = field(default=2, metadata={"help": "kernel size of the causal conv (--master conv)"})


@register_model("fasttrees_lstm_lm", dataclass=FastTreesLSTMConfig)
class FastTreesLSTMLanguageModel(ONLSTMLanguageModel):
    """FastTrees language model (PTB preset ``fasttrees_lstm_lm_ptb``)."""

    tree_label = "FastTrees"


@register_model("fasttrees_lstm_classifier", dataclass=FastTreesLSTMConfig)
class FastTreesLSTMClassifier(ONLSTMClassifier):
    """FastTrees sentence encoder for ``sentence_prediction`` / ``sentence_pair_classification``."""


preset("fasttrees_lstm_lm", "fasttrees_lstm_lm_ptb", **PTB)
preset("fasttrees_lstm_lm", "fasttrees_lstm_lm_conv_ptb", **PTB, master="conv")
preset("fasttrees_lstm_classifier", "fasttrees_lstm_classifier_logic", **LOGIC)
preset("fasttrees_lstm_classifier", "fasttrees_lstm_classifier_conv_logic", **LOGIC, master="conv")
# the ablation: the same classifier without master gates, i.e. a standard LSTM (decision 7 of the cell)
preset("fasttrees_lstm_classifier", "lstm_classifier_logic", **LOGIC, master="none")
