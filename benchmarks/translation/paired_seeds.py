#!/usr/bin/env python
"""Paired comparison of two models' BLEU over the same seeds: mean difference, its standard error, and an
exact two-sided sign-flip permutation p-value (all 2^n sign patterns of the paired differences).

    python benchmarks/translation/paired_seeds.py --a 23.95 25.10 ... --b 23.41 24.72 ...
"""
import argparse
import itertools
import math
import statistics


def mean_se(values):
    """(mean, standard error of the mean); the s.e. is None for a single value."""
    mean = statistics.mean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def paired(a, b):
    """{"diff", "se", "ahead", "n", "p"} of A − B over seeds given in the same order."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired comparison needs the same number (>= 2) of seeds, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    mean, se = mean_se(diffs)
    observed = abs(sum(diffs))
    flips = list(itertools.product((1, -1), repeat=len(diffs)))
    extreme = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= observed - 1e-9 for signs in flips)
    return {"diff": mean, "se": se, "ahead": sum(d > 0 for d in diffs), "n": len(diffs), "p": extreme / len(flips)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--a", type=float, nargs="+", required=True, help="model A's scores, one per seed")
    p.add_argument("--b", type=float, nargs="+", required=True, help="model B's scores, same seeds, same order")
    a = p.parse_args()
    try:
        r = paired(a.a, a.b)
    except ValueError as e:
        p.error(str(e))
    print(f"mean A {statistics.mean(a.a):.2f}  mean B {statistics.mean(a.b):.2f}  "
          f"A - B {r['diff']:+.2f} (s.e. {r['se']:.2f})  "
          f"A ahead in {r['ahead']} of {r['n']}  sign-flip p = {r['p']:.2f}")


if __name__ == "__main__":
    main()
