"""Transformer-XL relative positional attention (Dai et al., ACL 2019, Sec. 3.3).

The attention score between query position ``i`` and key position ``j`` is
the sum of four terms (paper Eq. in Sec. 3.3)::

    A_ij = q_i^T k_j          (a) content addressing
         + q_i^T W_kR R_{i-j} (b) content-dependent positional bias
         + u^T k_j            (c) global content bias
         + v^T W_kR R_{i-j}   (d) global positional bias

computed as in the official code (``RelPartialLearnableMultiHeadAttn``):
``(a)+(c) = (q + u) k^T`` and ``(b)+(d) = rel_shift((q + v) (W_kR R)^T)``,
the sum scaled by ``1/sqrt(d_head)``.  ``R`` is the sinusoid of
:class:`RelativeSinusoid` (no parameters), evaluated at the distances
``klen-1, ..., 0``.  Keys and values are computed from ``[SG(memory) ∘ h]``
(Sec. 3.2); queries only from ``h``.  Projections have no bias; the output
goes through dropout, the residual connection and LayerNorm (post-norm,
the reference default) or the LayerNorm is applied to the inputs
(``pre_norm``).

Reconstruction decisions
------------------------
1. *Queries only for the segment.*  The fused ``qkv_net`` weight keeps the reference layout, but its query
   part is applied to the segment only (the reference also projects the memory rows and discards them).  The
   memory rows' keys/values are projected apart from the segment's: the memory is detached, so their
   backward is the weight gradient only (the reference back-propagates into the concatenated input, memory
   rows included, for nothing).  Same results.
2. *rel_shift without copies.*  :func:`rel_shift` keeps the reference form (pad, reinterpret, slice); the
   attention uses :func:`shifted_position_scores`, which gets the zero column from the matmul itself (``W_kR R``
   with a zero row in front) and reads the shifted scores as a slice of that buffer.  In training the scale
   and the mask are applied in one pass; in evaluation the scale goes on the queries and the mask is written
   only into the columns that can hold hidden keys (:func:`hidden_key_columns`).  Same values and gradients.
3. *same_length only with memory*: with ``mem_len == 0`` the reference's ``same_length`` window would hide
   every key, so :func:`attention_mask` applies it only when ``mem_len > 0``.
4. *Mixed precision.*  The frequencies and angles of ``R`` are computed in float32 (not a buffer that
   ``model.half()`` would cast: in bfloat16 the angle of a distance of 700 is off by up to 1.2) and ``R``
   is cast to the model's dtype once; ``R`` has no parameters, so evaluation keeps it per (length, clamp,
   dtype, device).  The attention softmax of a half-precision model runs in float32; ``u``, ``v`` and
   ``W_kR R`` follow the queries' dtype and the mask the scores' dtype, so ``torch.autocast`` works.

Tensors are batch-first here: hidden states ``(B, T, C)``, memory
``(B, M, C)``, scores ``(B, H, T, M+T)``.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fairseq.modules import FairseqDropout


class RelativeSinusoid(nn.Module):
    """The relative position matrix ``R`` of the paper (Sec. 3.3).

    Like the reference: the frequencies are ``1/10000^(2k/d)`` and the
    encoding is the concatenation ``[sin | cos]`` (not interleaved).
    Distances larger than ``clamp_len`` (when > 0) are clamped.  Computed in
    float32 and cast to ``dtype`` at the end, kept per (length, clamp, dtype,
    device) in evaluation (decision 4 of the module docstring).
    """

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, klen: int, clamp_len: int = -1, dtype=None, device=None):
        if self.training:
            return self._compute(klen, clamp_len, dtype, device)
        key = (klen, clamp_len, dtype, device)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            if len(cache) >= 8:
                cache.clear()
            cache[key] = self._compute(klen, clamp_len, dtype, device)
        return cache[key]

    def _compute(self, klen, clamp_len, dtype, device):
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, self.dim, 2.0, device=device) / self.dim))
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=device)
        if clamp_len > 0:
            pos_seq = pos_seq.clamp(max=clamp_len)
        angles = torch.outer(pos_seq, inv_freq)
        out = torch.cat([angles.sin(), angles.cos()], dim=-1)
        return out if dtype is None else out.to(dtype)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """The reference's ``_rel_shift`` on the last two dims ``(qlen, klen)``.

    With the relative encodings ordered from distance ``klen-1`` down to 0,
    the output at ``[i, j]`` holds distance ``(mlen + i) - j`` for every
    ``j <= mlen + i``; the other entries are junk that the causal mask hides.
    (Reference form, kept for reading and tests; the attention computes the
    same numbers without the copies, see :func:`shifted_position_scores`.)
    """
    *lead, qlen, klen = x.shape
    padded = F.pad(x, (1, 0))  # zero column in front of the key axis
    padded = padded.view(*lead, klen + 1, qlen)
    return padded[..., 1:, :].reshape(*lead, qlen, klen)


def shifted_position_scores(q: torch.Tensor, r_k: torch.Tensor) -> torch.Tensor:
    """``rel_shift(q @ r_k[:, 1:]^T)`` without the reference's two copies.

    ``q``: (B, H, T, D); ``r_k``: (H, K+1, D), the position keys with a zero
    row in front (:func:`pad_position_keys`).  The reference pads a zero
    column in front of the scores and reinterprets the buffer; here the zero
    column comes out of the matmul itself, and the shift is a view of that
    buffer: element ``[i, j]`` of the result is flat element ``T + i·K + j``
    of the (T, K+1) block, so the result is the slice ``[T, T + T·K)`` of the
    flattened block read as (T, K) -- no copy.  Same values as
    :func:`rel_shift` (tested), including the junk entries above the causal
    diagonal.
    """
    B, H, T, _ = q.shape
    K = r_k.size(-2) - 1
    padded = torch.matmul(q, r_k.transpose(-1, -2))  # (B, H, T, K+1), column 0 is zero
    return padded.flatten(-2)[..., T:T + T * K].unflatten(-1, (T, K))


def pad_position_keys(position_keys: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``W_kR R`` (K, H·D) as (H, K+1, D) with a zero row in front of each head's keys: the zero column
    that :func:`shifted_position_scores` shifts in, in the layout its matrix product reads fastest."""
    K = position_keys.size(0)
    padded = F.pad(position_keys, (0, 0, 1, 0)).view(K + 1, num_heads, -1)
    return padded.transpose(0, 1).contiguous()


def attention_mask(qlen: int, mlen: int, mem_len: int, same_length: bool, device=None) -> torch.Tensor:
    """Boolean ``(qlen, mlen+qlen)`` mask, True where a key is hidden.

    Standard: query ``i`` sees keys ``j <= i + mlen`` (causal over memory +
    segment).  ``same_length`` (used by the reference at evaluation): every
    query sees the same number of keys, ``mem_len``, ending at itself -- the
    reference's ``triu(1+mlen) + tril(-mask_shift_len)`` window.  It is only
    applied when ``mem_len > 0`` (with ``mem_len == 0`` the reference's
    window would hide every key).
    """
    klen = mlen + qlen
    ones = torch.ones(qlen, klen, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + mlen)
    if same_length and mem_len > 0:
        mask_len = klen - mem_len
        mask_shift_len = qlen - mask_len if mask_len > 0 else qlen
        mask = mask | torch.tril(ones, diagonal=-mask_shift_len)
    return mask


def additive_mask(mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The boolean mask of :func:`attention_mask` as 0 / -inf to add to the scores."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


def hidden_key_columns(qlen: int, mlen: int, mem_len: int, same_length: bool) -> Tuple[int, int]:
    """``(a, b)``: every hidden key of :func:`attention_mask` lies in a column ``< a`` or ``>= b`` (computed
    from the lengths, no look at the mask), so evaluation writes the mask into those columns only."""
    klen = mlen + qlen
    a = 0
    if same_length and mem_len > 0:
        mask_len = klen - mem_len
        a = max(0, qlen - (qlen - mask_len if mask_len > 0 else qlen))
    a = min(a, klen)
    return a, max(a, min(mlen + 1, klen))


class RelativeMultiheadAttention(nn.Module):
    """One Transformer-XL attention sub-layer (attention + residual + LayerNorm).

    ``r_w_bias`` (u) and ``r_r_bias`` (v) are either this layer's own
    parameters (``untie_r``) or shared ones passed in by the decoder.
    Parameters keep the reference's layout: ``qkv_net`` is one fused
    ``(3·H·D, C)`` projection without bias, ``r_net`` ``(H·D, C)`` and
    ``o_net`` ``(C, H·D)``, all without bias.
    """

    def __init__(self, embed_dim, num_heads, head_dim, dropout=0.0, attention_dropout=0.0,
                 pre_norm=False, layer_norm_eps=1e-5, own_biases=True):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        inner = num_heads * head_dim
        self.qkv_net = nn.Linear(embed_dim, 3 * inner, bias=False)
        self.r_net = nn.Linear(embed_dim, inner, bias=False)
        self.o_net = nn.Linear(inner, embed_dim, bias=False)
        self.layer_norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.dropout = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.attention_dropout = attention_dropout
        self.attn_dropout = FairseqDropout(attention_dropout, module_name=self.__class__.__name__)
        self.pre_norm = pre_norm
        self.scale = 1.0 / math.sqrt(head_dim)
        if own_biases:
            self.r_w_bias = nn.Parameter(torch.zeros(num_heads, head_dim))
            self.r_r_bias = nn.Parameter(torch.zeros(num_heads, head_dim))
        else:
            self.r_w_bias = self.r_r_bias = None

    def forward(self, h, r, mask, memory: Optional[torch.Tensor] = None,
                r_w_bias: Optional[torch.Tensor] = None, r_r_bias: Optional[torch.Tensor] = None,
                memory_kv: Optional[torch.Tensor] = None, position_keys: Optional[torch.Tensor] = None,
                mask_columns: Optional[Tuple[int, int]] = None):
        """``h``: (B, T, C) segment; ``r``: (K, C) relative encodings for the
        ``K = M + T`` keys; ``mask``: (T, K) bool, True where a key is hidden; ``memory``: (B, M, C) or None.

        ``memory_kv`` (B, M, 2·H·D) and ``position_keys`` (H, K+1, D): the key/value projections of
        ``memory`` and ``W_kR R`` (:func:`pad_position_keys`) from an earlier call of the same pass
        (evaluation/generation only, see ``TransformerXLDecoder``); they are then not recomputed.
        ``mask_columns``: :func:`hidden_key_columns` of ``mask`` (only those columns are masked at evaluation).  Returns the output
        (B, T, C), the key/value projections of memory + segment (B, K, 2·H·D) and the padded ``W_kR R``."""
        u = self.r_w_bias if self.r_w_bias is not None else r_w_bias
        v = self.r_r_bias if self.r_r_bias is not None else r_r_bias
        B, T, _ = h.shape
        H, D = self.num_heads, self.head_dim
        M = 0 if memory is None else memory.size(1)
        K = M + T
        h_in = self.layer_norm(h) if self.pre_norm else h
        w = self.qkv_net.weight
        w_kv = w[H * D:]
        # queries only for the segment; keys and values for memory + segment.  The memory rows are
        # projected on their own: they are detached, so their backward is only the weight gradient (the
        # reference projects cat(memory, h) and back-propagates into the memory rows for nothing).
        # LayerNorm is per row, so pre-norm's LN(cat(memory, h)) = cat(LN(memory), h_in).
        q = F.linear(h_in, w[: H * D]).view(B, T, H, D).transpose(1, 2)
        kv_new = F.linear(h_in, w_kv)
        if M == 0:
            kv_flat = kv_new
        elif memory_kv is not None and memory_kv.size(1) == M:
            kv_flat = torch.cat([memory_kv, kv_new], dim=1)
        else:
            kv_mem = F.linear(self.layer_norm(memory) if self.pre_norm else memory, w_kv)
            kv_flat = torch.cat([kv_mem, kv_new], dim=1)
        kv = kv_flat.view(B, K, 2, H, D)
        k, val = (x.transpose(1, 2) for x in kv.unbind(2))  # (unbind: its backward is one stack, no zero fill)
        if position_keys is None or position_keys.size(1) != K + 1:
            position_keys = pad_position_keys(self.r_net(r), H)  # W_kR R, (H, K+1, D), a zero row in front

        # (b)+(d): (q + v) W_kR R, shifted so that column j holds distance i-j (rel_shift), scaled and masked
        # (u and v are cast to the queries' dtype: under autocast the projections are bfloat16/float16)
        q_v = q + v.to(q.dtype).unsqueeze(1)
        # (a)+(c): (q + u) k^T, scaled, plus the positional bias, softmax, dropatt
        q_u = q + u.to(q.dtype).unsqueeze(1)
        if torch.is_grad_enabled() or self.training:  # (training: the same path when recomputed by
            # --checkpoint-activations, whose forward has no autograd)
            bd = shifted_position_scores(q_v, position_keys.to(q.dtype))  # (B, H, T, K), a view of the product
            bias = torch.add(additive_mask(mask, bd.dtype), bd, alpha=self.scale)  # one pass: scale, mask, copy
            attn = self._attend(q_u, k, val, bias)
        else:  # (evaluation without autograd: the scale on the queries, the mask written into the product's
            # columns that hold hidden keys, the fused kernel)
            bias = shifted_position_scores(q_v * self.scale, position_keys.to(q.dtype))
            a, b = (K, K) if mask_columns is None else mask_columns
            bias[..., :a].masked_fill_(mask[:, :a], float("-inf"))
            bias[..., b:].masked_fill_(mask[:, b:], float("-inf"))
            attn = F.scaled_dot_product_attention(q_u, k, val, attn_mask=bias, scale=self.scale)
        out = self.o_net(attn.transpose(1, 2).reshape(B, T, H * D))
        out = self.dropout(out)
        return (h + out if self.pre_norm else self.layer_norm(h + out)), kv_flat, position_keys

    def _attend(self, q_u, k, val, bias):
        """``softmax(scale·(q_u k^T) + bias) val`` with dropatt: what ``scaled_dot_product_attention``
        computes, written out for training.  The bias (mask + scaled positional term) is a fresh tensor
        and the content term is accumulated into it by the matmul itself (``baddbmm_``: the scale is
        the GEMM's alpha); on CPU, SDPA with a mask that needs a gradient takes its reference path, which
        scales q and k in two extra passes and checks for fully masked rows (never the case here: a
        query always sees itself)."""
        B, H, T, D = q_u.shape
        K = k.size(2)
        scores = bias.view(B * H, T, K).baddbmm_(q_u.reshape(B * H, T, D), k.reshape(B * H, K, D).transpose(1, 2),
                                                  alpha=self.scale)
        if scores.dtype == torch.float32:
            probs = torch.softmax(scores, dim=-1)
        else:  # (half precision: the softmax in float32)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(val.dtype)
        probs = self.attn_dropout(probs)
        return torch.bmm(probs, val.reshape(B * H, K, D)).view(B, H, T, D)


class PositionwiseFF(nn.Module):
    """Position-wise feed-forward sub-layer with residual and LayerNorm (post- or pre-norm)."""

    def __init__(self, embed_dim, ffn_dim, dropout=0.0, pre_norm=False, layer_norm_eps=1e-5):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.layer_norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.dropout = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.pre_norm = pre_norm

    def forward(self, x):
        y = self.layer_norm(x) if self.pre_norm else x
        y = self.dropout(self.fc2(self.dropout(F.relu(self.fc1(y)))))
        return x + y if self.pre_norm else self.layer_norm(x + y)


class TransformerXLLayer(nn.Module):
    """``RelPartialLearnableDecoderLayer``: relative attention then feed-forward."""

    def __init__(self, embed_dim, num_heads, head_dim, ffn_dim, dropout=0.0, attention_dropout=0.0,
                 pre_norm=False, layer_norm_eps=1e-5, own_biases=True):
        super().__init__()
        self.attn = RelativeMultiheadAttention(embed_dim, num_heads, head_dim, dropout, attention_dropout,
                                               pre_norm, layer_norm_eps, own_biases)
        self.ff = PositionwiseFF(embed_dim, ffn_dim, dropout, pre_norm, layer_norm_eps)

    def forward(self, h, r, mask, memory=None, r_w_bias=None, r_r_bias=None, memory_kv=None, position_keys=None,
                mask_columns=None):
        """Returns the layer output and the attention's key/value projections of memory + segment
        and ``W_kR R`` (see :meth:`RelativeMultiheadAttention.forward`)."""
        out, kv, position_keys = self.attn(h, r, mask, memory, r_w_bias, r_r_bias, memory_kv, position_keys,
                                           mask_columns)
        if self.training:  # (only evaluation reuses them; no extra outputs for --checkpoint-activations)
            return self.ff(out), None, None
        return self.ff(out), kv, position_keys
