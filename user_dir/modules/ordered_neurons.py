"""Ordered-neuron recurrent layers: ON-LSTM and the recurrent FastTrees cell.

Where the papers' ideas live
----------------------------
**ON-LSTM** (Shen et al., "Ordered Neurons", ICLR 2019, eqs. 9–14) orders an LSTM's cell by two *master*
gates, each a cumulative softmax over ``D_m = H / C`` master units (one unit per chunk of ``C`` neurons)::

    f̃_t = cumax(W_f̃ x_t + U_f̃ h_{t−1} + b_f̃)          ĩ_t = 1 − cumax(W_ĩ x_t + U_ĩ h_{t−1} + b_ĩ)
    f_t, i_t, o_t = σ(W x_t + U h_{t−1} + b)            ĉ_t = tanh(W_c x_t + U_c h_{t−1} + b_c)
    ω_t = f̃_t ∘ ĩ_t      f̂_t = f_t ∘ ω_t + (f̃_t − ω_t)      î_t = i_t ∘ ω_t + (ĩ_t − ω_t)
    c_t = f̂_t ∘ c_{t−1} + î_t ∘ ĉ_t                     h_t = o_t ∘ tanh(c_t)

(each master value applies to the ``C`` neurons of its chunk; ``master="recurrent"``).

**FastTrees** (Pung & Chan, arXiv 2111.14031, §3; the model of its Tables 1–4) computes the master gates
from the input alone, ``f̃_t = cumax(F_f(x_t))`` and ``ĩ_t = 1 − cumax(F_i(x_t))``, so that they are
evaluated for every t at once, before the time loop (:class:`MasterGateNetwork`).

**Regularisation** as both papers (AWD-LSTM, Merity et al. 2018): weight drop (DropConnect) on the
hidden-to-hidden matrix, one mask per forward pass; locked (variational) dropout between layers
(:class:`OrderedNeuronsStack`); embedding dropout (:func:`embedding_dropout`).

**Syntactic distance** (ON-LSTM §4.3, used for unsupervised parsing): ``d_t = 1 − mean(f̃_t)`` over a layer's
master units, returned by every forward pass.

Reconstruction decisions
------------------------
1. *Standard gates read h_{t−1}* in the FastTrees cell (f, i, o, ĉ as in ON-LSTM), as the authors' released
   ``FastTrees.py``; only the master gates leave the loop.  The released ``FasterFT.py`` (standard gates
   without h_{t−1}) is not built here: it is the Transformer sublayer's cell
   (:mod:`user_dir.modules.fasttrees_layer`) run as an RNN.
2. *F* (``master``): ``"ffn"`` (default, the paper's text: "2 layered position-wise feed-forward layers"),
   ``Linear(d_in, h) → ReLU → Linear(h, D_m)`` for each of F_f and F_i (first layers fused); ``"linear"``
   (the released ``FastTrees.py``): one position-wise linear map; ``"conv"`` (Conv. FastTrees, the paper's
   text): a *causal* 1-D convolution over time (kernel ``k``, the input left-padded by ``k − 1``, so x_t never
   sees a later token), shared by F_f and F_i, ReLU, then one position-wise layer each.  The released
   ``ConvFT.py`` convolves without trimming the right pad and so reads x_{t+1}.
3. *F's width* (``master_hidden_dim``, the conv's channels) defaults to the width that gives F as many weights
   as ON-LSTM's master gates have (:func:`equal_parameter_width`), so that the two cells compare at equal size.
4. *Time loop*: everything that does not depend on ``h_{t−1}`` (the input projections of all gates,
   FastTrees' master gates) is computed for the whole sequence first; each step costs one matrix product of
   ``h_{t−1}`` and the gate arithmetic (:meth:`OrderedNeuronsLayer.forward`, the reference written step by
   step), in float32.
5. *Weight drop inverted*: kept weights are scaled by ``1/(1−p)`` in training; the released code instead
   scales by ``1−p`` at evaluation (the same model up to a reparametrisation).
6. *Padding*: a padded step leaves (h, c) unchanged, and F reads it as a zero input, as the causal
   convolution reads the steps before a sequence's start; so a sentence's outputs and final state are the same
   alone and in a batch padded on either side.  (The conv window carried out of a right-padded row holds those
   zeros.)
7. *Ablation* (``master="none"``, not in either paper): no master gates, f̃ = ĩ = 1, so ω = 1, f̂ = f, î = i
   and the cell is the standard LSTM with the same sizes, regularisation and heads: the control that shows
   what the master gates themselves do.  Its syntactic distances are 0.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .fasttrees_layer import cumax

MASTER_KINDS = ("recurrent", "ffn", "linear", "conv", "none")
State = Tuple[Tensor, Tensor]  # (h, c), each (B, H)


def check_chunking(hidden_size, chunk_size, what="--hidden-size"):
    """A ``ValueError`` naming the flags when ``chunk_size`` does not divide ``hidden_size``."""
    if chunk_size < 1 or hidden_size % chunk_size != 0:
        raise ValueError(f"--chunk-size {chunk_size} must be a positive divisor of {what} {hidden_size} "
                         f"(each master unit controls --chunk-size neurons)")


def master_gates(pre: Tensor):
    """(f̃, ĩ) = (cumax(a), 1 − cumax(b)) from master pre-activations [a | b] (…, 2·D_m), in float32."""
    n_chunk = pre.size(-1) // 2
    return cumax(pre[..., :n_chunk].float()), 1.0 - cumax(pre[..., n_chunk:].float())


def ordered_neurons_cell(f_master: Tensor, i_master: Tensor, gates: Tensor, c: Tensor, chunk_size: int):
    """One step of the structured gating (module docstring), in float32.

    f_master, i_master: (B, D_m) master gates; gates: (B, 4·H) pre-activations of o, ĉ, i, f; c: (B, H) float32.
    Returns (h, c)."""
    B, n_chunk = f_master.shape
    o, c_hat, i, f = gates.float().view(B, 4, n_chunk, chunk_size).unbind(1)
    fm, im = f_master.unsqueeze(-1), i_master.unsqueeze(-1)
    overlap = fm * im
    f_hat = torch.sigmoid(f) * overlap + (fm - overlap)
    i_hat = torch.sigmoid(i) * overlap + (im - overlap)
    c = f_hat * c.view(B, n_chunk, chunk_size) + i_hat * torch.tanh(c_hat)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h.view(B, -1), c.view(B, -1)


def equal_parameter_width(master, input_size, hidden_size, n_chunk, conv_kernel_size=2):
    """The width of F with as many weights as ON-LSTM's master gates, ``2·D_m·(d_in + H)`` (their rows of W
    and U): ``ffn`` ``2h·(d_in + D_m)``, ``conv`` ``h·(k·d_in + 2·D_m)`` (``linear`` has no width)."""
    budget = 2 * n_chunk * (input_size + hidden_size)
    per_unit = 2 * (input_size + n_chunk) if master == "ffn" else conv_kernel_size * input_size + 2 * n_chunk
    return max(1, round(budget / per_unit))


class MasterGateNetwork(nn.Module):
    """FastTrees' F_f and F_i (``master`` ``"ffn"``, ``"linear"`` or ``"conv"``): ``x (T, B, d_in)`` →
    master pre-activations ``(T, B, 2·D_m)``, forget gates first.  ``window`` (conv only): the last ``k − 1``
    inputs of the previous call, (B, d_in, k − 1), for decoding step by step; the new window is returned with
    the output."""

    def __init__(self, input_size, n_chunk, master="ffn", hidden_dim=0, conv_kernel_size=2, hidden_size=None):
        super().__init__()
        if master not in ("ffn", "linear", "conv"):
            raise ValueError(f"--master must be 'ffn', 'linear' or 'conv' for FastTrees, got {master!r}")
        if master == "conv" and conv_kernel_size < 1:
            raise ValueError(f"--conv-kernel-size must be >= 1, got {conv_kernel_size}")
        if hidden_dim < 0:
            raise ValueError(f"--master-hidden-dim must be >= 0, got {hidden_dim}")
        self.master = master
        hidden = hidden_dim or equal_parameter_width(master, input_size, hidden_size or input_size, n_chunk,
                                                     conv_kernel_size)
        self.window = conv_kernel_size - 1 if master == "conv" else 0
        if master == "linear":
            self.out = nn.Linear(input_size, 2 * n_chunk)
        elif master == "ffn":
            self.hidden = nn.Linear(input_size, 2 * hidden)
            self.out_forget, self.out_input = nn.Linear(hidden, n_chunk), nn.Linear(hidden, n_chunk)
        else:
            self.conv = nn.Conv1d(input_size, hidden, conv_kernel_size)
            self.out = nn.Linear(hidden, 2 * n_chunk)

    def forward(self, x: Tensor, window: Optional[Tensor] = None):
        if self.master == "linear":
            return self.out(x), None
        if self.master == "ffn":
            hf, hi = F.relu(self.hidden(x)).chunk(2, dim=-1)
            return torch.cat([self.out_forget(hf), self.out_input(hi)], -1), None
        if window is None:  # the start of a sequence: zeros before x_1
            window = x.new_zeros(x.size(1), x.size(2), self.window)
        full = torch.cat([window, x.permute(1, 2, 0)], 2)  # (B, d_in, k − 1 + T)
        hidden = F.relu(self.conv(full)).permute(2, 0, 1)  # (T, B, hidden)
        return self.out(hidden), full[:, :, full.size(2) - self.window:]


class OrderedNeuronsLayer(nn.Module):
    """One ON-LSTM or FastTrees layer (module docstring), time-major: ``x (T, B, d_in)`` → ``h (T, B, H)``.

    ``keep`` (T, B), False at padding: a padded step leaves (h, c) unchanged, so a sequence's outputs and
    final state do not depend on the padding after it.  :meth:`forward` is the reference: the time loop
    written out step by step."""

    def __init__(self, input_size, hidden_size, chunk_size, master="recurrent", master_hidden_dim=0,
                 conv_kernel_size=2, weight_drop=0.0):
        super().__init__()
        if master not in MASTER_KINDS:
            raise ValueError(f"--master must be one of {', '.join(MASTER_KINDS)}, got {master!r}")
        check_chunking(hidden_size, chunk_size)
        self.input_size, self.hidden_size, self.chunk_size = input_size, hidden_size, chunk_size
        self.n_chunk = hidden_size // chunk_size
        self.weight_drop = weight_drop
        self.master = master
        n_gates = 4 * hidden_size + (2 * self.n_chunk if self.recurrent_master else 0)
        # all gates' input projections in one matrix (ON-LSTM: [f̃ | ĩ | o | ĉ | i | f], FastTrees: [o | ĉ | i | f])
        self.ih = nn.Linear(input_size, n_gates)
        self.weight_hh = nn.Parameter(torch.empty(n_gates, hidden_size))
        nn.init.uniform_(self.weight_hh, -hidden_size ** -0.5, hidden_size ** -0.5)
        self.master_net = None if master in ("recurrent", "none") else MasterGateNetwork(
            input_size, self.n_chunk, master, master_hidden_dim, conv_kernel_size, hidden_size)

    @property
    def recurrent_master(self) -> bool:
        """ON-LSTM's master gates, read from h_{t−1} inside the loop."""
        return self.master == "recurrent"

    def initial_state(self, x: Tensor) -> State:
        B = x.size(1)
        return x.new_zeros(B, self.hidden_size), x.new_zeros(B, self.hidden_size, dtype=torch.float32)

    def precompute(self, x: Tensor, window: Optional[Tensor] = None, keep: Optional[Tensor] = None):
        """What does not depend on h: (gate input projections (T, B, G), FastTrees' master gates (f̃, ĩ), each
        (T, B, D_m), or ``None`` for ON-LSTM, the conv window to carry); padded steps enter F as zeros."""
        if self.master == "none":  # decision 7: f̃ = ĩ = 1
            ones = x.new_ones(1, 1, self.n_chunk, dtype=torch.float32).expand(x.size(0), x.size(1), -1)
            return self.ih(x), (ones, ones), None
        if self.master_net is None:
            return self.ih(x), None, None
        pre, window = self.master_net(x if keep is None else x.masked_fill(~keep.unsqueeze(-1), 0.0), window)
        return self.ih(x), master_gates(pre), window

    def hidden_weight(self) -> Tensor:
        """U with weight drop: one DropConnect mask for the whole forward pass."""
        return F.dropout(self.weight_hh, self.weight_drop, self.training)

    def forward(self, x: Tensor, state: Optional[State] = None, keep: Optional[Tensor] = None,
                window: Optional[Tensor] = None):
        """Returns (h (T, B, H), final state (h, c), master forget gates f̃ (T, B, D_m), conv window)."""
        gates_x, masters, window = self.precompute(x, window, keep)
        w_hh = self.hidden_weight()
        h, c = self.initial_state(x) if state is None else state
        outputs: List[Tensor] = []
        forgets: List[Tensor] = []
        n_master = 2 * self.n_chunk
        # the per-step slices, taken once (unbind: indexing [t] inside the loop would make autograd write a
        # zero-filled gradient of the whole sequence at every step)
        steps_x = gates_x.unbind(0)
        steps_master = None if masters is None else list(zip(masters[0].unbind(0), masters[1].unbind(0)))
        steps_keep = None if keep is None else keep.unsqueeze(-1).unbind(0)
        for t in range(x.size(0)):
            gates = steps_x[t] + F.linear(h, w_hh)
            if steps_master is None:  # ON-LSTM: the master gates read h_{t−1}
                f_master, i_master = master_gates(gates[:, :n_master])
                gates = gates[:, n_master:]
            else:  # FastTrees: computed before the loop
                f_master, i_master = steps_master[t]
            h_t, c_t = ordered_neurons_cell(f_master, i_master, gates, c, self.chunk_size)
            h_t = h_t.to(x.dtype)
            if steps_keep is not None:
                k = steps_keep[t]
                h_t, c_t = torch.where(k, h_t, h), torch.where(k, c_t, c)
            h, c = h_t, c_t
            outputs.append(h)
            if masters is None:
                forgets.append(f_master)
        f_masters = torch.stack(forgets) if masters is None else masters[0]
        return torch.stack(outputs), (h, c), f_masters, window


class OrderedNeuronsStack(nn.Module):
    """Layers of :class:`OrderedNeuronsLayer` with locked (variational) dropout between them (AWD-LSTM's
    ``dropouth``): the same mask at every time step of a sequence.  ``sizes``: input size, then each layer's
    hidden size."""

    def __init__(self, sizes, chunk_size, master="recurrent", master_hidden_dim=0, conv_kernel_size=2,
                 weight_drop=0.0, hidden_dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([
            OrderedNeuronsLayer(sizes[i], sizes[i + 1], chunk_size, master, master_hidden_dim, conv_kernel_size,
                                weight_drop) for i in range(len(sizes) - 1)])
        self.hidden_dropout = hidden_dropout

    def forward(self, x: Tensor, states: Optional[List[State]] = None, keep: Optional[Tensor] = None,
                windows: Optional[List[Optional[Tensor]]] = None):
        """x (T, B, d_in) → (output (T, B, H_last), outputs of every layer, final states, syntactic distances
        (layers, T, B), conv windows)."""
        outputs, finals, distances, new_windows = [], [], [], []
        for n, layer in enumerate(self.layers):
            if n > 0:
                x = locked_dropout(x, self.hidden_dropout, self.training)
            x, final, f_master, window = layer(x, None if states is None else states[n], keep,
                                               None if windows is None else windows[n])
            outputs.append(x)
            finals.append(final)
            distances.append(1.0 - f_master.mean(-1))
            new_windows.append(window)
        return x, outputs, finals, torch.stack(distances), new_windows


def locked_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout with one mask per sequence, shared by all time steps: x (T, B, C)."""
    if not training or p == 0:
        return x
    mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(embed: nn.Embedding, tokens: Tensor, p: float, training: bool) -> Tensor:
    """AWD-LSTM's embedding dropout: drops whole word types (rows of the table) for a forward pass."""
    weight = embed.weight
    if training and p > 0:
        weight = weight * weight.new_empty(weight.size(0), 1).bernoulli_(1 - p) / (1 - p)
    return F.embedding(tokens, weight, embed.padding_idx)
