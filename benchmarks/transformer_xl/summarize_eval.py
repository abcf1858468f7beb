"""The Transformer-XL paper's evaluation speed-up table (Dai et al. 2019, Table 9) beside ours, from the runs of
``bench_speed.py eval --size enwik8_base --tgt-len T --out results/eval_speedup_enwik8_base_tT.json``, as
markdown; ``--claims`` writes the ``txl_eval_speedup_3800`` row into the paper-claims file.

    python benchmarks/transformer_xl/summarize_eval.py [--claims benchmarks/results/paper_claims.json]
"""
import argparse
import glob
import json
import os
import re

from user_dir.result_rows import upsert

HERE = os.path.dirname(os.path.abspath(__file__))
# Dai et al. 2019: how much slower Al-Rfou et al.'s vanilla model evaluates than Transformer-XL (character level)
PAPER = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}


def load_runs(results):
    """{segment length T: bench_speed.py eval output} for every ``eval_speedup_enwik8_base_t*.json``."""
    runs = {}
    for path in glob.glob(os.path.join(results, "eval_speedup_enwik8_base_t*.json")):
        with open(path) as f:
            runs[int(re.search(r"_t(\d+)\.json$", path).group(1))] = json.load(f)
    return dict(sorted(runs.items()))


def table(runs):
    lengths = sorted({r["attention_length"] for run in runs.values() for r in run["results"]})
    head = "| attention length L | paper | " + " | ".join(f"ours, segments of {t} (range)" for t in runs) + " |"
    lines = [head, "|" + "---|" * (2 + len(runs))]
    for length in lengths:
        cells = []
        for run in runs.values():
            row = next((r for r in run["results"] if r["attention_length"] == length), None)
            cells.append("" if row is None else f"{row['speedup_of_medians']:.0f}x "
                         f"({min(row['paired_speedups']):.0f}–{max(row['paired_speedups']):.0f})")
        lines.append(f"| {length:,} | {PAPER.get(length, '')}{'x' if length in PAPER else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claim(runs):
    """The speed-up at L = 3,800 of every segment length (``ours`` is the best one's median)."""
    at = {t: next((r for r in run["results"] if r["attention_length"] == 3800), None) for t, run in runs.items()}
    at = {t: r for t, r in at.items() if r is not None}
    if not at:
        return None
    best = max(at, key=lambda t: at[t]["speedup_of_medians"])
    setting = runs[best]["setting"]
    return {"id": "txl_eval_speedup_3800", "paper": "Transformer-XL (Dai et al. 2019), Table 9",
            "claim": "evaluation up to 1,874x faster than a vanilla Transformer (one forward over the whole window "
                     "per token) at attention length 3,800",
            "ours": at[best]["speedup_of_medians"], "ours_runs": at[best]["paired_speedups"], "baseline": 1.0,
            "paper_value": PAPER[3800], "seeds": None,
            "by_segment_length": {str(t): r["speedup_of_medians"] for t, r in at.items()},
            "setting": (f"enwik8 base size ({setting['layers']} layers, d {setting['dim']}, {setting['heads']} heads x "
                        f"{setting['head_dim']}, FFN {setting['ffn']}), {setting['vocab']} symbols, batch 1, memory = L "
                        f"with same_length, segments of {best} tokens; vanilla = fairseq transformer_lm of the same "
                        f"size; median of {setting['repeats']} interleaved repeats, one CPU thread"),
            "command": runs[best]["command"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--claims", help="write the txl_eval_speedup_3800 row into this JSON list")
    args = p.parse_args(argv)
    runs = load_runs(args.results)
    if not runs:
        raise SystemExit(f"summarize_eval: no eval_speedup_enwik8_base_t*.json in {args.results}")
    print(table(runs))
    row = claim(runs)
    if args.claims and row:
        upsert(args.claims, [row], key=lambda r: r["id"])


if __name__ == "__main__":
    main()
