#!/usr/bin/env python
"""One finished run of ``examples/translation/multi30k_converged.sh`` as a result row.

Reads the run's ``train.log`` (fairseq's simple log) for the number of updates, the validation-loss
history and whether training stopped by ``--patience`` (``converged``) or at ``--max-update``
(not converged), writes ``WORK/result.json`` and, with ``--results``, replaces the row of the same
(arch, routing, seed, device) in that JSON list (creating the file), keeping it sorted.  Runs that finish
at the same time (``benchmarks/gpu/multi30k_converged.sh``) take turns at the file (an exclusive lock).
"""
import argparse
import json
import os
import sys

from user_dir.result_rows import parse_train_log, train_seconds, upsert


def key(row):
    return row["arch"], row["routing"] or "", row["seed"], row.get("device", "cpu")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--arch", required=True)
    p.add_argument("--routing", default="")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--valid-bleu", type=float, required=True)
    p.add_argument("--test-bleu", type=float, required=True)
    p.add_argument("--max-update", type=int, required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--command", required=True)
    p.add_argument("--results", default=None)
    args = p.parse_args(argv)
    updates, epochs, losses, early = parse_train_log(os.path.join(args.work, "train.log"), "loss")
    seconds = train_seconds(os.path.join(args.work, "train.log"))
    row = {
        "arch": args.arch, "routing": args.routing or None, "seed": args.seed, "updates": updates,
        "epochs": epochs, "converged": early, "best_valid_loss": min(losses),
        "valid_bleu": args.valid_bleu, "test_bleu": args.test_bleu, "train_seconds": seconds, "device": args.device,
        "command": args.command,
    }
    if not early and updates < args.max_update:
        raise SystemExit(f"converged_rows: {args.work} stopped at {updates} updates, neither by --patience nor "
                         f"at --max-update {args.max_update}: an interrupted run (run the command again)")
    with open(os.path.join(args.work, "result.json"), "w") as f:
        json.dump(row, f, indent=1)
    if args.results:
        upsert(args.results, [row], key)
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
