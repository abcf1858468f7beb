"""Star-Transformer encoder (Guo et al., NAACL 2019, arXiv 1902.09113), linear in the length.

Paper, Sec. 2 ("Implementation"/"Update") and Algorithm 1::

    H^0 = E,  s^0 = average(E)                              # E: token + learned position embeddings
    for t = 1..T:                                            # separate parameters per step
        C_i^t = [h_{i-1}^{t-1}; h_i^{t-1}; h_{i+1}^{t-1}; e_i; s^{t-1}]
        h_i^t = LayerNorm(ReLU(MultiAtt(h_i^{t-1}, C_i^t)))   # (1) satellites, all i in parallel
        s^t   = LayerNorm(ReLU(MultiAtt(s^{t-1}, [s^{t-1}; H^t])))  # (2) relay, uses the new H^t

The paper and the two public implementations (fastNLP, Tencent's NeuralClassifier) differ in the details
below; each is an option here (a field of :class:`StarTransformerOptions`, the fairseq flag of the same
name), so that either implementation can be reproduced:

* **Ring** (``star_no_ring_wrap``): the paper says "the first and last nodes are also connected"
  (Sec. 2, ring connections), so the default closes the ring — *per sentence*: the first
  real token's left neighbour is the sentence's last real token, whatever the padding.
  fastNLP and Tencent's NeuralClassifier do not wrap (``star_no_ring_wrap=True``).
* **Padded / missing neighbours** (``star_unmasked_ring_pads``): by default a neighbour that is
  padding (or beyond the ends of an open ring) gets score −inf, so a sentence's outputs
  do not depend on the batch it is in.  ``True`` reproduces fastNLP: the ends of the
  sequence see a zero key/value (score 0, value 0, still taking softmax mass) and pad
  satellites are ordinary neighbours.
* **Norm placement** (``star_norm_position``): ``post`` = paper, LN(act(MultiAtt(h, C)));
  ``pre`` = fastNLP, act(MultiAtt(LN(h), C)) with LN on the query and the ring keys only.
* **Relay norm** (``star_no_relay_norm``): paper yes, fastNLP no.
* **Activation** (``star_activation``): ``relu`` (paper) or ``leaky_relu`` (fastNLP, slope 0.01).
* **Relay initialisation** (``star_unmasked_relay_init``): s^0 is the mean over the real tokens
  (default) or over all positions including padding (fastNLP).
* **Deeper stacks** (fastNLP issue #267, the first author's advice): ``star_residual``,
  ``encoder_ffn_embed_dim`` (> 0 adds a position-wise FFN sub-layer to satellites and relay) and
  ``init_std`` (> 0: all projections ~ N(0, init_std), biases 0; fastNLP uses 0.05).
* **Dropout** (``star_block_dropout``): the paper does not say where; Tencent's code drops each
  block's activation output before the LayerNorm (default: the ``dropout`` rate), fastNLP
  only the input embeddings (``star_block_dropout=0``).
* Heads: ``encoder_head_dim`` may differ from ``d / heads`` (fastNLP's 1×1-conv projections map
  d → heads·head_dim), default ``d // heads``.

:data:`FASTNLP` holds the settings that reproduce fastNLP 1.0.1's ``StarTransformer``.

Cost (paper, "Comparison to the standard Transformer"): O(5nd) for the ring, O(nd) for the
relay.  The ring attention projects K and V once per step and reads the neighbours by
slicing the projected tensors along the sequence axis, so no n×n tensor and no stacked
copy of the five context vectors exist: the scores are a (B, n, H, 5) tensor and the
weighted sum is accumulated in place.  The relay's single query is folded into its key
and value projections (:class:`RelayAttention`), so the relay step is O(n d H) and stores
no projected copy of H.

Activation memory: the ring core (five scores, softmax, weighted sum, W^O) is one
autograd Function (:class:`_RingCore`) with a hand-written backward.  It keeps only its
inputs (h^{t-1}, which is the previous cycle's output, and e, shared by all cycles) and the
B x n x H x 5 probabilities, and recomputes the five projections q, k, v, k(e), v(e) in
the backward pass — five extra n x d x d products per cycle instead of keeping six n x d
tensors.  A cycle then keeps about 2 n·d values (the activation output and the normed
output) against ~8 n·d through plain autograd (``RingAttention.fused = False``, kept as the
reference implementation).  ``checkpoint_activations`` recomputes each whole cycle during the
backward pass, keeping only the cycle inputs (about one n x d tensor per cycle).
"""
from dataclasses import dataclass, field, fields
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.utils import safe_getattr
from torch import nn
from torch.utils.checkpoint import checkpoint

ACTIVATION_CHOICES = ChoiceEnum(["relu", "leaky_relu"])
NORM_CHOICES = ChoiceEnum(["post", "pre"])


@dataclass
class StarTransformerOptions(FairseqDataclass):
    """Hyper-parameters of :class:`StarTransformer`: the fairseq flags of the Star-Transformer stack
    (``--encoder-embed-dim`` ...; the model's config extends them)."""

    encoder_embed_dim: int = field(default=300, metadata={"help": "hidden size d of satellites and relay"})
    encoder_layers: int = field(default=2, metadata={"help": "T, number of update cycles (separate parameters)"})
    encoder_attention_heads: int = field(default=6, metadata={"help": "attention heads"})
    encoder_head_dim: int = field(default=0, metadata={"help": "per-head size; 0 = d / heads (fastNLP: 50)"})
    encoder_ffn_embed_dim: int = field(default=0, metadata={"help": "FFN sub-layer size; 0 = none (paper)"})
    max_positions: int = field(default=512, metadata={"help": "size of the learned position table"})
    dropout: float = field(default=0.1, metadata={"help": "embedding and block-output dropout"})
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout on attention weights"})
    star_block_dropout: float = field(default=-1.0, metadata={
        "help": "dropout on each Star block's output before its norm; < 0: --dropout (Tencent's code), "
                "0: embedding dropout only (fastNLP)"})
    star_activation: ACTIVATION_CHOICES = field(default="relu", metadata={"help": "relu (paper) or leaky_relu (fastNLP)"})
    star_norm_position: NORM_CHOICES = field(default="post", metadata={"help": "post (paper) or pre (fastNLP)"})
    star_no_relay_norm: bool = field(default=False, metadata={
        "help": "no LayerNorm on the relay (fastNLP); the paper normalises it"})
    star_no_ring_wrap: bool = field(default=False, metadata={
        "help": "open ring, no first <-> last token link (fastNLP, Tencent); the paper closes the ring"})
    star_unmasked_ring_pads: bool = field(default=False, metadata={
        "help": "do not mask padded / missing ring neighbours: zero keys at the ends, pads visible (fastNLP)"})
    star_unmasked_relay_init: bool = field(default=False, metadata={
        "help": "s^0 = mean over all positions, pads included (fastNLP); default: over real tokens"})
    star_residual: bool = field(default=False, metadata={"help": "residual connections (for deeper stacks)"})
    init_std: float = field(default=0.0, metadata={"help": ">0: N(0, std) init of projections (fastNLP 0.05); 0 = xavier"})
    layernorm_eps: float = field(default=1e-5)
    checkpoint_activations: bool = field(default=False, metadata={
        "help": "recompute each Star cycle in the backward pass (less activation memory, ~1/3 more compute)"})

    @classmethod
    def of(cls, cfg):
        """The options in ``cfg`` (these options, a model config, a DictConfig or a Namespace); one it lacks
        (a checkpoint older than the option) or sets to None takes its default."""
        return cls(**{f.name: safe_getattr(cfg, f.name, f.default) for f in fields(cls) if not f.name.startswith("_")})

    @classmethod
    def fastnlp(cls, **kw):
        """The options that reproduce fastNLP 1.0.1 ``StarTransformer`` exactly (:data:`FASTNLP`), then ``kw``."""
        return cls(**{**FASTNLP, **kw})


# fastNLP 1.0.1's StarTransformer: leaky ReLU, pre-norm, no relay norm, open ring with zero-padded ends and
# visible pads, relay initialised over all positions, eps 1e-6, no attention or block dropout
FASTNLP = dict(star_activation="leaky_relu", star_norm_position="pre", star_no_relay_norm=True,
               star_no_ring_wrap=True, star_unmasked_ring_pads=True, star_unmasked_relay_init=True,
               layernorm_eps=1e-6, attention_dropout=0.0, star_block_dropout=0.0)


ACTIVATIONS = {"relu": F.relu, "leaky_relu": F.leaky_relu}


class _Ring:
    """Per-batch neighbour bookkeeping for the ring, computed once per forward pass.

    ``left_missing``/``right_missing`` (B, n, 1) mark positions whose neighbour is masked;
    ``first``/``last`` (B,) are each sentence's first and last real positions (for the wrap),
    ``left_partner``/``right_partner`` the rows whose key and value they see across the wrap
    (here ``last`` and ``first``; a block of rows keeps copies of them, see :class:`_BlockRing`).
    Everything is built with tensor ops: no value is read back to the host.
    """

    first_kept = last_kept = None  # (blocks only) whether the block owns first/last

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
            idx = torch.arange(n, device=device).expand(B, n)
            self.first = torch.where(real, idx, n).min(1).values.clamp(max=n - 1)
            self.last = torch.where(real, idx, -1).max(1).values.clamp(min=0)
            rows = self.rows = torch.arange(B, device=device)
            left = left.clone()
            right = right.clone()
            left[rows, self.first] = False
            right[rows, self.last] = False
            # the shifted (non-wrapped) neighbour values must not be added at the wrapped slots
            self.is_first = (idx == self.first[:, None])[..., None, None]  # B n 1 1
            self.is_last = (idx == self.last[:, None])[..., None, None]
            self.left_partner, self.right_partner = self.last, self.first
        if not mask_pads:
            # wrap without masking: only the two wrapped slots are replaced, pads stay visible
            left = torch.zeros_like(left)
            right = torch.zeros_like(right)
        self.left_missing = left.unsqueeze(-1)
        self.right_missing = right.unsqueeze(-1)


def _softmax(x):
    """Softmax over the last axis, computed in float32 for half-precision inputs."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float().softmax(-1).to(x.dtype)
    return x.softmax(-1)


def _owned(x, kept):
    """x, zeroed for sentences whose token a block does not own (None: the whole input, kept)."""
    return x if kept is None else x * kept


def _dot(a, b):
    """Per-head dot product over the last axis: (..., H, dh) x (..., H, dh) -> (..., H)."""
    return (a * b).sum(-1)


class _BlockRing:
    """Neighbour bookkeeping of rows ``[start, stop)`` of a long input (rows ``[a, c)`` plus halo rows).

    The block is processed with open ends (a missing neighbour beyond its first/last row
    sees a zero key and value, score 0, as the sequence ends do); the halo rows make the
    rows it keeps see their true neighbours.  For a closed ring three rows are appended to
    the block: a separator (zero key and value) and copies of every sentence's last and
    first real token (``left_partner``/``right_partner``), so a first/last token sees its
    wrapped neighbour wherever that lies in the sequence.  A sentence whose first (last)
    token is not in the block points ``first`` (``last``) at the appended copy, whose
    outputs and gradients are discarded; ``first_kept``/``last_kept`` (B, 1, 1) say whether
    the block owns that token, so only its owner sends gradient to the partner copy.
    """

    def __init__(self, ring: _Ring, a, c, start, stop):
        self.wrap = ring.wrap
        nb = stop - start
        self.tail = 3 if ring.wrap else 0
        self.left_missing = self.right_missing = None
        if ring.left_missing is not None:
            self.left_missing, self.right_missing = (self._rows(m[:, start:stop], True)
                                                     for m in (ring.left_missing, ring.right_missing))
        if not ring.wrap:
            return
        self.sep, device = nb, ring.first.device
        self.rows = ring.rows
        inside = lambda i, lo, hi: (i >= lo) & (i < hi)  # noqa: E731
        self.left_partner = torch.full_like(ring.first, nb + 1)
        self.right_partner = torch.full_like(ring.first, nb + 2)
        self.first = torch.where(inside(ring.first, start, stop), ring.first - start, self.right_partner)
        self.last = torch.where(inside(ring.last, start, stop), ring.last - start, self.left_partner)
        idx = torch.arange(nb + self.tail, device=device)
        self.is_first = (idx == self.first[:, None])[..., None, None]
        self.is_last = (idx == self.last[:, None])[..., None, None]
        self.first_kept = inside(ring.first, a, c)[:, None, None]
        self.last_kept = inside(ring.last, a, c)[:, None, None]

    def _rows(self, x, fill, tail=None):
        """x (B, nb, ...) followed by the block's appended rows (``tail`` after the separator, else ``fill``)."""
        if not self.tail:
            return x
        extra = x.new_full((x.shape[0], self.tail, *x.shape[2:]), fill)
        if tail is not None:
            extra[:, 1:] = tail
        return torch.cat([x, extra], 1)


class _RingCore(torch.autograd.Function):
    """Ring attention of one cycle with a hand-written backward that keeps almost nothing.

    Forward: the five scores q_i . [k_{i-1}, k_i, k_{i+1}, k(e_i), k(s)], their softmax and the
    weighted sum of the values, then W^O — exactly :meth:`RingAttention.forward_autograd`.
    Saved for backward: the inputs (h, e, s: h is the previous cycle's output and e is shared
    by all cycles, so they are kept anyway), the weights and the 5-way probabilities
    (B x n x H x 5, i.e. 5/head_dim of one n x d tensor).  Backward recomputes the five
    projections q, k, v, k(e), v(e) (five n x d x d products) and the attention output,
    instead of keeping those six n x d tensors alive between forward and backward.

    Blocks along n: a long input, padded or not (``n > block_rows``, no attention
    dropout), is processed ``block_rows`` positions at a time, forward and backward, each
    block with one (forward) or two (backward) halo rows per side taken from its
    neighbours, and for a closed ring copies of each sentence's wrapped neighbours
    (:class:`_BlockRing`).  Every value is computed by the same
    formulas as without blocks; only the working set changes — a block's projections,
    scores and gradients stay in the CPU caches instead of streaming n x d temporaries
    through memory, which made the time per token grow with n.
    """

    block_rows = 512

    @staticmethod
    def _project(h, emb, relay, wq, bq, wk, bk, wv, bv, H, dh):
        B, n, _ = h.shape
        split = lambda x: x.view(*x.shape[:-1], H, dh)  # noqa: E731
        q = split(F.linear(h, wq, bq)).mul_(dh ** -0.5)
        return (q, split(F.linear(h, wk, bk)), split(F.linear(h, wv, bv)), split(F.linear(emb, wk, bk)),
                split(F.linear(emb, wv, bv)), split(F.linear(relay, wk, bk)), split(F.linear(relay, wv, bv)))

    @staticmethod
    def _attend(pd, v, ve, vs, ring):
        """sum over the five slots of pd_slot * value_slot -> (B, n, H, dh)."""
        out = pd[..., 1:2] * v
        out.addcmul_(pd[..., 3:4], ve).addcmul_(pd[..., 4:5], vs)
        pl, pr = pd[..., 0:1], pd[..., 2:3]
        if ring.wrap:
            pl, pr = pl.masked_fill(ring.is_first, 0.0), pr.masked_fill(ring.is_last, 0.0)
        out[:, 1:].addcmul_(pl[:, 1:], v[:, :-1])
        out[:, :-1].addcmul_(pr[:, :-1], v[:, 1:])
        if ring.wrap:
            rows, f, l_ = ring.rows, ring.first, ring.last
            out.index_put_((rows, f), pd[rows, f, :, 0:1] * v[rows, ring.left_partner], accumulate=True)
            out.index_put_((rows, l_), pd[rows, l_, :, 2:3] * v[rows, ring.right_partner], accumulate=True)
        return out

    @staticmethod
    def _blocks(n, ring, blocked, halo):
        """(a, c, rows, lo, block ring): rows [a, c) and their halo; ``rows`` slices dim 1 and the
        block's own rows start at ``lo`` in it.  Without ``blocked``: one block, the whole input."""
        if not blocked:
            yield 0, n, slice(None), 0, ring
            return
        m = _RingCore.block_rows
        for a in range(0, n, m):
            c = min(a + m, n)
            start, stop = max(a - halo, 0), min(c + halo, n)
            yield a, c, slice(start, stop), a - start, _BlockRing(ring, a, c, start, stop)

    @staticmethod
    def _partners(h, ring):
        """(B, 2, d): every sentence's last and first real token, the wrapped neighbours a block copies."""
        if not ring.wrap:
            return None
        return torch.stack([h[ring.rows, ring.last], h[ring.rows, ring.first]], 1)

    @staticmethod
    def _block_rows(x, rows, ring, partners=None):
        """The block's rows of x (with a closed ring: the separator, then the partner copies or zeros)."""
        return ring._rows(x[:, rows], 0.0, partners) if isinstance(ring, _BlockRing) else x[:, rows]

    @staticmethod
    def _block_project(ring, *args):
        """:meth:`_project` of a block; the separator row gets a zero key and value (an open end)."""
        q, k, v, ke, ve, ks, vs = _RingCore._project(*args)
        if isinstance(ring, _BlockRing) and ring.tail:
            k[:, ring.sep] = 0.0
            v[:, ring.sep] = 0.0
        return q, k, v, ke, ve, ks, vs

    @staticmethod
    def _probs(q, k, ke, ks, ring):
        B, n, heads, _ = q.shape
        scores = torch.empty(B, n, heads, 5, dtype=q.dtype, device=q.device)
        scores[..., 1] = _dot(q, k)
        scores[..., 3] = _dot(q, ke)
        scores[..., 4] = _dot(q, ks)
        scores[..., 0] = F.pad(_dot(q[:, 1:], k[:, :-1]), (0, 0, 1, 0))
        scores[..., 2] = F.pad(_dot(q[:, :-1], k[:, 1:]), (0, 0, 0, 1))
        if ring.wrap:
            rows, f, l_ = ring.rows, ring.first, ring.last
            scores[rows, f, :, 0] = _dot(q[rows, f], k[rows, ring.left_partner])
            scores[rows, l_, :, 2] = _dot(q[rows, l_], k[rows, ring.right_partner])
        if ring.left_missing is not None:
            scores[..., 0].masked_fill_(ring.left_missing, float("-inf"))
            scores[..., 2].masked_fill_(ring.right_missing, float("-inf"))
        return _softmax(scores)

    @staticmethod
    def forward(ctx, h, emb, relay, wq, bq, wk, bk, wv, bv, wo, bo, ring, heads, head_dim, p_drop, training):
        B, n, d = h.shape
        drop = p_drop > 0 and training
        blocked = not drop and n > _RingCore.block_rows
        partners = _RingCore._partners(h, ring) if blocked else None
        if blocked:
            probs = torch.empty(B, n, heads, 5, dtype=h.dtype, device=h.device)
            y = torch.empty(B, n, wo.shape[0], dtype=h.dtype, device=h.device)
        for a, c, rows, lo, bring in _RingCore._blocks(n, ring, blocked, 1):
            h_b, e_b = _RingCore._block_rows(h, rows, bring, partners), _RingCore._block_rows(emb, rows, bring)
            q, k, v, ke, ve, ks, vs = _RingCore._block_project(bring, h_b, e_b, relay, wq, bq, wk, bk, wv, bv,
                                                               heads, head_dim)
            p = _RingCore._probs(q, k, ke, ks, bring)
            pd = F.dropout(p, p_drop, training) if drop else p
            out = _RingCore._attend(pd, v, ve, vs, bring)[:, lo:lo + c - a]
            if not blocked:
                probs, y = p, F.linear(out.reshape(B, n, -1), wo, bo)
            else:
                probs[:, a:c] = p[:, lo:lo + c - a]
                y[:, a:c] = F.linear(out.reshape(B, c - a, -1), wo, bo)
            del q, k, v, ke, ve, out
        ctx.save_for_backward(h, emb, relay, wq, bq, wk, bk, wv, bv, wo, probs, pd if drop else probs)
        ctx.ring, ctx.heads, ctx.head_dim, ctx.blocked = ring, heads, head_dim, blocked
        return y

    @staticmethod
    def backward(ctx, gy):
        h, emb, relay, wq, bq, wk, bk, wv, bv, wo, probs_all, pd_all = ctx.saved_tensors
        H, dh = ctx.heads, ctx.head_dim
        B, n, d = h.shape
        gy = gy.contiguous()
        g_wq, g_wk, g_wv, g_wo = (torch.zeros_like(w) for w in (wq, wk, wv, wo))
        g_bq, g_bk, g_bv, g_bo = (torch.zeros_like(b) for b in (bq, bk, bv, wo[:, 0]))
        g_ks_all = g_vs_all = 0
        partners = _RingCore._partners(h, ctx.ring) if ctx.blocked else None
        g_partners = 0  # (blocks, closed ring) gradients of the partner copies' keys and values
        if ctx.blocked:
            g_h, g_emb = torch.empty_like(h), torch.empty_like(emb)
        with torch.no_grad():
            for a, c, rows, lo, ring in _RingCore._blocks(n, ctx.ring, ctx.blocked, 2):
                m, keep = c - a, slice(lo, lo + c - a)
                h_b = _RingCore._block_rows(h, rows, ring, partners)
                e_b, probs, pd, gy_b = (_RingCore._block_rows(x, rows, ring) for x in (emb, probs_all, pd_all, gy))
                nb = h_b.shape[1]
                q, k, v, ke, ve, ks, vs = _RingCore._block_project(ring, h_b, e_b, relay, wq, bq, wk, bk, wv, bv,
                                                                   H, dh)
                out = _RingCore._attend(pd, v, ve, vs, ring)[:, keep].reshape(B * m, H * dh)
                gy2 = gy_b.reshape(B * nb, d)
                gy_keep = gy[:, a:c].reshape(B * m, d)
                g_wo.addmm_(gy_keep.t(), out)
                g_bo += gy_keep.sum(0)
                del out
                ga = gy2.mm(wo).view(B, nb, H, dh)  # d loss / d attention output
                # through the weighted sum: gradients of the (dropped-out) probabilities and of the values
                g_pd = torch.empty_like(probs)
                g_pd[..., 1] = _dot(ga, v)
                g_pd[..., 3] = _dot(ga, ve)
                g_pd[..., 4] = _dot(ga, vs)
                g_pd[..., 0] = F.pad(_dot(ga[:, 1:], v[:, :-1]), (0, 0, 1, 0))
                g_pd[..., 2] = F.pad(_dot(ga[:, :-1], v[:, 1:]), (0, 0, 0, 1))
                pl, pr = pd[..., 0:1], pd[..., 2:3]
                if ring.wrap:
                    rws, f, l_, lp, rp = ring.rows, ring.first, ring.last, ring.left_partner, ring.right_partner
                    g_pd[rws, f, :, 0] = _dot(ga[rws, f], v[rws, lp])
                    g_pd[rws, l_, :, 2] = _dot(ga[rws, l_], v[rws, rp])
                    pl, pr = pl.masked_fill(ring.is_first, 0.0), pr.masked_fill(ring.is_last, 0.0)
                g_ve = pd[..., 3:4] * ga
                g_vs_all = g_vs_all + (pd[:, keep, :, 4:5] * ga[:, keep]).sum(1, keepdim=True)
                g_v = pd[..., 1:2] * ga
                g_v[:, :-1].addcmul_(pl[:, 1:], ga[:, 1:])  # v_i is the left neighbour of i + 1
                g_v[:, 1:].addcmul_(pr[:, :-1], ga[:, :-1])  # and the right neighbour of i - 1
                if ring.wrap:
                    g_v.index_put_((rws, lp), _owned(pd[rws, f, :, 0:1] * ga[rws, f], ring.first_kept), accumulate=True)
                    g_v.index_put_((rws, rp), _owned(pd[rws, l_, :, 2:3] * ga[rws, l_], ring.last_kept),
                                   accumulate=True)
                del ga, v, ve, vs
                # dropout on the probabilities, then the softmax
                g_p = g_pd if pd is probs else g_pd * torch.where(probs > 0, pd / probs.clamp(min=1e-30), 0.0)
                g_s = probs * (g_p - (g_p * probs).sum(-1, keepdim=True))
                del g_pd, g_p
                # through the scores q_i . key_slot
                gl, gr = g_s[..., 0:1], g_s[..., 2:3]
                g_q = g_s[..., 1:2] * k
                g_q.addcmul_(g_s[..., 3:4], ke).addcmul_(g_s[..., 4:5], ks)
                if ring.wrap:
                    gl, gr = gl.masked_fill(ring.is_first, 0.0), gr.masked_fill(ring.is_last, 0.0)
                g_q[:, 1:].addcmul_(gl[:, 1:], k[:, :-1])
                g_q[:, :-1].addcmul_(gr[:, :-1], k[:, 1:])
                g_k = g_s[..., 1:2] * q
                g_k[:, :-1].addcmul_(gl[:, 1:], q[:, 1:])
                g_k[:, 1:].addcmul_(gr[:, :-1], q[:, :-1])
                if ring.wrap:
                    g_q.index_put_((rws, f), g_s[rws, f, :, 0:1] * k[rws, lp], accumulate=True)
                    g_q.index_put_((rws, l_), g_s[rws, l_, :, 2:3] * k[rws, rp], accumulate=True)
                    g_k.index_put_((rws, lp), _owned(g_s[rws, f, :, 0:1] * q[rws, f], ring.first_kept),
                                   accumulate=True)
                    g_k.index_put_((rws, rp), _owned(g_s[rws, l_, :, 2:3] * q[rws, l_], ring.last_kept),
                                   accumulate=True)
                if isinstance(ring, _BlockRing) and ring.tail:  # the partner copies' gradients
                    g_partners = g_partners + torch.stack([g_k[:, -2:], g_v[:, -2:]]).reshape(2, B, 2, H * dh)
                g_ke = g_s[..., 3:4] * q
                g_ks_all = g_ks_all + (g_s[:, keep, :, 4:5] * q[:, keep]).sum(1, keepdim=True)
                del q, k, ke, ks, g_s
                g_q.mul_(dh ** -0.5)
                # through the projections, the block's own rows only
                flat = lambda x: x[:, keep].reshape(-1, H * dh)  # noqa: E731
                h2, e2 = h[:, a:c].reshape(-1, d), emb[:, a:c].reshape(-1, d)
                g_q, g_k, g_v, g_ke, g_ve = flat(g_q), flat(g_k), flat(g_v), flat(g_ke), flat(g_ve)
                g_wq.addmm_(g_q.t(), h2)
                g_bq += g_q.sum(0)
                g_wk.addmm_(g_k.t(), h2).addmm_(g_ke.t(), e2)
                g_bk += g_k.sum(0) + g_ke.sum(0)
                g_wv.addmm_(g_v.t(), h2).addmm_(g_ve.t(), e2)
                g_bv += g_v.sum(0) + g_ve.sum(0)
                gh_b = g_q.mm(wq).addmm_(g_k, wk).addmm_(g_v, wv).view(B, m, d)
                ge_b = g_ke.mm(wk).addmm_(g_ve, wv).view(B, m, d)
                if ctx.blocked:
                    g_h[:, a:c], g_emb[:, a:c] = gh_b, ge_b
                else:
                    g_h, g_emb = gh_b, ge_b
                del gh_b, ge_b
                del g_q, g_k, g_v, g_ke, g_ve
            if partners is not None:  # the wrapped neighbours' keys and values, back to their rows
                (g_kp, g_vp), p2 = g_partners.reshape(2, 2 * B, H * dh), partners.reshape(2 * B, d)
                g_wk.addmm_(g_kp.t(), p2)
                g_bk += g_kp.sum(0)
                g_wv.addmm_(g_vp.t(), p2)
                g_bv += g_vp.sum(0)
                g_p = g_kp.mm(wk).addmm_(g_vp, wv).view(B, 2, d)
                rws = ctx.ring.rows
                g_h.index_put_((rws, ctx.ring.last), g_p[:, 0], accumulate=True)
                g_h.index_put_((rws, ctx.ring.first), g_p[:, 1], accumulate=True)
            g_ks, g_vs, s2 = g_ks_all.reshape(-1, H * dh), g_vs_all.reshape(-1, H * dh), relay.reshape(-1, d)
            g_wk.addmm_(g_ks.t(), s2)
            g_bk += g_ks.sum(0)
            g_wv.addmm_(g_vs.t(), s2)
            g_bv += g_vs.sum(0)
            g_relay = g_ks.mm(wk).addmm_(g_vs, wv).view(B, 1, d)
        return (g_h, g_emb, g_relay, g_wq, g_bq, g_wk, g_bk, g_wv, g_bv, g_wo, g_bo,
                None, None, None, None, None)


class _Projections(nn.Module):
    """W^Q, W^K, W^V (d -> heads * head_dim, with bias, like fastNLP's 1x1 convs) and W^O."""

    def __init__(self, embed_dim, heads, head_dim, attention_dropout=0.0):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.q_proj = nn.Linear(embed_dim, inner)
        self.k_proj = nn.Linear(embed_dim, inner)
        self.v_proj = nn.Linear(embed_dim, inner)
        self.out_proj = nn.Linear(inner, embed_dim)
        self.attention_dropout = attention_dropout
        self.fused = True  # RingAttention: hand-written backward (see _RingCore)


class RingAttention(_Projections):
    """Satellite update MultiAtt(h_i, C_i) with C_i = [h_{i-1}; h_i; h_{i+1}; e_i; s] (Alg. 1, line 5)."""

    def _split(self, x):
        return x.view(*x.shape[:-1], self.heads, self.head_dim)

    def forward(self, h, emb, relay, ring: _Ring):
        """h, emb: (B, n, d); relay: (B, 1, d) -> (B, n, d).

        With ``fused`` (default) the core runs as :class:`_RingCore` (same outputs and
        gradients, far less activation memory); otherwise through plain autograd ops.
        """
        if not self.fused:
            return self.forward_autograd(h, emb, relay, ring)
        tensors = (h, emb, relay, self.q_proj.weight, self.q_proj.bias, self.k_proj.weight, self.k_proj.bias,
                   self.v_proj.weight, self.v_proj.bias, self.out_proj.weight, self.out_proj.bias)
        device = h.device.type
        if torch.is_autocast_enabled(device):
            # autocast (--amp) does not reach inside an autograd Function: cast every input to
            # the autocast dtype here (autograd casts the gradients back) and run the core,
            # forward and backward, in that one dtype
            dtype = torch.get_autocast_dtype(device)
            tensors = tuple(t.to(dtype) for t in tensors)
            with torch.autocast(device, enabled=False):
                return _RingCore.apply(*tensors, ring, self.heads, self.head_dim, self.attention_dropout,
                                       self.training)
        return _RingCore.apply(*tensors, ring, self.heads, self.head_dim, self.attention_dropout, self.training)

    def forward_autograd(self, h, emb, relay, ring: _Ring):
        """Reference implementation of the same ring attention with autograd-tracked ops."""
        B, n, _ = h.shape
        q = self._split(self.q_proj(h)) * (self.head_dim ** -0.5)  # B n H dh
        k, v = self._split(self.k_proj(h)), self._split(self.v_proj(h))
        k_e, v_e = self._split(self.k_proj(emb)), self._split(self.v_proj(emb))
        k_s, v_s = self._split(self.k_proj(relay)), self._split(self.v_proj(relay))  # B 1 H dh

        s_self, s_e, s_s = _dot(q, k), _dot(q, k_e), _dot(q, k_s)
        # neighbours by shifting along the sequence: score 0 at the open ends (= zero key)
        s_left = F.pad(_dot(q[:, 1:], k[:, :-1]), (0, 0, 1, 0))
        s_right = F.pad(_dot(q[:, :-1], k[:, 1:]), (0, 0, 0, 1))
        rows = torch.arange(B, device=h.device)
        if ring.wrap:
            # closed ring: first real token <-> last real token of the same sentence
            f, l_ = ring.first, ring.last
            s_left = s_left.index_put((rows, f), _dot(q[rows, f], k[rows, l_]))
            s_right = s_right.index_put((rows, l_), _dot(q[rows, l_], k[rows, f]))
        if ring.left_missing is not None:
            s_left = s_left.masked_fill(ring.left_missing, float("-inf"))
            s_right = s_right.masked_fill(ring.right_missing, float("-inf"))
        probs = _softmax(torch.stack([s_left, s_self, s_right, s_e, s_s], -1))  # B n H 5
        probs = F.dropout(probs, self.attention_dropout, self.training)
        p = probs.unsqueeze(-1)
        out = p[..., 1, :] * v + p[..., 3, :] * v_e + p[..., 4, :] * v_s
        p_left, p_right = p[..., 0, :], p[..., 2, :]
        if ring.wrap:
            p_left = p_left.masked_fill(ring.is_first, 0.0)
            p_right = p_right.masked_fill(ring.is_last, 0.0)
        out[:, 1:] += p_left[:, 1:] * v[:, :-1]
        out[:, :-1] += p_right[:, :-1] * v[:, 1:]
        if ring.wrap:
            f, l_ = ring.first, ring.last
            wrapped = torch.stack([p[rows, f, :, 0] * v[rows, l_], p[rows, l_, :, 2] * v[rows, f]], 1)
            out = out.index_put((torch.cat([rows, rows]), torch.cat([f, l_])),
                                wrapped.transpose(0, 1).reshape(2 * B, self.heads, self.head_dim),
                                accumulate=True)
        return self.out_proj(out.reshape(B, n, -1))


class RelayAttention(_Projections):
    """Relay update MultiAtt(s, [s; H]) with padded satellites masked (Alg. 1, line 7)."""

    def forward(self, s, nodes, pad_mask):
        """s: (B, 1, d); nodes: (B, n, d); pad_mask: (B, n) True = pad, or None -> (B, 1, d).

        With a single query the key and value projections of the n satellites are folded
        into the query and the context (exact algebra, no approximation)::

            q_h . (W_K,h h_j + b_K,h) = h_j . (W_K,h^T q_h) + q_h . b_K,h
            sum_j a_hj (W_V,h h_j + b_V,h) = W_V,h (sum_j a_hj h_j) + b_V,h sum_j a_hj

        so the relay costs O(n d H) instead of O(n d^2) and keeps no projected copy of H.
        """
        B, n, d = nodes.shape
        H, dh = self.heads, self.head_dim
        q = self.q_proj(s).view(B, H, dh) * (dh ** -0.5)
        w_k = self.k_proj.weight.view(H, dh, d)
        w_v = self.v_proj.weight.view(H, dh, d)
        b_k, b_v = self.k_proj.bias.view(H, dh), self.v_proj.bias.view(H, dh)
        u = torch.einsum("bhe,hed->bhd", q, w_k)  # W_K,h^T q_h
        scores_nodes = torch.einsum("bnd,bhd->bhn", nodes, u) + (q * b_k).sum(-1, keepdim=True)
        k_s = self.k_proj(s).view(B, H, 1, dh)
        score_relay = torch.matmul(k_s, q.unsqueeze(-1)).squeeze(-1)  # B H 1
        if pad_mask is not None:
            scores_nodes = scores_nodes.masked_fill(pad_mask[:, None, :], float("-inf"))
        probs = _softmax(torch.cat([score_relay, scores_nodes], -1))  # B H 1+n (float32 in half precision)
        probs = F.dropout(probs, self.attention_dropout, self.training)
        p_relay, p_nodes = probs[..., :1], probs[..., 1:]
        context = torch.einsum("bhn,bnd->bhd", p_nodes, nodes)
        out = torch.einsum("bhd,hed->bhe", context, w_v) + b_v * p_nodes.sum(-1, keepdim=True)
        out = out + p_relay * self.v_proj(s).view(B, H, dh)
        return self.out_proj(out.reshape(B, 1, H * dh))


class _FFN(nn.Module):
    def __init__(self, d, ffn_dim, activation):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(d, ffn_dim), nn.Linear(ffn_dim, d), activation

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class StarTransformerCycle(nn.Module):
    """One update step t of Algorithm 1: satellites first, then the relay from the new H^t."""

    def __init__(self, o: StarTransformerOptions, head_dim):
        super().__init__()
        self.o = o
        d = o.encoder_embed_dim
        self.block_dropout = o.dropout if o.star_block_dropout < 0 else o.star_block_dropout
        self.act = ACTIVATIONS[o.star_activation]
        self.ring_attn = RingAttention(d, o.encoder_attention_heads, head_dim, o.attention_dropout)
        self.relay_attn = RelayAttention(d, o.encoder_attention_heads, head_dim, o.attention_dropout)
        self.ring_norm = nn.LayerNorm(d, eps=o.layernorm_eps)
        self.relay_norm = nn.LayerNorm(d, eps=o.layernorm_eps) if not o.star_no_relay_norm else None
        ffn_dim = o.encoder_ffn_embed_dim
        if ffn_dim > 0:
            self.ring_ffn, self.relay_ffn = _FFN(d, ffn_dim, self.act), _FFN(d, ffn_dim, self.act)
            self.ring_ffn_norm = nn.LayerNorm(d, eps=o.layernorm_eps)
            self.relay_ffn_norm = nn.LayerNorm(d, eps=o.layernorm_eps) if not o.star_no_relay_norm else None
        else:
            self.ring_ffn = self.relay_ffn = None

    def _block(self, x, norm, fn):
        """act(f(.)) with the configured norm placement, dropout and optional residual."""
        pre, post = self.o.star_norm_position == "pre", self.o.star_norm_position == "post"
        y = fn(norm(x) if (pre and norm is not None) else x)
        y = F.dropout(self.act(y), self.block_dropout, self.training)
        if self.o.star_residual:
            y = x + y
        return norm(y) if (post and norm is not None) else y

    def _ffn(self, x, ffn, norm):
        pre, post = self.o.star_norm_position == "pre", self.o.star_norm_position == "post"
        y = F.dropout(ffn(norm(x) if (pre and norm is not None) else x), self.block_dropout, self.training)
        y = x + y
        return norm(y) if (post and norm is not None) else y

    def forward(self, nodes, relay, emb, pad_mask, ring):
        # (1) satellites; in pre-norm mode LN is applied to the query and ring keys only
        # (e_i and s enter un-normalised, as in fastNLP)
        nodes = self._block(nodes, self.ring_norm, lambda h: self.ring_attn(h, emb, relay, ring))
        if self.ring_ffn is not None:
            nodes = self._ffn(nodes, self.ring_ffn, self.ring_ffn_norm)
        if pad_mask is not None:
            nodes = nodes.masked_fill(pad_mask.unsqueeze(-1), 0.0)
        # (2) relay, attending over [s^{t-1}; H^t]
        relay = self._block(relay, self.relay_norm, lambda s: self.relay_attn(s, nodes, pad_mask))
        if self.relay_ffn is not None:
            relay = self._ffn(relay, self.relay_ffn, self.relay_ffn_norm)
        return nodes, relay


class StarTransformer(nn.Module):
    """T Star-Transformer cycles over input embeddings (Alg. 1).

    ``forward(x, pad_mask)``: x (B, n, d) token embeddings (projected to ``embed_dim``),
    pad_mask (B, n) bool with True at padding (or None).  Returns ``(nodes, relay)``:
    H^T (B, n, d) with padding zeroed, and s^T (B, d).
    """

    def __init__(self, options):
        """``options``: :class:`StarTransformerOptions` or a config holding them (:meth:`StarTransformerOptions.of`)."""
        super().__init__()
        o = self.options = StarTransformerOptions.of(options)
        if o.star_activation not in ACTIVATIONS:
            raise ValueError(f"--star-activation must be one of {sorted(ACTIVATIONS)}, got {o.star_activation!r}")
        if o.star_norm_position not in ("pre", "post"):
            raise ValueError(f"--star-norm-position must be 'pre' or 'post', got {o.star_norm_position!r}")
        d, heads = o.encoder_embed_dim, o.encoder_attention_heads
        head_dim = o.encoder_head_dim or d // heads
        if head_dim <= 0:
            raise ValueError(f"head dim must be positive (embed_dim={d}, heads={heads})")
        self.head_dim = head_dim
        self.embed_positions = nn.Embedding(o.max_positions, d) if o.max_positions > 0 else None
        self.cycles = nn.ModuleList([StarTransformerCycle(o, head_dim) for _ in range(o.encoder_layers)])
        self.reset_parameters()

    def reset_parameters(self):
        std = self.options.init_std
        for name, p in self.cycles.named_parameters():
            if "norm" in name:
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif std > 0:
                nn.init.normal_(p, 0.0, std)
            else:
                nn.init.xavier_uniform_(p)
        if self.embed_positions is not None:
            nn.init.normal_(self.embed_positions.weight, 0.0, std if std > 0 else 0.02)

    def positions(self, pad_mask, B, n, device):
        """0-based positions counted from each sentence's first real token (left padding safe).

        With right padding (or none) this is ``arange(n)`` at every position, pads included,
        as in fastNLP.
        """
        idx = torch.arange(n, device=device).expand(B, n)
        if pad_mask is None:
            return idx
        leading = (~pad_mask).long().cumsum(1).eq(0).sum(1, keepdim=True)  # leading pads
        return (idx - leading).clamp(min=0)

    def forward(self, x, pad_mask=None):
        """No value is read back to the host (a GPU never waits), unless the input is longer
        than the position table, where the longest sentence is measured for the error."""
        B, n, d = x.shape
        o = self.options
        if self.embed_positions is not None:
            pos = self.positions(pad_mask, B, n, x.device)
            if n > o.max_positions:  # only then can a sentence be too long: measure it
                longest = int(pos.max()) + 1
                if longest > o.max_positions:
                    raise ValueError(
                        f"input of {longest} tokens is longer than the position table "
                        f"(--max-positions {o.max_positions}); raise --max-positions or truncate the data "
                        f"(e.g. --shorten-method truncate)")
            x = x + self.embed_positions(pos)
        emb = F.dropout(x, o.dropout, self.training)  # e_i of the context C_i
        if pad_mask is not None and not o.star_unmasked_relay_init:
            real = (~pad_mask).unsqueeze(-1).to(emb.dtype)
            relay = (emb * real).sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp(min=1)
        else:
            relay = emb.mean(1, keepdim=True)  # s^0 = average(E)
        ring = _Ring(pad_mask, B, n, x.device, not o.star_no_ring_wrap, not o.star_unmasked_ring_pads)
        nodes = emb
        for cycle in self.cycles:
            if o.checkpoint_activations and self.training and torch.is_grad_enabled():
                nodes, relay = checkpoint(cycle, nodes, relay, emb, pad_mask, ring, use_reentrant=False)
            else:
                nodes, relay = cycle(nodes, relay, emb, pad_mask, ring)
        return nodes, relay.squeeze(1)

    @torch.no_grad()
    def load_fastnlp_state(self, fastnlp_module):
        """Copies the weights of a fastNLP ``StarTransformer`` (1×1 Conv2d -> Linear)."""
        src = fastnlp_module
        if self.embed_positions is not None and src.pos_emb is not None:
            self.embed_positions.weight.copy_(src.pos_emb.weight)
        for cyc, ring, star, norm in zip(self.cycles, src.ring_att, src.star_att, src.norm):
            for mine, theirs in ((cyc.ring_attn, ring), (cyc.relay_attn, star)):
                for a, b in (("q_proj", "WQ"), ("k_proj", "WK"), ("v_proj", "WV"), ("out_proj", "WO")):
                    conv = getattr(theirs, b)
                    getattr(mine, a).weight.copy_(conv.weight[:, :, 0, 0])
                    getattr(mine, a).bias.copy_(conv.bias)
            cyc.ring_norm.weight.copy_(norm.weight)
            cyc.ring_norm.bias.copy_(norm.bias)


def star_flops(n, d, layers, heads, inner=None, ffn_dim=0):
    """FLOPs (2 per multiply-add) of one forward pass of a Star-Transformer stack, matrix products only."""
    inner = inner or d
    per_layer = 2 * n * d * inner * 6  # ring: q, k, v, o of h_i + k, v of e_i
    per_layer += 2 * n * inner * 5 * 2  # ring: 5 scores and the weighted sum per position
    per_layer += 2 * n * d * heads * 2  # relay: folded scores and context over n satellites
    per_layer += 2 * n * d * ffn_dim * 2 * 2 if ffn_dim else 0  # satellite FFN (relay FFN is O(d^2))
    return layers * per_layer
