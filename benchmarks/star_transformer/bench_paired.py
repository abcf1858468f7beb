#!/usr/bin/env python
"""Interleaved Star / Transformer forward+backward timing at one length (robust to shared-CPU load).

``bench_scaling.py`` times all Star repeats, then all Transformer repeats; on a shared machine
the load can change between the two.  This script alternates them within each repeat —
Star with the blocked ring core (``_RingCore.block_rows``, default), Star with the whole
input as one block (the core before blocking), then the Transformer — and reports each
repeat's times and the median of the per-repeat ratios, next to the FLOP bound of
``bench_scaling.py``.

Example::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/star_transformer/bench_paired.py --n 16384 --repeats 3
"""
import argparse
import statistics

import torch
from bench_scaling import build_models, star_flops, step, time_model, transformer_flops


def timed(model, tokens, lengths):
    """One timed forward+backward step, no warm-up."""
    return time_model(model, tokens, lengths, 1, float("inf"), warmup=False)[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--d", type=int, default=300)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-baseline", action="store_true", help="Star blocked vs one block only")
    p.add_argument("--no-warmup-from", type=int, default=4096, help="no warm-up run from this length on")
    a = p.parse_args(argv)
    from user_dir.modules.star_transformer_layer import _RingCore

    torch.manual_seed(0)
    star, _, baseline, dictionary = build_models(a.d, a.heads, a.layers)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (1, a.n))
    lengths = torch.tensor([a.n])
    block = _RingCore.block_rows
    bound = transformer_flops(a.n, a.d, a.layers, 4 * a.d) / star_flops(a.n, a.d, a.layers, a.heads)
    print(f"# n={a.n} d={a.d} heads={a.heads} layers={a.layers} batch=1 threads={torch.get_num_threads()} "
          f"block_rows={block} FLOP bound {bound:.2f}x")
    if a.n < a.no_warmup_from:
        for model in (star, baseline):
            step(model, tokens, lengths)
    print("| repeat | Star s (blocked) | Star s (one block) | Transformer s | speed-up | measured/bound "
          "| blocked vs one block |")
    print("|---|---|---|---|---|---|---|")
    speedups, gains = [], []
    for r in range(a.repeats):
        _RingCore.block_rows = block
        ts = timed(star, tokens, lengths)
        _RingCore.block_rows = 1 << 62
        t1 = timed(star, tokens, lengths)
        _RingCore.block_rows = block
        tb = float("nan") if a.no_baseline else timed(baseline, tokens, lengths)
        speedups.append(tb / ts)
        gains.append(t1 / ts)
        base = "| - | - | -" if a.no_baseline else f"| {tb:.4f} | {tb / ts:.2f}x | {tb / ts / bound:.0%}"
        print(f"| {r} | {ts:.4f} | {t1:.4f} {base} | {t1 / ts:.2f}x |", flush=True)
    s, g = statistics.median(speedups), statistics.median(gains)
    base = "| - | -" if a.no_baseline else f"| {s:.2f}x | {s / bound:.0%}"
    print(f"| median | | | {base} | {g:.2f}x |")


if __name__ == "__main__":
    main()
