"""Capsule routing over attention logits (Duan, Cao & Zhao 2020, "Capsule-Transformer for Neural Machine
Translation", arXiv 2004.14649).

Where the paper's ideas live
----------------------------
* **Capsules from the logit cube** (paper §3, Fig. 2).  For one attention module the scaled dot-product
  logits form the cube ``E ∈ R^{H×Lq×Lk}``.  A *vertical* capsule ``C↕_h`` is the whole ``Lq×Lk`` slice of
  head ``h``; a *horizontal* capsule ``C↔_l`` is the ``H×Lk`` slice of query token ``l``.
* **Votes are the logits themselves** (paper §3, "vote vector generation"): no learned transformation,
  ``V_{m→n} = C_m`` — capsule sizes vary with the sentence length, so no weight matrix can act on them.
* **Dynamic routing** (paper Alg. 1, after Sabour et al. 2017) with ``r`` iterations: couplings ``R =
  softmax(B)``, outputs ``Ω_n = squash(Σ_m R_{m→n} V_{m→n})`` (paper Eq. 6), agreements ``B_{m→n} +=
  <V_{m→n}, Ω_n>``. Implemented once, in :func:`dynamic_routing`.
* **Two implementations** (``--capsule-implementation``): this module is the reference, on explicit
  capsules; ``capsule_routing_fast`` (the default) computes the same from Gram matrices (tested equal).
* **Ω is added to E before the softmax** (paper §3, Fig. 3): ``softmax(E + Ω↕ + Ω↔ + mask)``; see
  :class:`CapsuleMultiheadAttention`.

Reconstruction decisions (the paper's equations are not available)
------------------------------------------------------------------
1. *Non-degenerate routing.*  With identical votes and zero initial logits every output capsule is the same
   average and agreements never break the tie.  The initial routing logits ``B⁰`` are therefore **learned**:
   ``H×H`` for vertical routing (initialised to ``log H`` on the diagonal, so a head starts routed mostly to
   itself) and a relative-position table of ``2D+1`` scalars for horizontal routing (``D =
   --horizontal-max-distance``, initialised to ``-|n-m|/2``: a locality prior).  These are the only extra
   parameters: ``H² + 2D + 1`` per routed module with ``--capsule-routing both``.
2. *Squash scale.*  ``--capsule-squash l2`` (default) is the paper's squash (Sabour's, on the L2 norm of the
   whole capsule): ``||Ω_n|| < 1`` for a capsule of ``Lq·Lk`` entries, a correction of ``E`` that shrinks
   as sentences get longer.  ``--capsule-squash rms`` measures norms and agreements per entry (``||s||² /
   size``), so ``rms(Ω_n) = q/(1+q)`` whatever the length (trained worse on Multi30k: BENCHMARKS.md).
3. *Vertical couplings* are normalised over output capsules (heads), exactly as Sabour / the paper.
4. *Horizontal couplings* are normalised over the **input** capsules (tokens) visible to each output token.
   Normalising over outputs (Sabour) would make the coupling of token ``m`` to output ``t`` depend on
   outputs ``> t``: a causality leak in the decoder.  One rule is used everywhere so encoder and decoder
   behave alike.
5. *Causality* (decoder modules, ``causal=True``).  The vertical capsule seen by query ``t`` is its head's
   **prefix** over queries ``≤ t`` (each query routes its own prefix, so the full forward equals step-by-step
   decoding); horizontal output ``t`` only receives input tokens ``≤ t``.
6. *Padding.*  Masked logits (pad keys, future keys) and pad query rows are set to 0 before routing (never
   ``-inf``), pad rows are excluded as capsules, and the masks are re-applied after adding ``Ω``.
7. *Optional Ω gate* (``--capsule-omega-gate``, off by default; **not in the paper**).  A learned per-head
   scale on ``Ω``, initialised to 0: the model starts as the plain transformer and learns how much routing
   to add (``H`` more parameters per routed module).
8. *Incremental decoding* (reference).  A causal module keeps the neutralised logit rows of the earlier
   queries (0 at keys they did not see) and their visible-key counts; a decoding step appends its row and
   routes as the full pass routes that row, so full pass = decoding.  Beam search reorders the kept rows.
   (The fast implementation's decoding state is described in :mod:`user_dir.modules.capsule_routing_fast`.)
9. *Half precision.*  Capsule norms sum squared logits over whole capsules and pass float16's 65504 at
   sentence length; ``squash`` needs a tiny epsilon.  Routing runs in float32 with autocast off, and only
   ``Ω`` is cast back to the logits' dtype (as fairseq computes its softmax in float32).

Shapes: ``B`` batch, ``H`` heads, ``Q`` query rows, ``K`` keys.
"""
import contextlib
import math
from typing import Dict, Iterable, Optional

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
    """Factor ``f`` with ``squash(s) = f·s`` (paper Eq. 6): ``f = √q / (1+q)`` for ``q = ||s||²``
    (divided by the capsule size in rms mode), ``q`` floored at a tiny ``ε`` (an empty capsule would
    give ``√q`` an infinite gradient; below ``ε`` the output ``f·s`` is below ``ε`` whatever ``f`` is)."""
    q = sq_norm.clamp_min(_EPS)
    return q.sqrt() / (q + 1.0)


def dynamic_routing(capsules: Tensor, init_logits: Tensor, iters: int, size: Optional[Tensor], out_dim: int,
                    visible: Optional[Tensor] = None):
    """Dynamic routing (paper Alg. 1) with identity votes ``V_{m→n} = C_m``.

    Args:
        capsules: ``(G, M, S)``: ``G`` groups of ``M`` input capsules of ``S`` entries.
        init_logits: ``(G, M, N)`` or ``(M, N)`` learned initial routing logits ``B⁰`` (decision 1).
        iters: routing iterations ``r ≥ 1``.
        size: what squared norms and agreements are divided by, broadcastable to ``(G, N)``
            (rms squash); ``None`` for the paper's L2 squash.
        out_dim: the dimension couplings are normalised over: ``-1`` output capsules (Sabour,
            decision 3) or ``-2`` input capsules (decision 4).
        visible: optional bool ``(G, M, N)``: input ``m`` may vote for output ``n``.
    Returns ``(outputs (G, N, S), couplings (G, M, N))``.
    """
    logits = init_logits
    for it in range(iters):
        if visible is not None:
            logits = logits.masked_fill(~visible, -1e4)
        couplings = torch.softmax(logits, dim=out_dim)  # R = softmax(B)
        if visible is not None:
            couplings = couplings * visible
        s = couplings.transpose(-1, -2) @ capsules  # s_n = Σ_m R_{m→n} V_{m→n}
        sq_norm = s.square().sum(-1)  # ||s_n||², (G, N)
        if size is not None:
            sq_norm = sq_norm / size
        outputs = squash_gain(sq_norm).unsqueeze(-1) * s  # Ω_n = squash(s_n)
        if it + 1 < iters:
            agreement = capsules @ outputs.transpose(-1, -2)  # <V_{m→n}, Ω_n>, (G, M, N)
            logits = logits + (agreement if size is None else agreement / size.unsqueeze(-2))
    return outputs, couplings


class CapsuleRouting(nn.Module):
    """Vertical and/or horizontal capsule routing of one attention module, on explicit capsules.

    The learned initial routing logits (and the optional Ω gate) are the only parameters."""

    def __init__(self, num_heads: int, routing: str = "both", iters: int = 3, causal: bool = False,
                 squash: str = "l2", max_distance: int = 8, omega_gate: bool = False):
        super().__init__()
        if routing not in ROUTING_KINDS or squash not in SQUASH_MODES or not iters >= 1 or max_distance < 0:
            raise ValueError(f"CapsuleRouting: routing must be one of {ROUTING_KINDS} (got {routing!r}), squash one of "
                             f"{SQUASH_MODES} ({squash!r}), iters >= 1 ({iters!r}), max_distance >= 0 ({max_distance!r})")
        self.num_heads, self.routing, self.iters = num_heads, routing, iters
        self.causal, self.squash, self.max_distance = causal, squash, max_distance
        self.vertical = routing in ("vertical", "both")
        self.horizontal = routing in ("horizontal", "both")
        if self.vertical:  # decision 1: B⁰ = log H on the diagonal
            self.vertical_logits = nn.Parameter(torch.eye(num_heads) * math.log(max(num_heads, 2)))
        if self.horizontal:  # decision 1: B⁰ = -|n - m| / 2 for relative distances up to ±D
            offsets = torch.arange(-max_distance, max_distance + 1, dtype=torch.float)
            self.horizontal_logits = nn.Parameter(-0.5 * offsets.abs())
        self.omega_gate = nn.Parameter(torch.zeros(num_heads)) if omega_gate else None  # decision 7

    def extra_repr(self):
        return (f"routing={self.routing}, iters={self.iters}, causal={self.causal}, squash={self.squash}, "
                f"max_distance={self.max_distance}, omega_gate={self.omega_gate is not None}")

    def _size(self, n: Tensor) -> Optional[Tensor]:
        """Capsule size (``n`` visible logits) that norms are divided by: rms squash only (decision 2)."""
        return n.clamp_min(1.0) if self.squash == "rms" else None

    def forward(self, logits: Tensor, counts: Tensor, state: Optional[Dict[str, Tensor]] = None,
                capture: bool = False, keep_state: bool = False):
        """Routes the neutralised logit cube ``logits`` ``(B, Q, H, K)`` (0 at masked entries and pad rows,
        decision 6); ``counts`` ``(B, Q)``: visible logits per row (0: a pad row, no capsule); ``state``: the
        rows of earlier queries while decoding (causal modules); ``keep_state``: return the next step's state.
        Returns ``(omega, new_state, info)``: ``Ω`` in ``logits``' layout and dtype; ``info``: couplings and
        ``Ω`` of each routing when ``capture``.  Runs in float32, autocast off (decision 9)."""
        dtype, q_len = logits.dtype, logits.size(1)
        info: Dict[str, Tensor] = {}
        with torch.autocast(logits.device.type, enabled=False):
            rows, row_counts = logits.float(), counts.float()
            if state:  # decision 8: earlier rows (0 at keys they did not see), then this step's
                kept = state["rows"]
                rows = torch.cat([F.pad(kept, (0, rows.size(-1) - kept.size(-1))), rows], dim=1)
                row_counts = torch.cat([state["counts"], row_counts], dim=1)
            new_state = dict(rows=rows, counts=row_counts) if keep_state and self.causal else {}
            omega = 0.0
            for kind, route in (("vertical", self._vertical), ("horizontal", self._horizontal)):
                if getattr(self, kind):
                    o, couplings = route(rows, row_counts, q_len)
                    omega = omega + o
                    if capture:
                        info[f"{kind}_couplings"], info[f"omega_{kind}"] = couplings, o
            if self.omega_gate is not None:  # decision 7: a learned scale per head
                omega = omega * self.omega_gate.float().view(1, 1, -1, 1)
        return omega.to(dtype), new_state, info

    def _vertical(self, rows: Tensor, counts: Tensor, q_len: int):
        """One capsule per head, ``C↕_h = E[:, h, :]`` (``Q·K`` entries); couplings over output heads.
        Causal (decision 5): query ``t`` routes the prefix capsules of rows ``≤ t``.  ``Ω↕`` of the last
        ``q_len`` rows ``(B, q_len, H, K)`` and the couplings ``(B, 1 or q_len, H, H)``."""
        bsz, total, heads, k_len = rows.shape
        init = self.vertical_logits.float()
        if not self.causal:
            capsules = rows.transpose(1, 2).reshape(bsz, heads, total * k_len)
            out, couplings = dynamic_routing(capsules, init, self.iters, self._size(counts.sum(1, keepdim=True)), -1)
            return out.view(bsz, heads, total, k_len).transpose(1, 2), couplings.unsqueeze(1)
        omega, couplings = [], []
        for t in range(total - q_len, total):
            prefix = rows[:, :t + 1].transpose(1, 2).reshape(bsz, heads, (t + 1) * k_len)
            size = self._size(counts[:, :t + 1].sum(1, keepdim=True))
            out, c = dynamic_routing(prefix, init, self.iters, size, -1)
            omega.append(out.view(bsz, heads, t + 1, k_len)[:, :, t])  # query t's own row of Ω↕
            couplings.append(c)
        return torch.stack(omega, 1), torch.stack(couplings, 1)

    def _horizontal(self, rows: Tensor, counts: Tensor, q_len: int):
        """One capsule per query token, ``C↔_m = E[m]`` (``H·K`` entries), for the last ``q_len`` rows as
        outputs; couplings over the visible input tokens (decision 4): not pad rows, and ``m ≤ n`` when
        causal.  ``Ω↔`` ``(B, q_len, H, K)`` and the couplings ``(B, M, q_len)``."""
        bsz, total, heads, k_len = rows.shape
        capsules = rows.reshape(bsz, total, heads * k_len)
        offsets = (torch.arange(total - q_len, total, device=rows.device).unsqueeze(0)
                   - torch.arange(total, device=rows.device).unsqueeze(1))  # [m, n]: n - m
        init = self.horizontal_logits.float()[offsets.clamp(-self.max_distance, self.max_distance) + self.max_distance]
        visible = (counts > 0).unsqueeze(-1)  # pad rows are no capsules (decision 6)
        if self.causal:
            visible = visible & (offsets >= 0)
        size = self._size(counts[:, total - q_len:] * heads)
        out, couplings = dynamic_routing(capsules, init, self.iters, size, -2, visible=visible)
        return out.view(bsz, q_len, heads, k_len), couplings


class CapsuleMultiheadAttention(MultiheadAttention):
    """fairseq's :class:`MultiheadAttention` whose score path is capsule-routed (paper Fig. 3):
    ``softmax(E + Ω↕ + Ω↔ + masks)``, ``Ω`` from ``routing`` on the neutralised ``E``.  Projections,
    key/value caching, dropout and the output projection are fairseq's; the routing state of earlier target
    positions (causal modules) is kept in ``incremental_state["capsule_state"]``.  ``capture = True``
    (:func:`capturing`) keeps the last call's logits, ``Ω`` and couplings in ``last_capture``."""

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

    # hooks of the fast implementation (capsule_routing_fast): the routing's inputs besides the logits (none
    # here), and a beam reorder still to apply to the state (the reference applies it at once)
    def _routing_factors(self, q, k, key_padding_mask, order) -> dict:
        return {}

    def _pending_reorder(self, cap_state):
        return cap_state, None

    @staticmethod
    def _append(kept, new, order, dim):
        return torch.cat([kept if order is None else kept.index_select(0, order), new], dim)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        saved_state, cap_state, order = None, None, None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if "prev_key" in saved_state and static_kv:
                key = value = None
            if self.capsule.causal:
                cap_state = self.get_incremental_state(incremental_state, "capsule_state")
                if cap_state is not None:
                    cap_state, order = self._pending_reorder(cap_state)
        if self.self_attention:
            key = value = query
        q = self.q_proj(query) * self.scaling
        k, v = (None, None) if key is None else (self.k_proj(key), self.v_proj(value))
        heads, hd = self.num_heads, self.head_dim
        q = q.contiguous().view(tgt_len, bsz * heads, hd).transpose(0, 1)
        if k is not None:
            k = k.contiguous().view(-1, bsz * heads, hd).transpose(0, 1)
            v = v.contiguous().view(-1, bsz * heads, hd).transpose(0, 1)
        if saved_state is not None:
            prev_mask = saved_state.get("prev_key_padding_mask")
            if "prev_key" in saved_state:
                if static_kv:  # encoder keys
                    k = saved_state["prev_key"].view(bsz * heads, -1, hd)
                    v = saved_state["prev_value"].view(bsz * heads, -1, hd)
                else:  # keys grow by this step (in a pending beam order)
                    k = self._append(saved_state["prev_key"], k.view(bsz, heads, -1, hd), order, 2)
                    v = self._append(saved_state["prev_value"], v.view(bsz, heads, -1, hd), order, 2)
                    k, v = k.view(bsz * heads, -1, hd), v.view(bsz * heads, -1, hd)
                    if prev_mask is not None and order is not None:
                        prev_mask = prev_mask.index_select(0, order)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask, prev_key_padding_mask=prev_mask,
                batch_size=bsz, src_len=k.size(1), static_kv=static_kv)
            saved_state["prev_key"], saved_state["prev_value"] = k.view(bsz, heads, -1, hd), v.view(bsz, heads, -1, hd)
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        src_len = k.size(1)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None

        scores = torch.bmm(q, k.transpose(1, 2)).view(bsz, heads, tgt_len, src_len)
        logits, new_state = self._route(scores, attn_mask, key_padding_mask, cap_state,
                                        self._routing_factors(q, k, key_padding_mask, order), incremental_state)
        if incremental_state is not None and self.capsule.causal:
            self.set_incremental_state(incremental_state, "capsule_state", new_state)
        logits = logits.view(bsz * heads, tgt_len, src_len)
        if before_softmax:
            return logits, v
        probs_float = utils.softmax(logits, dim=-1, onnx_trace=self.onnx_trace)
        probs = self.dropout_module(probs_float.type_as(logits))
        attn = torch.bmm(probs, v).transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        weights = probs_float.view(bsz, heads, tgt_len, src_len).transpose(1, 0) if need_weights else None
        return self.out_proj(attn), weights if need_head_weights or weights is None else weights.mean(dim=0)

    def _route(self, scores, attn_mask, key_padding_mask, cap_state, factors, incremental_state):
        """``(logits, state)``: masked logits are neutralised (0) before routing and re-masked (-inf) after
        ``Ω`` is added (decision 6)."""
        bsz, heads, tgt_len, src_len = scores.shape
        key_visible = routed = None  # what a query sees; the logits that enter routing
        if attn_mask is not None:
            key_visible = routed = torch.isfinite(attn_mask).unsqueeze(0)
            scores = scores + torch.nan_to_num(attn_mask, neginf=0.0).to(scores.dtype)
        if key_padding_mask is not None:
            key_pad = key_padding_mask.to(torch.bool)
            keys = ~key_pad.unsqueeze(1)
            key_visible = routed = keys if key_visible is None else key_visible & keys
            if self.self_attention:  # query rows are the last tgt_len keys: pad rows are no capsules
                routed = key_visible & ~key_pad[:, -tgt_len:].unsqueeze(2)
        neutral = scores.transpose(1, 2)  # (B, T, H, S)
        if routed is None:
            counts = scores.new_full((bsz, tgt_len), src_len)
        else:
            counts = routed.sum(-1).expand(bsz, tgt_len)
            neutral = neutral.masked_fill(~routed.unsqueeze(2), 0.0)
        omega, new_state, info = self.capsule(neutral, counts, cap_state, capture=self.capture,
                                              keep_state=incremental_state is not None, **factors)
        logits = scores + omega.transpose(1, 2)
        if key_visible is not None:
            logits = logits.masked_fill_(~key_visible.unsqueeze(1), float("-inf"))
        if self.capture:
            visible = torch.ones(bsz, tgt_len, src_len, dtype=torch.bool, device=scores.device)
            self.last_capture = dict(info, logits_before=scores.detach(), logits_after=logits.detach(),
                                     visible=visible if key_visible is None else visible & key_visible)
        return logits, new_state

    def reorder_incremental_state(self, incremental_state, new_order):
        """Beam search's reorder of the kept keys and values (fairseq's) and of the routing state."""
        incremental_state = super().reorder_incremental_state(incremental_state, new_order)
        cap_state = self.get_incremental_state(incremental_state, "capsule_state")
        if cap_state is not None:
            cap_state = {name: kept.index_select(0, new_order) for name, kept in cap_state.items()}
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

