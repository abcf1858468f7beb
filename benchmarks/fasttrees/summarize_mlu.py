#!/usr/bin/env python
"""The MLU table (the FastTrees paper's Table 6, Transformer form) from ``results/mlu.json`` (rows written by
``mlu.sh``): accuracy per sequence of ``fasttrees_transformer`` and ``transformer`` per seed at each update
budget, and FastTrees − Transformer over the seeds both have, as markdown.  ``--claims`` writes the
``fasttrees_mlu`` row (the largest budget both models have run) into the paper-claims file.

    python benchmarks/fasttrees/summarize_mlu.py [--results JSON] [--claims benchmarks/results/paper_claims.json]
"""
import argparse
import os
import sys

from user_dir.result_rows import mean_se, paired, paired_text, read_rows, upsert, verdict

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("fasttrees_transformer", "transformer")
PAPER_GAIN = 8.16  # points of accuracy per sequence, FastTrees over the Transformer (Table 6, 100K steps)


def budgets(rows):
    """{updates: {arch: {seed: sequence accuracy}}}, budgets in increasing order."""
    out = {}
    for r in rows:
        out.setdefault(r["updates"], {}).setdefault(r["arch"], {})[r["seed"]] = r["sequence_accuracy"]
    return dict(sorted(out.items()))


def common_seeds(by_arch):
    return sorted(set(by_arch.get(MODELS[0], {})) & set(by_arch.get(MODELS[1], {})))


def markdown(rows):
    lines = ["| updates | model | accuracy per sequence, per seed | mean ± s.e. | FastTrees − Transformer |",
             "|---|---|---|---|---|"]
    for updates, by_arch in budgets(rows).items():
        seeds = common_seeds(by_arch)
        if len(seeds) >= 2:
            p = paired(*[[by_arch[m][s] for s in seeds] for m in MODELS])
            gain = f"{paired_text(p)}: {verdict(p)}"
        elif seeds:
            gain = f"{by_arch[MODELS[0]][seeds[0]] - by_arch[MODELS[1]][seeds[0]]:+.2f} (seed {seeds[0]} only)"
        else:
            gain = "—"
        for arch in MODELS:
            runs = by_arch.get(arch)
            if not runs:
                continue
            mean, se = mean_se(list(runs.values()))
            per_seed = ", ".join(f"{s}: {runs[s]:.2f}" for s in sorted(runs))
            lines.append(f"| {updates:,} | `{arch}` | {per_seed} | {mean:.2f}{'' if se is None else f' ± {se:.2f}'} "
                         f"| {gain if arch == MODELS[0] else ''} |")
    return "\n".join(lines)


def claim_row(rows):
    """The ``fasttrees_mlu`` row at the largest budget with a seed of both models (None without one)."""
    paired_budgets = [(u, by_arch) for u, by_arch in budgets(rows).items() if common_seeds(by_arch)]
    if not paired_budgets:
        return None
    updates, by_arch = paired_budgets[-1]
    seeds = common_seeds(by_arch)
    return {"id": "fasttrees_mlu", "paper": "FastTrees (Pung & Chan 2021), Table 6",
            "claim": "FastTrees-Transformer is +8.16 points of accuracy per sequence ahead of the Transformer on "
                     "mathematical language understanding (tensor2tensor tiny, 100K steps)",
            "ours": [by_arch[MODELS[0]][s] for s in seeds], "baseline": [by_arch[MODELS[1]][s] for s in seeds],
            "paper_value": PAPER_GAIN, "seeds": seeds, "updates": updates,
            "setting": f"2+2 layers, d 128, FFN 512, 4 heads (FastTrees chunk 8), {updates:,} updates of 4,096 "
                       "tokens (the paper: 100K steps), greedy decoding, 10,000 held-out expressions",
            "command": "benchmarks/fasttrees/mlu.sh fasttrees_transformer|transformer SEED"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=os.path.join(HERE, "results", "mlu.json"))
    p.add_argument("--claims", help="write the fasttrees_mlu row into this JSON list")
    args = p.parse_args(argv)
    rows = read_rows(args.results, p, "benchmarks/fasttrees/mlu.sh")
    print(markdown(rows))
    if args.claims:
        row = claim_row(rows)
        if row is None:
            p.error(f"{args.results}: no seed that both {MODELS[0]} and {MODELS[1]} have run: no claim row")
        upsert(args.claims, [row], key=lambda r: r["id"])


if __name__ == "__main__":
    sys.exit(main())
