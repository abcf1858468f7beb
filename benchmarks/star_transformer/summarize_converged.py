#!/usr/bin/env python
"""The Star-Transformer convergence tables from ``benchmarks/star_transformer/results/converged.json`` (rows of
``converged.sh``): per experiment (SST-5, CoNLL-2003, masked summation at each length n) and model the test metric
per seed and its mean ± s.e., and Star − Transformer paired over the seeds both have (sign-flip p) with a verdict.

    python benchmarks/star_transformer/summarize_converged.py [--results JSON] \
        [--claims benchmarks/results/paper_claims.json]

Runs that stopped at ``--max-epoch`` rather than by ``--patience`` are marked "capped", and runs held to a minimum
epoch count (``MIN_EPOCH``) name it beside their epochs; a masked-summation run whose best dev MSE is no better
than predicting the targets' mean is marked "failed" in the table and listed under ``failed_seeds`` in its claim
row (it still counts in the mean: it is what the model did).  Where a model has
runs at several learning rates (masked summation, ``LR=``), it is reported at the one whose runs have the best
mean dev metric (chosen on dev, never on test), and the table says which it was.  ``--claims`` writes the rows
``star_sst5``, ``star_conll03`` and ``star_masked_sum`` (the longest n with >= 2 paired seeds; ``by_n`` holds every
length's test MSE per model and seed) into the paper-claims file.
"""
import argparse
import os
import sys

from user_dir.result_rows import chosen_on_dev, mean_se, paired, paired_text, read_rows, upsert, verdict
from user_dir.tasks.masked_summation import mean_predictor_mse

HERE = os.path.dirname(os.path.abspath(__file__))
METRIC = {"sst5": "accuracy", "conll03": "span_f1", "masked_sum": "mse"}
MASKED_SUM_MEAN_MSE = mean_predictor_mse(10)  # converged.sh's 10 masked positions
HIGHER_IS_BETTER = {"accuracy": True, "span_f1": True, "mse": False}
TITLES = {"sst5": "SST-5 test accuracy", "conll03": "CoNLL-2003 test span F1", "masked_sum": "masked summation test MSE"}
CLAIMS = {
    "sst5": ("star_sst5", "the Star-Transformer beats the Transformer on SST-5 (52.9 vs 50.4 accuracy, GloVe)", 52.9),
    "conll03": ("star_conll03", "the Star-Transformer is competitive on CoNLL-2003 NER (paper: 90.93 F1 with "
                "GloVe and character features)", 90.93),
    "masked_sum": ("star_masked_sum", "on masked summation the Star-Transformer and the Transformer both stay "
                   "accurate as the length n grows, while the LSTM and BiLSTM degrade quickly (MSE, Fig. 3a; no "
                   "table of values)", None),
}


MODELS = ("star", "transformer", "lstm", "bilstm")  # the masked summation's recurrent baselines last


def lr_choices(rows):
    """({(task, n, model): (its learning rate chosen on dev, {learning rate: mean best dev metric})}, the rows at
    the chosen rates); rows without a learning rate have ``None``."""
    choices, chosen = {}, []
    for task in METRIC:
        task_choices, task_rows = chosen_on_dev(
            [r for r in rows if r["task"] == task], group=lambda r: (r["task"], r.get("n"), r["model"]),
            setting=lambda r: r.get("lr"), dev=lambda r: r.get("best_dev"),
            higher_is_better=HIGHER_IS_BETTER[METRIC[task]])
        choices.update(task_choices)
        chosen += task_rows
    return choices, chosen


def experiments(chosen):
    """{(task, n): {model: {seed: row}}} from the rows at the chosen learning rates (:func:`lr_choices`)."""
    out = {}
    for r in chosen:
        out.setdefault((r["task"], r.get("n")), {}).setdefault(r["model"], {})[r["seed"]] = r
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)))


def failed(row):
    """Whether a masked-summation run never beat predicting the mean (``MASKED_SUM_MEAN_MSE``)."""
    dev = row.get("best_dev")
    return row["task"] == "masked_sum" and dev is not None and dev >= MASKED_SUM_MEAN_MSE


def epochs_text(row):
    """``"34"``, ``"50 (capped)"``, ``"6 (failed)"``, or with the run's minimum where it had one, ``"29 (min 20)"``."""
    minimum = f" (min {row['min_epoch']})" if row.get("min_epoch", 1) > 1 else ""
    return f"{row['epochs']}{minimum}{'' if row['converged'] else ' (capped)'}{' (failed)' if failed(row) else ''}"


def lr_text(choice, metric):
    """`` (lr 0.001)`` for a model's (chosen learning rate, {rate: mean dev}), with the dev means of every rate run
    when there are several; ``""`` without a learning rate."""
    lr, means = choice
    if lr is None:
        return ""
    if len(means) == 1:
        return f" (lr {lr:g})"
    others = ", ".join(f"{x:g}: {m:.4g}" for x, m in sorted(means.items()))
    return f" (lr {lr:g}, chosen on mean dev {metric}: {others})"


def compare(star, transformer, metric):
    """Star − Transformer over the common seeds (``None`` below 2) and the verdict (paired t-test p < 0.05)."""
    common = sorted(set(star) & set(transformer))
    if len(common) < 2:
        return None
    p = paired([star[s]["test"] for s in common], [transformer[s]["test"] for s in common], HIGHER_IS_BETTER[metric])
    outcome = verdict(p, HIGHER_IS_BETTER[metric])
    p["verdict"] = outcome if outcome == "within noise" else f"Star {outcome}"
    p["seeds"] = common
    return p


def markdown(rows):
    lines = []
    choices, chosen = lr_choices(rows)
    for (task, n), models in experiments(chosen).items():
        metric = METRIC[task]
        lines += ["", f"{TITLES[task]}{f', n = {n}' if n else ''}:", "",
                  "| model | test per seed | mean ± s.e. | epochs | Star − Transformer (paired) | verdict |",
                  "|---|---|---|---|---|---|"]
        comparison = compare(models.get("star", {}), models.get("transformer", {}), metric)
        for model in MODELS:
            runs = models.get(model)
            if not runs:
                continue
            seeds = sorted(runs)
            values = [runs[s]["test"] for s in seeds]
            mean, se = mean_se(values)
            per_seed = ", ".join(f"{s}: {v:g}" for s, v in zip(seeds, values))
            epochs = ", ".join(epochs_text(runs[s]) for s in seeds)
            diff = verdict = "—"
            if model == "star" and comparison:
                diff = paired_text(comparison)
                verdict = comparison["verdict"]
            lines.append(f"| {model}{lr_text(choices[task, n, model], metric)} | {per_seed} | {mean:.4g}{'' if se is None else f' ± {se:.2g}'} | {epochs} "
                         f"| {diff} | {verdict} |")
    return "\n".join(lines).lstrip("\n")


def claim_rows(rows):
    out, runs = [], experiments(lr_choices(rows)[1])
    for task, (cid, claim, value) in CLAIMS.items():
        candidates = [(n, models) for (t, n), models in runs.items() if t == task]
        paired_ok = [(n, m) for n, m in candidates if compare(m.get("star", {}), m.get("transformer", {}), METRIC[task])]
        if not paired_ok:
            continue
        n, models = max(paired_ok, key=lambda c: c[0] or 0)
        seeds = sorted(set(models["star"]) & set(models["transformer"]))
        lrs = {m: models[m][seeds[0]].get("lr") for m in ("star", "transformer")}
        lr_env = "" if set(lrs.values()) <= {None, 1e-3} else f"LR=<star {lrs['star']:g}, transformer {lrs['transformer']:g}> "
        row = {"id": cid, "paper": "Star-Transformer (Guo et al. 2019)", "claim": claim,
               "ours": [models["star"][s]["test"] for s in seeds],
               "baseline": [models["transformer"][s]["test"] for s in seeds], "paper_value": value, "seeds": seeds,
               "converged": all(models[m][s]["converged"] for m in ("star", "transformer") for s in seeds),
               "command": f"{'N=' + str(n) + ' ' if n else ''}{lr_env}benchmarks/star_transformer/converged.sh {task} "
                          f"star|transformer SEED (random embeddings: no GloVe)"}
        if task == "masked_sum":
            row["n"] = n
            row["lr"] = lrs
            row["failed_seeds"] = {m: [s for s in seeds if failed(models[m][s])] for m in ("star", "transformer")}
            row["by_n"] = {str(k): {m: {str(s): r["test"] for s, r in sorted(by_model[m].items())}
                                    for m in MODELS if by_model.get(m)}
                           for k, by_model in sorted(candidates, key=lambda c: c[0])}  # every length run, per seed
            at_n = row["by_n"][str(n)]
            row["recurrent_baselines"] = {m: at_n[m] for m in ("lstm", "bilstm") if m in at_n}  # the pair's n
        out.append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=os.path.join(HERE, "results", "converged.json"))
    p.add_argument("--claims", help="write the star_sst5 / star_conll03 / star_masked_sum rows into this JSON list")
    args = p.parse_args(argv)
    rows = read_rows(args.results, p, "benchmarks/star_transformer/converged.sh")
    print(markdown(rows))
    if args.claims:
        upsert(args.claims, claim_rows(rows), key=lambda r: r["id"])


if __name__ == "__main__":
    sys.exit(main())
