"""The fused ring attention of the Star-Transformer: one autograd Function with a hand-written backward.

What it computes.  The satellite update of one cycle, exactly as the reference
:class:`~user_dir.modules.star_transformer_layer.RingAttention` does with plain autograd ops
(same outputs and gradients, tested to 1e-10 in float64).  For every position i, per head::

    q_i     = W^Q h_i / sqrt(head_dim)
    scores  = q_i . [k(h_{i-1}), k(h_i), k(h_{i+1}), k(e_i), k(s)]    k(x) = W^K x, v(x) = W^V x
    weights = softmax(scores)         (a masked neighbour scores -inf; a closed ring links a
                                       sentence's first and last real token)
    y_i     = W^O sum_slot weights_slot v(slot)

Why it exists: activation memory.  Through autograd one cycle keeps q, k, v, k(e), v(e) and
the weighted sum, six n x d tensors, between forward and backward.  :class:`FusedRingCore`
keeps only its inputs (h, the previous cycle's output, and e, shared by all cycles, which
are kept anyway) and the (B, n, H, 5) softmax weights (5 / head_dim of one n x d tensor);
its hand-written backward recomputes the five projections (five n x d x d products).  A
cycle then keeps about 2 n d values instead of about 8 n d.

Blocks along n (speed on CPU).  Without attention dropout an input longer than
``block_rows`` (default :data:`BLOCK_ROWS`) runs ``block_rows`` positions at a time, forward
and backward, each block with one (forward) or two (backward) halo rows per side taken from
its neighbours (:class:`BlockNeighbours`); the values follow the same formulas, only the
working set changes, so a block's projections, scores and gradients stay in the caches
instead of streaming n x d temporaries through memory.
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

BLOCK_ROWS = 512  # positions per block of the fused core (see the module docstring)

LEFT, SELF, RIGHT, EMB, RELAY = range(5)  # the five context slots of C_i = [h_{i-1}; h_i; h_{i+1}; e_i; s]


class RingNeighbours:
    """Who neighbours whom on each sentence's ring, computed once per forward pass and shared by all cycles.

    ``left_missing``/``right_missing`` (B, n, 1) mark positions whose left/right neighbour is masked
    (None: nothing is masked); with a closed ring (``wrap``) ``first``/``last`` (B,) are each
    sentence's first and last real positions, ``left_partner``/``right_partner`` the rows whose key
    and value they see across the wrap (``last`` and ``first``), ``is_first``/``is_last``
    (B, n, 1, 1) mark them and ``batch`` is ``arange(B)`` for indexing.  Built with tensor ops:
    no value is read back to the host.
    """

    separator = None  # (blocks only) the row with a zero key and value that precedes the partner copies
    owns_first = owns_last = None  # (blocks only) whether the block owns each sentence's first/last token

    def __init__(self, pad_mask: Optional[torch.Tensor], B, n, device, wrap, mask_pads):
        self.wrap, self.mask_pads = wrap, mask_pads
        self.left_missing = self.right_missing = None
        self.first = self.last = None
        if not (wrap or mask_pads):
            return  # fastNLP: open ring, zero keys at the ends, pads unmasked
        pad = pad_mask if pad_mask is not None else torch.zeros(B, n, dtype=torch.bool, device=device)
        edge = torch.ones(B, 1, dtype=torch.bool, device=device)
        left = torch.cat([edge, pad[:, :-1]], 1)  # position i-1 absent or padding
        right = torch.cat([pad[:, 1:], edge], 1)
        if wrap:
            real = ~pad
            position = torch.arange(n, device=device).expand(B, n)
            self.first = torch.where(real, position, n).min(1).values.clamp(max=n - 1)
            self.last = torch.where(real, position, -1).max(1).values.clamp(min=0)
            batch = self.batch = torch.arange(B, device=device)
            left = left.clone()
            right = right.clone()
            left[batch, self.first] = False
            right[batch, self.last] = False
            # the shifted (non-wrapped) neighbour values must not be added at the wrapped slots
            self.is_first = (position == self.first[:, None])[..., None, None]
            self.is_last = (position == self.last[:, None])[..., None, None]
            self.left_partner, self.right_partner = self.last, self.first
        if not mask_pads:
            # wrap without masking: only the two wrapped slots are replaced, pads stay visible
            left = torch.zeros_like(left)
            right = torch.zeros_like(right)
        self.left_missing = left.unsqueeze(-1)
        self.right_missing = right.unsqueeze(-1)

    def take(self, x, rows, partners=None):
        """Rows ``rows`` of x (B, n, ...): the whole input needs no appended rows."""
        return x[:, rows]


class BlockNeighbours(RingNeighbours):
    """The ring of rows ``[start, stop)`` of a long input: the rows ``[own_start, own_stop)`` a block
    computes, plus halo rows.

    The block runs with open ends (a neighbour beyond its first/last row sees a zero key and
    value, as the sequence ends do); the halo rows make the rows it owns see their true
    neighbours.  For a closed ring three rows are appended: a ``separator`` (zero key and value)
    and copies of every sentence's last and first real token (``left_partner``/``right_partner``),
    so a first/last token sees its wrapped neighbour wherever that lies.  A sentence whose first
    (last) token is not in the block points ``first`` (``last``) at the appended copy, whose outputs
    and gradients are discarded; ``owns_first``/``owns_last`` (B, 1, 1) say whether the block owns
    that token, so only its owner sends gradient to the partner copy.
    """

    def __init__(self, ring: RingNeighbours, own_start, own_stop, start, stop):
        self.wrap = ring.wrap
        rows = stop - start
        self.extra_rows = 3 if ring.wrap else 0
        self.left_missing = self.right_missing = None
        if ring.left_missing is not None:
            self.left_missing, self.right_missing = (self._append(m[:, start:stop], True)
                                                     for m in (ring.left_missing, ring.right_missing))
        if not ring.wrap:
            return
        self.separator, self.batch = rows, ring.batch
        inside = lambda i, lo, hi: (i >= lo) & (i < hi)  # noqa: E731
        self.left_partner = torch.full_like(ring.first, rows + 1)
        self.right_partner = torch.full_like(ring.first, rows + 2)
        self.first = torch.where(inside(ring.first, start, stop), ring.first - start, self.right_partner)
        self.last = torch.where(inside(ring.last, start, stop), ring.last - start, self.left_partner)
        position = torch.arange(rows + self.extra_rows, device=ring.first.device)
        self.is_first = (position == self.first[:, None])[..., None, None]
        self.is_last = (position == self.last[:, None])[..., None, None]
        self.owns_first = inside(ring.first, own_start, own_stop)[:, None, None]
        self.owns_last = inside(ring.last, own_start, own_stop)[:, None, None]

    def _append(self, x, fill, partners=None):
        """x (B, rows, ...) then the appended rows: ``fill``, or the separator's ``fill`` then ``partners``."""
        if not self.extra_rows:
            return x
        extra = x.new_full((x.shape[0], self.extra_rows, *x.shape[2:]), fill)
        if partners is not None:
            extra[:, 1:] = partners
        return torch.cat([x, extra], 1)

    def take(self, x, rows, partners=None):
        """The block's rows of x (with a closed ring: the separator, then the partner copies or zeros)."""
        return self._append(x[:, rows], 0.0, partners)


class Block(NamedTuple):
    own_start: int  # the block computes rows [own_start, own_stop) of the input ...
    own_stop: int
    rows: slice  # ... from these rows (its own rows and the halo)
    offset: int  # where its own rows start among ``rows``
    ring: RingNeighbours

    @property
    def own(self):
        """Its own rows, as a slice of the block."""
        return slice(self.offset, self.offset + self.own_stop - self.own_start)


def blocks(n, ring, block_rows, halo):
    """The blocks of an input of n rows, ``halo`` rows on each side; ``block_rows`` None: one block, the input."""
    if block_rows is None:
        yield Block(0, n, slice(None), 0, ring)
        return
    for own_start in range(0, n, block_rows):
        own_stop = min(own_start + block_rows, n)
        start, stop = max(own_start - halo, 0), min(own_stop + halo, n)
        yield Block(own_start, own_stop, slice(start, stop), own_start - start,
                    BlockNeighbours(ring, own_start, own_stop, start, stop))


def softmax(x):
    """Softmax over the last axis, computed in float32 for half-precision inputs."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float().softmax(-1).to(x.dtype)
    return x.softmax(-1)


def head_dot(a, b):
    """Per-head dot product over the last axis: (..., H, dh) x (..., H, dh) -> (..., H)."""
    return (a * b).sum(-1)


def _slot(weights, slot):
    """One slot of (..., 5) weights, kept as a trailing axis of size 1 to broadcast over the head dim."""
    return weights[..., slot:slot + 1]


def _owned(x, owns):
    """x, zeroed for sentences whose token a block does not own (None: the whole input, all owned)."""
    return x if owns is None else x * owns


def project(h, emb, relay, weights, heads, head_dim):
    """q (scaled), k, v of h, k and v of e, k and v of s; each (B, rows, H, dh)."""
    wq, bq, wk, bk, wv, bv = weights
    split = lambda x: x.view(*x.shape[:-1], heads, head_dim)  # noqa: E731
    q = split(F.linear(h, wq, bq)).mul_(head_dim ** -0.5)
    return (q, split(F.linear(h, wk, bk)), split(F.linear(h, wv, bv)), split(F.linear(emb, wk, bk)),
            split(F.linear(emb, wv, bv)), split(F.linear(relay, wk, bk)), split(F.linear(relay, wv, bv)))


def _project_block(ring, h, emb, relay, weights, heads, head_dim):
    """:func:`project`; a block's separator row gets a zero key and value (an open end)."""
    projected = project(h, emb, relay, weights, heads, head_dim)
    if ring.separator is not None:
        _, k, v = projected[:3]
        k[:, ring.separator] = 0.0
        v[:, ring.separator] = 0.0
    return projected


def _slot_dots(x, ring_side, emb_side, relay_side, ring):
    """x_i . [y_{i-1}, y_i, y_{i+1}, y(e_i), y(s)] per head -> (B, rows, H, 5), 0 beyond the ends.

    With x = q and y = keys: the scores; with x = d loss / d (weighted sum) and y = values: the
    gradient of the weights."""
    B, rows, heads, _ = x.shape
    dots = torch.empty(B, rows, heads, 5, dtype=x.dtype, device=x.device)
    dots[..., SELF] = head_dot(x, ring_side)
    dots[..., EMB] = head_dot(x, emb_side)
    dots[..., RELAY] = head_dot(x, relay_side)
    dots[..., LEFT] = F.pad(head_dot(x[:, 1:], ring_side[:, :-1]), (0, 0, 1, 0))
    dots[..., RIGHT] = F.pad(head_dot(x[:, :-1], ring_side[:, 1:]), (0, 0, 0, 1))
    if ring.wrap:
        b, first, last = ring.batch, ring.first, ring.last
        dots[b, first, :, LEFT] = head_dot(x[b, first], ring_side[b, ring.left_partner])
        dots[b, last, :, RIGHT] = head_dot(x[b, last], ring_side[b, ring.right_partner])
    return dots


def _ring_weights(weights, ring):
    """The left/right slots of ``weights``, zero where the shifted neighbour is replaced by the wrap."""
    left, right = _slot(weights, LEFT), _slot(weights, RIGHT)
    if ring.wrap:
        left, right = left.masked_fill(ring.is_first, 0.0), right.masked_fill(ring.is_last, 0.0)
    return left, right


def _weighted_sum(weights, ring_side, emb_side, relay_side, ring):
    """sum over the five slots of weights_slot * y_slot -> (B, rows, H, dh).

    With the softmax weights and the values: the attention output; with the scores' gradient and
    the keys: the gradient of q."""
    out = _slot(weights, SELF) * ring_side
    out.addcmul_(_slot(weights, EMB), emb_side).addcmul_(_slot(weights, RELAY), relay_side)
    left, right = _ring_weights(weights, ring)
    out[:, 1:].addcmul_(left[:, 1:], ring_side[:, :-1])
    out[:, :-1].addcmul_(right[:, :-1], ring_side[:, 1:])
    if ring.wrap:
        b, first, last = ring.batch, ring.first, ring.last
        out.index_put_((b, first), _slot(weights[b, first], LEFT) * ring_side[b, ring.left_partner], accumulate=True)
        out.index_put_((b, last), _slot(weights[b, last], RIGHT) * ring_side[b, ring.right_partner], accumulate=True)
    return out


def _weighted_sum_transposed(weights, grad, ring, own):
    """Gradients of :func:`_weighted_sum` with respect to its three inputs, given ``grad`` of its output:
    (ring side (B, rows, H, dh), embedding side (B, rows, H, dh), relay side summed over the block's own
    rows (B, 1, H, dh))."""
    grad_emb = _slot(weights, EMB) * grad
    grad_relay = (_slot(weights[:, own], RELAY) * grad[:, own]).sum(1, keepdim=True)
    grad_ring = _slot(weights, SELF) * grad
    left, right = _ring_weights(weights, ring)
    grad_ring[:, :-1].addcmul_(left[:, 1:], grad[:, 1:])  # y_i is the left neighbour of i + 1
    grad_ring[:, 1:].addcmul_(right[:, :-1], grad[:, :-1])  # and the right neighbour of i - 1
    if ring.wrap:
        b, first, last = ring.batch, ring.first, ring.last
        grad_ring.index_put_((b, ring.left_partner), _owned(_slot(weights[b, first], LEFT) * grad[b, first],
                                                            ring.owns_first), accumulate=True)
        grad_ring.index_put_((b, ring.right_partner), _owned(_slot(weights[b, last], RIGHT) * grad[b, last],
                                                             ring.owns_last), accumulate=True)
    return grad_ring, grad_emb, grad_relay


def _scores_softmax(q, k, k_emb, k_relay, ring):
    scores = _slot_dots(q, k, k_emb, k_relay, ring)
    if ring.left_missing is not None:
        scores[..., LEFT].masked_fill_(ring.left_missing, float("-inf"))
        scores[..., RIGHT].masked_fill_(ring.right_missing, float("-inf"))
    return softmax(scores)


def wrap_partners(h, ring):
    """(B, 2, d): every sentence's last and first real token, the wrapped neighbours a block copies."""
    if not ring.wrap:
        return None
    return torch.stack([h[ring.batch, ring.last], h[ring.batch, ring.first]], 1)


class FusedRingCore(torch.autograd.Function):
    """Ring attention of one cycle (module docstring) with a hand-written backward that keeps almost nothing."""

    @staticmethod
    def forward(ctx, h, emb, relay, wq, bq, wk, bk, wv, bv, wo, bo, ring, heads, head_dim, p_drop, training,
                block_rows):
        B, n, d = h.shape
        dropout = p_drop > 0 and training
        blocked = not dropout and n > block_rows
        partners = wrap_partners(h, ring) if blocked else None
        weights = (wq, bq, wk, bk, wv, bv)
        if blocked:
            probs = torch.empty(B, n, heads, 5, dtype=h.dtype, device=h.device)
            y = torch.empty(B, n, wo.shape[0], dtype=h.dtype, device=h.device)
        for block in blocks(n, ring, block_rows if blocked else None, halo=1):
            br = block.ring
            h_b, emb_b = br.take(h, block.rows, partners), br.take(emb, block.rows)
            q, k, v, k_emb, v_emb, k_relay, v_relay = _project_block(br, h_b, emb_b, relay, weights, heads, head_dim)
            block_probs = _scores_softmax(q, k, k_emb, k_relay, br)
            dropped = F.dropout(block_probs, p_drop, training) if dropout else block_probs
            attended = _weighted_sum(dropped, v, v_emb, v_relay, br)[:, block.own]
            own_rows = block.own_stop - block.own_start
            if not blocked:
                probs, y = block_probs, F.linear(attended.reshape(B, n, -1), wo, bo)
            else:
                probs[:, block.own_start:block.own_stop] = block_probs[:, block.own]
                y[:, block.own_start:block.own_stop] = F.linear(attended.reshape(B, own_rows, -1), wo, bo)
            del q, k, v, k_emb, v_emb, attended
        ctx.save_for_backward(h, emb, relay, wq, bq, wk, bk, wv, bv, wo, probs, dropped if dropout else probs)
        ctx.ring, ctx.heads, ctx.head_dim = ring, heads, head_dim
        ctx.block_rows = block_rows if blocked else None
        return y

    @staticmethod
    def backward(ctx, grad_y):
        h, emb, relay, wq, bq, wk, bk, wv, bv, wo, all_probs, all_dropped = ctx.saved_tensors
        heads, head_dim, inner = ctx.heads, ctx.head_dim, ctx.heads * ctx.head_dim
        weights = (wq, bq, wk, bk, wv, bv)
        B, n, d = h.shape
        grad_y = grad_y.contiguous()
        grad_wq, grad_wk, grad_wv, grad_wo = (torch.zeros_like(w) for w in (wq, wk, wv, wo))
        grad_bq, grad_bk, grad_bv, grad_bo = (torch.zeros_like(b) for b in (bq, bk, bv, wo[:, 0]))
        grad_k_relay = grad_v_relay = 0
        blocked = ctx.block_rows is not None
        partners = wrap_partners(h, ctx.ring) if blocked else None
        grad_partners = 0  # (blocks, closed ring) gradients of the partner copies' keys and values
        if blocked:
            grad_h, grad_emb = torch.empty_like(h), torch.empty_like(emb)
        with torch.no_grad():
            for block in blocks(n, ctx.ring, ctx.block_rows, halo=2):
                ring, own, own_rows = block.ring, block.own, block.own_stop - block.own_start
                h_b = ring.take(h, block.rows, partners)
                emb_b, probs, dropped, grad_y_b = (ring.take(x, block.rows)
                                                   for x in (emb, all_probs, all_dropped, grad_y))
                rows = h_b.shape[1]
                q, k, v, k_emb, v_emb, k_relay, v_relay = _project_block(ring, h_b, emb_b, relay, weights, heads,
                                                                         head_dim)
                # through W^O
                attended = _weighted_sum(dropped, v, v_emb, v_relay, ring)[:, own].reshape(B * own_rows, inner)
                grad_y_own = grad_y[:, block.own_start:block.own_stop].reshape(B * own_rows, d)
                grad_wo.addmm_(grad_y_own.t(), attended)
                grad_bo += grad_y_own.sum(0)
                del attended
                grad_attended = grad_y_b.reshape(B * rows, d).mm(wo).view(B, rows, heads, head_dim)
                # through the weighted sum: gradients of the (dropped-out) weights and of the values
                grad_dropped = _slot_dots(grad_attended, v, v_emb, v_relay, ring)
                grad_v, grad_v_emb, grad_v_relay_b = _weighted_sum_transposed(dropped, grad_attended, ring, own)
                grad_v_relay = grad_v_relay + grad_v_relay_b
                del grad_attended, v, v_emb, v_relay
                # dropout on the weights, then the softmax
                grad_probs = grad_dropped if dropped is probs else \
                    grad_dropped * torch.where(probs > 0, dropped / probs.clamp(min=1e-30), 0.0)
                grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
                del grad_dropped, grad_probs
                # through the scores q_i . key_slot
                grad_q = _weighted_sum(grad_scores, k, k_emb, k_relay, ring)
                grad_k, grad_k_emb, grad_k_relay_b = _weighted_sum_transposed(grad_scores, q, ring, own)
                grad_k_relay = grad_k_relay + grad_k_relay_b
                if ring.separator is not None:  # the partner copies' gradients
                    grad_partners = grad_partners + torch.stack([grad_k[:, -2:], grad_v[:, -2:]]).reshape(
                        2, B, 2, inner)
                del q, k, k_emb, k_relay, grad_scores
                grad_q.mul_(head_dim ** -0.5)
                # through the projections, the block's own rows only
                flat = lambda x: x[:, own].reshape(-1, inner)  # noqa: E731
                h_own = h[:, block.own_start:block.own_stop].reshape(-1, d)
                emb_own = emb[:, block.own_start:block.own_stop].reshape(-1, d)
                grad_q, grad_k, grad_v, grad_k_emb, grad_v_emb = map(flat, (grad_q, grad_k, grad_v, grad_k_emb,
                                                                            grad_v_emb))
                grad_wq.addmm_(grad_q.t(), h_own)
                grad_bq += grad_q.sum(0)
                grad_wk.addmm_(grad_k.t(), h_own).addmm_(grad_k_emb.t(), emb_own)
                grad_bk += grad_k.sum(0) + grad_k_emb.sum(0)
                grad_wv.addmm_(grad_v.t(), h_own).addmm_(grad_v_emb.t(), emb_own)
                grad_bv += grad_v.sum(0) + grad_v_emb.sum(0)
                grad_h_b = grad_q.mm(wq).addmm_(grad_k, wk).addmm_(grad_v, wv).view(B, own_rows, d)
                grad_emb_b = grad_k_emb.mm(wk).addmm_(grad_v_emb, wv).view(B, own_rows, d)
                if blocked:
                    grad_h[:, block.own_start:block.own_stop] = grad_h_b
                    grad_emb[:, block.own_start:block.own_stop] = grad_emb_b
                else:
                    grad_h, grad_emb = grad_h_b, grad_emb_b
                del grad_h_b, grad_emb_b, grad_q, grad_k, grad_v, grad_k_emb, grad_v_emb
            if partners is not None:  # the wrapped neighbours' keys and values, back to their rows
                (grad_k_partner, grad_v_partner) = grad_partners.reshape(2, 2 * B, inner)
                _project_backward(partners.reshape(2 * B, d), grad_k_partner, grad_v_partner, wk, wv,
                                  grad_wk, grad_bk, grad_wv, grad_bv)
                grad_partner_rows = grad_k_partner.mm(wk).addmm_(grad_v_partner, wv).view(B, 2, d)
                batch = ctx.ring.batch
                grad_h.index_put_((batch, ctx.ring.last), grad_partner_rows[:, 0], accumulate=True)
                grad_h.index_put_((batch, ctx.ring.first), grad_partner_rows[:, 1], accumulate=True)
            grad_k_relay, grad_v_relay = grad_k_relay.reshape(-1, inner), grad_v_relay.reshape(-1, inner)
            _project_backward(relay.reshape(-1, d), grad_k_relay, grad_v_relay, wk, wv,
                              grad_wk, grad_bk, grad_wv, grad_bv)
            grad_relay = grad_k_relay.mm(wk).addmm_(grad_v_relay, wv).view(B, 1, d)
        return (grad_h, grad_emb, grad_relay, grad_wq, grad_bq, grad_wk, grad_bk, grad_wv, grad_bv, grad_wo, grad_bo,
                None, None, None, None, None, None)


def _project_backward(x, grad_k, grad_v, wk, wv, grad_wk, grad_bk, grad_wv, grad_bv):
    """Accumulates the W^K / W^V gradients of the keys and values k = W^K x, v = W^V x (x: rows x d)."""
    grad_wk.addmm_(grad_k.t(), x)
    grad_bk += grad_k.sum(0)
    grad_wv.addmm_(grad_v.t(), x)
    grad_bv += grad_v.sum(0)


def fused_ring_attention(h, emb, relay, q_proj, k_proj, v_proj, out_proj, ring: RingNeighbours, heads, head_dim,
                         attention_dropout, training, block_rows=BLOCK_ROWS):
    """h, emb: (B, n, d); relay: (B, 1, d) -> (B, n, d) through :class:`FusedRingCore`.

    autocast (--amp) does not reach inside an autograd Function: under autocast every input is
    cast to the autocast dtype here (autograd casts the gradients back) and the core runs,
    forward and backward, in that one dtype."""
    tensors = (h, emb, relay, q_proj.weight, q_proj.bias, k_proj.weight, k_proj.bias,
               v_proj.weight, v_proj.bias, out_proj.weight, out_proj.bias)
    args = (ring, heads, head_dim, attention_dropout, training, block_rows)
    device = h.device.type
    if not torch.is_autocast_enabled(device):
        return FusedRingCore.apply(*tensors, *args)
    dtype = torch.get_autocast_dtype(device)
    with torch.autocast(device, enabled=False):
        return FusedRingCore.apply(*(t.to(dtype) for t in tensors), *args)
