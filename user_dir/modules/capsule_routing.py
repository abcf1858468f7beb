"""Capsule routing over attention logits (Duan, Cao & Zhao 2020, "Capsule-Transformer
for Neural Machine Translation", arXiv 2004.14649).

Where the paper's ideas live
----------------------------
* **Capsules from the logit cube** (paper §3, Fig. 2).  For one attention module
  the scaled dot-product logits form the cube ``E ∈ R^{H×Lq×Lk}``.  A *vertical*
  capsule ``C↕_h`` is the whole ``Lq×Lk`` slice of head ``h``; a *horizontal*
  capsule ``C↔_l`` is the ``H×Lk`` slice of query token ``l``.
* **Votes are the logits themselves** (paper §3, "vote vector generation"): no
  learned transformation, ``V_{m→n} = C_m`` — capsule sizes vary with the
  sentence length, so no weight matrix can act on them.
* **Dynamic routing** (paper Alg. 1, after Sabour et al. 2017) with ``r``
  iterations: couplings ``R = softmax(B)``, outputs ``Ω_n = squash(Σ_m R_{m→n}
  V_{m→n})`` (paper Eq. 6), agreements ``B_{m→n} += <V_{m→n}, Ω_n>``.
  Implemented once, in :func:`dynamic_routing`.
* **Ω is added to E before the softmax** (paper §3, Fig. 3):
  ``softmax(E + Ω↕ + Ω↔ + mask)``; see :class:`CapsuleMultiheadAttention`.

Reconstruction decisions (the paper's equations are not available)
------------------------------------------------------------------
1. *Non-degenerate routing.*  With identical votes and zero initial logits
   every output capsule is the same average and agreements never break the
   tie.  The initial routing logits ``B⁰`` are therefore **learned**:
   ``H×H`` for vertical routing (initialised to ``log H`` on the diagonal, so a
   head starts routed mostly to itself) and a relative-position table of
   ``2D+1`` scalars for horizontal routing (``D = --horizontal-max-distance``,
   initialised to ``-|n-m|/2``: a locality prior).  These are the only extra
   parameters: ``H² + 2D + 1`` per routed module with ``--capsule-routing both``.
2. *Squash scale.*  ``--capsule-squash l2`` (default) is the paper's squash
   (Sabour's, on the L2 norm of the whole capsule): ``||Ω_n|| < 1`` for a
   capsule of ``Lq·Lk`` entries, so ``Ω`` is a gentle correction of ``E``
   that shrinks as sentences get longer (trained on Multi30k:
   ``rms(Ω)/rms(E) ≈ 0.13``).  ``--capsule-squash rms`` measures norms and
   agreements per entry (``||s||² / size``), so ``rms(Ω_n) = q/(1+q)``
   independently of sentence length (``rms(Ω)/rms(E) ≈ 0.66``); it trained
   worse at the Multi30k budget, which is why it is not the default
   (BENCHMARKS.md, capsule section).
3. *Vertical couplings* are normalised over output capsules (heads), exactly
   as Sabour / the paper.
4. *Horizontal couplings* are normalised over the **input** capsules (tokens)
   visible to each output token.  Normalising over outputs (Sabour) would make
   the coupling of token ``m`` to output ``t`` depend on outputs ``> t``: a
   causality leak in the decoder.  One rule is used everywhere so encoder and
   decoder behave alike.
5. *Causality* (decoder modules, ``causal=True``).  Vertical capsules span all
   queries of a head; the capsule seen by query ``t`` is its **prefix** over
   queries ``≤ t``.  All routing quantities are expressed through the Gram
   matrix of the capsules, so the prefix version is a cumulative sum over
   queries of per-query ``H×H`` Gram matrices: each query runs its own routing
   on its prefix, all in one batched pass, and the full forward equals
   step-by-step decoding (the running sum is the incremental state).
   Horizontal output ``t`` only receives input tokens ``≤ t``.
6. *Padding.*  Masked logits (pad keys, future keys) and pad query rows are set
   to 0 before routing (never ``-inf``), pad rows are excluded as capsules, and
   the masks are re-applied after adding ``Ω``.
7. *Optional Ω gate* (``--capsule-omega-gate``, off by default; **not in the
   paper**).  A learned per-head scale on ``Ω``, initialised to 0: the model
   starts as the plain transformer and learns how much routing to add
   (``H`` more parameters per routed module).  For short training budgets,
   where ``Ω`` at full strength slows early learning (BENCHMARKS.md).
8. *Horizontal routing from the query/key factors* (cost, not semantics).  A horizontal
   capsule is ``C_m = (q_m^h·k_k^h)`` over the heads ``h`` and the keys ``k`` row ``m``
   sees.  When those key sets are nested (key padding: all rows see the same keys; causal
   self-attention: row ``m`` sees keys ``≤ m``; these are the masks the model's layers pass)
   the Gram matrix is ``G_mn = u_min(m,n)·q_max(m,n)`` with ``u_m = Σ_k E_mk k_k`` (heads
   concatenated, ``D = H·d``; ``q_m K_hᵀK_h`` per head when all rows see the same keys):
   ``O(M²·D)`` instead of forming the ``(M × H·K)`` capsules (``O(H·M³)``).
   ``Ω = Σ_m w_mn C_m`` is ``(Wᵀ Q_h) K_hᵀ`` when all rows see the same keys, ``Wᵀ E_h`` in a
   causal self-attention pass, and ``k_k · Σ_{m≥k} w_mn q_m`` (a suffix sum) while
   decoding.  Decoding keeps ``G`` (grown by one column per token) and ``q_m`` of the earlier
   rows, plus, in decoder self-attention, their logit rows while the target is at most twice
   the head width (``H·M² ≤ 2·M·D``: the cheaper state there) and ``u_m`` beyond, with the
   logits ``E_h[m, k]`` of each row inside its block of 16 rows: a step's suffix sum is then
   ``k_k · Σ_{m in later blocks} w_m q_m`` (block totals, ``O(M·D)``) plus the kept in-block
   logits weighted (``O(M·H·16)``), not ``O(M·D·16)`` (:func:`decode_suffix_omega`).  Past
   ``GRAM_FREE_DECODING·D`` target tokens, where the ``M²`` Gram costs more than the factors, decoding
   drops it: a routing iteration's ``G c`` comes from block totals of ``c_m u_m`` and ``c_m q_m``, their
   prefix and suffix sums and the Gram's in-block entries (:func:`decode_agreement`), ``O(M·D)`` per
   token, with state ``O(M·D)`` per row.
9. *Half precision.*  Gram matrices sum squared logits over whole capsules (a
   vertical capsule is a head's ``Lq×Lk`` slice) and pass float16's 65504 at
   sentence length; ``squash`` needs a tiny epsilon.  Routing therefore runs in
   float32 with autocast off, and only ``Ω`` is cast back to the logits' dtype (the
   way fairseq computes its softmax in float32).

Shapes: ``B`` batch, ``H`` heads, ``Q`` query rows, ``K`` keys.
"""
import contextlib
import functools
import math
from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq import utils
from fairseq.modules import MultiheadAttention

ROUTING_KINDS = ("vertical", "horizontal", "both")
SQUASH_MODES = ("rms", "l2")
_EPS = 1e-9


def squash_gain(sq_norm: Tensor) -> Tensor:
    """Factor ``f`` with ``squash(s) = f·s`` (paper Eq. 6): ``f = √q / (1+q)`` for ``q = ||s||²``.

    ``sq_norm`` is ``q`` (already divided by the capsule size in rms mode).  ``q`` is floored at a
    tiny ``ε``: the Gram quadratic form ``cᵀGc`` of a (nearly) cancelling sum can round below 0, and an
    empty capsule (``q = 0``) would give ``√q`` an infinite gradient; below ``ε`` the output
    ``f·s`` is below ``ε`` whatever ``f`` is.  Four operations: a decoding step runs this ``2·r``
    times per routed module.
    """
    q = sq_norm.clamp_min(_EPS)
    return q.sqrt() / (q + _scalar(1.0, q))


@functools.lru_cache(maxsize=None)
def _constant(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.tensor(value, dtype=dtype, device=device)


def _scalar(value: float, like: Tensor) -> Tensor:
    """A cached 0-dim tensor: adding it costs one kernel, adding a Python float costs a
    conversion too (this matters in beam search, where routing runs on tiny tensors at
    every step).  Never modified in place."""
    return _constant(value, like.dtype, like.device)


def dynamic_routing(gram: Tensor, init_logits: Tensor, iters: int, size: Optional[Tensor],
                    out_dim: int, visible: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Dynamic routing (paper Alg. 1) with identity votes, in Gram-matrix form.

    Votes are the input capsules themselves (``V_{m→n} = C_m``), so every
    quantity the algorithm needs is an inner product of capsules:
    ``<C_m, s_n> = (G c)_{mn}`` and ``||s_n||² = Σ_m c_{mn} (G c)_{mn}``.

    Args:
        gram: ``(G, M, M)`` symmetric Gram matrices of ``G`` groups of ``M`` input capsules, or a
            function ``c -> G c`` on ``(G, M, 1)`` couplings (one output: a decoding step without the Gram,
            :func:`decode_agreement`); ``init_logits`` is then ``(G, M, 1)``.
        init_logits: ``(G, M, N)`` or ``(M, N)`` (shared by the groups) learned
            initial routing logits ``B⁰``.
        iters: number of routing iterations ``r`` (≥ 1).
        size: capsule size that norms are divided by, broadcastable to
            ``(G, N)``; ``None`` for the literal L2 squash (no division).
        out_dim: the dimension of ``init_logits`` the couplings are normalised
            over: ``-1`` (output capsules, Sabour) or ``-2`` (input capsules).
        visible: optional bool ``(G, M, N)``: input ``m`` may vote for output ``n``;
            the causal pattern ``m - (M - N) <= n`` (horizontal routing), whose zero
            triangle the products skip when ``M = N``.

    Returns ``(weights, couplings)``: ``Ω_n = Σ_m weights_{mn} C_m``.
    """
    logits, inv_size = init_logits, None if size is None else size.reciprocal()
    if inv_size is not None and inv_size.dim():
        inv_size = inv_size.unsqueeze(-2)  # (G, 1, N)
    for it in range(iters):
        if visible is not None:
            logits = logits.masked_fill(~visible, -1e4)
        couplings = torch.softmax(logits, dim=out_dim)
        if visible is not None:
            couplings = couplings * visible
        if couplings.dim() == 2:  # the shared initial logits, first iteration
            couplings = couplings.expand(gram.size(0), -1, -1)
        if callable(gram):
            agree = gram(couplings)
        elif couplings.size(-1) == 1:  # one output (a decoding step): (cᵀ G)ᵀ, G being symmetric, is the
            agree = torch.bmm(couplings.transpose(1, 2), gram).transpose(1, 2)  # fast form of G c on CPU
        elif visible is not None:  # causal: c_mn = 0 for m > n (matmul_upper checks M = N)
            agree = matmul_upper(gram, couplings)
        else:
            agree = torch.bmm(gram, couplings)  # <C_m, s_n>
        sq_norm = (couplings * agree).sum(-2, keepdim=True)  # (G, 1, N)
        gain = squash_gain(sq_norm if inv_size is None else sq_norm * inv_size)
        if it + 1 < iters:
            logits = torch.addcmul(logits, agree, gain if inv_size is None else gain * inv_size)
    return couplings * gain, couplings


class _SmallBatchMatmul(torch.autograd.Function):
    """``torch.bmm(a, b)`` for many small ``a`` (``H × H``, one per query), ``a`` made contiguous in
    the forward and, transposed, in the backward: a transposed small operand makes CPU batched
    GEMM about 2.5x slower."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.bmm(a.contiguous(), b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = torch.bmm(grad, b.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        grad_b = torch.bmm(a.transpose(1, 2).contiguous(), grad) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def small_bmm(a: Tensor, b: Tensor) -> Tensor:
    if not torch.is_grad_enabled():  # decoding: no autograd.Function overhead
        return torch.bmm(a.contiguous(), b)
    return _SmallBatchMatmul.apply(a, b)


class _SelfGram(torch.autograd.Function):
    """``x xᵀ`` for ``x`` ``(G, H, N)`` with few rows (``H``) and long ones: the backward is the one
    product ``(g + gᵀ) x`` (autograd's two products include one into a transposed ``(G, N, H)``)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.bmm(x, x.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.bmm((grad + grad.transpose(1, 2)).contiguous(), x)


def self_gram(x: Tensor) -> Tensor:
    if not torch.is_grad_enabled():
        return torch.bmm(x, x.transpose(1, 2))
    return _SelfGram.apply(x)


def matmul_upper(g: Tensor, c: Tensor, min_block: int = 64) -> Tensor:
    """``g @ c`` for square ``c`` with ``c[m, n] = 0`` for ``m > n`` (causal couplings), skipping
    its zero lower-left block recursively: about half the work of a dense product."""
    size = c.size(-1)
    if size < 2 * min_block or c.size(-2) != size:
        return torch.matmul(g, c)
    h = size // 2
    left = matmul_upper(g[..., :h], c[..., :h, :h], min_block)
    return torch.cat([left, torch.matmul(g, c[..., h:])], dim=-1)


def matmul_lower(w: Tensor, e: Tensor, min_block: int = 64) -> Tensor:
    """``w @ e`` for square lower-triangular ``w`` and ``e`` (``x[i, j] = 0`` for ``j > i``),
    skipping their zero blocks recursively: about a third of the work of a dense product."""
    size = e.size(-1)
    if size < 2 * min_block or e.size(-2) != size or w.size(-1) != size or w.size(-2) != size:
        return torch.matmul(w, e)
    h = size // 2
    top_left = matmul_lower(w[..., :h, :h], e[..., :h, :h], min_block)
    top = torch.cat([top_left, top_left.new_zeros(top_left.shape[:-1] + (size - h,))], dim=-1)
    bottom = torch.cat([torch.matmul(w[..., h:, :], e[..., :h]),
                        matmul_lower(w[..., h:, h:], e[..., h:, h:], min_block)], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def matmul_tril(e: Tensor, x: Tensor, min_block: int = 64) -> Tensor:
    """``e @ x`` for square lower-triangular ``e`` (``e[i, j] = 0`` for ``j > i``: causal logits) and any
    ``x``, skipping ``e``'s zero upper-right blocks recursively: about half the work of a dense product."""
    size = e.size(-1)
    if size < 2 * min_block or e.size(-2) != size:
        return torch.matmul(e, x)
    h = size // 2
    top = matmul_tril(e[..., :h, :h], x[..., :h, :], min_block)
    bottom = torch.matmul(e[..., h:, :h], x[..., :h, :]) + matmul_tril(e[..., h:, h:], x[..., h:, :], min_block)
    return torch.cat([top, bottom], dim=-2)


def matmul_triu(a: Tensor, b: Tensor, min_block: int = 64) -> Tensor:
    """The upper triangle (``[m, n]``, ``m <= n``) of the square product ``a @ b``, its lower-left blocks
    skipped recursively (0 there, or the product's own values near the diagonal): about half the work."""
    size = a.size(-2)
    if size < 2 * min_block or b.size(-1) != size:
        return torch.matmul(a, b)
    h = size // 2
    top = torch.cat([matmul_triu(a[..., :h, :], b[..., :h], min_block), torch.matmul(a[..., :h, :], b[..., h:])],
                    dim=-1)
    corner = matmul_triu(a[..., h:, :], b[..., h:], min_block)
    bottom = torch.cat([corner.new_zeros(corner.shape[:-1] + (h,)), corner], dim=-1)
    return torch.cat([top, bottom], dim=-2)


@functools.lru_cache(maxsize=None)
def _upper_ones(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[k, m] = 1`` where ``m >= k`` (cached; never modified in place)."""
    return torch.ones(size, size, dtype=dtype, device=device).triu()


def suffix_weighted_sums(w: Tensor, rows: Tensor, block: int = 16) -> Tensor:
    """``S[b, n, k] = Σ_{m ≥ k} w[b, n, m] rows[b, m]`` for ``w`` ``(B, Q, M)``, ``rows`` ``(B, M, D)``.

    In blocks of ``block`` rows: a triangular product inside each block and a suffix sum of
    the block totals across blocks, ``O(Q·M·block·D)``: linear in ``M``, as matrix products
    (one block up to ``3·block`` rows).
    Returns ``(B, Q, M, D)``.
    """
    bsz, q_len, size = w.shape
    if size <= 3 * block:  # short: one triangular product is cheaper than blocks, padding and a scan
        block = size
    blocks = -(-size // block)
    pad = blocks * block - size
    if pad:
        w, rows = F.pad(w, (0, pad)), F.pad(rows, (0, 0, 0, pad))
    upper = _upper_ones(block, w.dtype, w.device)
    within = torch.matmul(upper * w.view(bsz, q_len, blocks, 1, block),
                          rows.view(bsz, 1, blocks, block, -1))  # (B, Q, nb, block, D)
    if blocks > 1:
        totals = within[:, :, :, 0]  # a block's total is the suffix sum at its first row
        later = totals.flip(2).cumsum(2).flip(2) - totals  # the blocks after each block
        within = within + later.unsqueeze(3)
    return within.reshape(bsz, q_len, blocks * block, -1)[:, :, :size]


def block_diagonal(logits: Tensor, first: int, block: int = 16) -> Tensor:
    """In-block logits of causal self-attention rows ``m = first .. first+Q-1``: ``(B, Q, H, block)``
    with ``[b, m, h, j] = E_h[m, s_m + j]`` (``s_m`` the first row of ``m``'s block of ``block`` rows)
    and 0 for keys after ``m``; ``logits`` ``(B, Q, H, K)``, key ``k`` being row ``k``."""
    bsz, q_len, heads, k_len = logits.shape
    if q_len == 1:  # a decoding step: row `first` sees keys s .. first of its block, then zeros
        start = first // block * block
        return F.pad(logits[..., start:first + 1], (0, block - (first + 1 - start)))
    rows = torch.arange(first, first + q_len, device=logits.device)
    idx = (rows // block * block).unsqueeze(1) + torch.arange(block, device=logits.device)  # (Q, block)
    picked = F.pad(logits, (0, block)).gather(3, idx.view(1, q_len, 1, block).expand(bsz, q_len, heads, block))
    return picked * (idx <= rows.unsqueeze(1)).to(logits.dtype).view(1, q_len, 1, block)


def _whole_blocks(x: Tensor, block: int) -> Tensor:
    """``x`` ``(G, M, W)`` as ``(G, C, block, W)``: its buffer's rows, up to the ``C`` whole blocks of
    ``block`` rows that it holds.  Decoding state is a view of a buffer with room for more rows
    (:func:`append_rows`), so a ``(G, M // block, block, W)`` view of it is no batch of matrices and a
    per-block ``matmul`` would copy it; the buffer's whole blocks are.  Rows from ``M`` on are whatever the
    buffer holds: only products of blocks inside ``M`` may be used."""
    groups, rows, width = x.shape
    if x.stride(2) != 1 or x.stride(1) != width:
        x = x.contiguous()
    room = rows
    if groups > 1 and x.stride(0) % width == 0:
        held = x.untyped_storage().nbytes() // x.element_size() - x.storage_offset() - (groups - 1) * x.stride(0)
        room = max(rows, min(x.stride(0), held) // width)
    return x.as_strided((groups, room // block, block, width), (x.stride(0), block * width, width, 1))


def decode_suffix_omega(w: Tensor, q_rows: Tensor, key: Tensor, diag: Tensor, block: int = 16) -> Tensor:
    """``Ω_h[k] = Σ_{m ≥ k} w_m E_h[m, k]`` of one decoding step in causal self-attention, ``(B, H, M)``.

    ``w`` ``(B, M)`` the new query's weights, ``q_rows`` ``(B, M, D)``, ``key`` ``(B, H, M, d)``,
    ``diag`` ``(B, M, H, block)`` from :func:`block_diagonal`.  For ``k`` in block ``j``:
    ``k_k^h · Σ_{m in blocks > j} w_m q_m^h`` (block totals and their suffix sum, ``O(M·D)``) plus
    ``Σ_{m in block j} w_m E_h[m, k]`` from the kept in-block logits (``O(M·H·block)``), instead of
    :func:`suffix_weighted_sums`' ``O(M·D·block)``.  The weighted block sums of ``q_rows`` and ``diag`` are
    batched matmuls on the state's buffers (:func:`_whole_blocks`), not on copies.  The last block
    (1 to ``block`` rows, the new one among them) is handled on its own.
    """
    bsz, total = w.shape
    heads, hd = key.size(1), key.size(-1)
    start = (total - 1) // block * block  # first row of the last block
    w_tail = w[:, start:]
    tail = (w_tail.view(bsz, -1, 1, 1) * diag[:, start:, :, :total - start]).sum(1)  # (B, H, total - start)
    if not start:
        return tail
    full = start // block
    q_blocks = _whole_blocks(q_rows, block)  # (B, nq, block, D)
    w_blocks = F.pad(w[:, :start], (0, q_blocks.size(1) * block - start)).view(bsz, -1, 1, block)
    totals = torch.matmul(w_blocks, q_blocks)[:, 1:full, 0]  # (B, full - 1, D): blocks 1 .. full - 1
    a_tail = torch.bmm(w_tail.unsqueeze(1), q_rows[:, start:])  # (B, 1, D): the last block's total
    later = torch.cat([totals, a_tail], dim=1).flip(1).cumsum(1).flip(1)  # (B, full, D): blocks after each
    later = later.view(bsz, full, heads, 1, hd).transpose(1, 2)  # (B, H, full, 1, d)
    across = (key[:, :, :start].view(bsz, heads, full, block, hd) * later).sum(-1)  # (B, H, full, block)
    d_blocks = _whole_blocks(diag.flatten(2), block)  # (B, nd, block, H·block)
    if d_blocks.size(1) != q_blocks.size(1):
        w_blocks = F.pad(w[:, :start], (0, d_blocks.size(1) * block - start)).view(bsz, -1, 1, block)
    within = torch.matmul(w_blocks, d_blocks)[:, :full, 0].view(bsz, full, heads, block)  # (B, full, H, block)
    head = (across + within.transpose(1, 2)).reshape(bsz, heads, start)
    return torch.cat([head, tail], dim=-1)


def symmetric_from_upper(x: Tensor) -> Tensor:
    """The symmetric matrices (last two dimensions) whose upper triangles, diagonal included, are ``x``'s."""
    return x.triu() + x.triu(1).transpose(-1, -2)


def block_gram(u_rows: Tensor, q_rows: Tensor, block: int = 16) -> Tensor:
    """The Gram's in-block entries ``(B, M, block)``: ``[m, i] = G[m, s_m + i]`` (``s_m`` the first row of
    ``m``'s block of ``block`` rows; 0 past the last row), from the factors of decoder self-attention
    (``G_mn = u_min(m,n) · q_max(m,n)``, :func:`factored_gram`): ``O(M·block·D)``."""
    bsz, total, width = u_rows.shape
    pad = -total % block
    u_blocks = F.pad(u_rows, (0, 0, 0, pad)).view(bsz, -1, block, width)
    q_blocks = F.pad(q_rows, (0, 0, 0, pad)).view(bsz, -1, block, width)
    x = torch.matmul(u_blocks, q_blocks.transpose(2, 3))  # x[a, b] = u_a · q_b, right for a <= b
    return symmetric_from_upper(x).reshape(bsz, -1, block)[:, :total]


def grow_block_gram(kept: Tensor, u_rows: Tensor, q_new: Tensor, order: Optional[Tensor] = None,
                    block: int = 16) -> Tensor:
    """:func:`block_gram` of one more row (a decoding step of decoder self-attention): the kept
    ``(B, P, block)`` entries, taken in beam ``order`` (:func:`append_rows`), grown by row ``t = P``:
    ``G[m, t] = u_m · q_t`` for ``m`` from its block's first row to ``t``, which is both the new row's
    entries and, by symmetry, a new column of the earlier rows of its block.  ``u_rows`` ``(B, P + 1, D)``
    (the new row's ``u`` included), ``q_new`` ``(B, 1, D)``.  ``O(block·D)`` per token."""
    total = u_rows.size(1)
    start = (total - 1) // block * block
    cols = torch.bmm(u_rows[:, start:], q_new.transpose(1, 2))  # (B, t - start + 1, 1)
    grown = append_rows(kept, F.pad(cols.transpose(1, 2), (0, block - cols.size(1))), order)
    if total - 1 > start:
        grown[:, start:total - 1, total - 1 - start] = cols[:, :-1, 0]
    return grown


def decode_agreement(c: Tensor, q_rows: Tensor, u_rows: Tensor, blocks: Optional[Tensor],
                     block: int = 16) -> Tensor:
    """``G c`` of one decoding step without the ``M × M`` Gram: ``O(M·D)`` per routing iteration.

    ``c`` ``(B, M, 1)`` the new output's couplings, ``q_rows`` and ``u_rows`` ``(B, M, D)`` the factors
    of the kept rows.  Decoder self-attention (``blocks``, :func:`block_gram`): ``G_mn = u_min · q_max``,
    so for row ``m`` in block ``j``, ``(G c)_m = q_m · Σ_{blocks < j} c_n u_n + u_m · Σ_{blocks > j}
    c_n q_n + Σ_{n in block j} G_mn c_n``: block totals of the weighted factors, their prefix and
    suffix sums, and the kept in-block entries.  Encoder-decoder attention (``blocks`` ``None``, all
    rows see the same keys): ``G_mn = u_m · q_n``, so ``G c = U (Qᵀ c)``.  The block products run on
    the state's buffers (:func:`_whole_blocks`; rows past ``M`` are whatever a buffer holds, so only
    the results of blocks before the last one are used); the last block is handled on its own.
    """
    if blocks is None:
        return torch.bmm(u_rows, torch.bmm(c.transpose(1, 2), q_rows).transpose(1, 2))
    bsz, total, _ = c.shape
    start = (total - 1) // block * block  # first row of the last block
    full = start // block
    c_tail, q_tail = c[:, start:], q_rows[:, start:]  # the last block: (B, L, 1), (B, L, D)
    tail = torch.bmm(blocks[:, start:, :total - start], c_tail)  # its in-block part
    if not full:
        return tail

    q_blocks, u_blocks, g_blocks = (_whole_blocks(x, block) for x in (q_rows, u_rows, blocks))  # (B, n, block, W)
    c_padded = F.pad(c[:, :start, 0], (0, max(x.size(1) for x in (q_blocks, u_blocks, g_blocks)) * block - start))

    def c_for(x_blocks):  # c in blocks to match a buffer's (0 from the last block on)
        return c_padded[:, :x_blocks.size(1) * block].view(bsz, -1, 1, block)

    c_q, c_u, c_g = c_for(q_blocks), c_for(u_blocks), c_for(g_blocks)
    sum_u = torch.matmul(c_u, u_blocks)[:, :full, 0]  # (B, full, D): no row follows the last block
    sum_q = torch.cat([torch.matmul(c_q, q_blocks)[:, :full, 0], torch.bmm(c_tail.transpose(1, 2), q_tail)], 1)
    before = torch.cat([sum_u.new_zeros(bsz, 1, sum_u.size(-1)), sum_u.cumsum(1)], 1)  # over earlier blocks
    after = sum_q.flip(1).cumsum(1).flip(1)[:, 1:]  # (B, full, D): Σ c_n q_n over the blocks after each

    def per_row(x_blocks, sums):  # x_m · sums_{j(m)} for the rows of the whole blocks: (B, full, block, 1)
        return torch.matmul(x_blocks, F.pad(sums, (0, 0, 0, x_blocks.size(1) - full)).unsqueeze(-1))[:, :full]

    head = (per_row(q_blocks, before[:, :full]) + per_row(u_blocks, after)
            + torch.matmul(g_blocks, c_g.transpose(2, 3))[:, :full])
    tail = tail + torch.bmm(q_tail, before[:, full].unsqueeze(-1))
    return torch.cat([head.reshape(bsz, start, 1), tail], 1)


def key_gram_u(query: Tensor, key: Tensor) -> Tensor:
    """``u_m = Σ_k E_mk k_k`` per head when every row sees the same keys: ``q_m (K_hᵀ K_h)``, ``(B, H, M, d)``.

    ``query`` ``(B, H, M, d)`` (pad rows 0), ``key`` ``(B, H, K, d)`` with the keys no row sees set to 0
    (:meth:`CapsuleMultiheadAttention._route_masked`).  ``O((M + K)·D·d)`` instead of ``O(M·K·D)``: cheaper
    once ``M·K > (M + K)·d`` (sentences longer than twice the head width)."""
    return torch.matmul(query, torch.matmul(key.transpose(2, 3), key))


def factored_gram(u: Tensor, q: Tensor) -> Tensor:
    """Gram matrix ``G_mn = u_min(m,n) · q_max(m,n)`` of horizontal capsules, ``(B, M, M)``.

    ``q``, ``u``: ``(B, M, D)``, heads concatenated (see :meth:`CapsuleRouting._horizontal`).
    One ``(M × D)·(D × M)`` product: ``O(M²·D)``, never the ``(M × H·K)`` capsules.
    """
    x = matmul_triu(u, q.transpose(1, 2))  # x_mn = u_m · q_n, right (and computed) for m <= n
    return symmetric_from_upper(x)


def _take(kept: Tensor, order: Optional[Tensor]) -> Tensor:
    return kept if order is None else kept.index_select(0, order)


def _take_into(out: Tensor, kept: Tensor, order: Optional[Tensor]) -> None:
    """``out.copy_(_take(kept, order))`` with one copy: ``index_select`` writes straight into ``out`` (a
    view of a larger buffer) unless autograd is recording, which ``out=`` does not support."""
    if order is not None and not (torch.is_grad_enabled() and (kept.requires_grad or out.requires_grad)):
        torch.index_select(kept, 0, order, out=out)
    else:
        out.copy_(_take(kept, order))


def _offsets(past: int, total: int, device: torch.device) -> Tensor:
    """``[m, n - past] = n - m`` for input rows ``m < total`` and output rows ``past <= n < total``."""
    return torch.arange(past, total, device=device).unsqueeze(0) - torch.arange(total, device=device).unsqueeze(1)


def _offset_index(offsets: Tensor, max_distance: int) -> Tensor:
    """Index of each offset in the relative-position table: clamped to ``±max_distance``."""
    return offsets.clamp(-max_distance, max_distance) + max_distance


@functools.lru_cache(maxsize=1024)
def _decoding_offset_index(total: int, max_distance: int, device: torch.device) -> Tensor:
    """:func:`_offset_index` of one decoding step (output row ``total - 1``), ``(total, 1)``, cached (a few
    bytes per target length, like :func:`_upper_ones` never modified in place): it saves five small ops per
    module and step."""
    return _offset_index(_offsets(total - 1, total, device), max_distance)


STATE_CAPACITY_STEP = 64

# Decoding drops the kept M×M Gram once the target is longer than this many times the model width
# D = H·d (decision 8, decode_agreement): a step then reads the q and u rows a few times per routing
# iteration (O(M·D) per token) instead of copying and reading the Gram (O(M²)).  Measured on CPU
# (benchmarks/capsule_transformer/long_decoding.py), the two cost the same at about 3.5·D.
GRAM_FREE_DECODING = 4


def _capacity(size: int) -> int:
    """Decoding state is allocated in sizes rounded up to 64 steps: a buffer one step longer than
    the last (freed) one is a fresh allocation every step, which glibc serves from newly mapped,
    page-faulted memory once it is large; equal sizes reuse the freed memory."""
    return -(-size // STATE_CAPACITY_STEP) * STATE_CAPACITY_STEP


def append_rows(kept: Tensor, new: Tensor, order: Optional[Tensor] = None, dim: int = 1) -> Tensor:
    """``torch.cat([kept.index_select(0, order), new], dim)`` as one copy of ``kept``: beam search's
    reorder of decoding state is applied while the state grows by a step, not as a copy of its own
    (``order`` ``None``: no reorder).  One ``index_select`` into the new buffer (``torch.cat`` and a
    separate reorder copy the whole state twice per step).  The result is a view of a buffer of
    :func:`_capacity` rows along ``dim``."""
    past = kept.size(dim)
    total = past + new.size(dim)
    shape = list(new.shape)
    shape[dim] = _capacity(total)
    out = new.new_empty(shape).narrow(dim, 0, total)
    out.narrow(dim, past, new.size(dim)).copy_(new)
    _take_into(out.narrow(dim, 0, past), kept, order)
    return out


def grow_rows(kept: Tensor, new: Tensor, order: Optional[Tensor] = None) -> Tensor:
    """Causal self-attention logit rows ``(B, P, H, P)`` (row ``m`` 0 beyond key ``m``, as kept while
    decoding) grown by the new rows ``new`` ``(B, Q, H, P + Q)``: ``(B, P + Q, H, P + Q)``, the kept rows
    taken in beam ``order`` first (as :func:`append_rows`).  One copy of the kept rows, straight into
    their place (a pad to the new width, a ``cat`` and a reorder copy them three times); the result is a
    view of a buffer of :func:`_capacity` ``²`` entries per row and head, its inner ``(H, K)`` contiguous."""
    bsz, q_len, heads, total = new.shape
    past = kept.size(1)
    cap = _capacity(total)
    out = new.new_empty(bsz * cap * heads * cap)[:bsz * cap * heads * total].view(bsz, cap, heads, total)
    out = out[:, :total]
    _take_into(out[:, :past, :, :past], kept, order)
    out[:, :past, :, past:] = 0.0  # earlier rows do not see the new keys
    out[:, past:] = new
    return out


def grow_gram(gram: Tensor, cols: Tensor, order: Optional[Tensor] = None) -> Tensor:
    """The ``(B, M, M)`` Gram of ``M = P + Q`` rows from the kept ``(B, P, P)`` one (rows taken in
    beam ``order`` first, as :func:`append_rows`) and the new rows' columns ``cols`` ``(B, M, Q)``
    (``G_mn`` for new ``n``, right for ``m <= n``)."""
    past = gram.size(1)
    block = cols[:, past:]
    total = cols.size(1)
    grown = cols.new_empty(cols.size(0), _capacity(total), _capacity(total))[:, :total, :total]
    _take_into(grown[:, :past, :past], gram, order)
    grown[:, :past, past:] = cols[:, :past]
    grown[:, past:, :past] = cols[:, :past].transpose(1, 2)
    grown[:, past:, past:] = block if block.size(1) == 1 else symmetric_from_upper(block)
    return grown


class CapsuleRouting(nn.Module):
    """Vertical and/or horizontal capsule routing of one attention module.

    ``forward(E, valid, counts, state)`` returns ``Ω`` of ``E``'s shape; see the
    module docstring for the design.  The learned initial routing logits are
    the module's only parameters.
    """

    def __init__(self, num_heads: int, routing: str = "both", iters: int = 3,
                 causal: bool = False, squash: str = "l2", max_distance: int = 8,
                 omega_gate: bool = False):
        super().__init__()
        if routing not in ROUTING_KINDS:
            raise ValueError(f"--capsule-routing must be one of {ROUTING_KINDS}, got {routing!r}")
        if squash not in SQUASH_MODES:
            raise ValueError(f"--capsule-squash must be one of {SQUASH_MODES}, got {squash!r}")
        check_routing_iters(iters)
        if max_distance < 0:
            raise ValueError(f"--horizontal-max-distance must be >= 0, got {max_distance}")
        self.num_heads, self.routing, self.iters = num_heads, routing, iters
        self.causal, self.squash, self.max_distance = causal, squash, max_distance
        self.vertical = routing in ("vertical", "both")
        self.horizontal = routing in ("horizontal", "both")
        if self.vertical:
            self.vertical_logits = nn.Parameter(torch.eye(num_heads) * math.log(max(num_heads, 2)))
        if self.horizontal:
            offsets = torch.arange(-max_distance, max_distance + 1, dtype=torch.float)
            self.horizontal_logits = nn.Parameter(-0.5 * offsets.abs())
        self.omega_gate = nn.Parameter(torch.zeros(num_heads)) if omega_gate else None

    def extra_repr(self):
        return (f"routing={self.routing}, iters={self.iters}, causal={self.causal}, "
                f"squash={self.squash}, max_distance={self.max_distance}, "
                f"omega_gate={self.omega_gate is not None}")

    def forward(self, logits: Tensor, counts: Tensor, state: Optional[Dict[str, Tensor]] = None,
                capture: bool = False, query: Optional[Tensor] = None, key: Optional[Tensor] = None,
                keys_are_rows: bool = False, keep_state: bool = False, order: Optional[Tensor] = None):
        """Routes the neutralised logit cube.

        Args:
            logits: ``(B, Q, H, K)`` logits (query-major layout, so that both
                routings are plain batched matmuls), 0 at masked entries and
                pad rows.
            counts: ``(B, Q)`` number of visible logits of each query row
                (0 for pad rows, which then take no part in routing).
            state: incremental-decoding state of earlier query rows (causal
                modules only); ``None`` for a full pass.
            query, key: ``(B, H, Q, d)`` scaled queries and ``(B, H, K, d)`` keys
                with ``logits = query · keyᵀ`` on the visible entries.  Horizontal
                routing works on these factors (module docstring, decision 8);
                without them (tests, plots of a bare cube) the rows of ``logits``
                are the factors, and no ``state`` may be given.
            keys_are_rows: self-attention: key ``k`` is query row ``k``, so a
                causal row ``m`` sees the keys ``≤ m``.
            keep_state: return the state that the next decoding step needs.
            order: beam search's pending reorder of ``state`` (rows of the batch), applied
                while the state grows (:func:`append_rows`); ``None``: none.
        Returns ``(omega, new_state, info)`` with ``omega`` in ``logits``'
        layout and dtype; ``info`` holds the couplings when ``capture`` is set.
        All routing runs in float32 (decision 9), with autocast off.
        """
        state = state or {}
        new_state: Dict[str, Tensor] = {}
        info: Dict[str, Tensor] = {}
        omega = None
        dtype = logits.dtype
        with torch.autocast(logits.device.type, enabled=False):
            logits = logits.float()  # any layout: attention passes a (B, Q, H, K) view of its (B, H, Q, K)
            if query is not None:
                query, key = query.float(), key.float()
            if self.vertical:
                omega, c = self._vertical(logits, counts, state, new_state, order)
                if capture:
                    info["vertical_couplings"], info["omega_vertical"] = c, omega
            if self.horizontal:
                o, c = self._horizontal(logits, counts, state, new_state if keep_state else None, query, key,
                                       keys_are_rows, order)
                omega = o if omega is None else omega + o
                if capture:
                    info["horizontal_couplings"], info["omega_horizontal"] = c, o
            if self.omega_gate is not None:  # decision 7: (B, Q, H, K) scaled per head
                omega = omega * self.omega_gate.float().view(1, 1, -1, 1)
        return omega.to(dtype), new_state, info

    def _size(self, n: Tensor, per: int = 1) -> Optional[Tensor]:
        """Capsule size that norms are divided by, from ``n`` visible logits of ``per`` entries each:
        ``None`` (no division) for the L2 squash."""
        return (n * per if per != 1 else n).clamp_min(1.0) if self.squash == "rms" else None

    def _vertical(self, logits, counts, state, new_state, order=None):
        """One capsule per head (M = N = H); per-query prefix routing when causal."""
        bsz, q_len, heads, k_len = logits.shape
        n = counts.to(logits.dtype)
        if not self.causal:  # one routing per sentence on the (B, H, Q·K) capsules: attention's own layout
            caps = logits.transpose(1, 2).reshape(bsz, heads, q_len * k_len)
            gram = self_gram(caps)
            weights, couplings = dynamic_routing(gram, self.vertical_logits.float(), self.iters,
                                                 self._size(n.sum(1, keepdim=True)), out_dim=-1)
            omega = torch.bmm(weights.transpose(1, 2).contiguous(), caps)  # Ω↕_n = Σ_m w_mn C_m
            return omega.view(bsz, heads, q_len, k_len).transpose(1, 2), couplings.unsqueeze(1)
        rows = logits.reshape(bsz * q_len, heads, k_len)
        row_gram = self_gram(rows).view(bsz, q_len, heads, heads)
        gram = row_gram.cumsum(1) if q_len > 1 else row_gram  # prefix sums over queries
        if "vertical_gram" in state:
            gram = gram + _take(state["vertical_gram"], order).unsqueeze(1)
        new_state["vertical_gram"] = gram[:, -1]
        size = None
        if self.squash == "rms":  # the prefix capsules' entries (the L2 squash divides by no size)
            n = n.cumsum(1) if q_len > 1 else n
            if "vertical_count" in state:
                n = n + _take(state["vertical_count"], order)
            new_state["vertical_count"] = n[:, -1:]
            size = self._size(n).view(bsz * q_len, 1)
        weights, couplings = dynamic_routing(gram.view(bsz * q_len, heads, heads), self.vertical_logits.float(),
                                             self.iters, size, out_dim=-1)
        omega = small_bmm(weights.transpose(1, 2), rows)  # Ω↕_n = Σ_m w_mn C_m, query by query
        return omega.view(bsz, q_len, heads, k_len), couplings.view(bsz, q_len, heads, heads)

    def _horizontal(self, logits, counts, state, new_state, query, key, keys_are_rows, order=None):
        """One capsule per query token (its logits on all heads, ``H·K`` entries), decision 8."""
        bsz, q_len, heads, k_len = logits.shape
        row_counts = new_counts = counts.to(logits.dtype)
        if query is None and state:
            raise ValueError("incremental horizontal routing needs the queries and keys of the logits")
        keep = self.causal and query is not None and new_state is not None
        past = state["horizontal_counts"].size(1) if "horizontal_counts" in state else 0
        total = past + q_len
        # decoder self-attention keeps its logit rows while H·M² <= 2·M·D (M <= 2d): there they are the
        # cheaper state (Ω = Wᵀ rows, O(H·d²) per token); beyond, u_m and the suffix sums
        keep_rows = keep and keys_are_rows and total <= 2 * query.size(-1)
        rows = None  # the capsules themselves: a bare cube, short keys (K <= d), or kept rows
        if query is None or (not past and k_len <= query.size(-1)) or keep_rows or "horizontal_rows" in state:
            rows = logits
            if "horizontal_rows" in state:  # earlier rows saw fewer keys: 0 beyond
                rows = grow_rows(state["horizontal_rows"], logits, order)
            rows = rows.reshape(bsz, total, heads * k_len)
        if query is not None:  # q_m, pad rows zeroed, heads concatenated
            valid = (counts > 0).to(logits.dtype).view(bsz, 1, q_len, 1)
            q_new = (query * valid).transpose(1, 2).reshape(bsz, q_len, -1)
            q_rows = append_rows(state["horizontal_q"], q_new, order) if past else q_new
        if past:
            row_counts = append_rows(state["horizontal_counts"], row_counts, order)
        diag = None
        if query is not None and (rows is None or (keep and not keep_rows)):
            # u_m = Σ_k E_mk k_k over the keys row m sees: for the factored Gram, and kept once rows are not
            if "horizontal_u" in state:
                u_new = torch.matmul(logits.transpose(1, 2), key).transpose(1, 2).reshape(bsz, q_len, -1)
                u_rows = append_rows(state["horizontal_u"], u_new, order)
            else:  # all rows at once (a full pass, or when decoding stops keeping the logit rows)
                cube = logits if rows is None else rows.view(bsz, total, heads, k_len)
                if self.causal and keys_are_rows:  # row m sees keys <= m: a triangular product
                    u = matmul_tril(cube.transpose(1, 2), key)
                elif q_len * k_len > (q_len + k_len) * key.size(-1):  # same keys for all: Q_h (K_hᵀ K_h)
                    u = key_gram_u(query * valid, key)
                else:
                    u = torch.matmul(cube.transpose(1, 2), key)
                u_rows = u.transpose(1, 2).reshape(bsz, total, -1)
            # in-block logits for decode_suffix_omega (decoder self-attention), kept like u_m
            if self.causal and keys_are_rows and (keep or "horizontal_diag" in state):
                if "horizontal_diag" in state:
                    diag = append_rows(state["horizontal_diag"], block_diagonal(logits, past), order)
                else:
                    diag = block_diagonal(cube, 0)
        blocks = None  # the Gram's in-block entries, kept instead of the Gram (decoder self-attention)
        if past and q_len == 1 and rows is None and total > GRAM_FREE_DECODING * q_new.size(-1):
            gram = None  # a long target: routing from the factors, O(M·D) per token (decode_agreement)
            if keys_are_rows:
                blocks = (grow_block_gram(state["horizontal_blocks"], u_rows, q_new, order)
                          if "horizontal_blocks" in state else block_gram(u_rows, q_rows))
        elif "horizontal_gram" in state:  # decoding: the kept Gram grows by the new rows' columns
            if rows is not None:
                cols = torch.bmm(rows[:, past:], rows.transpose(1, 2)).transpose(1, 2)
            else:
                cols = torch.bmm(u_rows, q_new.transpose(1, 2))
            gram = grow_gram(state["horizontal_gram"], cols, order)
        elif rows is not None:
            gram = torch.bmm(rows, rows.transpose(1, 2))
        else:  # a full pass (or rows added to a state that had dropped the Gram)
            gram = factored_gram(u_rows, q_rows)
        if keep:
            new_state.update(horizontal_q=q_rows, horizontal_counts=row_counts)
            if gram is not None:
                new_state["horizontal_gram"] = gram
            if blocks is not None:
                new_state["horizontal_blocks"] = blocks
            if keep_rows:
                new_state["horizontal_rows"] = rows.view(bsz, total, heads, k_len)
            else:
                new_state["horizontal_u"] = u_rows
                if keys_are_rows:
                    new_state["horizontal_diag"] = diag
        visible = None
        if q_len == 1:  # a decoding step
            index = _decoding_offset_index(total, self.max_distance, logits.device)
        else:
            offsets = _offsets(past, total, logits.device)
            index = _offset_index(offsets, self.max_distance)
            if self.causal:  # output row n sees input rows m <= n: (M, Q), broadcast over the batch
                visible = offsets >= 0
        init = self.horizontal_logits.float()[index]  # (M, Q)
        # pad rows are no capsules: a -1e4 initial logit keeps their couplings at 0 in every iteration
        # (their agreement stays 0, their logits being 0) -- no mask to test for, no host sync
        empty = (row_counts == 0).to(logits.dtype) * _scalar(-1e4, logits)  # (B, M)
        init = init + empty.unsqueeze(-1)  # (B, M, Q)
        size = self._size(new_counts, per=heads)  # (B, Q): entries of output capsule n
        if gram is None:
            gram = functools.partial(decode_agreement, q_rows=q_rows, u_rows=u_rows, blocks=blocks)
        weights, couplings = dynamic_routing(gram, init, self.iters, size, out_dim=-2, visible=visible)
        wt = weights.transpose(1, 2)  # (B, Q, M): Ω_n = Σ_m w_mn C_m
        if rows is not None:
            omega = torch.bmm(wt, rows)
        elif not (self.causal and keys_are_rows):  # all rows see the same keys: Ω_h = (Wᵀ Q_h) K_hᵀ
            wq = torch.bmm(wt, q_rows).view(bsz, q_len, heads, -1).transpose(1, 2)
            omega = torch.matmul(wq, key.transpose(2, 3)).transpose(1, 2)
        elif not past:  # full causal self-attention pass: Ω_h = Wᵀ E_h
            omega = matmul_lower(wt.unsqueeze(1), logits.transpose(1, 2)).transpose(1, 2)  # both triangular
        elif q_len == 1 and diag is not None:  # one decoding step: block totals + in-block logits
            omega = decode_suffix_omega(wt[:, 0], q_rows, key, diag).unsqueeze(1)  # (B, 1, H, K)
        else:  # decoding, row m sees keys <= m: Ω_h[n, k] = k_k · Σ_{m >= k} w_mn q_m (a suffix sum)
            sums = suffix_weighted_sums(wt, q_rows).view(bsz, q_len, total, heads, -1)
            omega = (sums * key.transpose(1, 2).unsqueeze(1)).sum(-1).transpose(2, 3)  # (B, Q, H, K)
        return omega.reshape(bsz, q_len, heads, k_len), couplings


class CapsuleMultiheadAttention(MultiheadAttention):
    """fairseq's :class:`MultiheadAttention` whose score path is capsule-routed.

    Projections, caching of keys/values for incremental decoding, dropout and
    the output projection are fairseq's; only the logits change (paper Fig. 3):
    ``softmax(E + Ω↕ + Ω↔ + masks)``, ``Ω`` from :class:`CapsuleRouting` on the
    neutralised ``E``.  The routing state of earlier target positions (causal
    modules) is kept in ``incremental_state`` under ``"capsule_state"``; beam
    search's reorder of it (and of self-attention's keys and values) is deferred
    to the next step, which applies it while growing the state
    (:meth:`reorder_incremental_state`, :func:`append_rows`).

    ``capture = True`` keeps the last call's logits before routing, ``Ω`` and
    the couplings in ``last_capture``; :func:`capturing` sets it for a block of
    code (the plotting and routing-strength scripts).
    """

    def __init__(self, embed_dim, num_heads, routing: CapsuleRouting, **kwargs):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise ValueError("capsule routing does not support add_bias_kv / add_zero_attn")
        kwargs.pop("xformers_att_config", None)
        super().__init__(embed_dim, num_heads, **kwargs)
        if routing.num_heads != num_heads:
            raise ValueError(f"routing built for {routing.num_heads} heads, attention has {num_heads}")
        self.capsule = routing
        self.capture = False
        self.last_capture: Dict[str, Tensor] = {}

    def set_beam_size(self, beam_size):
        """Routing state grows per target step, so fairseq's shared-beam cross-attention is not used."""
        self.beam_size = 1

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None,
                need_weights=True, static_kv=False, attn_mask=None, before_softmax=False,
                need_head_weights=False):
        if need_head_weights:
            need_weights = True
        tgt_len, bsz, embed_dim = query.size()
        saved_state, cap_state, order = None, None, None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if "prev_key" in saved_state and static_kv:
                key = value = None
            if self.capsule.causal:
                cap_state = self.get_incremental_state(incremental_state, "capsule_state")
                if cap_state is not None:  # beam search's reorder, deferred to this step's growth of the state
                    cap_state = dict(cap_state)
                    order = cap_state.pop("reorder", None)
        q = self.q_proj(query) * self.scaling
        if self.self_attention:
            k, v = self.k_proj(query), self.v_proj(query)
        elif key is None:
            k = v = None
        else:
            k, v = self.k_proj(key), self.v_proj(value)
        heads, hd = self.num_heads, self.head_dim
        q = q.contiguous().view(tgt_len, bsz * heads, hd).transpose(0, 1)
        if k is not None:
            k = k.contiguous().view(-1, bsz * heads, hd).transpose(0, 1)
            v = v.contiguous().view(-1, bsz * heads, hd).transpose(0, 1)
        if saved_state is not None:
            prev_mask = saved_state.get("prev_key_padding_mask")
            if "prev_key" in saved_state:
                if static_kv:  # encoder keys: fairseq's own (eager) reorder
                    k = saved_state["prev_key"].view(bsz * heads, -1, hd)
                    v = saved_state["prev_value"].view(bsz * heads, -1, hd)
                else:  # keys grow by this step, reordered on the way (one copy, as append_rows)
                    k = append_rows(saved_state["prev_key"], k.view(bsz, heads, -1, hd), order, dim=2)
                    v = append_rows(saved_state["prev_value"], v.view(bsz, heads, -1, hd), order, dim=2)
                    k, v = k.view(bsz * heads, -1, hd), v.view(bsz * heads, -1, hd)
                    if prev_mask is not None:
                        prev_mask = _take(prev_mask, order)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=prev_mask,
                batch_size=bsz, src_len=k.size(1), static_kv=static_kv)
            saved_state["prev_key"] = k.view(bsz, heads, -1, hd)
            saved_state["prev_value"] = v.view(bsz, heads, -1, hd)
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        src_len = k.size(1)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None

        scores = torch.bmm(q, k.transpose(1, 2)).view(bsz, heads, tgt_len, src_len)
        factors = dict(query=q.view(bsz, heads, tgt_len, hd), key=k.view(bsz, heads, src_len, hd),
                       keys_are_rows=self.self_attention, capture=self.capture,
                       keep_state=incremental_state is not None, order=order)
        if attn_mask is None and key_padding_mask is None:
            # nothing masked (beam-search steps, unpadded batches): no masks to build or apply
            counts = scores.new_full((bsz, tgt_len), src_len)
            omega, new_state, info = self.capsule(scores.transpose(1, 2), counts, cap_state, **factors)
            logits = scores + omega.transpose(1, 2)
            key_visible = None
        else:
            logits, key_visible, new_state, info = self._route_masked(scores, attn_mask, key_padding_mask,
                                                                     cap_state, factors)
        if incremental_state is not None and self.capsule.causal:
            self.set_incremental_state(incremental_state, "capsule_state", new_state)
        if self.capture:
            visible = torch.ones(bsz, tgt_len, src_len, dtype=torch.bool, device=scores.device)
            visible = visible if key_visible is None else visible & key_visible
            self.last_capture = dict(info, logits_before=scores.detach(), logits_after=logits.detach(),
                                     visible=visible)
        logits = logits.view(bsz * heads, tgt_len, src_len)
        if before_softmax:
            return logits, v
        probs_float = utils.softmax(logits, dim=-1, onnx_trace=self.onnx_trace)
        probs = self.dropout_module(probs_float.type_as(logits))
        attn = torch.bmm(probs, v).transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        attn = self.out_proj(attn)
        weights = None
        if need_weights:
            weights = probs_float.view(bsz, heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return attn, weights

    def _route_masked(self, scores, attn_mask, key_padding_mask, cap_state, factors):
        """Routing with fairseq's masks: masked logits are neutralised (0) before routing and
        re-masked (-inf, as fairseq does) after ``Ω`` is added.  Masks stay broadcast shapes
        (``(1, T, S)`` future mask, ``(B, 1, S)`` key padding) where they can.  Returns
        ``(logits, key_visible, state, info)``, ``key_visible`` broadcastable to ``(B, T, S)``."""
        bsz, heads, tgt_len, src_len = scores.shape
        key_visible = None  # what fairseq's masks let a query see
        if attn_mask is not None:
            key_visible = torch.isfinite(attn_mask).unsqueeze(0)
            scores = scores + torch.nan_to_num(attn_mask, neginf=0.0).to(scores.dtype)
        routed = key_visible  # the logits that enter routing
        if key_padding_mask is not None:
            key_pad = key_padding_mask.to(torch.bool)
            keys = ~key_pad.unsqueeze(1)
            key_visible = keys if key_visible is None else key_visible & keys
            routed = key_visible
            if self.self_attention:  # query rows are the last tgt_len keys: pad rows are no capsules
                routed = key_visible & ~key_pad[:, -tgt_len:].unsqueeze(2)
        counts = routed.sum(-1).expand(bsz, tgt_len)
        if key_padding_mask is not None:  # keys no row sees are 0 (key_gram_u)
            factors = dict(factors, key=factors["key"].masked_fill(key_pad.view(bsz, 1, src_len, 1), 0.0))
        neutral = scores.transpose(1, 2).masked_fill(~routed.unsqueeze(2), 0.0)
        omega, new_state, info = self.capsule(neutral, counts, cap_state, **factors)
        logits = (scores + omega.transpose(1, 2)).masked_fill_(~key_visible.unsqueeze(1), float("-inf"))
        return logits, key_visible, new_state, info

    def reorder_incremental_state(self, incremental_state, new_order):
        """Beam search's reorder, deferred: the routing state (and, in self-attention, the kept
        keys and values) grows at every step anyway, so the next step applies ``new_order`` while
        copying it (:func:`append_rows`) instead of copying it once more here.  Successive
        reorders before a step compose."""
        cap_state = self.get_incremental_state(incremental_state, "capsule_state")
        if cap_state is None:  # nothing decoded yet, or a module without routing state
            return super().reorder_incremental_state(incremental_state, new_order)
        if not self.self_attention:  # encoder keys: fairseq's reorder (a no-op within beams)
            incremental_state = super().reorder_incremental_state(incremental_state, new_order)
        pending = cap_state.get("reorder")
        cap_state = dict(cap_state, reorder=new_order if pending is None else pending.index_select(0, new_order))
        self.set_incremental_state(incremental_state, "capsule_state", cap_state)
        return incremental_state


@contextlib.contextmanager
def capturing(modules: Iterable[CapsuleMultiheadAttention]):
    """Within the block, each module keeps its last call's routing in ``last_capture``;
    afterwards capturing is off again and the captures are dropped."""
    modules = list(modules)
    for m in modules:
        m.capture = True
    try:
        yield
    finally:
        for m in modules:
            m.capture, m.last_capture = False, {}


def check_routing_iters(iters) -> None:
    """``--routing-iters`` must be a positive integer (paper Alg. 1 runs ``r ≥ 1`` iterations)."""
    if not isinstance(iters, int) or isinstance(iters, bool) or iters <= 0:
        raise ValueError(f"--routing-iters must be a positive integer (got {iters!r}); "
                         "dynamic routing needs at least one iteration")
