#!/usr/bin/env python
"""One finished run of ``examples/translation/multi30k_converged.sh`` as a result row.

Reads the run's ``train.log`` (fairseq's simple log) for the number of updates, the validation-loss
history and whether training stopped by ``--patience`` (``converged``) or at ``--max-update``
(not converged), writes ``WORK/result.json`` and, with ``--results``, replaces the row of the same
(arch, routing, seed, device) in that JSON list (creating the file), keeping it sorted.  Runs that finish
at the same time (``benchmarks/gpu/multi30k_converged.sh``) take turns at the file (an exclusive lock).
"""
import argparse
import fcntl
import json
import os
import re
import sys


def parse_log(path):
    """(updates, epochs, validation losses in order, stopped early) of a fairseq-train log."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    valid = [(int(e), float(l), int(u)) for e, l, u in re.findall(
        r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+) \|.*?num_updates (\d+)", text)]
    if not valid:
        raise SystemExit(f"converged_rows: {path} holds no validation line; did training run?")
    early = "early stop since valid performance hasn't improved" in text
    return valid[-1][2], valid[-1][0], [loss for _, loss, _ in valid], early


def key(row):
    return row["arch"], row["routing"] or "", row["seed"], row.get("device", "cpu")


def upsert(path, new_rows, key=key):
    """Replaces the rows of the JSON list at ``path`` (created if absent) that have the ``key`` of one of
    ``new_rows`` by those, keeping the list sorted by ``key``; runs finishing together take turns (a lock)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = []
        if os.path.exists(path):
            with open(path) as f:
                rows = json.load(f)
        replaced = {key(r) for r in new_rows}
        rows = sorted([r for r in rows if key(r) not in replaced] + list(new_rows), key=key)
        with open(path + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
        os.replace(path + ".tmp", path)


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
    updates, epochs, losses, early = parse_log(os.path.join(args.work, "train.log"))
    seconds_file = os.path.join(args.work, "train_seconds")
    seconds = None
    if os.path.exists(seconds_file):
        with open(seconds_file) as f:
            seconds = sum(int(x) for x in f.read().split())
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
        upsert(args.results, [row])
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
