"""Star-Transformer encoder (Guo et al., NAACL 2019, arXiv 1902.09113), linear in the length.

Where the paper's ideas live
----------------------------
n satellite nodes on a ring plus one relay node that every satellite talks to (paper Fig. 1, Sec. 2
"Implementation"/"Update", Algorithm 1)::

    H^0 = E,  s^0 = average(E)                              # E: token + learned position embeddings
    for t = 1..T:                                            # separate parameters per step
        C_i^t = [h_{i-1}^{t-1}; h_i^{t-1}; h_{i+1}^{t-1}; e_i; s^{t-1}]
        h_i^t = LayerNorm(ReLU(MultiAtt(h_i^{t-1}, C_i^t)))   # (1) satellites, all i in parallel
        s^t   = LayerNorm(ReLU(MultiAtt(s^{t-1}, [s^{t-1}; H^t])))  # (2) relay, uses the new H^t

Satellite update (1): :class:`RingAttention` (the reference, plain autograd) or :class:`FusedRingAttention`
(``star_ring_core="fused"``, the default: the same outputs and gradients from :mod:`.star_ring_core`, which
keeps about 2 n·d values per cycle for the backward pass instead of about 8 n·d).  Relay update (2):
:class:`RelayAttention`.  One step with its norm, activation and optional FFN: :class:`StarTransformerCycle`;
the T steps: :class:`StarTransformer` (``checkpoint_activations`` recomputes each whole cycle in the backward
pass, keeping about one n×d tensor per cycle).

Cost (paper, "Comparison to the standard Transformer"): O(5nd) for the ring, O(nd) for the relay.  The ring's
scores are a (B, n, H, 5) tensor (the neighbours' keys read by shifting the projected keys along the
sequence, no n×n tensor); the relay's single query is folded into its key and value projections (O(n d H),
no projected copy of H).

Reconstruction decisions
------------------------
The paper and the two public implementations (fastNLP, Tencent's NeuralClassifier) differ in the details
below.  Each is a field of :class:`StarTransformerOptions` (the fairseq flag of the same name); the default
follows the paper's text with padding-invariant outputs, and :data:`FASTNLP` holds the settings that
reproduce fastNLP 1.0.1's ``StarTransformer``.

1. *Closed ring, per sentence* (``star_no_ring_wrap``).  "The first and last nodes are also connected"
   (Sec. 2): the first real token's left neighbour is the sentence's last real token, whatever the padding.
   fastNLP and NeuralClassifier leave the ring open.
2. *Padded and missing neighbours are masked* (``star_unmasked_ring_pads``): score −inf, so a sentence's
   outputs do not depend on the batch it is in.  fastNLP: the ends of the sequence see a zero key/value
   (score 0, still taking softmax mass) and pad satellites (zeroed after every update) are ordinary
   neighbours.
3. *Norm placement* (``star_norm_position``): ``post`` = the paper, LN(act(MultiAtt(h, C))); ``pre`` =
   fastNLP, act(MultiAtt(LN(h), C)) with LN on the query and the ring keys only (e_i and s un-normalised).
4. *Relay norm* (``star_no_relay_norm``): the paper normalises the relay, fastNLP does not.
5. *Activation* (``star_activation``): ``relu`` (paper) or ``leaky_relu`` (fastNLP, slope 0.01).
6. *Relay initialisation* (``star_unmasked_relay_init``): s^0 is the mean over the real tokens (default) or
   over all positions, padding included (fastNLP).
7. *Positions* are counted from each sentence's first real token (:meth:`StarTransformer.positions`), so
   left padding is safe; input longer than the position table is an error naming ``--max-positions``.
8. *Head size* (``encoder_head_dim``): ``d // heads`` by default; fastNLP's 1×1-conv projections map d →
   heads·head_dim with any head_dim.
9. *Dropout placement* (``star_block_dropout``): the paper does not say where.  NeuralClassifier drops each
   block's activation output before the LayerNorm (default: the ``dropout`` rate), fastNLP only the input
   embeddings (``star_block_dropout=0``).
10. *Deeper stacks* (not in the paper; the first author's advice, fastNLP issue #267): ``star_residual``,
    ``encoder_ffn_embed_dim`` (> 0 adds a position-wise FFN sub-layer to satellites and relay) and
    ``init_std`` (> 0: all projections ~ N(0, init_std), biases 0; fastNLP uses 0.05).

The heads on top of the encoder (sentence vector, NLI features) are :mod:`user_dir.models.star_transformer`'s.
"""
from dataclasses import dataclass, field, fields
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.utils import safe_getattr
from torch import nn
from torch.utils.checkpoint import checkpoint

from .star_ring_core import (BLOCK_ROWS, LEFT, RIGHT, RingNeighbours, fused_ring_attention, head_dot,
                             softmax)

ACTIVATION_CHOICES = ChoiceEnum(["relu", "leaky_relu"])
NORM_CHOICES = ChoiceEnum(["post", "pre"])
RING_CORE_CHOICES = ChoiceEnum(["fused", "reference"])


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
    star_ring_core: RING_CORE_CHOICES = field(default="fused", metadata={
        "help": "ring attention: fused (hand-written backward, ~1/4 of the activation memory) or reference "
                "(plain autograd); same outputs and gradients"})

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


class RingAttention(_Projections):
    """Satellite update MultiAtt(h_i, C_i) with C_i = [h_{i-1}; h_i; h_{i+1}; e_i; s] (Alg. 1, line 5).

    This is the reference: the paper's update in plain autograd ops.  :class:`FusedRingAttention`
    computes the same outputs and gradients keeping far less for the backward pass.
    """

    def _split(self, x):
        return x.view(*x.shape[:-1], self.heads, self.head_dim)

    def forward(self, h, emb, relay, ring: RingNeighbours):
        """h, emb: (B, n, d); relay: (B, 1, d) -> (B, n, d)."""
        B, n, _ = h.shape
        batch = torch.arange(B, device=h.device)
        # queries of the satellites; keys and values of the five context entries, each projected once
        q = self._split(self.q_proj(h)) * (self.head_dim ** -0.5)  # B n H dh
        k, v = self._split(self.k_proj(h)), self._split(self.v_proj(h))
        k_emb, v_emb = self._split(self.k_proj(emb)), self._split(self.v_proj(emb))
        k_relay, v_relay = self._split(self.k_proj(relay)), self._split(self.v_proj(relay))  # B 1 H dh

        # scores of h_i, e_i and s; the neighbours h_{i-1}, h_{i+1} by shifting along the sequence
        # (score 0 at the open ends, as a zero key)
        score_self, score_emb, score_relay = head_dot(q, k), head_dot(q, k_emb), head_dot(q, k_relay)
        score_left = F.pad(head_dot(q[:, 1:], k[:, :-1]), (0, 0, 1, 0))
        score_right = F.pad(head_dot(q[:, :-1], k[:, 1:]), (0, 0, 0, 1))
        if ring.wrap:  # closed ring: a sentence's first real token <-> its last real token
            first, last = ring.first, ring.last
            score_left = score_left.index_put((batch, first), head_dot(q[batch, first], k[batch, last]))
            score_right = score_right.index_put((batch, last), head_dot(q[batch, last], k[batch, first]))
        if ring.left_missing is not None:  # padding / beyond an open end
            score_left = score_left.masked_fill(ring.left_missing, float("-inf"))
            score_right = score_right.masked_fill(ring.right_missing, float("-inf"))

        # softmax over the five slots [left, self, right, e_i, s]
        weights = softmax(torch.stack([score_left, score_self, score_right, score_emb, score_relay], -1))
        weights = F.dropout(weights, self.attention_dropout, self.training).unsqueeze(-1)  # B n H 5 1
        w_left, w_self, w_right, w_emb, w_relay = weights.unbind(-2)

        # weighted sum of the values, the neighbours again by shifting
        out = w_self * v + w_emb * v_emb + w_relay * v_relay
        if ring.wrap:  # the wrapped slots take the partner's value below, not the shifted one
            w_left = w_left.masked_fill(ring.is_first, 0.0)
            w_right = w_right.masked_fill(ring.is_last, 0.0)
        out[:, 1:] += w_left[:, 1:] * v[:, :-1]
        out[:, :-1] += w_right[:, :-1] * v[:, 1:]
        if ring.wrap:
            first, last = ring.first, ring.last
            wrapped = torch.stack([weights[batch, first, :, LEFT] * v[batch, last],
                                   weights[batch, last, :, RIGHT] * v[batch, first]], 1)
            out = out.index_put((torch.cat([batch, batch]), torch.cat([first, last])),
                                wrapped.transpose(0, 1).reshape(2 * B, self.heads, self.head_dim), accumulate=True)
        return self.out_proj(out.reshape(B, n, -1))


class FusedRingAttention(RingAttention):
    """:class:`RingAttention` through the fused core (:mod:`.star_ring_core`): same outputs and gradients,
    about a quarter of the activation memory; inputs longer than ``block_rows`` run in blocks."""

    def __init__(self, embed_dim, heads, head_dim, attention_dropout=0.0, block_rows=BLOCK_ROWS):
        super().__init__(embed_dim, heads, head_dim, attention_dropout)
        self.block_rows = block_rows

    def forward(self, h, emb, relay, ring: RingNeighbours):
        return fused_ring_attention(h, emb, relay, self.q_proj, self.k_proj, self.v_proj, self.out_proj, ring,
                                    self.heads, self.head_dim, self.attention_dropout, self.training,
                                    self.block_rows)


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
        probs = softmax(torch.cat([score_relay, scores_nodes], -1))  # B H 1+n (float32 in half precision)
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

    def __init__(self, options: StarTransformerOptions, head_dim, ring_block_rows=BLOCK_ROWS):
        super().__init__()
        self.options = options
        d = options.encoder_embed_dim
        self.block_dropout = options.dropout if options.star_block_dropout < 0 else options.star_block_dropout
        self.act = ACTIVATIONS[options.star_activation]
        heads, attention_dropout = options.encoder_attention_heads, options.attention_dropout
        if options.star_ring_core == "fused":
            self.ring_attn = FusedRingAttention(d, heads, head_dim, attention_dropout, block_rows=ring_block_rows)
        else:
            self.ring_attn = RingAttention(d, heads, head_dim, attention_dropout)
        self.relay_attn = RelayAttention(d, heads, head_dim, attention_dropout)
        self.ring_norm = nn.LayerNorm(d, eps=options.layernorm_eps)
        self.relay_norm = None if options.star_no_relay_norm else nn.LayerNorm(d, eps=options.layernorm_eps)
        ffn_dim = options.encoder_ffn_embed_dim
        if ffn_dim > 0:
            self.ring_ffn, self.relay_ffn = _FFN(d, ffn_dim, self.act), _FFN(d, ffn_dim, self.act)
            self.ring_ffn_norm = nn.LayerNorm(d, eps=options.layernorm_eps)
            self.relay_ffn_norm = None if options.star_no_relay_norm else nn.LayerNorm(d, eps=options.layernorm_eps)
        else:
            self.ring_ffn = self.relay_ffn = None

    def _block(self, x, norm, fn):
        """act(f(.)) with the configured norm placement, dropout and optional residual."""
        pre, post = self.options.star_norm_position == "pre", self.options.star_norm_position == "post"
        y = fn(norm(x) if (pre and norm is not None) else x)
        y = F.dropout(self.act(y), self.block_dropout, self.training)
        if self.options.star_residual:
            y = x + y
        return norm(y) if (post and norm is not None) else y

    def _ffn(self, x, ffn, norm):
        pre, post = self.options.star_norm_position == "pre", self.options.star_norm_position == "post"
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

    def __init__(self, options, ring_block_rows=BLOCK_ROWS):
        """``options``: :class:`StarTransformerOptions` or a config holding them (:meth:`StarTransformerOptions.of`);
        ``ring_block_rows``: block size of the fused ring core (:mod:`.star_ring_core`)."""
        super().__init__()
        o = self.options = StarTransformerOptions.of(options)
        if o.star_activation not in ACTIVATIONS:
            raise ValueError(f"--star-activation must be one of {sorted(ACTIVATIONS)}, got {o.star_activation!r}")
        if o.star_norm_position not in ("pre", "post"):
            raise ValueError(f"--star-norm-position must be 'pre' or 'post', got {o.star_norm_position!r}")
        if o.star_ring_core not in ("fused", "reference"):
            raise ValueError(f"--star-ring-core must be 'fused' or 'reference', got {o.star_ring_core!r}")
        d, heads = o.encoder_embed_dim, o.encoder_attention_heads
        head_dim = o.encoder_head_dim or d // heads
        if head_dim <= 0:
            raise ValueError(f"head dim must be positive (embed_dim={d}, heads={heads})")
        self.head_dim = head_dim
        self.embed_positions = nn.Embedding(o.max_positions, d) if o.max_positions > 0 else None
        self.cycles = nn.ModuleList([StarTransformerCycle(o, head_dim, ring_block_rows)
                                     for _ in range(o.encoder_layers)])
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
        ring = RingNeighbours(pad_mask, B, n, x.device, not o.star_no_ring_wrap, not o.star_unmasked_ring_pads)
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
