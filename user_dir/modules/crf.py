"""Token tagging head: a linear layer over h_i^T, optionally a linear-chain CRF on top.

The paper (Sec. 5.4) reports Star-Transformer with and without a CRF layer; this module is
the CRF (Lafferty et al. 2001): score(y) = sum_i emit[i, y_i] + sum_i trans[y_{i-1}, y_i]
+ start[y_1] + end[y_n], trained by the negative log-likelihood (forward algorithm) and
decoded by Viterbi.  All sequences in a batch may have different lengths (``mask``).
"""
import torch
from torch import nn


class LinearChainCRF(nn.Module):
    def __init__(self, num_tags):
        super().__init__()
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))  # [from, to]
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))

    def nll(self, emissions, tags, mask):
        """Summed negative log-likelihood. emissions (B, n, K), tags (B, n), mask (B, n) True = real.

        Real tokens must come first in each row (right padding).
        """
        B, n, K = emissions.shape
        tags = tags.masked_fill(~mask, 0)
        maskf = mask.to(emissions.dtype)
        # gold path score
        gold = self.start[tags[:, 0]] + emissions[:, 0].gather(1, tags[:, :1]).squeeze(1)
        if n > 1:
            emit = emissions[:, 1:].gather(2, tags[:, 1:].unsqueeze(-1)).squeeze(-1)
            trans = self.transitions[tags[:, :-1], tags[:, 1:]]
            gold = gold + ((emit + trans) * maskf[:, 1:]).sum(1)
        last = tags.gather(1, (mask.sum(1, keepdim=True) - 1).clamp(min=0)).squeeze(1)
        gold = gold + self.end[last]
        # partition function
        alpha = self.start + emissions[:, 0]  # B K
        for i in range(1, n):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.transitions + emissions[:, i].unsqueeze(1), 1)
            alpha = torch.where(mask[:, i:i + 1], nxt, alpha)
        log_z = torch.logsumexp(alpha + self.end, 1)
        return (log_z - gold).sum()

    @torch.no_grad()
    def decode(self, emissions, mask):
        """Viterbi best paths (B, n); padded positions get tag 0."""
        B, n, K = emissions.shape
        score = self.start + emissions[:, 0]
        back = []
        for i in range(1, n):
            total = score.unsqueeze(2) + self.transitions  # B K(from) K(to)
            best, idx = total.max(1)
            nxt = best + emissions[:, i]
            m = mask[:, i:i + 1]
            score = torch.where(m, nxt, score)
            back.append(torch.where(m, idx, torch.arange(K, device=idx.device).expand(B, K)))
        score = score + self.end
        path = [score.argmax(1)]
        for idx in reversed(back):
            path.append(idx.gather(1, path[-1].unsqueeze(1)).squeeze(1))
        path.reverse()
        return torch.stack(path, 1).masked_fill(~mask, 0)


class TaggingHead(nn.Module):
    """dropout -> Linear(d, K) emissions; with ``crf`` a :class:`LinearChainCRF` on top."""

    def __init__(self, input_dim, num_tags, crf=False, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(input_dim, num_tags)
        self.crf = LinearChainCRF(num_tags) if crf else None

    def forward(self, features):
        return self.proj(self.dropout(features))

    def loss(self, emissions, tags, mask):
        """Summed loss over real tokens (cross-entropy, or CRF negative log-likelihood)."""
        if self.crf is not None:
            return self.crf.nll(emissions.float(), tags, mask)
        return nn.functional.cross_entropy(emissions[mask].float(), tags[mask], reduction="sum")

    def predict(self, emissions, mask):
        if self.crf is not None:
            return self.crf.decode(emissions.float(), mask)
        return emissions.argmax(-1).masked_fill(~mask, 0)
