#!/usr/bin/env python
"""Writes predicted tags for a file with a trained ``sequence_tagging`` checkpoint.

Input: a CoNLL-style file (the word in ``--word-column``; other columns, gold tags
included, are ignored; blank lines separate sentences; ``-DOCSTART-`` skipped) or, with
``--tokens-per-line``, one whitespace-tokenised sentence per line.  Output: ``word TAG``
per line, a blank line after each sentence (CoNLL), or ``--tokens-per-line`` output
``TAG TAG ...`` per line.

Example::

    python examples/star_transformer/predict_tags.py --path checkpoints/ner/checkpoint_best.pt \\
        --data data/conll03-ner --input data/conll03-ner/test.txt --output test.pred.txt
"""
import argparse
import sys

import torch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="checkpoint")
    p.add_argument("--data", help="data directory with dict.txt/tags.txt (default: the checkpoint's)")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--word-column", type=int, default=None, help="default: the checkpoint's --word-column")
    p.add_argument("--tokens-per-line", action="store_true")
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args(argv)

    import user_dir  # noqa: F401  (registers the plugin)
    from fairseq import checkpoint_utils
    from user_dir.tasks.sequence_tagging import TaggingFormatError

    overrides = {"data": a.data} if a.data else {}
    if a.word_column is not None:
        overrides["word_column"] = a.word_column
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([a.path], arg_overrides=overrides)
    model = models[0].eval()
    if cfg.task._name != "sequence_tagging":
        sys.exit(f"predict_tags: {a.path} was trained with --task {cfg.task._name}, not sequence_tagging")
    try:
        if a.tokens_per_line:
            with open(a.input, encoding="utf-8") as f:
                sents = [line.split() for line in f]
            ds = task.dataset_from_words(sents, source=a.input)
        else:
            ds = task.dataset_from_file(a.input, with_tags=False)
            from user_dir.tasks.sequence_tagging import read_conll
            sents = [w for w, _, _ in read_conll(a.input, task.cfg.word_column, with_tags=False)]
    except (TaggingFormatError, FileNotFoundError) as e:
        sys.exit(f"predict_tags: {e}")
    preds = []
    with torch.no_grad():
        for start in range(0, len(ds), a.batch_size):
            preds += task.predict_tags(model, ds, range(start, min(start + a.batch_size, len(ds))))
    with open(a.output, "w", encoding="utf-8") as f:
        for words, tags in zip(sents, preds):
            if a.tokens_per_line:
                f.write(" ".join(tags) + "\n")
            else:
                f.writelines(f"{w} {t}\n" for w, t in zip(words, tags))
                f.write("\n")
    print(f"wrote {a.output}: {len(preds)} sentences")


if __name__ == "__main__":
    main()
