#!/usr/bin/env python
"""Mathematical language understanding (MLU; Wangperawong 2018, tensor2tensor's ``algorithmic_math_...``
description) generated from a seed, character level, as fairseq translation data.

    python preprocess/mlu_prepare.py --out benchmarks/work/mlu_raw --train 100000 --valid 2000 --test 10000 \
        --seed 1 [--dest benchmarks/work/mlu_bin]

Each example assigns two integers drawn uniformly from [−1000, 1000) to x and y, in a random order, then asks for
``a op b`` with a, b ∈ {x, y} and op ∈ {+, −, *}; the answer is the target::

    source  y=-523,x=85,x*y        target  -44455

Both sides are written one character per token (``y = - 5 2 3 , x = 8 5 , x * y``) to ``OUT/{train,valid,test}.
{src,tgt}``; an example appears in one split only.  With ``--dest`` they are binarized with one joined
dictionary (``preprocess/prepare_translation.py --bpe none``, no length filtering).  Accuracy is per sequence:
a prediction counts when every character of the answer is right.
"""
import argparse
import os
import random
import sys

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def example(rng):
    """(source, answer) of one MLU question."""
    values = {"x": rng.randrange(-1000, 1000), "y": rng.randrange(-1000, 1000)}
    names = ["x", "y"]
    rng.shuffle(names)
    a, b, op = rng.choice("xy"), rng.choice("xy"), rng.choice(sorted(OPS))
    source = ",".join(f"{n}={values[n]}" for n in names) + f",{a}{op}{b}"
    return source, str(OPS[op](values[a], values[b]))


def characters(text):
    return " ".join(text)


def generate(sizes, seed):
    """{split: [(source, answer)]}, the splits disjoint."""
    rng = random.Random(seed)
    seen, out = set(), {}
    for split, n in sizes.items():
        rows = []
        while len(rows) < n:
            ex = example(rng)
            if ex[0] not in seen:
                seen.add(ex[0])
                rows.append(ex)
        out[split] = rows
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the character-level text files")
    p.add_argument("--train", type=int, default=100000)
    p.add_argument("--valid", type=int, default=2000)
    p.add_argument("--test", type=int, default=10000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dest", help="also binarize into this directory (fairseq translation data, src -> tgt)")
    args = p.parse_args(argv)
    for split in ("train", "valid", "test"):
        if getattr(args, split) < 1:
            p.error(f"--{split} must be >= 1, got {getattr(args, split)}")
    data = generate({"train": args.train, "valid": args.valid, "test": args.test}, args.seed)
    os.makedirs(args.out, exist_ok=True)
    for split, rows in data.items():
        for side, k in (("src", 0), ("tgt", 1)):
            with open(os.path.join(args.out, f"{split}.{side}"), "w", encoding="utf-8") as f:
                f.writelines(characters(row[k]) + "\n" for row in rows)
    print(f"mlu_prepare: {args.train} / {args.valid} / {args.test} examples in {args.out}")
    if args.dest:
        import prepare_translation

        return prepare_translation.main(["--raw", args.out, "--src", "src", "--tgt", "tgt", "--dest", args.dest,
                                         "--bpe", "none", "--max-len", "100000", "--max-ratio", "100000"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
