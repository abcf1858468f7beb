"""ON-LSTM baseline for the speed comparison (Shen et al., ICLR 2019; gates as design notes §5.2).

A faithful re-implementation of the ON-LSTM cell: master gates from x_t
*and* h_{t−1}, so every step waits for the previous one (a Python loop over
time, as the released code).  Kept in benchmarks/ only: it is the baseline
the FastTrees paper compares its training speed against.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def cumax(x):
    return torch.cumsum(F.softmax(x, dim=-1), dim=-1)


class ONLSTMCell(nn.Module):
    def __init__(self, input_size, hidden_size, chunk_size):
        super().__init__()
        assert hidden_size % chunk_size == 0
        self.hidden_size, self.chunk_size, self.n_chunk = hidden_size, chunk_size, hidden_size // chunk_size
        self.ih = nn.Linear(input_size, 4 * hidden_size + 2 * self.n_chunk)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size + 2 * self.n_chunk)

    def forward(self, x_proj, h, c):
        gates = x_proj + self.hh(h)
        c_in, c_forget = gates[:, : 2 * self.n_chunk].chunk(2, 1)
        o, cell, i, f = gates[:, 2 * self.n_chunk:].view(-1, 4 * self.n_chunk, self.chunk_size).chunk(4, 1)
        m_in = (1.0 - cumax(c_in))[:, :, None]
        m_forget = cumax(c_forget)[:, :, None]
        overlap = m_forget * m_in
        f = torch.sigmoid(f) * overlap + (m_forget - overlap)
        i = torch.sigmoid(i) * overlap + (m_in - overlap)
        c = f * c.view(-1, self.n_chunk, self.chunk_size) + i * torch.tanh(cell)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h.view(-1, self.hidden_size), c.view(-1, self.hidden_size)


class ONLSTMLanguageModel(nn.Module):
    """Embedding → n ON-LSTM layers → tied softmax.  Input (B, T) → logits (B, T, V)."""

    def __init__(self, vocab, hidden, layers, chunk_size):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cells = nn.ModuleList(ONLSTMCell(hidden, hidden, chunk_size) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens).transpose(0, 1)  # (T, B, H)
        for cell in self.cells:
            proj = cell.ih(x)  # input projections of all steps at once, as the released code
            h = c = x.new_zeros(x.size(1), cell.hidden_size)
            outs = []
            for t in range(x.size(0)):
                h, c = cell(proj[t], h, c)
                outs.append(h)
            x = torch.stack(outs, 0)
        return self.out(x.transpose(0, 1))
