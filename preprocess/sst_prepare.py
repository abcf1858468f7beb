#!/usr/bin/env python
"""SST (sentence level) -> binarized data for fairseq's ``sentence_prediction`` task.

Reads the ``stsa`` files of ``shared/data/sst`` (``LABEL<space>tokenised sentence``, one per
line) and writes ``DEST/input0`` and ``DEST/label`` as ``fairseq-preprocess`` does for
RoBERTa's GLUE recipes.  Labels keep their numeric order in ``label/dict.txt``, so class
index i is label i.  SST-2 uses ``stsa.binary.*``, SST-5 ``stsa.fine.*``.

Example::

    python preprocess/sst_prepare.py --raw ../shared/data/sst/stsa --classes 5 --dest data-bin/sst5
"""
import argparse
import os
import shutil
import sys
import tempfile

SPLITS = {"train": "train", "valid": "dev", "test": "test"}


class PrepareError(Exception):
    pass


def fairseq_preprocess(args):
    """Runs ``fairseq-preprocess`` in this process (one interpreter start for all the calls)."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess

    logging.getLogger("fairseq_cli.preprocess").setLevel(logging.WARNING)
    parsed = options.get_preprocessing_parser().parse_args(args)
    try:
        preprocess.main(parsed)
    except (Exception, SystemExit) as e:
        raise PrepareError(f"fairseq-preprocess {' '.join(args)} failed: {e}") from e


def write_label_dict(labels, path):
    with open(path, "w") as f:
        for lab in labels:
            f.write(f"{lab} 1\n")


def binarize(columns, labels, dest, thresholdsrc=0):
    """``columns``: {split: [list of texts per input column]}; ``labels``: {split: [label str]}.

    Builds DEST/input{k} (one shared dictionary learned on every training column) and DEST/label.
    The result is assembled in a temporary directory and moved into place at the end.
    """
    label_set = sorted({lab for labs in labels.values() for lab in labs}, key=lambda x: (len(x), x))
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="prep_", dir=parent)
    try:
        raw = os.path.join(tmp, "raw")
        os.makedirs(raw)
        ncols = len(next(iter(columns.values())))
        for split, cols in columns.items():
            for k, texts in enumerate(cols):
                with open(os.path.join(raw, f"{split}.input{k}"), "w") as f:
                    f.writelines(t + "\n" for t in texts)
            with open(os.path.join(raw, f"{split}.label"), "w") as f:
                f.writelines(lab + "\n" for lab in labels[split])
        # one dictionary over all training columns
        with open(os.path.join(raw, "dictsrc.txt"), "w") as f:
            for texts in columns["train"]:
                f.writelines(t + "\n" for t in texts)
        out = os.path.join(tmp, "bin")
        fairseq_preprocess(["--only-source", "--trainpref", os.path.join(raw, "dictsrc.txt"),
                            "--destdir", os.path.join(tmp, "dict"), "--dict-only",
                            "--thresholdsrc", str(thresholdsrc), "--workers", "1"])
        dict_path = os.path.join(tmp, "dict", "dict.txt")
        for k in range(ncols):
            prefs = [f"--{s}pref" if s != "train" else "--trainpref" for s in columns]
            args = ["--only-source", "--srcdict", dict_path, "--destdir", os.path.join(out, f"input{k}"),
                    "--workers", "1"]
            for split, pref in zip(columns, prefs):
                args += [pref, os.path.join(raw, f"{split}.input{k}")]
            fairseq_preprocess(args)
        write_label_dict(label_set, os.path.join(tmp, "labels.txt"))
        args = ["--only-source", "--srcdict", os.path.join(tmp, "labels.txt"),
                "--destdir", os.path.join(out, "label"), "--workers", "1"]
        for split in columns:
            args += ["--trainpref" if split == "train" else f"--{split}pref", os.path.join(raw, f"{split}.label")]
        fairseq_preprocess(args)
        if os.path.exists(dest):
            shutil.rmtree(dest)
        shutil.move(out, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return label_set


def read_stsa(path, max_lines=0):
    labels, texts = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            lab, _, text = line.partition(" ")
            if not lab.isdigit() or not text:
                raise PrepareError(f"{path}:{lineno}: expected 'LABEL sentence', got {line[:60]!r}")
            labels.append(lab)
            texts.append(text)
            if max_lines and len(labels) >= max_lines:
                break
    return labels, texts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", required=True, help="directory with stsa.{fine,binary}.{train,dev,test}")
    p.add_argument("--classes", type=int, choices=[2, 5], default=5)
    p.add_argument("--dest", required=True)
    p.add_argument("--max-lines", type=int, default=0, help="keep only the first N lines per split (tests)")
    a = p.parse_args(argv)
    name = "fine" if a.classes == 5 else "binary"
    columns, labels = {}, {}
    try:
        for split, file_split in SPLITS.items():
            path = os.path.join(a.raw, f"stsa.{name}.{file_split}")
            if not os.path.exists(path):
                raise PrepareError(f"missing file {path}")
            labels[split], texts = read_stsa(path, a.max_lines)
            columns[split] = [texts]
        label_set = binarize(columns, labels, a.dest)
    except PrepareError as e:
        sys.exit(f"sst_prepare: {e}")
    print(f"wrote {a.dest}: {sum(len(v) for v in labels.values())} sentences, labels {label_set}")


if __name__ == "__main__":
    main()
