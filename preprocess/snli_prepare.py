#!/usr/bin/env python
"""SNLI (RE2 preprocessed ``premise<TAB>hypothesis<TAB>label``) -> ``sentence_pair_classification`` data.

Writes ``DEST/input0`` (premises), ``DEST/input1`` (hypotheses, same dictionary) and
``DEST/label`` (labels in numeric order: 0 entailment, 1 neutral, 2 contradiction).
``shared/data/snli-re2-preprocessed`` has only dev and test (the 550k train split is
missing), so by default the dev file is split: its first ``--valid-size`` pairs become the
validation set and the rest the training set; ``--train FILE`` uses a real train file.

Example::

    python preprocess/snli_prepare.py --dev ../shared/data/snli-re2-preprocessed/dev.txt \\
        --test ../shared/data/snli-re2-preprocessed/test.txt --dest data-bin/snli
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sst_prepare import PrepareError, binarize  # noqa: E402


def read_pairs(path, max_lines=0):
    first, second, labels = [], [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 3:
                raise PrepareError(f"{path}:{lineno}: expected 3 tab-separated columns "
                                   f"(premise, hypothesis, label), found {len(cols)}")
            first.append(cols[0])
            second.append(cols[1])
            labels.append(cols[2].strip())
            if max_lines and len(labels) >= max_lines:
                break
    return [first, second], labels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", help="training file (absent in shared/data: the dev file is split instead)")
    p.add_argument("--dev", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--valid-size", type=int, default=1000, help="without --train: dev pairs kept for validation")
    p.add_argument("--max-lines", type=int, default=0)
    a = p.parse_args(argv)
    try:
        cols, labels = {}, {}
        dev_cols, dev_labels = read_pairs(a.dev, a.max_lines)
        if a.train:
            cols["train"], labels["train"] = read_pairs(a.train, a.max_lines)
            cols["valid"], labels["valid"] = dev_cols, dev_labels
        else:
            v = a.valid_size
            if v >= len(dev_labels):
                raise PrepareError(f"--valid-size {v} leaves no training pairs in {a.dev} ({len(dev_labels)} pairs)")
            cols["train"], labels["train"] = [c[v:] for c in dev_cols], dev_labels[v:]
            cols["valid"], labels["valid"] = [c[:v] for c in dev_cols], dev_labels[:v]
        cols["test"], labels["test"] = read_pairs(a.test, a.max_lines)
        label_set = binarize(cols, labels, a.dest)
    except PrepareError as e:
        sys.exit(f"snli_prepare: {e}")
    print(f"wrote {a.dest}: {', '.join(f'{k} {len(v)}' for k, v in labels.items())} pairs, labels {label_set}")


if __name__ == "__main__":
    main()
