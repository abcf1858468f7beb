#!/usr/bin/env python
"""Raw parallel text → BPE → binarized fairseq data (``fairseq-preprocess``).

Input: a directory with one file per split and language, e.g. ``train.en``,
``valid.en``, ``test.en`` (``val``/``dev`` prefixes, name infixes such as
``train.lc.norm.tok.en`` and ``.gz`` files are recognised; ``--train-pref``,
``--valid-pref``, ``--test-pref`` pick them explicitly).  As with
``fairseq-preprocess --testpref a,b,c``, ``--test-pref`` (and ``--valid-pref``)
take a comma list: the sets become the splits ``test``, ``test1``, ``test2``, …
(``valid``, ``valid1``, …), all with the training split's BPE and dictionary.
A missing file among them stops the run before anything is written.

Steps: optional Moses tokenisation (sacremoses) and lowercasing → cleaning of
the training split (empty lines, ``--max-len`` tokens, ``--max-ratio``) →
BPE learned on the training split (subword-nmt, joint by default, or
sentencepiece) and applied to every split → ``fairseq-preprocess``.
The result is built in a temporary directory and moved into ``--dest`` only
when every step succeeded, so a failed run never leaves data that looks
complete.

Example::

    python preprocess/prepare_translation.py --raw ../shared/data/multi30k/tok \\
        --src en --tgt de --dest data-bin/multi30k --bpe subword-nmt --merges 8000 \\
        --test-pref test_2016_flickr.lc.norm.tok,test_2017_flickr.lc.norm.tok,test_2017_mscoco.lc.norm.tok
"""
import argparse
import glob
import gzip
import io
import os
import shutil
import subprocess
import sys
import tempfile

SPLIT_PREFIXES = {"train": ["train"], "valid": ["valid", "val", "dev"], "test": ["test"]}


class PrepareError(Exception):
    """A problem with the user's input, reported as one line."""


def _open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def split_names(split, prefixes):
    """fairseq-preprocess's names for a comma list of prefixes: ``test``, ``test1``, ``test2``, …"""
    return [split if k == 0 else f"{split}{k}" for k in range(len(prefixes))]


def find_split_file(raw_dir, split, lang, explicit_prefix=None, name=None):
    """Locate the raw file of one split and language in ``raw_dir`` (``name``: e.g. ``test1`` of ``test``)."""
    if explicit_prefix:
        candidates = [f"{explicit_prefix}.{lang}", f"{explicit_prefix}.{lang}.gz"]
        found = [c for c in candidates if os.path.isfile(c) or os.path.isfile(os.path.join(raw_dir, c))]
        if not found:
            raise PrepareError(f"--{split}-pref: no file {explicit_prefix}.{lang}[.gz] (in {raw_dir} or as a path) "
                               f"for the {name or split} split")
        return found[0] if os.path.isfile(found[0]) else os.path.join(raw_dir, found[0])
    for prefix in SPLIT_PREFIXES[split]:
        for suffix in (f".{lang}", f".{lang}.gz"):
            exact = os.path.join(raw_dir, prefix + suffix)
            if os.path.isfile(exact):
                return exact
            matches = sorted(glob.glob(os.path.join(raw_dir, f"{prefix}[._]*{suffix}")))
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise PrepareError(
                    f"several candidate {split} files for '{lang}' in {raw_dir}: "
                    f"{', '.join(os.path.basename(m) for m in matches)}; pick one with --{split}-pref"
                )
    raise PrepareError(
        f"no {split} file for language '{lang}' in {raw_dir} "
        f"(looked for {'/'.join(SPLIT_PREFIXES[split])}[.*].{lang}[.gz])"
    )


def read_lines(path):
    with _open_text(path) as f:
        return [line.rstrip("\n") for line in f]


def read_parallel(src_path, tgt_path):
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise PrepareError(
            f"misaligned parallel files: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)} lines"
        )
    if not src:
        raise PrepareError(f"empty corpus: {src_path} and {tgt_path} have no lines")
    return src, tgt


def normalise(lines, lang, tokenize, lowercase):
    if tokenize:
        from sacremoses import MosesTokenizer

        tok = MosesTokenizer(lang=lang)
        lines = [tok.tokenize(line, escape=False, return_str=True) for line in lines]
    if lowercase:
        lines = [line.lower() for line in lines]
    return [" ".join(line.split()) for line in lines]


def clean(src, tgt, max_len, max_ratio):
    """Drops empty pairs, pairs over ``max_len`` tokens and pairs whose length ratio exceeds ``max_ratio``."""
    kept = []
    for s, t in zip(src, tgt):
        ns, nt = len(s.split()), len(t.split())
        if ns == 0 or nt == 0 or ns > max_len or nt > max_len:
            continue
        if max(ns, nt) / min(ns, nt) > max_ratio:
            continue
        kept.append((s, t))
    return [s for s, _ in kept], [t for _, t in kept]


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


class SubwordNmtBPE:
    def __init__(self, train_texts, merges, workdir):
        from subword_nmt.learn_bpe import learn_bpe

        self.codes = os.path.join(workdir, "bpe.codes")
        joined = os.path.join(workdir, "bpe.train")
        write_lines(joined, [line for text in train_texts for line in text])
        with open(joined, encoding="utf-8") as fin, open(self.codes, "w", encoding="utf-8") as fout:
            learn_bpe(fin, fout, merges, min_frequency=2, total_symbols=False)

    def apply(self, lines):
        from subword_nmt.apply_bpe import BPE

        with open(self.codes, encoding="utf-8") as f:
            bpe = BPE(f)
        return [bpe.process_line(line) for line in lines]


class SentencePieceBPE:
    def __init__(self, train_texts, vocab_size, workdir):
        import sentencepiece as spm

        joined = os.path.join(workdir, "spm.train")
        write_lines(joined, [line for text in train_texts for line in text])
        prefix = os.path.join(workdir, "spm")
        spm.SentencePieceTrainer.train(
            input=joined, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
            character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
        )
        self.sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        self.codes = prefix + ".model"

    def apply(self, lines):
        return [" ".join(self.sp.encode(line, out_type=str)) for line in lines]


def run_fairseq_preprocess(args, text_dir, out_dir, names):
    def prefs(split):
        return ",".join(os.path.join(text_dir, n) for n in names[split])

    cmd = [
        os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess"),
        "--source-lang", args.src, "--target-lang", args.tgt,
        "--trainpref", prefs("train"), "--validpref", prefs("valid"), "--testpref", prefs("test"),
        "--destdir", out_dir, "--workers", str(args.workers),
        "--thresholdsrc", str(args.vocab_threshold), "--thresholdtgt", str(args.vocab_threshold),
    ]
    if not os.path.exists(cmd[0]):
        cmd[0] = shutil.which("fairseq-preprocess") or "fairseq-preprocess"
    if args.joined_dictionary:
        cmd.append("--joined-dictionary")
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def prepare(args):
    if not os.path.isdir(args.raw):
        raise PrepareError(f"raw data directory not found: {args.raw}")
    if args.src == args.tgt:
        raise PrepareError(f"--src and --tgt are both '{args.src}'")
    prefixes = {"train": [args.train_pref], "valid": [args.valid_pref], "test": [args.test_pref]}
    for split in ("valid", "test"):
        if prefixes[split][0]:
            prefixes[split] = prefixes[split][0].split(",")
            if not all(prefixes[split]):
                raise PrepareError(f"--{split}-pref {','.join(prefixes[split])!r}: empty entry in the comma list")
    if args.train_pref and "," in args.train_pref:
        raise PrepareError(f"--train-pref {args.train_pref!r}: one training set only (concatenate the files)")
    names = {split: split_names(split, p) for split, p in prefixes.items()}
    paths = {}
    for split in ("train", "valid", "test"):  # every file located before any is read or written
        for name, prefix in zip(names[split], prefixes[split]):
            paths[name] = (split, [find_split_file(args.raw, split, lang, prefix, name) for lang in (args.src, args.tgt)])
    data = {}
    for name, (split, (src_path, tgt_path)) in paths.items():
        src, tgt = read_parallel(src_path, tgt_path)
        src = normalise(src, args.src, args.tokenize, args.lowercase)
        tgt = normalise(tgt, args.tgt, args.tokenize, args.lowercase)
        if split == "train":
            n = len(src)
            src, tgt = clean(src, tgt, args.max_len, args.max_ratio)
            print(f"| train: kept {len(src)} of {n} pairs after cleaning "
                  f"(max-len {args.max_len}, max-ratio {args.max_ratio})", file=sys.stderr)
            if not src:
                raise PrepareError(f"empty corpus: no training pair of {src_path} survives cleaning")
        data[name] = (src, tgt)

    os.makedirs(os.path.dirname(os.path.abspath(args.dest)) or ".", exist_ok=True)
    work = tempfile.mkdtemp(prefix=".prepare-", dir=os.path.dirname(os.path.abspath(args.dest)))
    try:
        text_dir = os.path.join(work, "text")
        os.makedirs(text_dir)
        train_texts = list(data["train"])
        if args.bpe == "subword-nmt":
            bpe = SubwordNmtBPE(train_texts, args.merges, work)
        elif args.bpe == "sentencepiece":
            bpe = SentencePieceBPE(train_texts, args.merges, work)
        else:
            bpe = None
        for split, (src, tgt) in data.items():
            for lang, lines in ((args.src, src), (args.tgt, tgt)):
                write_lines(os.path.join(text_dir, f"{split}.{lang}"), bpe.apply(lines) if bpe else lines)
        bin_dir = os.path.join(work, "bin")
        run_fairseq_preprocess(args, text_dir, bin_dir, names)
        if bpe is not None:
            shutil.copy(bpe.codes, os.path.join(bin_dir, os.path.basename(bpe.codes)))
        # the un-BPE'd references, for scoring with sacrebleu
        for split, (src, tgt) in data.items():
            write_lines(os.path.join(bin_dir, f"{split}.raw.{args.src}"), src)
            write_lines(os.path.join(bin_dir, f"{split}.raw.{args.tgt}"), tgt)
        if os.path.exists(args.dest):
            shutil.rmtree(args.dest)
        os.replace(bin_dir, args.dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"| binarized data in {args.dest}", file=sys.stderr)


def build_parser():
    p = argparse.ArgumentParser(description="Raw parallel text → BPE → fairseq-preprocess")
    p.add_argument("--raw", required=True, help="directory with the raw train/valid/test files")
    p.add_argument("--src", required=True, help="source language suffix, e.g. en")
    p.add_argument("--tgt", required=True, help="target language suffix, e.g. de")
    p.add_argument("--dest", required=True, help="output directory for the binarized data")
    p.add_argument("--train-pref", help="explicit train prefix (path or name in --raw)")
    p.add_argument("--valid-pref", help="explicit valid prefix; a comma list gives valid, valid1, …")
    p.add_argument("--test-pref", help="explicit test prefix; a comma list a,b,c gives test, test1, test2 "
                   "(as fairseq-preprocess --testpref)")
    p.add_argument("--bpe", choices=["subword-nmt", "sentencepiece", "none"], default="subword-nmt")
    p.add_argument("--merges", type=int, default=8000,
                   help="BPE merge operations (subword-nmt) or vocabulary size (sentencepiece)")
    p.add_argument("--vocab-threshold", type=int, default=0,
                   help="map words occurring fewer times than this to <unk> in fairseq's dictionary")
    p.add_argument("--joined-dictionary", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--tokenize", action="store_true", help="Moses-tokenize with sacremoses first")
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--max-len", type=int, default=250, help="drop training pairs longer than this (tokens)")
    p.add_argument("--max-ratio", type=float, default=9.0, help="drop training pairs with a larger length ratio")
    p.add_argument("--workers", type=int, default=1)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        prepare(args)
    except PrepareError as e:
        print(f"prepare_translation.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except subprocess.CalledProcessError as e:
        print(f"prepare_translation.py: error: fairseq-preprocess failed (exit {e.returncode})", file=sys.stderr)
        sys.exit(e.returncode or 1)


if __name__ == "__main__":
    main()
