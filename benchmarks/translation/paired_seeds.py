#!/usr/bin/env python
"""Paired comparison of two models' BLEU over the same seeds: mean difference, its standard error, the paired
t-test p-value and the exact two-sided sign-flip permutation p-value (all 2^n sign patterns of the paired
differences).

    python benchmarks/translation/paired_seeds.py --a 23.95 25.10 ... --b 23.41 24.72 ...
"""
import argparse
import statistics

from user_dir.result_rows import paired


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
          f"A ahead in {r['ahead']} of {r['n']}  t-test p = {r['t_p']:.3f}  sign-flip p = {r['p']:.2f}")


if __name__ == "__main__":
    main()
