#!/usr/bin/env python
"""One finished run of ``benchmarks/fasttrees/ptb_lstm.sh`` as a result row.

Reads the run's ``train.log`` (the number of updates reached), ``eval_valid.txt`` / ``eval_test.txt``
(``fairseq-eval-lm``'s perplexity) and ``parsing_all.txt`` / ``parsing_wsj10.txt`` (the F1 tables of
``examples/fasttrees/eval_parsing.py``), writes ``WORK/result.json`` and, with ``--results``, replaces the row of
the same (size flags, arch, seed) in that JSON list.  A run that stopped before ``--max-update``: no row.
"""
import os
import re
import sys

from rows import record, run_arguments
from user_dir.result_rows import train_seconds


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def perplexity(path):
    found = re.findall(r"Perplexity: ([\d.]+)", read(path))
    if not found:
        raise SystemExit(f"ptb_rows: {path} holds no perplexity; did fairseq-eval-lm run?")
    return float(found[-1])


def parsing_f1(path):
    """{parser: sentence-level F1 (%)} and the sentence count of an eval_parsing.py table."""
    text = read(path)
    count = re.search(r"sentences: (\d+)", text)
    scores = {name.strip(): float(f1) for name, f1 in re.findall(r"^\| ([^|]+) \| ([\d.]+) \|$", text, re.M)}
    if not count or not scores:
        raise SystemExit(f"ptb_rows: {path} holds no parsing table")
    return scores, int(count.group(1))


def main(argv=None):
    args = run_arguments(__doc__.split("\n\n")[0], "--max-update", argv)
    train_log = os.path.join(args.work, "train.log")
    updates = [int(u) for u in re.findall(r"num_updates[= ](\d+)", read(train_log))]
    if not updates or max(updates) < args.max_update:
        raise SystemExit(f"ptb_rows: {args.work} stopped at update {max(updates, default=0)} of {args.max_update}: "
                         "an interrupted run (run the command again)")
    parsing, sentences = parsing_f1(os.path.join(args.work, "parsing_all.txt"))
    parsing10, sentences10 = parsing_f1(os.path.join(args.work, "parsing_wsj10.txt"))
    row = {"arch": args.arch, "seed": args.seed, "size_flags": args.size_flags, "updates": max(updates),
           "valid_ppl": perplexity(os.path.join(args.work, "eval_valid.txt")),
           "test_ppl": perplexity(os.path.join(args.work, "eval_test.txt")),
           "parsing_f1": parsing, "parsing_sentences": sentences,
           "parsing_f1_wsj10": parsing10, "parsing_sentences_wsj10": sentences10,
           "train_seconds": train_seconds(train_log), "command": args.command}
    record(args.work, row, args.results, key=lambda r: (r["size_flags"], r["arch"], r["seed"]))


if __name__ == "__main__":
    sys.exit(main())
