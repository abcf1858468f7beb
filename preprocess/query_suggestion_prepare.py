#!/usr/bin/env python
"""Sessions (``.ses``: one per line, queries separated by TAB) → binarized data for ``--task query_suggestion``.

Each session q_1..q_m becomes m − 1 examples, prefix ``q_1 </q> … q_j`` →
next query q_{j+1} (``user_dir/modules/query_sessions.py``).  Writes

* ``DEST/raw/{split}.src``, ``DEST/raw/{split}.tgt``: the examples as text (the
  ``.tgt`` files are the references for ``preprocess/query_suggestion_score.py``;
  the flat-session baseline, fairseq's ``transformer`` with ``--task translation``,
  reads the very same binarized rows);
* ``DEST/dict.{src,tgt}.txt`` (one joined word dictionary from the training
  split, always holding the separator ``</q>``) and the ``fairseq-preprocess``
  output ``DEST/{split}.src-tgt.{src,tgt}.{bin,idx}``.

Bad sessions (single query, empty query, query longer than
``--max-query-length``) stop the run with the file and line named, or with
``--bad-sessions skip`` are dropped and counted.

Example::

    python preprocess/query_suggestion_prepare.py --ses-dir data/synthetic --dest data-bin/synthetic
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from query_suggestion_load import load_module  # noqa: E402

_m = load_module("query_sessions")
SEP, SessionError, flatten, read_sessions, session_examples = (
    _m.SEP, _m.SessionError, _m.flatten, _m.read_sessions, _m.session_examples)

SPLITS = ("train", "valid", "test")


def write_examples(ses_path, out_prefix, args):
    sessions, skipped = read_sessions(ses_path, args.max_query_length, args.bad_sessions)
    n = 0
    with open(out_prefix + ".src", "w", encoding="utf-8") as src, open(out_prefix + ".tgt", "w", encoding="utf-8") as tgt:
        for queries in sessions:
            for context, target in session_examples(queries, args.max_context_queries):
                src.write(flatten(context) + "\n")
                tgt.write(" ".join(target) + "\n")
                n += 1
    if n == 0:
        raise SessionError(f"{ses_path}: no usable session (a session needs at least two queries)")
    skip_note = f", skipped {sum(skipped.values())} ({dict(skipped)})" if skipped else ""
    print(f"{ses_path}: {len(sessions)} sessions -> {n} examples{skip_note}")
    return n


def build_dictionary(raw_dir, args):
    from fairseq.data import Dictionary  # imported late: input errors are reported without loading fairseq

    d = Dictionary()
    for side in ("src", "tgt"):
        with open(os.path.join(raw_dir, f"train.{side}"), encoding="utf-8") as f:
            for line in f:
                for word in line.split():
                    if word != SEP:
                        d.add_symbol(word)
    d.finalize(threshold=args.min_freq, nwords=args.nwords, padding_factor=1)
    d.add_symbol(SEP)
    d.pad_to_multiple_(8)
    return d


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ses-dir", required=True, help="directory with train.ses, valid.ses, test.ses")
    p.add_argument("--dest", required=True)
    p.add_argument("--max-query-length", type=int, default=16, help="must not exceed the task's --max-query-length")
    p.add_argument("--max-context-queries", type=int, default=0, help="keep the last N queries of a prefix (0 = all)")
    p.add_argument("--bad-sessions", choices=["error", "skip"], default="error")
    p.add_argument("--min-freq", type=int, default=1, help="words seen fewer times in training become <unk>")
    p.add_argument("--nwords", type=int, default=-1, help="keep the N most frequent words (-1 = all)")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    work = None
    try:
        for split in SPLITS:
            if not os.path.isfile(os.path.join(args.ses_dir, f"{split}.ses")):
                raise SessionError(f"{args.ses_dir}/{split}.ses not found (need train.ses, valid.ses, test.ses)")
        work = tempfile.mkdtemp(prefix=".qs-prepare-", dir=os.path.dirname(os.path.abspath(args.dest)) or ".")
        raw = os.path.join(work, "raw")
        os.makedirs(raw)
        for split in SPLITS:
            write_examples(os.path.join(args.ses_dir, f"{split}.ses"), os.path.join(raw, split), args)
        dict_path = os.path.join(work, "dict.txt")
        build_dictionary(raw, args).save(dict_path)
        fairseq_preprocess = os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess")
        cmd = [fairseq_preprocess if os.path.exists(fairseq_preprocess) else "fairseq-preprocess",
               "--source-lang", "src", "--target-lang", "tgt", "--srcdict", dict_path, "--tgtdict", dict_path,
               "--destdir", work, "--workers", str(args.workers)]
        for split in SPLITS:
            cmd += [f"--{split}pref", os.path.join(raw, split)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SessionError(f"fairseq-preprocess failed:\n{proc.stderr[-3000:]}")
        os.remove(dict_path)
        if os.path.exists(args.dest):
            shutil.rmtree(args.dest)
        os.replace(work, args.dest)
    except SessionError as e:
        sys.exit(f"query_suggestion_prepare.py: error: {e}")
    finally:
        if work and os.path.isdir(work):
            shutil.rmtree(work)
    print(f"wrote {args.dest}")


if __name__ == "__main__":
    main()
