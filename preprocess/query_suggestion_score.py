#!/usr/bin/env python
"""Scores ``fairseq-generate --nbest k`` output for query suggestion: BLEU, exact match@1/@k, MRR.

The n-best suggestions of each example are its ``H-<id>`` lines (or ``D-`` with
``--detok``) in the order fairseq prints them (best first); references come from
``--ref`` (one per line, e.g. ``DEST/raw/test.tgt`` of
``preprocess/query_suggestion_prepare.py``) or else from the ``T-<id>`` lines.
A missing example is an error, never a silently smaller test set.  Definitions:
``user_dir/modules/query_suggestion_metrics.py``.  The last line printed is
``BLEU = … EM@1 = … EM@k = … MRR = … (n = …)``.
"""
import argparse
import collections
import sys

from query_suggestion_load import load_module  # noqa: E402

_m = load_module("query_suggestion_metrics")
score = _m.score


def read_generate_output(path, hyp_prefix="H"):
    """{id: [suggestions, best first]} and {id: reference} from fairseq-generate output."""
    nbest, refs = collections.defaultdict(list), {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            head, _, rest = line.rstrip("\n").partition("\t")
            kind, dash, idx = head.partition("-")
            if not dash or not idx.isdigit():
                continue
            if kind == hyp_prefix:
                nbest[int(idx)].append(rest.partition("\t")[2])  # drop the score column
            elif kind == "T":
                refs[int(idx)] = rest
    return nbest, refs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("generate_output")
    p.add_argument("--ref", help="reference next queries, one per line (default: the T- lines)")
    p.add_argument("--k", type=int, default=5, help="report exact match@k (and @1)")
    p.add_argument("--detok", action="store_true", help="score the D- lines instead of the H- lines")
    args = p.parse_args(argv)
    nbest, refs = read_generate_output(args.generate_output, "D" if args.detok else "H")
    if args.ref:
        with open(args.ref, encoding="utf-8") as f:
            refs = dict(enumerate(line.rstrip("\n") for line in f))
    if not refs:
        sys.exit(f"query_suggestion_score.py: error: no references (no T- lines in {args.generate_output}; pass --ref)")
    missing = sorted(i for i in refs if i not in nbest)
    if missing:
        sys.exit(f"query_suggestion_score.py: error: {args.generate_output} has no suggestion for {len(missing)} of "
                 f"{len(refs)} examples (first: id {missing[0]})")
    ids = sorted(refs)
    lists = [nbest[i] for i in ids]
    shortest = min(len(h) for h in lists)
    if shortest < args.k:
        print(f"warning: some examples have only {shortest} suggestions (< --k {args.k}); was --nbest {args.k} set?",
              file=sys.stderr)
    s = score([refs[i] for i in ids], lists, ks=sorted({1, args.k}))
    print(f"BLEU = {s['bleu']:.2f} EM@1 = {s['em@1']:.2f} EM@{args.k} = {s[f'em@{args.k}']:.2f} "
          f"MRR = {s['mrr']:.2f} (n = {s['n']})")


if __name__ == "__main__":
    main()
