"""The MTN encoder (Garg, Dhillon, Yu 2019, arXiv 1908.10408, Sec. 4 and Fig. 1).

Where the paper's ideas live
----------------------------
A session arrives as one fairseq source row ``q_1 </q> q_2 </q> … q_m <eos>`` (decision 1); the encoder

1. splits the row into queries (:func:`split_queries`, :func:`session_layout`);
2. **query level** (Sec. 4, "the query level employs a standard Transformer encoder"): fairseq
   ``TransformerEncoderLayer`` s over each query's tokens, shared across queries, with positions *within*
   the query;
3. **query projection** (Sec. 4, "a linear transformation … Query Projection layer … zero padding to the
   queries before this projection"): each query's token representations are zero-padded to P slots,
   flattened (P·d) and mapped linearly to one d-vector;
4. **positional embeddings over the query index** are added ("to inform the ordering among the queries");
5. **masked session encoder** (Sec. 4, Fig. 1) over the query vectors with a causal mask, so query j attends
   to queries ≤ j only ("prevents information leakage from subsequent queries");
6. **skip connection**: each token representation gets its query's session representation added ("we
   refine the individual token representations … by adding the representation of q … via a skip
   connection").

Steps 3–6 form one *level* (:class:`SessionLevel`); a K-level MTN ("stacks K − 1 masked encoders over a
standard Transformer encoder", ``--levels K``) runs K − 1 levels in sequence, each with its own projection and
masked encoder.  The encoder output is the refined token representations back in the source row's layout
(pads zero and masked), the standard fairseq encoder-output dict, so fairseq's ``TransformerDecoder``
attends to it unchanged.

Reconstruction decisions (where the paper is silent)
----------------------------------------------------
1. *Source representation*: a session prefix is one source row, its queries joined by ``</q>`` (HRED's
   end-of-query symbol, :mod:`user_dir.modules.query_sessions`) and split inside the encoder, so
   ``fairseq-preprocess``, batching and ``fairseq-generate`` work unchanged.  The separator is fixed and must
   be in the source dictionary (checked when the model is built).
2. *Terminators*: every query keeps its terminator token, and the EOS that ends the last query is embedded as
   ``</q>``, so all queries look alike whatever their place in the session.
3. *Query length limit* = the projection's padding length: P = ``--max-query-length`` words (a task flag; the
   model takes it from the task) + 1 terminator slot.  A longer query is an error
   (:class:`SessionInputError` naming the flag), never truncated.
4. *Session layers (a deviation)*: the paper says each layer of the masked session encoder "is similar to the
   middle sublayer in a Transformer decoder layer", i.e. the encoder-decoder (cross-)attention sublayer.
   Here each layer is a fairseq ``TransformerEncoderLayer`` with a causal mask: masked *self*-attention over
   the query vectors, then an FFN, with residuals and layer norms (a decoder layer without its
   cross-attention).  The session level has a single input sequence, and the paper does not say what a
   cross-attention would attend from and to (one reading: queries from the layer below, keys/values from the
   projected query vectors, with the causal mask); that variant is not built.
5. *Levels k > 2* project the token representations refined by level k − 1 (the prose does not say what the
   third level reads; this reading makes every level re-summarise the refined tokens).
6. *Skip connection*: a plain sum, no extra layer norm.
7. *Positions*: sinusoidal, within a query and over the query index.
"""
import math

import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder
from fairseq.modules import FairseqDropout, LayerNorm, SinusoidalPositionalEmbedding
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase


class SessionInputError(ValueError):
    """A source row that cannot be split into queries (empty or over-long query)."""


def split_queries(src_tokens, pad, eos, sep, slots):
    """Locates every token of a batch of flattened sessions inside its query.

    Args:
        src_tokens: (B, S) rows ``q_1 sep q_2 sep … q_m eos``, left- or right-padded.
        slots: P, the number of token slots of a query (its words + terminator).

    Returns a dict: ``real`` (B, S) bool, non-pad tokens; ``qid`` (B, S) flat
    query id of each token (0..N−1 over the batch, valid where ``real``);
    ``pos`` (B, S) slot of each token in its query; ``n_queries`` (B,) queries per
    row; ``q_row``/``q_index`` (N,) row and in-session index of each query.
    """
    real = src_tokens.ne(pad)
    term = real & (src_tokens.eq(sep) | src_tokens.eq(eos))
    term_l = term.long()
    q_index_tok = term_l.cumsum(1) - term_l  # query index of each token within its row
    rank = real.long().cumsum(1) - 1  # index among the row's real tokens
    prev_term = torch.zeros_like(term)
    prev_term[:, 1:] = term[:, :-1]
    start = real & (prev_term | rank.eq(0))
    start_rank = torch.where(start, rank, torch.zeros_like(rank)).cummax(1).values
    pos = rank - start_rank
    if bool((start & term).any()):
        row = int((start & term).any(1).nonzero()[0])
        raise SessionInputError(f"source row {row} of the batch has an empty query "
                                f"(a query separator or EOS right after another, or at the start)")
    if bool((real & pos.ge(slots)).any()):
        row = int((real & pos.ge(slots)).any(1).nonzero()[0])
        raise SessionInputError(
            f"source row {row} of the batch has a query of {int(pos[row].max()) + 1} tokens (terminator included), "
            f"more than --max-query-length {slots - 1} words + 1; the query projection pads queries to that length"
        )
    n_queries = torch.where(real, q_index_tok, torch.full_like(q_index_tok, -1)).max(1).values + 1
    offsets = n_queries.cumsum(0) - n_queries
    qid = offsets.unsqueeze(1) + q_index_tok
    n_total = int(n_queries.sum())
    q_row = torch.repeat_interleave(torch.arange(len(n_queries), device=src_tokens.device), n_queries)
    q_index = torch.arange(n_total, device=src_tokens.device) - offsets[q_row]
    return {"real": real, "qid": qid, "pos": pos, "n_queries": n_queries, "q_row": q_row, "q_index": q_index}


def session_layout(src_tokens, pad, eos, sep, slots):
    """Where every query and token of a batch of sessions goes: the index tensors the encoder needs.

    Computed once per batch on the host side (the task's collater, see
    :class:`user_dir.tasks.query_suggestion.SessionLayoutDataset`), so the forward
    pass itself only gathers and never reads a value back from the device.  Raises
    :class:`SessionInputError` for an empty or over-long query.

    Returns a dict: ``query_tokens`` (N, P) each query's tokens (EOS written as the
    separator), pad in empty slots; ``query_slot`` (B, W) flat id of row b's j-th query,
    −1 past its last query; ``query_cell`` (N,) each query's place ``b * W + j`` in that
    grid; ``token_index`` (B, S) each token's slot ``query_id * P + position`` (0 at pads).
    """
    lay = split_queries(src_tokens, pad, eos, sep, slots)
    real, n_queries = lay["real"], lay["n_queries"]
    n_total, width = int(n_queries.sum()), max(int(n_queries.max()), 1)
    canonical = src_tokens.masked_fill(src_tokens.eq(eos), sep)
    query_tokens = src_tokens.new_full((n_total, slots), pad)
    query_tokens[lay["qid"][real], lay["pos"][real]] = canonical[real]
    query_cell = lay["q_row"] * width + lay["q_index"]
    query_slot = src_tokens.new_full((len(n_queries) * width,), -1)
    query_slot[query_cell] = torch.arange(n_total, device=src_tokens.device)
    token_index = torch.where(real, lay["qid"] * slots + lay["pos"], torch.zeros_like(lay["pos"]))
    return {"query_tokens": query_tokens, "query_slot": query_slot.view(len(n_queries), width),
            "query_cell": query_cell, "token_index": token_index}


def encoder_layers(cfg, num_layers):
    """fairseq ``TransformerEncoderLayer`` s, each wrapped in fairseq's ``checkpoint_wrapper``
    with ``--checkpoint-activations`` (recomputed in the backward pass, as fairseq's own encoder does)."""
    def build():
        layer = TransformerEncoderLayerBase(cfg)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return layer

    return nn.ModuleList(build() for _ in range(num_layers))


def causal_mask(n, device):
    """(n, n) bool, True above the diagonal: query i may not attend to a later query j > i."""
    return torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), 1)


class SessionLevel(nn.Module):
    """One MTN level above the query encoder: query projection + query positions + masked session encoder + skip."""

    def __init__(self, layer_cfg, num_layers, embed_dim, slots, dropout):
        super().__init__()
        self.query_projection = nn.Linear(slots * embed_dim, embed_dim)  # w_proj of Sec. 4
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.layers = encoder_layers(layer_cfg, num_layers)
        self.layer_norm = LayerNorm(embed_dim) if layer_cfg.encoder.normalize_before else None

    def forward(self, tokens, layout):
        """tokens: (N, P, d) token representations, zero in empty slots; returns them refined (same shape)."""
        n_q, slots, dim = tokens.shape
        z = self.query_projection(tokens.reshape(n_q, slots * dim))  # one vector per query
        missing = layout["query_slot"].lt(0)  # (B, W): past the row's last query
        width = missing.size(1)
        session = z[layout["query_slot"].clamp(min=0)].masked_fill(missing.unsqueeze(-1), 0.0)  # (B, W, d)
        positions = SinusoidalPositionalEmbedding.get_embedding(width, dim).to(z)
        session = self.dropout_module(session + positions.unsqueeze(0))
        x = session.transpose(0, 1)
        mask = causal_mask(width, z.device)
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=missing, attn_mask=mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        per_query = x.transpose(0, 1).reshape(-1, dim)[layout["query_cell"]]  # (N, d) session representations
        filled = layout["slot_filled"].unsqueeze(-1).to(tokens)
        return tokens + per_query.unsqueeze(1) * filled  # skip connection, real slots only


class MTNEncoder(FairseqEncoder):
    """Query-level Transformer encoder + K − 1 masked session levels (see module docstring)."""

    def __init__(self, query_cfg, session_cfg, dictionary, embed_tokens, separator_index,
                 max_query_length, levels, session_layers):
        super().__init__(dictionary)
        if levels < 2:
            raise ValueError(f"--levels must be at least 2 (a query level and one session level), got {levels}")
        dim = embed_tokens.embedding_dim
        self.padding_idx = dictionary.pad()
        self.eos_idx = dictionary.eos()
        self.separator_index = separator_index
        self.slots = max_query_length + 1
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if query_cfg.no_scale_embedding else math.sqrt(dim)
        self.register_buffer("token_positions", SinusoidalPositionalEmbedding.get_embedding(self.slots, dim),
                             persistent=False)
        self.dropout_module = FairseqDropout(query_cfg.dropout, module_name=self.__class__.__name__)
        self.layers = encoder_layers(query_cfg, query_cfg.encoder.layers)
        self.layer_norm = LayerNorm(dim) if query_cfg.encoder.normalize_before else None
        self.levels = nn.ModuleList(
            SessionLevel(session_cfg, session_layers, dim, self.slots, query_cfg.dropout) for _ in range(levels - 1)
        )
        self.max_source_positions = query_cfg.max_source_positions

    def layout(self, src_tokens):
        """:func:`session_layout` of a batch (host side; the collater passes it as ``session_layout``)."""
        return session_layout(src_tokens, self.padding_idx, self.eos_idx, self.separator_index, self.slots)

    def encode_queries(self, src_tokens, layout=None):
        """Steps 1–2: the query-level encodings (N, P, d), zero in empty slots, and the layout."""
        if layout is None or layout["query_tokens"].size(1) != self.slots:  # none, or made for another
            layout = self.layout(src_tokens)  # --max-query-length (generating with the task's default)
        layout = dict(layout)
        query_tokens = layout["query_tokens"]
        empty = query_tokens.eq(self.padding_idx)
        layout["slot_filled"] = ~empty
        x = self.embed_scale * self.embed_tokens(query_tokens) + self.token_positions.unsqueeze(0).to(
            self.embed_tokens.weight)
        x = self.dropout_module(x).transpose(0, 1)
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=empty)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1).masked_fill(empty.unsqueeze(-1), 0.0)  # zero padding before the projection
        return x, layout

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens=False, session_layout=None, **unused):
        """``session_layout``: :meth:`layout` of ``src_tokens`` made by the collater; without it the
        layout is computed here, which reads the query counts back from the device."""
        tokens, layout = self.encode_queries(src_tokens, session_layout)
        for level in self.levels:
            tokens = level(tokens, layout)
        pad = src_tokens.eq(self.padding_idx)
        out = tokens.reshape(-1, tokens.size(-1))[layout["token_index"]].masked_fill(pad.unsqueeze(-1), 0.0)
        return {
            "encoder_out": [out.transpose(0, 1)],  # S x B x C
            "encoder_padding_mask": [pad],
            "encoder_embedding": [],
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [] if src_lengths is None else [src_lengths],
        }

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out, new_order):
        """Beam search: reorders every batch-indexed tensor of ``encoder_out``."""
        def pick(key, dim):
            return [t.index_select(dim, new_order) for t in encoder_out[key]]

        return {
            "encoder_out": pick("encoder_out", 1),
            "encoder_padding_mask": pick("encoder_padding_mask", 0),
            "encoder_embedding": pick("encoder_embedding", 0),
            "encoder_states": pick("encoder_states", 1),
            "src_tokens": pick("src_tokens", 0),
            "src_lengths": pick("src_lengths", 0),
        }

    def max_positions(self):
        return self.max_source_positions
