#!/usr/bin/env python
"""One finished run of ``benchmarks/fasttrees/logic_lstm.sh`` as a result row.

Reads the run's ``train.log`` (fairseq's simple log: updates, epochs, validation accuracies, whether
``--patience`` stopped it; the row also records the run's ``--min-epoch``, the epochs trained before
``--patience`` could stop it) and ``validate.txt`` (``fairseq-validate`` on ``test_ops1`` … ``test_ops12``), writes
``WORK/result.json`` and, with ``--results``, replaces the row of the same (arch, seed, size flags, embedding
initialisation, learning rate) in that JSON list (created if absent).  The embedding initialisation
(``--embed-init``, set by the presets) and the learning rate are read from the configuration fairseq logs.  A
run that stopped neither by ``--patience`` nor at ``--max-epoch`` was cut off: no row.
"""
import os
import re
import sys

from rows import record, run_arguments
from user_dir.result_rows import parse_train_log, train_seconds


def parse_validate(path):
    """{operator count: test accuracy (%)} from fairseq-validate's output."""
    with open(path, encoding="utf-8") as f:
        found = re.findall(r"valid on 'test_ops(\d+)' subset \|.*?\| accuracy ([\d.]+)", f.read())
    if len(found) != 12:
        raise SystemExit(f"logic_rows: {path} has accuracies for {len(found)} of the 12 test sets")
    return {int(ops): float(acc) for ops, acc in found}


def logged_config(path):
    """The run's ``--embed-init`` and learning rate, from the configuration at the top of fairseq's log."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    embed_init = re.search(r"'embed_init': '?(\w+)", text)  # a ChoiceEnum: logged without quotes
    lr = re.search(r"'lr': \[([\d.e-]+)\]", text)
    if embed_init is None or lr is None:
        raise SystemExit(f"logic_rows: {path} does not log the configuration's 'embed_init' and 'lr'")
    return embed_init.group(1), float(lr.group(1))


def main(argv=None):
    args = run_arguments(__doc__.split("\n\n")[0], "--max-epoch", argv, int_flags=["--min-epoch"])
    train_log = os.path.join(args.work, "train.log")
    updates, epochs, valid, early = parse_train_log(train_log, "accuracy")
    if not early and epochs < args.max_epoch:
        raise SystemExit(f"logic_rows: {args.work} stopped at epoch {epochs}, neither by --patience nor at "
                         f"--max-epoch {args.max_epoch}: an interrupted run (run the command again)")
    by_ops = parse_validate(os.path.join(args.work, "validate.txt"))
    embed_init, lr = logged_config(train_log)
    row = {"arch": args.arch, "seed": args.seed, "size_flags": args.size_flags, "embed_init": embed_init, "lr": lr,
           "updates": updates, "epochs": epochs, "min_epoch": args.min_epoch, "converged": early, "best_valid_accuracy": max(valid),
           "accuracy_by_ops": by_ops, "accuracy_ops_1_6": sum(by_ops[k] for k in range(1, 7)) / 6,
           "accuracy_ops_7_12": sum(by_ops[k] for k in range(7, 13)) / 6, "train_seconds": train_seconds(train_log),
           "command": args.command + (f" (SIZE_FLAGS='{args.size_flags}')" if args.size_flags else "")}
    record(args.work, row, args.results, key=lambda r: (r["size_flags"], r["embed_init"], r["lr"], r["arch"], r["seed"]))


if __name__ == "__main__":
    sys.exit(main())
