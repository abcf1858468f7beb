#!/usr/bin/env python
"""Paired comparison of two models' BLEU over the same seeds: mean difference, its standard error, and an
exact two-sided sign-flip permutation p-value (all 2^n sign patterns of the paired differences).

    python benchmarks/capsule_transformer/paired_seeds.py --a 23.95 25.10 ... --b 23.41 24.72 ...
"""
import argparse
import itertools
import math
import statistics


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--a", type=float, nargs="+", required=True, help="model A's scores, one per seed")
    p.add_argument("--b", type=float, nargs="+", required=True, help="model B's scores, same seeds, same order")
    a = p.parse_args()
    if len(a.a) != len(a.b) or len(a.a) < 2:
        p.error(f"--a and --b need the same number (>= 2) of seeds (got {len(a.a)} and {len(a.b)})")
    diffs = [x - y for x, y in zip(a.a, a.b)]
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    observed = abs(sum(diffs))
    flips = list(itertools.product((1, -1), repeat=len(diffs)))
    extreme = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= observed - 1e-9 for signs in flips)
    print(f"mean A {statistics.mean(a.a):.2f}  mean B {statistics.mean(a.b):.2f}  "
          f"A - B {mean:+.2f} (sd {sd:.2f}, s.e. {sd / math.sqrt(len(diffs)):.2f})  "
          f"A ahead in {sum(d > 0 for d in diffs)} of {len(diffs)}  sign-flip p = {extreme / len(flips):.2f}")


if __name__ == "__main__":
    main()
