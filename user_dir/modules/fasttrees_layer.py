"""FastTrees: parallel latent tree induction as a Transformer sublayer.

Paper: Pung & Chan, "FastTrees: Parallel Latent Tree-Induction for Faster Sequence Encoding" (arXiv
2111.14031), built on the ordered-neuron gates of ON-LSTM (Shen et al., ICLR 2019).  The paper's equations
were lost from our copy and its released code covers only the RNN language model, so the Transformer
variant below follows its prose and the released RNN code.  Symbols follow ON-LSTM.

Where the paper's ideas live
----------------------------
* **Placement** (Sec. 3, "We place the tree induction module ... right after the self-attention layer"):
  self-attention → FastTrees → (cross-attention) → FFN (:class:`FastTreesEncoderLayer`,
  :class:`FastTreesDecoderLayer`).
* **Master gates from the input only** (paper, "master forget gate ... master input gate"), in parallel
  over time (:meth:`FastTreesSublayer.master_gates`)::

      f̃_t = cumax(F_f(x_t))          ĩ_t = 1 − cumax(F_i(x_t))          cumax = cumsum ∘ softmax

  ``--fasttrees-master ffn`` ("FastTrees"): F is a two-layer position-wise FFN, ``Linear(d, h) → ReLU →
  Linear(h, D_m)``; ``--fasttrees-master conv`` ("Conv. FastTrees"): a 1-D convolution over time (kernel
  ``--conv-kernel-size``, dilation ``--conv-dilation``) → ReLU → one position-wise layer.  ``D_m = d / C``
  master units, each controlling ``C = --chunk-size`` neurons (ON-LSTM chunking).
* **Structured gating** (ON-LSTM eqs. 9–14), with the standard gates from x_t only::

      f, i, o = σ(W x_t + b),   ĉ = tanh(W_c x_t + b_c)
      ω = f̃ ∘ ĩ,   f̂ = f ∘ ω + (f̃ − ω),   î = i ∘ ω + (ĩ − ω)
      c_t = f̂_t ∘ c_{t−1} + î_t ∘ ĉ_t,      h_t = o_t ∘ tanh(c_t)

* **Syntactic distance** (ON-LSTM §4.3, ``distance_cforget``): ``d_t = 1 − mean(f̃_t)``; set
  :attr:`FastTreesSublayer.record_distance` to keep it after a forward pass (trees:
  :mod:`user_dir.modules.fasttrees_trees`).

Reconstruction decisions (where the paper is silent)
----------------------------------------------------
1. *Every block* of the encoder and of the decoder gets a FastTrees sublayer, with the base Transformer's
   residual connection and layer norm around it (post-norm by default, ``--*-normalize-before`` for pre-norm).
2. *Standard gates from x_t only*, as the released ``FasterFT.py``: with no h_{t−1}, f̂ and î do not depend
   on c or h, so the recurrence over c is linear and the whole sublayer is parallel over time.
3. *Cell recurrence kept* (the c_{t−1} term), evaluated for all t at once by :func:`linear_scan`, a
   work-efficient odd–even parallel scan (:func:`odd_even_scan`: ⌈log2 T⌉ levels on strided views, O(T)
   work, only products and sums of numbers ≤ 1 in magnitude, so as accurate as the loop).
   ``--fasttrees-no-recurrence`` selects the fully parallel reading ``c_t = î_t ∘ ĉ_t``.
4. *Scan backward by hand* (:class:`_LinearScan`): the adjoint of c_t = f̂_t ∘ c_{t−1} + b_t is the same
   linear recurrence run right to left, so the backward pass is one more parallel scan instead of autograd
   replaying every scan level (same gradients).
5. *Causal conv*: the input is left-padded by ``(k−1)·dilation``, so x_t never sees tokens > t, in decoders
   *and* encoders (encoders are bidirectional through attention anyway).  The released ``ConvFT.py`` pads
   symmetrically without a chomp, so its output at t reads x_{t+1}.  The conv acts on the whole sublayer
   input, not on a slice of features as in ``ConvFT.py``.
6. *F_f and F_i are separate networks* of hidden width h (``--master-hidden-dim``, default d/2); their first
   layers are fused into one Linear/Conv1d of 2h outputs (mathematically two independent layers).  The
   sublayer keeps one Linear per map: fusing the gate projection with F's first layer, or gating i and f in
   one broadcast, was slower on CPU.
7. *Bidirectional option* (``--fasttrees-bidirectional``, encoders only): the second half of the units is
   scanned right to left with its own master hierarchy of D_m/2 units (needs an even D_m).
8. *Padding*: pad positions are identities of the recurrence (f̂ = 1, î = 0) and are zeroed before the
   conv, so a sentence's outputs do not depend on the padding around it.
9. *Incremental decoding*: a decoder keeps c_{t−1} and the last ``(k−1)·dilation`` conv inputs per layer in
   fairseq's ``incremental_state``; ``reorder_incremental_state`` reorders them for beam search.
10. *Half precision*: the gate arithmetic, the master gates' cumax and the cell recurrence run in float32
    for float16/bfloat16 inputs (forget gates near 1 are multiplied over the whole sequence, and 1 − f̂
    keeps only a few bits in bfloat16); the output is cast back and the incremental cell state stays float32.

The recurrent FastTrees model of the paper's Tables 1–4 is :mod:`user_dir.modules.ordered_neurons`.
"""
from dataclasses import dataclass, field, fields
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from fairseq.utils import safe_getattr
from torch import Tensor

MASTER_CHOICES = ChoiceEnum(["ffn", "conv"])


@dataclass
class FastTreesConfig(FairseqDataclass):
    """Flags of the FastTrees sublayer (shared by every FastTrees model); :meth:`of` reads them from a model's
    flat fairseq args, :meth:`validate` checks them against the model dimension."""

    chunk_size: int = field(default=8, metadata={
        "help": "neurons per master unit (ON-LSTM chunk size C); must divide the model dimension"})
    fasttrees_master: MASTER_CHOICES = field(default="ffn", metadata={
        "help": "master-gate network F: 'ffn' (two-layer position-wise FFN, FastTrees) or "
                "'conv' (causal 1-D conv + position-wise layer, Conv. FastTrees)"})
    master_hidden_dim: int = field(default=0, metadata={
        "help": "hidden size of F_f and F_i (conv channels in the conv variant); 0 = model dim / 2"})
    conv_kernel_size: int = field(default=3, metadata={"help": "kernel size of the causal conv (conv variant)"})
    conv_dilation: int = field(default=1, metadata={"help": "dilation of the causal conv (conv variant)"})
    fasttrees_no_recurrence: bool = field(default=False, metadata={
        "help": "fully parallel variant: c_t = î_t∘ĉ_t without the c_{t-1} term"})
    fasttrees_bidirectional: bool = field(default=False, metadata={
        "help": "encoders only: scan half of the cell units right to left (own master hierarchy)"})

    @classmethod
    def flags(cls, args):
        """``{flag: value}`` of every FastTrees flag in ``args`` (Namespace, DictConfig or config); a flag that
        ``args`` lacks or sets to None has its default."""
        return {f.name: safe_getattr(args, f.name, f.default) for f in fields(cls) if not f.name.startswith("_")}

    @classmethod
    def of(cls, args):
        """The FastTrees settings in ``args`` (see :meth:`flags`), each of its field's type."""
        return cls(**{name: type(getattr(cls, name))(value) for name, value in cls.flags(args).items()})

    def validate(self, embed_dim, bidirectional):
        """Raises ``ValueError`` naming the offending flag."""
        if self.chunk_size < 1 or embed_dim % self.chunk_size != 0:
            raise ValueError(
                f"--chunk-size {self.chunk_size} must be a positive divisor of the model dimension {embed_dim} "
                f"(each master unit controls --chunk-size neurons)")
        if bidirectional and (embed_dim // self.chunk_size) % 2 != 0:
            raise ValueError(
                f"--fasttrees-bidirectional needs an even number of master units, but model dimension {embed_dim} "
                f"/ --chunk-size {self.chunk_size} = {embed_dim // self.chunk_size}")
        if self.fasttrees_master not in ("ffn", "conv"):
            raise ValueError(f"--fasttrees-master must be 'ffn' or 'conv', got {self.fasttrees_master!r}")
        if self.fasttrees_master == "conv" and self.conv_kernel_size < 1:
            raise ValueError(f"--conv-kernel-size must be >= 1, got {self.conv_kernel_size}")
        if self.fasttrees_master == "conv" and self.conv_dilation < 1:
            raise ValueError(f"--conv-dilation must be >= 1, got {self.conv_dilation}")
        if self.master_hidden_dim < 0:
            raise ValueError(f"--master-hidden-dim must be >= 0, got {self.master_hidden_dim}")


def _wide(x):
    """x in float32 if it is in half precision (float16 / bfloat16), else unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def cumax(x, dim=-1):
    """ON-LSTM's cumulative softmax, ``cumsum(softmax(x))``: monotone from ~0 to exactly 1.

    In float32 for half-precision inputs (and returned so): a float16 running sum drifts off 1."""
    return torch.cumsum(F.softmax(_wide(x), dim=dim), dim=dim)


# --------------------------------------------------------------------------- scans
def sequential_scan(a, b, c0=None):
    """Reference loop over time: ``c_t = a_t ∘ c_{t−1} + b_t`` (dim 0 is time)."""
    c = torch.zeros_like(b[0]) if c0 is None else c0
    out = []
    for t in range(a.size(0)):
        c = a[t] * c + b[t]
        out.append(c)
    return torch.stack(out, 0)


def linear_scan(a, b, c0=None):
    """Parallel evaluation of the linear recurrence ``c_t = a_t ∘ c_{t−1} + b_t`` (time is dim 0).

    Forward: :func:`odd_even_scan`.  Backward (:class:`_LinearScan`): the
    adjoint ``g_t = ∂L/∂c_t + a_{t+1} g_{t+1}`` is the same linear recurrence
    run right to left, so it is one more parallel scan, and
    ``∂L/∂b_t = g_t``, ``∂L/∂a_t = g_t c_{t−1}``; this replaces autograd's
    replay of every scan level (same gradients, a fraction of the work).
    ``c0`` (the incremental state c_{t−1}) enters as ``b_1 + a_1 c0``.
    """
    if c0 is not None:
        b = torch.cat([torch.addcmul(b[:1], a[:1], c0.unsqueeze(0)), b[1:]], 0)
    if not (a.requires_grad or b.requires_grad):
        return odd_even_scan(a, b)
    return _LinearScan.apply(a, b)


class _LinearScan(torch.autograd.Function):
    """:func:`odd_even_scan` with its gradient computed by a reverse-time scan (see :func:`linear_scan`)."""

    @staticmethod
    def forward(ctx, a, b):
        c = odd_even_scan(a, b)
        ctx.save_for_backward(a, c)
        return c

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_c):
        a, c = ctx.saved_tensors
        a_next = torch.empty(a.shape, dtype=a.dtype, device=a.device)  # a_{t+1}; nothing follows the last step
        a_next[:-1] = a[1:]
        a_next[-1] = 0
        g = odd_even_scan(a_next, grad_c, reverse=True)
        grad_a = torch.empty(c.shape, dtype=c.dtype, device=c.device)
        grad_a[0] = 0  # c_{-1} = 0 (c0 is folded into b_1 by linear_scan)
        torch.mul(g[1:], c[:-1], out=grad_a[1:])
        return grad_a, g


def odd_even_scan(a, b, reverse=False):
    """Work-efficient parallel scan of a linear recurrence (time is dim 0, no Python loop over time).

    ``reverse=False``: ``c_t = a_t ∘ c_{t−1} + b_t`` with ``c_{−1} = 0``;
    ``reverse=True``: ``c_t = a_t ∘ c_{t+1} + b_t`` with ``c_T = 0``.

    Odd–even reduction: neighbouring steps are composed pairwise (the operator
    ``(a, b) ∘ (a', b') = (a·a', a'·b + b')`` is associative), which gives the
    same recurrence on every second position at half the length; it is solved
    recursively and the other positions follow from it in one fused
    multiply-add.  ``⌈log2 T⌉`` levels of vectorised ops on strided views,
    O(T) work in all (about twice the sequential loop's), and only products
    and sums of the recurrence's own numbers (no division, exp or log), so it
    is as accurate as the loop.
    """
    T = a.size(0)
    if T == 1:
        return b.clone()
    c = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    if not reverse:
        n = T // 2  # pairs (2j, 2j+1) -> the recurrence of c_{2j+1}
        a_lo, a_hi, b_lo, b_hi = a[0:2 * n:2], a[1:2 * n:2], b[0:2 * n:2], b[1:2 * n:2]
        c_odd = odd_even_scan(a_hi * a_lo, torch.addcmul(b_hi, a_hi, b_lo))
        c[1:2 * n:2] = c_odd
        c[0] = b[0]
        m = (T - 1) // 2  # c_{2j} = a_{2j} c_{2j−1} + b_{2j}, j = 1..m
        if m:
            torch.addcmul(b[2::2], a[2::2], c_odd[:m], out=c[2::2])
        return c
    o = T % 2  # pairs (o+2j, o+2j+1) -> the recurrence of c_{o+2j}; c_0 alone when T is odd
    n = (T - o) // 2
    a_lo, a_hi, b_lo, b_hi = a[o:T:2], a[o + 1:T:2], b[o:T:2], b[o + 1:T:2]
    c_lo = odd_even_scan(a_lo * a_hi, torch.addcmul(b_lo, a_lo, b_hi), reverse=True)
    c[o:T:2] = c_lo
    c[T - 1] = b[T - 1]  # c_T = 0
    if n > 1:  # c_{o+2j+1} = a_{o+2j+1} c_{o+2j+2} + b_{o+2j+1}
        torch.addcmul(b_hi[:n - 1], a_hi[:n - 1], c_lo[1:], out=c[o + 1:T - 1:2])
    if o:
        torch.addcmul(b[0], a[0], c_lo[0], out=c[0])
    return c


# --------------------------------------------------------------------------- sublayer
@with_incremental_state
class FastTreesSublayer(nn.Module):
    """The FastTrees(.) sublayer: ``x (T, B, d) → h (T, B, d)`` (see the module docstring).

    ``causal`` sublayers (decoders) support fairseq's ``incremental_state``;
    ``bidirectional`` (encoders only) scans the second half of the units
    right to left.  ``scan``: ``"parallel"`` (:func:`linear_scan`) or
    ``"loop"`` (:func:`sequential_scan`, the reference it is tested against).
    """

    def __init__(self, embed_dim, opts: FastTreesConfig, causal=True, bidirectional=False, scan="parallel"):
        super().__init__()
        if causal and bidirectional:
            raise ValueError("--fasttrees-bidirectional is for encoders only (a decoder must be causal)")
        if scan not in ("parallel", "loop"):
            raise ValueError(f"scan must be 'parallel' or 'loop', got {scan!r}")
        opts.validate(embed_dim, bidirectional)
        self.embed_dim, self.opts, self.causal = embed_dim, opts, causal
        self.chunk_size = opts.chunk_size
        self.n_chunk = embed_dim // opts.chunk_size
        self.ndir = 2 if bidirectional else 1
        hidden = opts.master_hidden_dim or max(1, embed_dim // 2)
        self.master_hidden = hidden
        if opts.fasttrees_master == "conv":
            # F_f, F_i: causal conv (both gates' channels in one Conv1d) + one position-wise layer each
            self.conv_window = (opts.conv_kernel_size - 1) * opts.conv_dilation
            self.master_in = nn.Conv1d(embed_dim, 2 * hidden, opts.conv_kernel_size, dilation=opts.conv_dilation)
        else:
            # F_f, F_i: two-layer position-wise FFNs (first layers fused into one Linear)
            self.conv_window = 0
            self.master_in = nn.Linear(embed_dim, 2 * hidden)
        self.master_forget = nn.Linear(hidden, self.n_chunk)
        self.master_input = nn.Linear(hidden, self.n_chunk)
        # standard ON-LSTM gates from x_t only: o, ĉ, i, f
        self.gates = nn.Linear(embed_dim, 4 * embed_dim)
        self.scan = scan
        self.record_distance = False
        self.distance: Optional[Tensor] = None

    # ----- master gates
    def _master_hidden(self, x, keep, incremental_state):
        if self.conv_window == 0:
            return F.relu(self.master_in(x))
        inp = x if keep is None else x * keep
        inp = inp.permute(1, 2, 0)  # (B, d, T)
        state = self._get_state(incremental_state) if incremental_state is not None else None
        if state is not None and "window" in state:
            window = state["window"]
        else:
            window = inp.new_zeros(inp.size(0), inp.size(1), self.conv_window)
        full = torch.cat([window, inp], 2)
        if incremental_state is not None:
            self._update_state(incremental_state, window=full[:, :, full.size(2) - self.conv_window:])
        return F.relu(self.master_in(full)).permute(2, 0, 1)

    def master_gates(self, x, keep=None, incremental_state=None):
        """(f̃, ĩ), each (T, B, D_m): cumax within each direction's master units."""
        hf, hi = self._master_hidden(x, keep, incremental_state).chunk(2, dim=-1)
        T, B = x.shape[:2]
        per_dir = (T, B, self.ndir, self.n_chunk // self.ndir)
        f_master = cumax(self.master_forget(hf).view(per_dir)).view(T, B, self.n_chunk)
        i_master = 1.0 - cumax(self.master_input(hi).view(per_dir)).view(T, B, self.n_chunk)
        return f_master, i_master

    # ----- incremental state
    def _get_state(self, incremental_state) -> Optional[Dict[str, Optional[Tensor]]]:
        return self.get_incremental_state(incremental_state, "fasttrees_state")

    def _update_state(self, incremental_state, **tensors):
        state = self._get_state(incremental_state) or {}
        state.update(tensors)
        self.set_incremental_state(incremental_state, "fasttrees_state", state)

    def reorder_incremental_state(self, incremental_state, new_order):
        state = self._get_state(incremental_state)
        if state is not None:
            for k, v in list(state.items()):
                if v is not None:
                    state[k] = v.index_select(0, new_order)
            self.set_incremental_state(incremental_state, "fasttrees_state", state)
        return incremental_state

    # ----- forward
    def forward(self, x, padding_mask: Optional[Tensor] = None, incremental_state=None):
        """x: (T, B, d); padding_mask: (B, T), True at pads; returns h (T, B, d)."""
        if incremental_state is not None and not self.causal:
            raise ValueError("incremental decoding needs a causal FastTrees sublayer")
        T, B, d = x.shape
        pad = None if padding_mask is None else padding_mask.t().unsqueeze(-1)  # (no .any(): no host sync)
        keep = None if pad is None else (~pad).to(x.dtype)
        f_master, i_master = self.master_gates(x, keep, incremental_state)
        if self.record_distance:
            fwd = f_master[:, :, : self.n_chunk // self.ndir]
            self.distance = (1.0 - fwd.mean(-1)).t().detach()  # (B, T)
        # the gate arithmetic in float32 for half-precision inputs: forget gates near 1 multiply up
        # over the whole sequence, and 1 - f̂ has only a few bits left in bfloat16
        o, c_hat, i, f = _wide(self.gates(x)).chunk(4, dim=-1)
        shape = (T, B, self.n_chunk, self.chunk_size)
        o, i, f = torch.sigmoid(o), torch.sigmoid(i).view(shape), torch.sigmoid(f).view(shape)
        c_hat = torch.tanh(c_hat).view(shape)
        fm, im = f_master.unsqueeze(-1), i_master.unsqueeze(-1)
        overlap = fm * im
        f_hat = f * overlap + (fm - overlap)
        i_hat = i * overlap + (im - overlap)
        b = (i_hat * c_hat).view(T, B, d)
        f_hat = f_hat.view(T, B, d)
        if pad is not None:  # pads are identities of the recurrence
            b = b.masked_fill(pad, 0.0)
            f_hat = f_hat.masked_fill(pad, 1.0)
        if self.opts.fasttrees_no_recurrence:
            c = b
        else:
            c = self._recur(f_hat, b, incremental_state)
        return (o * torch.tanh(c)).to(x.dtype)

    def _recur(self, f_hat, b, incremental_state):
        c0 = None
        if incremental_state is not None:
            state = self._get_state(incremental_state)
            c0 = None if state is None else state.get("cell")
        if self.ndir == 1:
            c = self._scan(f_hat, b, c0)
        else:
            half = self.embed_dim // 2
            c = torch.cat([
                self._scan(f_hat[..., :half], b[..., :half], None),
                self._scan(f_hat[..., half:].flip(0), b[..., half:].flip(0), None).flip(0),
            ], -1)
        if incremental_state is not None:
            self._update_state(incremental_state, cell=c[-1])
        return c

    def _scan(self, a, b, c0):
        if self.scan == "loop" or a.size(0) == 1:
            return sequential_scan(a, b, c0)
        return linear_scan(a, b, c0)


# --------------------------------------------------------------------------- layers
class _FastTreesBlockMixin:
    """self-attention → **FastTrees** → FFN: the FastTrees sublayer with the block's residual and norm."""

    def _build_fasttrees(self, cfg, causal, bidirectional):
        opts = getattr(cfg, "fasttrees", None)
        if opts is None:
            raise ValueError("FastTrees layers need cfg.fasttrees (use fasttrees_transformer_config(args))")
        self.fasttrees = FastTreesSublayer(self.embed_dim, opts, causal=causal, bidirectional=bidirectional)
        self.fasttrees_layer_norm = LayerNorm(self.embed_dim, export=cfg.export)

    def _fasttrees_block(self, x, padding_mask, incremental_state=None):
        residual = x
        if self.normalize_before:
            x = self.fasttrees_layer_norm(x)
        x = self.fasttrees(x, padding_mask, incremental_state)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.fasttrees_layer_norm(x)
        return x

    def _ffn_block(self, x):
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.dropout_module(self.fc2(x))
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x


class FastTreesEncoderLayer(_FastTreesBlockMixin, TransformerEncoderLayerBase):
    """fairseq's encoder layer with the FastTrees sublayer after self-attention (paper, Sec. 3)."""

    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        if return_fc:
            raise ValueError("FastTrees encoder layers do not support return_fc")
        self._build_fasttrees(cfg, causal=False, bidirectional=cfg.fasttrees.fasttrees_bidirectional)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x = self._fasttrees_block(x, encoder_padding_mask)
        return self._ffn_block(x)


class FastTreesDecoderLayer(_FastTreesBlockMixin, TransformerDecoderLayerBase):
    """fairseq's decoder layer: self-attention → FastTrees (causal, incremental) → cross-attention → FFN."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        unsupported = [flag for flag, on in [
            ("--cross-self-attention", self.cross_self_attention), ("--scale-attn", self.attn_ln is not None),
            ("--scale-heads", self.c_attn is not None), ("--scale-fc", self.ffn_layernorm is not None),
            ("--scale-resids", self.w_resid is not None)] if on]
        if unsupported:
            raise ValueError(f"FastTrees decoder layers do not support {', '.join(unsupported)}")
        self._build_fasttrees(cfg, causal=True, bidirectional=False)

    def forward(self, x, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state=None, prev_attn_state=None, self_attn_mask: Optional[Tensor] = None,
                self_attn_padding_mask: Optional[Tensor] = None, need_attn: bool = False,
                need_head_weights: bool = False):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise ValueError("FastTrees decoder layers do not take prev_*_attn_state")
        if need_head_weights:
            need_attn = True
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, attn = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                                 incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask)
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x = self._fasttrees_block(x, self_attn_padding_mask, incremental_state)
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            x, attn = self.encoder_attn(query=x, key=encoder_out, value=encoder_out,
                                        key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                                        static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                                        need_head_weights=need_head_weights)
            x = self.residual_connection(self.dropout_module(x), residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
        return self._ffn_block(x), attn, None


def fasttrees_modules(model):
    """All FastTrees sublayers of ``model``; a clear error if there are none."""
    found = [m for m in model.modules() if isinstance(m, FastTreesSublayer)]
    if not found:
        raise ValueError(
            f"model {type(model).__name__} has no FastTrees layers, so it induces no trees; "
            "use a fasttrees_transformer* architecture")
    return found
