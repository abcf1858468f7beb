#!/usr/bin/env python
"""Interleaved Star / Transformer forward+backward timing at one length (robust to shared-CPU load).

``bench_scaling.py`` times all Star repeats, then all Transformer repeats; on a shared machine
the load can change between the two.  This script alternates them within each repeat —
Star with the fused ring core in blocks of ``--block-rows`` (default
``star_ring_core.BLOCK_ROWS``), Star with the fused core on the whole input as one block (the
core before blocking), Star with the reference ring core (plain autograd,
``--star-ring-core reference``), then the Transformer — all with the same weights, each built
with its own construction options — and reports each repeat's times, the median of the
per-repeat ratios next to the FLOP bound of ``bench_scaling.py``, and each model's activation
memory (bytes autograd saves for backward).

Example::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/star_transformer/bench_paired.py --n 16384 --repeats 3
"""
import argparse
import copy
import dataclasses
import statistics

import torch
from bench_scaling import build_models, saved_bytes, star_flops, step, time_model, transformer_flops


def timed(model, tokens, lengths):
    """One timed forward+backward step, no warm-up."""
    return time_model(model, tokens, lengths, 1, float("inf"), warmup=False)[0]


def rebuilt(encoder, ring_core="fused", ring_block_rows=None):
    """A copy of a ``StarTransformerEncoder`` whose Star stack is built with these ring options (same weights)."""
    from user_dir.modules.star_ring_core import BLOCK_ROWS
    from user_dir.modules.star_transformer_layer import StarTransformer

    other = copy.deepcopy(encoder)
    options = dataclasses.replace(encoder.star.options, star_ring_core=ring_core)
    other.star = StarTransformer(options, ring_block_rows=ring_block_rows or BLOCK_ROWS)
    other.star.load_state_dict(encoder.star.state_dict())
    return other.train()


def main(argv=None):
    from user_dir.modules.star_ring_core import BLOCK_ROWS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--d", type=int, default=300)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--block-rows", type=int, default=BLOCK_ROWS, help="block size of the fused ring core")
    p.add_argument("--no-baseline", action="store_true", help="no Transformer")
    p.add_argument("--no-one-block", action="store_true", help="no fused core on the whole input")
    p.add_argument("--no-reference", action="store_true", help="no reference (autograd) ring core")
    p.add_argument("--no-memory", action="store_true", help="do not measure activation memory")
    p.add_argument("--no-warmup-from", type=int, default=4096, help="no warm-up run from this length on")
    a = p.parse_args(argv)

    torch.manual_seed(0)
    star, _, baseline, dictionary = build_models(a.d, a.heads, a.layers)
    models = {"Star": rebuilt(star, ring_block_rows=a.block_rows)}
    if not a.no_one_block:
        models["Star one block"] = rebuilt(star, ring_block_rows=1 << 62)
    if not a.no_reference:
        models["Star reference core"] = rebuilt(star, ring_core="reference")
    if not a.no_baseline:
        models["Transformer"] = baseline
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (1, a.n))
    lengths = torch.tensor([a.n])
    bound = transformer_flops(a.n, a.d, a.layers, 4 * a.d) / star_flops(a.n, a.d, a.layers, a.heads)
    print(f"# n={a.n} d={a.d} heads={a.heads} layers={a.layers} batch=1 threads={torch.get_num_threads()} "
          f"block_rows={a.block_rows} FLOP bound {bound:.2f}x")
    if a.n < a.no_warmup_from:
        for model in models.values():
            step(model, tokens, lengths)
    others = [name for name in models if name != "Star"]
    print("| repeat | " + " | ".join(f"{name} s" for name in models) + " | "
          + " | ".join(f"{name} / Star" for name in others) + " |")
    print("|---" * (1 + len(models) + len(others)) + "|")
    ratios = {name: [] for name in others}
    for r in range(a.repeats):
        times = {name: timed(model, tokens, lengths) for name, model in models.items()}
        for name in others:
            ratios[name].append(times[name] / times["Star"])
        print(f"| {r} | " + " | ".join(f"{t:.4f}" for t in times.values()) + " | "
              + " | ".join(f"{ratios[name][-1]:.2f}x" for name in others) + " |", flush=True)
    medians = {name: statistics.median(ratios[name]) for name in others}
    print("| median |" + " |" * len(models) + " " + " | ".join(f"{m:.2f}x" for m in medians.values()) + " |")
    if "Transformer" in medians:
        print(f"speed-up over the Transformer {medians['Transformer']:.2f}x = {medians['Transformer'] / bound:.0%} "
              f"of the FLOP bound {bound:.2f}x")
    if not a.no_memory:
        memory = {name: saved_bytes(model, tokens, lengths) / 2 ** 20 for name, model in models.items()}
        print("activation memory MB: " + ", ".join(f"{name} {mb:.1f} ({mb / memory['Star']:.2f}x Star)"
                                                   for name, mb in memory.items()))


if __name__ == "__main__":
    main()
