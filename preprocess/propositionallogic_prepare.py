#!/usr/bin/env python
"""Bowman et al. (2015) propositional-logic inference → fairseq ``sentence_prediction`` data.

    python preprocess/propositionallogic_prepare.py --data ../shared/data/propositionallogic \
        --dest data-bin/logic [--train-max-ops 6] [--keep-brackets] [--max-train N]

Reads ``train{0..K}`` (K = --train-max-ops) and ``test{1..12}`` (``.xz`` or
plain; lines ``RELATION<TAB>premise<TAB>hypothesis``), holds out 10% of the
training lines as ``valid`` (the FastTrees/ON-LSTM protocol), and binarizes
``input0`` (premise), ``input1`` (hypothesis) and ``label`` (premise and
hypothesis share one dictionary) exactly as ``fairseq-preprocess --only-source``
would, but in one process.  The test files become fairseq subsets ``test_ops1`` …
``test_ops12`` (``fairseq-validate --valid-subset test_ops7`` ...).
Brackets are removed by default (``--keep-brackets`` keeps them).  Beware: the
formulas are binary trees written ``( x ( op y ) )``, and without the brackets the
label often depends on a bracketing the input no longer shows (``not not f and e``
is generated as ``not ((not f) and e)``), so the bracket-free task is ambiguous and
caps every model's accuracy; ``examples/fasttrees/logic.sh`` keeps them by default.
"""
import argparse
import lzma
import os
import random


def read_split(data, name):
    for path, opener in ((os.path.join(data, name + ".xz"), lzma.open), (os.path.join(data, name), open)):
        if os.path.exists(path):
            rows = []
            with opener(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) != 3:
                        raise SystemExit(f"{path}:{n}: expected RELATION<TAB>premise<TAB>hypothesis, got {line!r}")
                    rows.append(parts)
            return rows
    return None


def clean(formula, keep_brackets):
    toks = formula.split()
    return " ".join(toks if keep_brackets else [t for t in toks if t not in ("(", ")")])


def binarize(lines, dictionary, prefix):
    """Writes ``prefix.bin/.idx`` (mmap, EOS appended) as fairseq-preprocess does."""
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(dictionary))
    for line in lines:
        builder.add_item(dictionary.encode_line(line, add_if_not_exist=False, append_eos=True))
    builder.finalize(prefix + ".idx")


def build_dictionary(lines):
    from fairseq.data import Dictionary

    d = Dictionary()
    for line in lines:
        for w in line.split():
            d.add_symbol(w)
    d.finalize(padding_factor=8)
    return d


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory with train0..train12 / test0..test12 (.xz or plain)")
    p.add_argument("--dest", required=True)
    p.add_argument("--train-max-ops", type=int, default=6, help="train on formulas with at most this many operators")
    p.add_argument("--test-ops", default="1-12", help="operator counts to build test subsets for, e.g. 1-12")
    p.add_argument("--keep-brackets", action="store_true")
    p.add_argument("--max-train", type=int, default=0, help="subsample the training lines (reduced budgets)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-valid", type=int, default=0, help="cap the validation lines")
    args = p.parse_args(argv)
    if not os.path.isdir(args.data):
        raise SystemExit(f"--data {args.data}: not a directory")
    train = []
    for k in range(args.train_max_ops + 1):
        rows = read_split(args.data, f"train{k}")
        if rows is None:
            raise SystemExit(f"--data {args.data}: train{k}(.xz) missing")
        train += rows
    rng = random.Random(args.seed)
    rng.shuffle(train)
    n_valid = max(1, len(train) // 10)
    valid, train = train[:n_valid], train[n_valid:]
    if args.max_train:
        train = train[: args.max_train]
    if args.max_valid:
        valid = valid[: args.max_valid]
    lo, hi = (int(x) for x in args.test_ops.split("-"))
    tests = {}
    for k in range(lo, hi + 1):
        rows = read_split(args.data, f"test{k}")
        if rows is None:
            raise SystemExit(f"--data {args.data}: test{k}(.xz) missing")
        tests[f"test_ops{k}"] = rows
    splits = {"train": train, "valid": valid, **tests}
    text = {name: [(clean(p, args.keep_brackets), clean(h, args.keep_brackets), r) for r, p, h in rows]
            for name, rows in splits.items()}
    words = build_dictionary([x for p, h, _ in text["train"] for x in (p, h)])
    labels = build_dictionary([r for _, _, r in text["train"]])
    for col, (side, d) in enumerate([("input0", words), ("input1", words), ("label", labels)]):
        os.makedirs(os.path.join(args.dest, side), exist_ok=True)
        d.save(os.path.join(args.dest, side, "dict.txt"))
        for name, rows in text.items():
            binarize([r[col] for r in rows], d, os.path.join(args.dest, side, name))
    print(f"train {len(train)}  valid {len(valid)}  test subsets: {', '.join(tests)}  -> {args.dest}")


if __name__ == "__main__":
    main()
