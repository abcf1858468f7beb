#!/usr/bin/env python
"""CoNLL-style tagging data (CoNLL-2003 NER/POS, PTB POS sample) -> a ``sequence_tagging`` data dir.

Writes ``DEST/{train,valid,test}.txt`` (``token TAG`` per line, blank line between
sentences), ``DEST/dict.txt`` (words of the training split, ``--min-count``) and
``DEST/tags.txt`` (tags of the training split).  Sources:

* ``--conll DIR``: ``DIR/{train,valid,test}.txt`` in CoNLL format; ``--tag-column`` picks
  the tag (CoNLL-2003: 3 = NER, 1 = POS).  ``-DOCSTART-`` and header lines are skipped.
* ``--ptb-zip FILE``: NLTK's ``treebank.zip`` (gold trees ``treebank/combined/wsj_*.mrg``);
  files wsj_0001-0159 train, 0160-0179 valid, 0180-0199 test.  ``-NONE-`` traces are dropped.

Examples::

    python preprocess/conll_tagging_prepare.py --conll ../shared/data/conll2003 --tag-column 3 --dest data/conll03-ner
    python preprocess/conll_tagging_prepare.py --ptb-zip ../shared/data/ptb-treebank-sample-nltk/treebank.zip \\
        --dest data/ptb-pos
"""
import argparse
import collections
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from user_dir.tasks.sequence_tagging import TaggingFormatError, read_conll  # noqa: E402


_LEAF = re.compile(r"\(([^\s()]+) ([^\s()]+)\)")


def _trees(text):
    """Top-level bracketed trees of a .mrg file (one per sentence)."""
    depth, start = 0, None
    for i, ch in enumerate(text):
        if ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                yield text[start: i + 1]


def ptb_sentences(zip_path):
    """{split: [(words, tags)]} from the gold trees of NLTK's treebank sample (combined/*.mrg)."""
    splits = collections.defaultdict(list)
    with zipfile.ZipFile(zip_path) as z:
        names = sorted(n for n in z.namelist() if re.search(r"combined/wsj_\d{4}\.mrg$", n))
        if not names:
            raise TaggingFormatError(f"{zip_path}: no treebank/combined/wsj_*.mrg files inside")
        for name in names:
            num = int(re.search(r"wsj_(\d{4})", name).group(1))
            split = "train" if num < 160 else "valid" if num < 180 else "test"
            for tree in _trees(z.read(name).decode("utf-8")):
                leaves = [(w, t) for t, w in _LEAF.findall(tree) if t != "-NONE-"]
                if leaves:
                    splits[split].append(([w for w, _ in leaves], [t for _, t in leaves]))
    return splits


def write_dir(splits, dest, min_count=1):
    os.makedirs(dest, exist_ok=True)
    counts, tagset = collections.Counter(), set()
    for words, tags in splits["train"]:
        counts.update(words)
        tagset.update(tags)
    for split, sents in splits.items():
        with open(os.path.join(dest, f"{split}.txt"), "w", encoding="utf-8") as f:
            for words, tags in sents:
                f.writelines(f"{w} {t}\n" for w, t in zip(words, tags))
                f.write("\n")
    with open(os.path.join(dest, "dict.txt"), "w", encoding="utf-8") as f:
        for w, c in counts.most_common():
            if c >= min_count:
                f.write(f"{w} {c}\n")
    with open(os.path.join(dest, "tags.txt"), "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in sorted(tagset))
    return {k: len(v) for k, v in splits.items()}, sorted(tagset)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--conll", help="directory with train.txt, valid.txt, test.txt")
    src.add_argument("--ptb-zip", help="NLTK treebank.zip")
    p.add_argument("--dest", required=True)
    p.add_argument("--word-column", type=int, default=0)
    p.add_argument("--tag-column", type=int, default=-1)
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--min-count", type=int, default=1)
    p.add_argument("--max-sentences", type=int, default=0, help="keep the first N sentences per split (tests)")
    a = p.parse_args(argv)
    try:
        if a.conll:
            splits = {}
            for split in ("train", "valid", "test"):
                sents = read_conll(os.path.join(a.conll, f"{split}.txt"), a.word_column, a.tag_column, a.lowercase)
                splits[split] = [(w, t) for w, t, _ in sents]
        else:
            splits = ptb_sentences(a.ptb_zip)
        if a.max_sentences:
            splits = {k: v[: a.max_sentences] for k, v in splits.items()}
        counts, tags = write_dir(splits, a.dest, a.min_count)
    except (TaggingFormatError, FileNotFoundError) as e:
        sys.exit(f"conll_tagging_prepare: {e}")
    print(f"wrote {a.dest}: sentences {counts}, {len(tags)} tags")


if __name__ == "__main__":
    main()
