#!/usr/bin/env python
"""Scores ``fairseq-generate`` output with sacrebleu against raw references.

Hypotheses are taken from the ``D-`` (detokenized) lines, put back in corpus
order by their sentence id, and scored against the reference file line by
line.  A missing hypothesis is an error, never a silently shorter test set.
The last line printed is ``BLEU = <score>``.
"""
import argparse
import sys

import sacrebleu


def read_hypotheses(path):
    hyps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                head, _score, text = (line.rstrip("\n").split("\t") + [""])[:3]
                hyps.setdefault(int(head[2:]), text)  # first (best) of the n-best
    return hyps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("generate_output")
    p.add_argument("reference")
    args = p.parse_args(argv)
    hyps = read_hypotheses(args.generate_output)
    with open(args.reference, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    missing = [i for i in range(len(refs)) if i not in hyps]
    if missing:
        sys.exit(f"score_generate.py: error: {args.generate_output} has no hypothesis for "
                 f"{len(missing)} of {len(refs)} reference lines of {args.reference} (first: line {missing[0] + 1})")
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in range(len(refs))], [refs])
    print(bleu, file=sys.stderr)
    print(f"BLEU = {bleu.score:.2f}")


if __name__ == "__main__":
    main()
