"""Shared by the MTN benchmarks: the two models at equal parameter count, built from CLI-style flags."""
import os

from user_dir.from_flags import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

D = 64
MTN_ARGS = ["--arch", "mtn_tiny", "--share-all-embeddings"]
# fairseq's transformer on the flattened session: as many layers as MTN has (query + session levels + decoder),
# its encoder FFN widened until the parameter counts match (see matched_transformer_args)
FLAT_BASE = ["--arch", "transformer", "--encoder-embed-dim", D, "--decoder-embed-dim", D,
             "--encoder-attention-heads", 2, "--decoder-attention-heads", 2, "--decoder-ffn-embed-dim", 128,
             "--decoder-layers", 1, "--share-all-embeddings"]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def build_pair(dictionary, max_query_length, levels=2):
    """(mtn model, flat transformer model, flat transformer flags) with equal parameter counts (within 1%)."""
    mtn, _ = build(MTN_ARGS[1], [*MTN_ARGS[2:], "--max-query-length", max_query_length, "--levels", levels],
                   task="query_suggestion", dictionary=dictionary)
    target = n_params(mtn)
    enc_layers = 1 + (levels - 1)  # the query layer + one layer per session level

    def flat_with(ffn):
        flags = [*FLAT_BASE, "--encoder-layers", enc_layers, "--encoder-ffn-embed-dim", ffn]
        return build("transformer", flags[2:], dictionary=dictionary)[0], flags

    # parameters grow linearly with the encoder FFN width: solve for the width that matches
    small, large = n_params(flat_with(64)[0]), n_params(flat_with(128)[0])
    ffn = max(8, round(64 + (target - small) * 64 / (large - small)))
    flat, flags = flat_with(ffn)
    assert abs(n_params(flat) - target) / target < 0.01, (n_params(flat), target)
    return mtn, flat, flags
