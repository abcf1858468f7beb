"""Adaptive input embedding and projected adaptive log-softmax of Transformer-XL.

Parameterised exactly as the official code (``AdaptiveEmbedding`` and
``utils/proj_adaptive_softmax.py::ProjectedAdaptiveLogSoftmax``), so weights
map one-to-one to the reference checkpoints.  fairseq's own
``AdaptiveInput``/``AdaptiveSoftmax`` (Baevski & Auli) cannot be reused:
they scale per band, project differently and order the tail clusters
differently, so the reference weights would not map onto them.

The vocabulary is split by ``cutoffs`` into a head ``[0, c0)`` and tail
clusters ``[c_{i-1}, c_i)``.  Cluster ``i`` has dimension
``d_embed // div_val**i`` and is projected to ``d_proj`` (= d_model) by
``projs[i]`` of shape ``(d_proj, d_i)``; with ``div_val == 1`` there is one
embedding table and one (optional, only when ``d_embed != d_proj``)
projection.  Embeddings are multiplied by ``sqrt(d_proj)``.  The softmax
head scores the shortlist plus one logit per tail cluster.

Reconstruction decisions
------------------------
1. *Tail-cluster order*: as the official code, the probability of tail cluster ``i`` (1-based) is read from
   head column ``-i`` (the cluster rows are in reverse order).  HuggingFace's port (4.35.2) reads column
   ``c0 + i - 1``; :func:`hf_cluster_rows` flips the rows when importing its weights.
2. *Adaptive input with* ``div_val > 1``: every band looks up every token (indices clamped into the band,
   other bands' rows zeroed), the bands' small vectors side by side are projected by one matmul with the
   bands' projections side by side.  The reference's sums, without its per-band ``nonzero()`` (a host sync)
   and without an (N, d_proj) tensor per band.
3. *Output bands with* ``div_val == 1`` are one ``split`` of the single output layer, shared by all bands of a
   call: its backward writes the (V, d) gradient once, where a slice per band would zero-fill a (V, d)
   gradient per band.  Same values and gradients.
4. *Float32 log-softmax* whatever the model's dtype (as fairseq's ``utils.log_softmax``): ``log_prob`` and
   ``nll`` return float32.
5. *Target-only training loss* (:meth:`ProjectedAdaptiveLogSoftmax.nll`, used by ``--criterion
   projected_adaptive_loss``): the head band for every position, each tail cluster only for the positions
   whose target falls in it, as the reference's training loss; no (N, V) tensor.  Selecting a cluster's
   positions reads their count back to the host (a data-dependent shape), in the criterion, not in the
   model's forward.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn


def band_edges(n_token: int, cutoffs: List[int]) -> List[int]:
    return [0] + list(cutoffs) + [n_token]


def check_cutoffs(cutoffs, n_token):
    cutoffs = list(cutoffs)
    if any(c <= 0 for c in cutoffs) or sorted(set(cutoffs)) != cutoffs:
        raise ValueError(f"--cutoffs must be strictly increasing positive integers, got {cutoffs}")
    if cutoffs and cutoffs[-1] >= n_token:
        raise ValueError(f"--cutoffs {cutoffs}: every cutoff must be smaller than the vocabulary size {n_token}")
    return cutoffs


class AdaptiveEmbedding(nn.Module):
    """The reference ``AdaptiveEmbedding`` (adaptive input, Sec. 4 of the paper's setup)."""

    def __init__(self, n_token, d_embed, d_proj, cutoffs, div_val=1):
        super().__init__()
        self.n_token, self.d_embed, self.d_proj, self.div_val = n_token, d_embed, d_proj, div_val
        self.edges = band_edges(n_token, check_cutoffs(cutoffs, n_token))
        self.emb_scale = d_proj ** 0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(n_token, d_embed))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.zeros(d_proj, d_embed)))
        else:
            for i in range(len(self.edges) - 1):
                d_i = d_embed // (div_val ** i)
                if d_i < 1:
                    raise ValueError(f"--div-val {div_val}: cluster {i} would have dimension "
                                     f"{d_embed} // {div_val}**{i} = 0; use a smaller --div-val")
                self.emb_layers.append(nn.Embedding(self.edges[i + 1] - self.edges[i], d_i))
                self.emb_projs.append(nn.Parameter(torch.zeros(d_proj, d_i)))

    def forward(self, tokens):
        if self.div_val == 1:
            emb = self.emb_layers[0](tokens)
            if len(self.emb_projs) > 0:
                emb = F.linear(emb, self.emb_projs[0])
            return emb * self.emb_scale
        # div_val > 1: every band looks up every token (indices clamped into the band, rows of the
        # other bands zeroed), the bands' (N, d_i) vectors side by side, then one projection by the
        # bands' projections side by side.  Same sums as projecting each band's tokens apart, with
        # no data-dependent shapes (no ``nonzero``, no host sync) and no (N, d_proj) tensor per band.
        flat = tokens.reshape(-1)
        parts = []
        for i, (lo, hi) in enumerate(zip(self.edges[:-1], self.edges[1:])):
            outside = (flat < lo) | (flat >= hi)
            emb_i = self.emb_layers[i]((flat - lo).clamp(0, hi - lo - 1))
            parts.append(emb_i.masked_fill(outside.unsqueeze(1), 0.0))
        out = F.linear(torch.cat(parts, dim=1), torch.cat(list(self.emb_projs), dim=1))
        return (out * self.emb_scale).view(*tokens.shape, self.d_proj)


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """The reference ``ProjectedAdaptiveLogSoftmax`` (adaptive softmax with projections).

    ``tie_weight`` shares the output word vectors with ``embedding``;
    ``tie_projs[i]`` shares projection ``i`` with the embedding's (``div_val
    == 1``: its single projection).  Output biases are always own parameters.
    """

    def __init__(self, n_token, d_embed, d_proj, cutoffs, div_val=1, embedding: Optional[AdaptiveEmbedding] = None,
                 tie_weight=True, tie_projs=()):
        super().__init__()
        self.n_token, self.d_embed, self.d_proj, self.div_val = n_token, d_embed, d_proj, div_val
        self.edges = band_edges(n_token, check_cutoffs(cutoffs, n_token))
        self.n_clusters = len(self.edges) - 2
        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        n_bands = len(self.edges) - 1
        tie_projs = list(tie_projs) + [False] * (n_bands - len(tie_projs))
        if (tie_weight or any(tie_projs)) and embedding is None:
            raise ValueError("tying needs the input embedding")

        self.out_layers = nn.ModuleList()
        if div_val == 1:
            self.out_layers.append(nn.Linear(d_embed, n_token))
        else:
            for i in range(n_bands):
                self.out_layers.append(nn.Linear(d_embed // (div_val ** i), self.edges[i + 1] - self.edges[i]))
        if tie_weight:
            for layer, emb in zip(self.out_layers, embedding.emb_layers):
                layer.weight = emb.weight

        # projections: own parameter, tied to the embedding's, or none (identity)
        self.out_projs = nn.ParameterList()
        self._proj_source = []  # per band: ("own", k) | ("emb", k) | None
        for i in range(n_bands):
            d_i = d_embed if div_val == 1 else d_embed // (div_val ** i)
            if div_val == 1 and d_proj == d_embed:
                self._proj_source.append(None)
            elif tie_projs[i]:
                self._proj_source.append(("emb", 0 if div_val == 1 else i))
            else:
                self._proj_source.append(("own", len(self.out_projs)))
                self.out_projs.append(nn.Parameter(torch.zeros(d_proj, d_i)))
        # keep a reference (not a submodule: its parameters belong to the decoder)
        self._embedding = [embedding]

    def proj(self, i) -> Optional[torch.Tensor]:
        src = self._proj_source[i]
        if src is None:
            return None
        kind, k = src
        return self.out_projs[k] if kind == "own" else self._embedding[0].emb_projs[k]

    def _bands(self):
        """Weight, bias and projection of every band; band 0 includes the cluster logits.

        With one output layer (``div_val == 1``) the bands are one ``split`` of it (decision 3 of the
        module docstring)."""
        if self.div_val == 1:
            weight, bias = self.out_layers[0].weight, self.out_layers[0].bias
            if self.n_clusters == 0:
                weights, biases = [weight], [bias]
            else:
                sizes = [hi - lo for lo, hi in zip(self.edges[:-1], self.edges[1:])]
                weights, biases = weight.split(sizes), bias.split(sizes)
        else:
            weights = [layer.weight for layer in self.out_layers]
            biases = [layer.bias for layer in self.out_layers]
        bands = []
        for i, (weight, bias) in enumerate(zip(weights, biases)):
            if i == 0 and self.n_clusters > 0:
                weight = torch.cat([weight, self.cluster_weight], dim=0)
                bias = torch.cat([bias, self.cluster_bias], dim=0)
            bands.append((weight, bias, self.proj(i)))
        return bands

    def _log_softmax(self, hidden, weight, bias, proj):
        """Log-softmax of one band's logits ``(hidden proj) W^T + b``, in float32 whatever the
        model's dtype (as fairseq's ``utils.log_softmax``)."""
        if proj is not None:
            hidden = F.linear(hidden, proj.t())
        return F.log_softmax(F.linear(hidden, weight, bias), dim=-1, dtype=torch.float32)

    def log_prob(self, hidden):
        """Log-probabilities over the whole vocabulary, shape ``hidden.shape[:-1] + (n_token,)``."""
        shape = hidden.shape[:-1]
        hidden = hidden.reshape(-1, hidden.size(-1))
        bands = self._bands()
        head = self._log_softmax(hidden, *bands[0])
        if self.n_clusters == 0:
            return head.view(*shape, self.n_token)
        parts = [head[:, : self.edges[1]]]
        for i in range(1, self.n_clusters + 1):
            tail = self._log_softmax(hidden, *bands[i])
            parts.append(head[:, -i].unsqueeze(1) + tail)
        return torch.cat(parts, dim=1).view(*shape, self.n_token)

    def nll(self, hidden, target):
        """Negative log-likelihood (float32) of ``target`` (same leading shape as ``hidden``).

        The training loss: only the head band is computed for every position, each tail
        cluster only for the positions whose target falls in it (as the reference), so
        no (N, V) tensor is built.  Equal to ``-log_prob(hidden).gather(target)`` (tested).
        Selecting the positions of a cluster reads their count back to the host (a data-dependent
        shape); this runs in the criterion, not in the model's forward."""
        shape = target.shape
        hidden = hidden.reshape(-1, hidden.size(-1))
        target = target.reshape(-1)
        bands = self._bands()
        head = self._log_softmax(hidden, *bands[0])
        if self.n_clusters == 0:
            return -head.gather(1, target.unsqueeze(1)).view(shape)
        in_head = target < self.edges[1]
        lp = head.gather(1, target.clamp(max=self.edges[1] - 1).unsqueeze(1)).squeeze(1).masked_fill(~in_head, 0.0)
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.edges[i], self.edges[i + 1]
            idx = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            tail = self._log_softmax(hidden[idx], *bands[i])
            lp_i = head[idx, -i] + tail.gather(1, (target[idx] - lo).unsqueeze(1)).squeeze(1)
            lp = lp.index_add(0, idx, lp_i)
        return -lp.view(shape)


def hf_cluster_rows(cluster: torch.Tensor) -> torch.Tensor:
    """Converts HF's cluster rows (``c0 + i - 1``) to the official order (column ``-i``) and back."""
    return cluster.flip(0)
