#!/usr/bin/env python
"""Unsupervised constituency parsing with a FastTrees model (ON-LSTM §4.3 protocol).

    python examples/fasttrees/eval_parsing.py --path checkpoints/ptb_lm/checkpoint_best.pt \
        --treebank ../shared/data/ptb-treebank-sample-nltk/treebank.zip [--max-len 10]

Reads the gold trees of ``treebank/combined/*.mrg`` (NLTK's 10% PTB sample),
drops punctuation and empty elements, lowercases and maps digits to ``N``
(as the Mikolov PTB the LM was trained on), induces a tree per sentence and
per layer from the master-forget-gate distances, and prints the
sentence-level unlabelled bracketing F1 against the gold trees, next to the
left- and right-branching baselines.
"""
import argparse

from user_dir.modules.fasttrees_trees import (
    build_tree, leaves, left_branching, load_model, read_treebank, right_branching, sentence_distances, sentence_f1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", required=True, help="checkpoint of a fasttrees_transformer_lm (or other FastTrees model)")
    p.add_argument("--data", help="binarized data directory, if not where training saw it")
    p.add_argument("--treebank", required=True, help="treebank.zip of ptb-treebank-sample-nltk (or a dir of .mrg)")
    p.add_argument("--max-len", type=int, default=0, help="only sentences of at most this many words (10: WSJ10)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N sentences")
    args = p.parse_args(argv)
    try:
        model, dictionary = load_model(args.path, args.data)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    golds = [t for t in read_treebank(args.treebank) if len(leaves(t)) >= 2]
    if args.max_len:
        golds = [t for t in golds if len(leaves(t)) <= args.max_len]
    if args.limit:
        golds = golds[: args.limit]
    sums, unk, total = {}, 0, 0
    for gold in golds:
        words = leaves(gold)
        unk += sum(dictionary.index(w) == dictionary.unk() for w in words)
        total += len(words)
        dist = sentence_distances(model, dictionary, words)
        scores = {"left-branching": sentence_f1(left_branching(words), gold),
                  "right-branching": sentence_f1(right_branching(words), gold)}
        for layer in range(dist.size(0)):
            scores[f"{getattr(model, 'tree_label', 'FastTrees')} layer {layer}"] = sentence_f1(build_tree(dist[layer].tolist(), words), gold)
        for k, v in scores.items():
            sums[k] = sums.get(k, 0.0) + v
    print(f"sentences: {len(golds)}  words: {total}  OOV rate: {unk / max(total, 1):.3f}")
    print("| parser | sentence-level unlabelled F1 |\n|---|---|")
    for k, v in sums.items():
        print(f"| {k} | {100 * v / max(len(golds), 1):.1f} |")


if __name__ == "__main__":
    main()
