#!/usr/bin/env python
"""The tree a FastTrees LM induces for one sentence of the PTB sample, next to its gold tree, as JSON for
``make_figures.py`` (docs/figures/fasttrees_tree.png).

    python benchmarks/figures/fasttrees_tree_data.py --path CKPT \
        --treebank ../shared/data/ptb-treebank-sample-nltk/treebank.zip --layer 1 \
        --out benchmarks/figures/results/fasttrees_tree.json --caption "..."

The sentence is the ``--index``-th gold tree with ``--min-len``..``--max-len`` words (punctuation removed,
lowercased, digits as N: the protocol of examples/fasttrees/eval_parsing.py).
"""
import argparse
import json

from user_dir.modules.fasttrees_trees import (
    build_tree, leaves, load_model, read_treebank, sentence_distances, sentence_f1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", required=True, help="checkpoint of a FastTrees LM")
    p.add_argument("--treebank", required=True, help="treebank.zip of ptb-treebank-sample-nltk")
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--index", type=int, default=0, help="which of the sentences of the chosen lengths")
    p.add_argument("--min-len", type=int, default=8)
    p.add_argument("--max-len", type=int, default=14)
    p.add_argument("--caption", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    model, dictionary = load_model(a.path)
    golds = [t for t in read_treebank(a.treebank) if a.min_len <= len(leaves(t)) <= a.max_len]
    if not 0 <= a.index < len(golds):
        p.error(f"--index {a.index}: only {len(golds)} sentences of {a.min_len}-{a.max_len} words")
    gold = golds[a.index]
    words = leaves(gold)
    dist = sentence_distances(model, dictionary, words)
    if not 0 <= a.layer < dist.size(0):
        p.error(f"--layer {a.layer}: the model has {dist.size(0)} FastTrees layers")
    induced = build_tree(dist[a.layer].tolist(), words)
    f1 = 100 * sentence_f1(induced, gold)
    caption = f"{a.caption} sentence F1 {f1:.1f}".strip()
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"gold": gold, "induced": induced, "layer": a.layer, "f1": round(f1, 2), "caption": caption}, f)
    print(f"wrote {a.out}: {' '.join(words)} (F1 {f1:.1f})")


if __name__ == "__main__":
    main()
