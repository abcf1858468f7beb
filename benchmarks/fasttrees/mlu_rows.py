#!/usr/bin/env python
"""One finished run of ``benchmarks/fasttrees/mlu.sh`` as a result row: accuracy per sequence (every character
of the answer right) of ``fairseq-generate``'s output on the held-out split, upserted by (arch, seed, updates)
into ``--results``."""
import argparse
import os
import re
import sys

from rows import record
from user_dir.result_rows import train_seconds


def sequence_accuracy(generate_output):
    """(accuracy %, number of examples): hypotheses (H-) equal to their targets (T-), by sentence id."""
    hyps, refs = {}, {}
    with open(generate_output, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"([HT])-(\d+)\t(.*)$", line.rstrip("\n"))
            if m:
                kind, i, rest = m.group(1), int(m.group(2)), m.group(3)
                if kind == "T":
                    refs[i] = rest
                else:
                    hyps.setdefault(i, rest.split("\t")[-1])
    if not refs or hyps.keys() != refs.keys():
        raise SystemExit(f"mlu_rows: {generate_output} has {len(hyps)} hypotheses for {len(refs)} targets")
    return 100.0 * sum(hyps[i] == refs[i] for i in refs) / len(refs), len(refs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--work", "--arch", "--command"):
        p.add_argument(name, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--updates", type=int, required=True)
    p.add_argument("--results", default=None)
    args = p.parse_args(argv)
    accuracy, n = sequence_accuracy(os.path.join(args.work, "test.generate.txt"))
    row = {"arch": args.arch, "seed": args.seed, "updates": args.updates, "test_examples": n,
           "sequence_accuracy": accuracy, "train_seconds": train_seconds(os.path.join(args.work, "train.log")),
           "command": args.command}
    record(args.work, row, args.results, key=lambda r: (r["arch"], r["seed"], r["updates"]))


if __name__ == "__main__":
    sys.exit(main())
