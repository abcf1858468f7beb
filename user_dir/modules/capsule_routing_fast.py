"""The fast implementation of capsule routing (``--capsule-implementation fast``, the default).

It computes what :mod:`user_dir.modules.capsule_routing` (the reference: the paper's routing on
explicit capsules) computes, equal within float rounding (``tests/test_capsule_transformer.py``
checks both on the same inputs), without forming the capsules:

* *Gram form.*  Votes are the capsules themselves, so dynamic routing only needs inner products
  of capsules: ``<C_m, s_n> = (G c)_{mn}``, ``||s_n||² = Σ_m c_mn (G c)_mn`` (:func:`gram_routing`).
  Vertical routing: per-query ``H×H`` Gram matrices, their running sum over queries being the
  causal prefix (and the decoding state).
* *Horizontal routing from the query/key factors.*  A horizontal capsule is ``C_m = (q_m^h·k_k^h)``
  over the heads ``h`` and the keys ``k`` row ``m`` sees.  When those key sets are nested (key
  padding: all rows see the same keys; causal self-attention: row ``m`` sees keys ``≤ m``) the Gram
  matrix is ``G_mn = u_min(m,n)·q_max(m,n)`` with ``u_m = Σ_k E_mk k_k`` (heads concatenated,
  ``D = H·d``; ``q_m K_hᵀK_h`` per head when all rows see the same keys and ``M·K > (M + K)·d``):
  ``O(M²·D)`` instead of ``O(H·M²·K)`` (:func:`factored_gram`, :func:`key_gram_u`).
  ``Ω = Σ_m w_mn C_m`` is ``(Wᵀ Q_h) K_hᵀ`` when all rows see the same keys, ``Wᵀ E_h`` in a causal
  self-attention pass (both triangular, :func:`matmul_lower`), and ``k_k · Σ_{m≥k} w_mn q_m`` (a
  suffix sum, :func:`suffix_weighted_sums`) while decoding.
* *Triangular products.*  Causal couplings, logits and the factored Gram are triangular; the
  products skip their zero blocks recursively (:func:`matmul_upper` and its siblings).
* *Decoding state.*  Decoding keeps the Gram (grown by one column per token, :func:`grow_gram`) and
  ``q_m`` of the earlier rows, plus, in decoder self-attention, their logit rows while the target is
  at most ``keep_rows_per_head_width·d`` tokens (``H·M² ≤ 2·M·D``: the cheaper state there) and
  ``u_m`` beyond, with each row's logits inside its block of ``block`` rows: a step's suffix sum is
  then block totals of ``w_m q_m`` (``O(M·D)``) plus the kept in-block logits weighted
  (``O(M·H·block)``, :func:`decode_suffix_omega`).  Per token: ``O(M² + M·D)``.
* *Deferred beam reorder.*  :class:`FastCapsuleMultiheadAttention` records beam search's reorder and
  applies it at the next step while growing the state (:func:`append_rows`: one copy, not two).

Every size threshold is a field of :class:`FastThresholds`, passed to :class:`FastCapsuleRouting`.
"""
import functools
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from user_dir.modules.capsule_routing import CapsuleMultiheadAttention, CapsuleRouting, squash_gain


@dataclass(frozen=True)
class FastThresholds:
    """The sizes at which the fast implementation changes how it computes (never what)."""

    keep_rows_per_head_width: int = 2  # decoder self-attention keeps its logit rows while M <= this · d
    block: int = 16  # rows per block of decoding's suffix sums and kept in-block logits
    dense_suffix_blocks: int = 3  # suffix sums over at most this many blocks: one triangular product
    triangular_min_block: int = 64  # triangular products recurse down to blocks of this size


def gram_routing(gram: Tensor, init_logits: Tensor, iters: int, size: Optional[Tensor], out_dim: int,
                 visible: Optional[Tensor] = None, min_block: int = 64):
    """:func:`user_dir.modules.capsule_routing.dynamic_routing` in Gram-matrix form.

    ``gram`` ``(G, M, M)``; ``init_logits`` ``(G, M, N)`` or ``(M, N)``; ``size`` broadcastable to
    ``(G, N)`` or ``None``; ``visible`` bool ``(G, M, N)`` (causal, ``m - (M - N) <= n``).
    Returns ``(weights, couplings)`` with ``Ω_n = Σ_m weights_mn C_m``.
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
        if visible is not None:  # causal: c_mn = 0 for m > n
            agree = matmul_upper(gram, couplings, min_block)
        else:
            agree = torch.bmm(gram, couplings)  # <C_m, s_n>
        sq_norm = (couplings * agree).sum(-2, keepdim=True)  # (G, 1, N)
        gain = squash_gain(sq_norm if inv_size is None else sq_norm * inv_size)
        if it + 1 < iters:
            logits = torch.addcmul(logits, agree, gain if inv_size is None else gain * inv_size)
    return couplings * gain, couplings


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


def _halves(size: int, min_block: int, *square: bool):
    """The split point of a recursive triangular product, or ``None`` (a dense product) when too small."""
    return size // 2 if size >= 2 * min_block and all(square) else None


def matmul_upper(g: Tensor, c: Tensor, min_block: int = 64) -> Tensor:
    """``g @ c`` for square ``c`` with ``c[m, n] = 0`` for ``m > n`` (causal couplings): about half the work."""
    size = c.size(-1)
    h = _halves(size, min_block, c.size(-2) == size)
    if h is None:
        return torch.matmul(g, c)
    left = matmul_upper(g[..., :h], c[..., :h, :h], min_block)
    return torch.cat([left, torch.matmul(g, c[..., h:])], dim=-1)


def matmul_lower(w: Tensor, e: Tensor, min_block: int = 64) -> Tensor:
    """``w @ e`` for square lower-triangular ``w`` and ``e``: about a third of the work."""
    size = e.size(-1)
    h = _halves(size, min_block, e.size(-2) == size, w.size(-1) == size, w.size(-2) == size)
    if h is None:
        return torch.matmul(w, e)
    top_left = matmul_lower(w[..., :h, :h], e[..., :h, :h], min_block)
    top = torch.cat([top_left, top_left.new_zeros(top_left.shape[:-1] + (size - h,))], dim=-1)
    bottom = torch.cat([torch.matmul(w[..., h:, :], e[..., :h]),
                        matmul_lower(w[..., h:, h:], e[..., h:, h:], min_block)], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def matmul_tril(e: Tensor, x: Tensor, min_block: int = 64) -> Tensor:
    """``e @ x`` for square lower-triangular ``e`` (causal logits) and any ``x``: about half the work."""
    size = e.size(-1)
    h = _halves(size, min_block, e.size(-2) == size)
    if h is None:
        return torch.matmul(e, x)
    top = matmul_tril(e[..., :h, :h], x[..., :h, :], min_block)
    bottom = torch.matmul(e[..., h:, :h], x[..., :h, :]) + matmul_tril(e[..., h:, h:], x[..., h:, :], min_block)
    return torch.cat([top, bottom], dim=-2)


def matmul_triu(a: Tensor, b: Tensor, min_block: int = 64) -> Tensor:
    """The upper triangle (``m <= n``) of the square product ``a @ b`` (0 or the product below it)."""
    size = a.size(-2)
    h = _halves(size, min_block, b.size(-1) == size)
    if h is None:
        return torch.matmul(a, b)
    top = torch.cat([matmul_triu(a[..., :h, :], b[..., :h], min_block), torch.matmul(a[..., :h, :], b[..., h:])],
                    dim=-1)
    corner = matmul_triu(a[..., h:, :], b[..., h:], min_block)
    bottom = torch.cat([corner.new_zeros(corner.shape[:-1] + (h,)), corner], dim=-1)
    return torch.cat([top, bottom], dim=-2)


@functools.lru_cache(maxsize=None)
def _upper_ones(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[k, m] = 1`` where ``m >= k`` (cached; never modified in place)."""
    return torch.ones(size, size, dtype=dtype, device=device).triu()


def suffix_weighted_sums(w: Tensor, rows: Tensor, block: int = 16, dense_blocks: int = 3) -> Tensor:
    """``S[b, n, k] = Σ_{m ≥ k} w[b, n, m] rows[b, m]`` for ``w`` ``(B, Q, M)``, ``rows`` ``(B, M, D)``:
    a triangular product inside blocks of ``block`` rows and a suffix sum of the block totals,
    ``O(Q·M·block·D)`` (one block when ``M <= dense_blocks·block``).  Returns ``(B, Q, M, D)``."""
    bsz, q_len, size = w.shape
    if size <= dense_blocks * block:
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
    with ``[b, m, h, j] = E_h[m, s_m + j]`` (``s_m`` the first row of ``m``'s block) and 0 for keys
    after ``m``; ``logits`` ``(B, Q, H, K)``, key ``k`` being row ``k``."""
    bsz, q_len, heads, k_len = logits.shape
    if q_len == 1:  # a decoding step: row `first` sees keys s .. first of its block, then zeros
        start = first // block * block
        return F.pad(logits[..., start:first + 1], (0, block - (first + 1 - start)))
    rows = torch.arange(first, first + q_len, device=logits.device)
    idx = (rows // block * block).unsqueeze(1) + torch.arange(block, device=logits.device)  # (Q, block)
    picked = F.pad(logits, (0, block)).gather(3, idx.view(1, q_len, 1, block).expand(bsz, q_len, heads, block))
    return picked * (idx <= rows.unsqueeze(1)).to(logits.dtype).view(1, q_len, 1, block)


def decode_suffix_omega(w: Tensor, q_rows: Tensor, key: Tensor, diag: Tensor, block: int = 16) -> Tensor:
    """``Ω_h[k] = Σ_{m ≥ k} w_m E_h[m, k]`` of one decoding step in causal self-attention, ``(B, H, M)``.

    ``w`` ``(B, M)`` the new query's weights, ``q_rows`` ``(B, M, D)``, ``key`` ``(B, H, M, d)``,
    ``diag`` ``(B, M, H, block)`` (:func:`block_diagonal`).  For ``k`` in block ``j``:
    ``k_k^h · Σ_{m in blocks > j} w_m q_m^h`` (block totals, ``O(M·D)``) plus
    ``Σ_{m in block j} w_m E_h[m, k]`` from the in-block logits (``O(M·H·block)``).  The last block
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
    w_blocks = w[:, :start].reshape(bsz, full, 1, block)
    q_blocks = q_rows[:, block:start].reshape(bsz, full - 1, block, heads * hd)
    totals = torch.matmul(w_blocks[:, 1:], q_blocks)[:, :, 0]  # (B, full - 1, D): blocks 1 .. full - 1
    a_tail = torch.bmm(w_tail.unsqueeze(1), q_rows[:, start:])  # (B, 1, D): the last block's total
    later = torch.cat([totals, a_tail], dim=1).flip(1).cumsum(1).flip(1)  # (B, full, D): blocks after each
    later = later.view(bsz, full, heads, 1, hd).transpose(1, 2)  # (B, H, full, 1, d)
    across = (key[:, :, :start].reshape(bsz, heads, full, block, hd) * later).sum(-1)  # (B, H, full, block)
    d_blocks = diag[:, :start].reshape(bsz, full, block, heads * block)
    within = torch.matmul(w_blocks, d_blocks)[:, :, 0].view(bsz, full, heads, block)
    head = (across + within.transpose(1, 2)).reshape(bsz, heads, start)
    return torch.cat([head, tail], dim=-1)


def symmetric_from_upper(x: Tensor) -> Tensor:
    """The symmetric matrices (last two dimensions) whose upper triangles, diagonal included, are ``x``'s."""
    return x.triu() + x.triu(1).transpose(-1, -2)


def key_gram_u(query: Tensor, key: Tensor) -> Tensor:
    """``u_m = Σ_k E_mk k_k`` per head when every row sees the same keys: ``q_m (K_hᵀ K_h)``, ``(B, H, M, d)``.
    ``key`` has the keys no row sees set to 0.  ``O((M + K)·D·d)`` instead of ``O(M·K·D)``."""
    return torch.matmul(query, torch.matmul(key.transpose(2, 3), key))


def factored_gram(u: Tensor, q: Tensor, min_block: int = 64) -> Tensor:
    """Gram matrix ``G_mn = u_min(m,n) · q_max(m,n)`` of horizontal capsules from ``(B, M, D)`` factors."""
    return symmetric_from_upper(matmul_triu(u, q.transpose(1, 2), min_block))


def _take(kept: Tensor, order: Optional[Tensor]) -> Tensor:
    return kept if order is None else kept.index_select(0, order)


def _take_into(out: Tensor, kept: Tensor, order: Optional[Tensor]) -> None:
    """``out.copy_(_take(kept, order))`` as one copy (``index_select(out=)``, which autograd does not support)."""
    if order is not None and not (torch.is_grad_enabled() and (kept.requires_grad or out.requires_grad)):
        torch.index_select(kept, 0, order, out=out)
    else:
        out.copy_(_take(kept, order))


def _offset_index(past: int, total: int, max_distance: int, device: torch.device) -> Tensor:
    """``[m, n - past]``: the relative-position table's index of offset ``n - m`` (clamped), and the offsets."""
    offsets = torch.arange(past, total, device=device).unsqueeze(0) - torch.arange(total, device=device).unsqueeze(1)
    return offsets.clamp(-max_distance, max_distance) + max_distance, offsets


@functools.lru_cache(maxsize=1024)
def _decoding_offset_index(total: int, max_distance: int, device: torch.device) -> Tensor:
    """:func:`_offset_index` of one decoding step, cached per target length (never modified in place)."""
    return _offset_index(total - 1, total, max_distance, device)[0]


def append_rows(kept: Tensor, new: Tensor, order: Optional[Tensor] = None, dim: int = 1) -> Tensor:
    """``torch.cat([_take(kept, order), new], dim)`` with one copy of ``kept``: beam search's reorder is
    applied while the state grows by a step (``order`` ``None``: no reorder)."""
    past = kept.size(dim)
    shape = list(new.shape)
    shape[dim] = past + new.size(dim)
    out = new.new_empty(shape)
    out.narrow(dim, past, new.size(dim)).copy_(new)
    _take_into(out.narrow(dim, 0, past), kept, order)
    return out


def grow_rows(kept: Tensor, new: Tensor, order: Optional[Tensor] = None) -> Tensor:
    """Causal self-attention logit rows ``(B, P, H, P)`` (row ``m`` 0 beyond key ``m``) grown by the new
    rows ``(B, Q, H, P + Q)``, the kept rows taken in beam ``order`` (:func:`append_rows`)."""
    bsz, q_len, heads, total = new.shape
    past = kept.size(1)
    out = new.new_empty(bsz, total, heads, total)
    _take_into(out[:, :past, :, :past], kept, order)
    out[:, :past, :, past:] = 0.0  # earlier rows do not see the new keys
    out[:, past:] = new
    return out


def grow_gram(gram: Tensor, cols: Tensor, order: Optional[Tensor] = None) -> Tensor:
    """The ``(B, M, M)`` Gram of ``M = P + Q`` rows from the kept ``(B, P, P)`` one (in beam ``order``) and
    the new rows' columns ``cols`` ``(B, M, Q)`` (right for ``m <= n``)."""
    past, total = gram.size(1), cols.size(1)
    block = cols[:, past:]
    grown = cols.new_empty(cols.size(0), total, total)
    _take_into(grown[:, :past, :past], gram, order)
    grown[:, :past, past:] = cols[:, :past]
    grown[:, past:, :past] = cols[:, :past].transpose(1, 2)
    grown[:, past:, past:] = block if block.size(1) == 1 else symmetric_from_upper(block)
    return grown


class FastCapsuleRouting(CapsuleRouting):
    """:class:`CapsuleRouting` (same parameters, same outputs) computed from Gram matrices and the
    query/key factors (module docstring).  ``thresholds``: :class:`FastThresholds`."""

    def __init__(self, *args, thresholds: FastThresholds = FastThresholds(), **kwargs):
        super().__init__(*args, **kwargs)
        self.thresholds = thresholds

    def forward(self, logits: Tensor, counts: Tensor, state: Optional[Dict[str, Tensor]] = None,
                capture: bool = False, keep_state: bool = False, query: Optional[Tensor] = None,
                key: Optional[Tensor] = None, keys_are_rows: bool = False, order: Optional[Tensor] = None):
        """:meth:`CapsuleRouting.forward`, plus ``query``, ``key`` ``(B, H, Q, d)``, ``(B, H, K, d)`` with
        ``logits = query · keyᵀ`` on the visible entries (without them, a bare cube: the rows of ``logits`` are
        the factors and no ``state`` may be given), ``keys_are_rows`` (self-attention: key ``k`` is row ``k``)
        and ``order``, beam search's pending reorder of ``state``, applied while the state grows."""
        state = state or {}
        new_state: Dict[str, Tensor] = {}
        info: Dict[str, Tensor] = {}
        omega = None
        dtype = logits.dtype
        with torch.autocast(logits.device.type, enabled=False):
            logits = logits.float()
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
            if self.omega_gate is not None:
                omega = omega * self.omega_gate.float().view(1, 1, -1, 1)
        return omega.to(dtype), new_state, info

    def _vertical(self, logits, counts, state, new_state, order=None):
        """One capsule per head (M = N = H); per-query prefix Grams (a running sum) when causal."""
        bsz, q_len, heads, k_len = logits.shape
        n = counts.to(logits.dtype)
        min_block = self.thresholds.triangular_min_block
        if not self.causal:  # one routing per sentence on the (B, H, Q·K) capsules
            caps = logits.transpose(1, 2).reshape(bsz, heads, q_len * k_len)
            weights, couplings = gram_routing(self_gram(caps), self.vertical_logits.float(), self.iters,
                                              self._size(n.sum(1, keepdim=True)), out_dim=-1, min_block=min_block)
            omega = torch.bmm(weights.transpose(1, 2).contiguous(), caps)  # Ω↕_n = Σ_m w_mn C_m
            return omega.view(bsz, heads, q_len, k_len).transpose(1, 2), couplings.unsqueeze(1)
        rows = logits.reshape(bsz * q_len, heads, k_len)
        row_gram = self_gram(rows).view(bsz, q_len, heads, heads)
        gram = row_gram.cumsum(1) if q_len > 1 else row_gram  # prefix sums over queries
        if "vertical_gram" in state:
            gram = gram + _take(state["vertical_gram"], order).unsqueeze(1)
        new_state["vertical_gram"] = gram[:, -1]
        size = None
        if self.squash == "rms":  # the prefix capsules' entries
            n = n.cumsum(1) if q_len > 1 else n
            if "vertical_count" in state:
                n = n + _take(state["vertical_count"], order)
            new_state["vertical_count"] = n[:, -1:]
            size = self._size(n).view(bsz * q_len, 1)
        weights, couplings = gram_routing(gram.view(bsz * q_len, heads, heads), self.vertical_logits.float(),
                                          self.iters, size, out_dim=-1, min_block=min_block)
        omega = torch.bmm(weights.transpose(1, 2), rows)  # Ω↕_n = Σ_m w_mn C_m, query by query
        return omega.view(bsz, q_len, heads, k_len), couplings.view(bsz, q_len, heads, heads)

    def _horizontal(self, logits, counts, state, new_state, query, key, keys_are_rows, order=None):
        """One capsule per query token (its logits on all heads, ``H·K`` entries), from the factors."""
        bsz, q_len, heads, k_len = logits.shape
        th = self.thresholds
        row_counts = new_counts = counts.to(logits.dtype)
        if query is None and state:
            raise ValueError("incremental horizontal routing needs the queries and keys of the logits")
        keep = self.causal and query is not None and new_state is not None
        past = state["horizontal_counts"].size(1) if "horizontal_counts" in state else 0
        total = past + q_len
        # decoder self-attention keeps its logit rows while they are the cheaper state (H·M² <= 2·M·D)
        keep_rows = keep and keys_are_rows and total <= th.keep_rows_per_head_width * query.size(-1)
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
                    u = matmul_tril(cube.transpose(1, 2), key, th.triangular_min_block)
                elif q_len * k_len > (q_len + k_len) * key.size(-1):  # same keys for all: Q_h (K_hᵀ K_h)
                    u = key_gram_u(query * valid, key)
                else:
                    u = torch.matmul(cube.transpose(1, 2), key)
                u_rows = u.transpose(1, 2).reshape(bsz, total, -1)
            if self.causal and keys_are_rows and keep:  # in-block logits for decode_suffix_omega
                if "horizontal_diag" in state:
                    diag = append_rows(state["horizontal_diag"], block_diagonal(logits, past, th.block), order)
                else:
                    diag = block_diagonal(cube, 0, th.block)
        if "horizontal_gram" in state:  # decoding: the kept Gram grows by the new rows' columns
            if rows is not None:
                cols = torch.bmm(rows[:, past:], rows.transpose(1, 2)).transpose(1, 2)
            else:
                cols = torch.bmm(u_rows, q_new.transpose(1, 2))
            gram = grow_gram(state["horizontal_gram"], cols, order)
        elif rows is not None:
            gram = torch.bmm(rows, rows.transpose(1, 2))
        else:  # a full pass (or rows added to a state that had dropped the logit rows)
            gram = factored_gram(u_rows, q_rows, th.triangular_min_block)
        if keep:
            new_state.update(horizontal_q=q_rows, horizontal_counts=row_counts, horizontal_gram=gram)
            if keep_rows:
                new_state["horizontal_rows"] = rows.view(bsz, total, heads, k_len)
            else:
                new_state["horizontal_u"] = u_rows
                if diag is not None:
                    new_state["horizontal_diag"] = diag
        visible = None
        if q_len == 1:  # a decoding step
            index = _decoding_offset_index(total, self.max_distance, logits.device)
        else:
            index, offsets = _offset_index(past, total, self.max_distance, logits.device)
            if self.causal:  # output row n sees input rows m <= n: (M, Q), broadcast over the batch
                visible = offsets >= 0
        init = self.horizontal_logits.float()[index]  # (M, Q)
        # pad rows are no capsules: a -1e4 initial logit keeps their couplings at 0 in every iteration
        init = init + ((row_counts == 0).to(logits.dtype) * -1e4).unsqueeze(-1)  # (B, M, Q)
        size = self._size(new_counts * heads)  # (B, Q): entries of output capsule n
        weights, couplings = gram_routing(gram, init, self.iters, size, out_dim=-2, visible=visible,
                                          min_block=th.triangular_min_block)
        wt = weights.transpose(1, 2)  # (B, Q, M): Ω_n = Σ_m w_mn C_m
        if rows is not None:
            omega = torch.bmm(wt, rows)
        elif not (self.causal and keys_are_rows):  # all rows see the same keys: Ω_h = (Wᵀ Q_h) K_hᵀ
            wq = torch.bmm(wt, q_rows).view(bsz, q_len, heads, -1).transpose(1, 2)
            omega = torch.matmul(wq, key.transpose(2, 3)).transpose(1, 2)
        elif not past:  # full causal self-attention pass: Ω_h = Wᵀ E_h (both triangular)
            omega = matmul_lower(wt.unsqueeze(1), logits.transpose(1, 2), th.triangular_min_block).transpose(1, 2)
        elif q_len == 1 and diag is not None:  # one decoding step: block totals + in-block logits
            omega = decode_suffix_omega(wt[:, 0], q_rows, key, diag, th.block).unsqueeze(1)  # (B, 1, H, K)
        else:  # decoding, row m sees keys <= m: Ω_h[n, k] = k_k · Σ_{m >= k} w_mn q_m (a suffix sum)
            sums = suffix_weighted_sums(wt, q_rows, th.block, th.dense_suffix_blocks).view(bsz, q_len, total, heads, -1)
            omega = (sums * key.transpose(1, 2).unsqueeze(1)).sum(-1).transpose(2, 3)  # (B, Q, H, K)
        return omega.reshape(bsz, q_len, heads, k_len), couplings


class FastCapsuleMultiheadAttention(CapsuleMultiheadAttention):
    """:class:`CapsuleMultiheadAttention` for :class:`FastCapsuleRouting`: it passes the routing the query/key
    factors, and defers beam search's reorder of the routing state (and, in self-attention, of the kept keys
    and values) to the next step, which applies it while growing them (:func:`append_rows`).  Successive
    reorders before a step compose."""

    def _routing_factors(self, q, k, key_padding_mask, order):
        """The query/key factors of the logits, the keys no row sees zeroed (:func:`key_gram_u`)."""
        heads, hd = self.num_heads, self.head_dim
        bsz = q.size(0) // heads
        key = k.view(bsz, heads, -1, hd)
        if key_padding_mask is not None:
            key = key.masked_fill(key_padding_mask.to(torch.bool).view(bsz, 1, -1, 1), 0.0)
        return dict(query=q.view(bsz, heads, -1, hd), key=key, keys_are_rows=self.self_attention, order=order)

    @staticmethod
    def _append(kept, new, order, dim):
        return append_rows(kept, new, order, dim)

    def _pending_reorder(self, cap_state):
        cap_state = dict(cap_state)
        return cap_state, cap_state.pop("reorder", None)

    def reorder_incremental_state(self, incremental_state, new_order):
        cap_state = self.get_incremental_state(incremental_state, "capsule_state")
        if cap_state is None:  # nothing decoded yet, or a module without routing state
            return super(CapsuleMultiheadAttention, self).reorder_incremental_state(incremental_state, new_order)
        if not self.self_attention:  # encoder keys: fairseq's reorder (a no-op within beams)
            incremental_state = super(CapsuleMultiheadAttention, self).reorder_incremental_state(
                incremental_state, new_order)
        pending = cap_state.get("reorder")
        cap_state = dict(cap_state, reorder=new_order if pending is None else pending.index_select(0, new_order))
        self.set_incremental_state(incremental_state, "capsule_state", cap_state)
        return incremental_state
