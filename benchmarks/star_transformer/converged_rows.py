#!/usr/bin/env python
"""One finished run of ``benchmarks/star_transformer/converged.sh`` as a result row (masked summation: one per
sequence length ``--n`` too; its metric, the MSE, is best when lowest).

Reads the run's training log (``train_*.log``: updates, epochs, the dev metric per epoch, whether
``--patience`` stopped it) and test log (``test_*.log``: ``fairseq-validate`` of the best-dev checkpoint on
test), writes ``WORK/result.json`` and, with ``--results``, replaces the row of the same (task, model, seed; and
for masked summation n and learning rate).
A run that stopped neither by ``--patience`` nor at ``--max-epoch`` was cut off: no row.
"""
import argparse
import glob
import json
import os
import re
import sys

from user_dir.result_rows import parse_train_log, train_seconds, upsert

METRIC = {"sst5": "accuracy", "conll03": "span_f1", "masked_sum": "mse"}


def one(work, pattern):
    found = glob.glob(os.path.join(work, pattern))
    if len(found) != 1:
        raise SystemExit(f"converged_rows: expected one {pattern} in {work}, found {len(found)}")
    return found[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--task", choices=sorted(METRIC), required=True)
    p.add_argument("--model", choices=["star", "transformer", "lstm", "bilstm"], required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--n", type=int, help="sequence length (masked_sum)")
    p.add_argument("--lr", type=float, help="learning rate (masked_sum: a row per learning rate)")
    p.add_argument("--max-epoch", type=int, required=True)
    p.add_argument("--min-epoch", type=int, default=1, help="the epoch before which --patience could not stop it")
    p.add_argument("--command", required=True)
    p.add_argument("--results", default=None)
    args = p.parse_args(argv)
    metric = METRIC[args.task]
    train_log = one(args.work, "train_*.log")
    updates, epochs, dev, early = parse_train_log(train_log, metric)
    if not early and epochs < args.max_epoch:
        raise SystemExit(f"converged_rows: {args.work} stopped at epoch {epochs}, neither by --patience nor at "
                         f"--max-epoch {args.max_epoch}: an interrupted run (run the command again)")
    test_log = one(args.work, "test_*.log")
    with open(test_log, encoding="utf-8") as f:
        test = re.findall(rf"valid on 'test' subset \|(?:[^\n]*?\|)? {metric} ([\d.]+) \|", f.read())
    if not test:
        raise SystemExit(f"converged_rows: {test_log} holds no test {metric}")
    masked_sum = {"n": args.n, "lr": args.lr, "min_epoch": args.min_epoch} if args.task == "masked_sum" else {}
    row = {"task": args.task, **masked_sum, "model": args.model, "seed": args.seed, "metric": metric,
           "updates": updates, "epochs": epochs, "converged": early,
           "best_dev": (min if metric == "mse" else max)(dev), "test": float(test[-1]),
           "train_seconds": train_seconds(train_log), "command": args.command}
    with open(os.path.join(args.work, "result.json"), "w") as f:
        json.dump(row, f, indent=1)
    if args.results:
        upsert(args.results, [row], key=lambda r: (r["task"], r.get("n", 0), r.get("lr", 0), r["model"], r["seed"]))
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
