"""Binarizes the word-level Penn Treebank (Mikolov's version, ``shared/data/ptb``) for LM tasks.

    python preprocess/ptb_lm.py --ptb ../shared/data/ptb --dest data-bin/ptb

Reads ``ptb.train.txt.xz`` (or ``ptb.train.txt``), ``ptb.valid.txt`` and
``ptb.test.txt`` and runs ``fairseq-preprocess --only-source`` (one sentence
per line; the binarizer ends every line with ``</s>``).  The vocabulary is
the corpus' own 10k words (``<unk>`` included as an ordinary word).
"""
import argparse
import lzma
import os
import shutil
import subprocess
import sys
import tempfile


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ptb", required=True, help="directory with ptb.{train,valid,test}.txt[.xz]")
    p.add_argument("--dest", required=True, help="output directory for the binarized data")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as raw:
        for split in ("train", "valid", "test"):
            src = os.path.join(args.ptb, f"ptb.{split}.txt")
            out = os.path.join(raw, f"{split}.txt")
            if os.path.exists(src):
                shutil.copy(src, out)
            elif os.path.exists(src + ".xz"):
                with lzma.open(src + ".xz", "rb") as f, open(out, "wb") as g:
                    shutil.copyfileobj(f, g)
            else:
                sys.exit(f"ptb_lm: {src}[.xz] not found")
        preprocess = os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess")
        subprocess.run([preprocess if os.path.exists(preprocess) else "fairseq-preprocess", "--only-source",
                        "--trainpref", os.path.join(raw, "train.txt"), "--validpref", os.path.join(raw, "valid.txt"),
                        "--testpref", os.path.join(raw, "test.txt"), "--destdir", args.dest,
                        "--workers", str(args.workers)], check=True)
    print(args.dest)


if __name__ == "__main__":
    main()
