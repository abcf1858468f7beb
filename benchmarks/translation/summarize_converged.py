#!/usr/bin/env python
"""The Multi30k convergence table from ``benchmarks/translation/results/multi30k_converged.json``: per
configuration the test BLEU per seed and its mean ± s.e., the paired difference from fairseq's ``transformer``
over the seeds both have (sign-flip p), and a verdict (ahead / within noise / behind); then one row per run (epochs
and updates to the stop, best validation loss, valid and test BLEU, training hours).

    python benchmarks/translation/summarize_converged.py [--results JSON] [--device cpu|cuda] \
        [--claims benchmarks/results/paper_claims.json]

Only runs stopped by ``--patience`` count (``"converged": true``); runs that hit the update cap are listed
apart and never enter the table.  ``--claims`` writes the rows ``capsule_multi30k`` (``enc_self`` routing, the
Multi30k recipe's) and ``fasttrees_multi30k`` into the paper-claims file.
"""
import argparse
import os
import sys

from user_dir.result_rows import mean_se, paired, paired_text, read_rows, upsert, verdict

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [("transformer", None), ("capsule_transformer", "enc_self"), ("capsule_transformer", "default"),
           ("fasttrees_transformer", None)]
CLAIMS = {
    "capsule_multi30k": (("capsule_transformer", "enc_self"), "Capsule-Transformer (Duan et al. 2020)",
                         "capsule routing over the attention logits improves BLEU over the Transformer "
                         "(WMT: +0.3 to +0.9)", 0.6),
    "fasttrees_multi30k": (("fasttrees_transformer", None), "FastTrees (Pung & Chan 2021), Table 5",
                           "FastTrees after self-attention improves BLEU over the Transformer (IWSLT'15 En-Vi: "
                           "+1.88)", 1.88),
}


def name(config):
    arch, routing = config
    return arch + (f" ({routing})" if routing else "")


def summarize(rows, device="cpu"):
    rows = [r for r in rows if r.get("device", "cpu") == device]
    converged = {c: {r["seed"]: r for r in rows if (r["arch"], r["routing"]) == c and r["converged"]} for c in CONFIGS}
    capped = [r for r in rows if not r["converged"]]
    base = converged[CONFIGS[0]]
    out = {"configs": {}, "capped": [(name((r["arch"], r["routing"])), r["seed"], r["updates"]) for r in capped]}
    for config in CONFIGS:
        runs = converged[config]
        if not runs:
            continue
        seeds = sorted(runs)
        bleu = [runs[s]["test_bleu"] for s in seeds]
        entry = {"seeds": seeds, "test_bleu": bleu, "runs": [runs[s] for s in seeds]}
        entry["mean"], entry["se"] = mean_se(bleu)
        common = [s for s in seeds if s in base]
        if config != CONFIGS[0] and len(common) >= 2:
            entry["paired"] = paired([runs[s]["test_bleu"] for s in common], [base[s]["test_bleu"] for s in common])
            entry["paired"]["seeds"] = common
            entry["verdict"] = verdict(entry["paired"])
        out["configs"][name(config)] = entry
    return out


def markdown(summary):
    lines = ["| configuration | test BLEU per seed | mean ± s.e. | updates | − transformer (paired) | verdict |",
             "|---|---|---|---|---|---|"]
    for config, e in summary["configs"].items():
        per_seed = ", ".join(f"{s}: {b:.2f}" for s, b in zip(e["seeds"], e["test_bleu"]))
        se = "" if e["se"] is None else f" ± {e['se']:.2f}"
        p = e.get("paired")
        diff = "—" if p is None else paired_text(p)
        lo, hi = min(r["updates"] for r in e["runs"]), max(r["updates"] for r in e["runs"])
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        lines.append(f"| {config} | {per_seed} | {e['mean']:.2f}{se} | {span} | {diff} "
                     f"| {e.get('verdict', '—')} |")
    lines += ["", "| run | seed | epochs | updates | best valid loss | valid BLEU | test BLEU | hours (one thread) |",
              "|---|---|---|---|---|---|---|---|"]
    for config, e in summary["configs"].items():
        for r in e["runs"]:
            lines.append(f"| {config} | {r['seed']} | {r['epochs']} | {r['updates']} | {r['best_valid_loss']:.3f} "
                         f"| {r['valid_bleu']:.2f} | {r['test_bleu']:.2f} | {r['train_seconds'] / 3600:.1f} |")
    if summary["capped"]:
        lines.append("")
        lines.append("Stopped at the update cap (not converged, not in the table): " +
                     "; ".join(f"{c} seed {s} ({u} updates)" for c, s, u in summary["capped"]))
    return "\n".join(lines)


def claim_rows(rows, device="cpu"):
    """paper_claims.json rows for the configurations with >= 2 converged seeds paired with the transformer's."""
    by = {(r["arch"], r["routing"], r["seed"]): r for r in rows if r["converged"] and r.get("device", "cpu") == device}
    out = []
    for cid, ((arch, routing), paper, claim, value) in CLAIMS.items():
        seeds = sorted(s for (a, ro, s) in by if (a, ro) == (arch, routing) and ("transformer", None, s) in by)
        if len(seeds) < 2:
            continue
        out.append({"id": cid, "paper": paper, "claim": claim,
                    "ours": [by[(arch, routing, s)]["test_bleu"] for s in seeds],
                    "baseline": [by[("transformer", None, s)]["test_bleu"] for s in seeds],
                    "paper_value": value, "seeds": seeds,
                    "command": f"examples/translation/multi30k_converged.sh {arch} SEED{' ' + routing if routing else ''}"
                               f" (and transformer SEED), Multi30k test_2016_flickr, converged (--patience 5)"})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=os.path.join(HERE, "results", "multi30k_converged.json"))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--claims", help="write the capsule_multi30k / fasttrees_multi30k rows into this JSON list")
    args = p.parse_args(argv)
    rows = read_rows(args.results, p, "examples/translation/multi30k_converged.sh")
    print(markdown(summarize(rows, args.device)))
    if args.claims:
        upsert(args.claims, claim_rows(rows, args.device), key=lambda r: r["id"])


if __name__ == "__main__":
    sys.exit(main())
