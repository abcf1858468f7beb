#!/usr/bin/env python
"""Print (and optionally draw) the binary tree a FastTrees model induces for each input sentence.

    python examples/fasttrees/induce_trees.py --path checkpoints/checkpoint_best.pt [--data DATA-BIN] \
        [--input sentences.txt] [--layer 1] [--png-dir trees/]

One tokenised sentence per line (stdin by default).  For each sentence and
layer it prints ``layer<TAB>tree`` and, with ``--show-distances``, the
syntactic distances ``1 − mean(f̃_t)`` of the master forget gate.  Trees are
built greedily top-down as in ON-LSTM (user_dir/modules/fasttrees_trees.py).
"""
import argparse
import os
import sys

import user_dir  # noqa: F401  (registers the models; checkpoint allow-list)
from user_dir.modules.fasttrees_trees import (
    build_tree, draw_tree, load_model, sentence_distances, tree_to_string)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", required=True, help="fairseq checkpoint of a FastTrees model")
    p.add_argument("--data", help="binarized data directory (its dict.txt), if not where training saw it")
    p.add_argument("--input", default="-", help="file of tokenised sentences, one per line (default: stdin)")
    p.add_argument("--layer", type=int, default=None, help="only this layer (0-based); default: every layer")
    p.add_argument("--png-dir", help="also draw each tree to PNG files in this directory")
    p.add_argument("--show-distances", action="store_true", help="print the syntactic distances too")
    args = p.parse_args(argv)
    try:
        model, dictionary = load_model(args.path, args.data)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    lines = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    if args.png_dir:
        os.makedirs(args.png_dir, exist_ok=True)
    for n, line in enumerate(lines, 1):
        words = line.split()
        if not words:
            continue
        dist = sentence_distances(model, dictionary, words)
        if args.layer is not None and not 0 <= args.layer < dist.size(0):
            p.error(f"--layer {args.layer}: the model has {dist.size(0)} FastTrees layers")
        layers = range(dist.size(0)) if args.layer is None else [args.layer]
        for layer in layers:
            tree = build_tree(dist[layer].tolist(), words)
            print(f"{n}\tlayer{layer}\t{tree_to_string(tree)}")
            if args.show_distances:
                print(f"{n}\tlayer{layer}\tdistances\t" + " ".join(f"{d:.3f}" for d in dist[layer].tolist()))
            if args.png_dir:
                draw_tree(tree, os.path.join(args.png_dir, f"sent{n}_layer{layer}.png"), title=f"layer {layer}")


if __name__ == "__main__":
    main()
