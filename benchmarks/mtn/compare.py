#!/usr/bin/env python
"""MTN vs fairseq ``transformer`` on the flattened session, equal parameter count, same number of updates.

Both read the same binarized data (``preprocess/query_suggestion_prepare.py``): the
flat baseline sees each session prefix as one sequence ``q_1 </q> q_2 … q_j``
(``--task translation``), MTN splits it into queries (``--task query_suggestion``).
Same optimiser, schedule, batch size, seed and number of updates; then
``fairseq-generate --beam k --nbest k`` on the test split and
``preprocess/query_suggestion_score.py`` (BLEU, EM@1, EM@k, MRR).

Example (the recorded runs are in BENCHMARKS.md)::

    python benchmarks/mtn/compare.py --data data-bin/synthetic --updates 3000 --out benchmarks/work/syn
"""
import argparse
import json
import os
import subprocess
import sys
import time

from common import MTN_ARGS, ROOT, build_pair, n_params

BIN = os.path.dirname(sys.executable)


def sh(cmd, log, done_marker=None):
    """Runs cmd with its output in ``log``.  fairseq-train on this CPU build sometimes aborts at interpreter
    exit ("terminate called without an active exception") after finishing; ``done_marker`` in the log
    then counts as success."""
    cmd = [str(c) for c in cmd]
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode and not (done_marker and done_marker in open(log).read()):
        sys.exit(f"failed ({proc.returncode}), see {log}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--updates", type=int, default=3000)
    p.add_argument("--max-query-length", type=int, default=16)
    p.add_argument("--levels", type=int, default=2)
    p.add_argument("--nbest", type=int, default=5)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    from fairseq.data import Dictionary

    os.makedirs(args.out, exist_ok=True)
    dictionary = Dictionary.load(os.path.join(args.data, "dict.src.txt"))
    mtn, flat, flat_flags = build_pair(dictionary, args.max_query_length, args.levels)
    common = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", args.lr, "--lr-scheduler", "inverse_sqrt",
              "--warmup-updates", min(200, args.updates // 5), "--criterion", "label_smoothed_cross_entropy",
              "--label-smoothing", 0.1, "--dropout", 0.1, "--max-tokens", args.max_tokens,
              "--max-update", args.updates, "--seed", args.seed, "--cpu", "--num-workers", 0, "--no-progress-bar",
              "--log-format", "simple", "--log-interval", 100, "--disable-validation", "--no-epoch-checkpoints",
              "--user-dir", os.path.join(ROOT, "user_dir")]
    runs = {
        "mtn": (["--task", "query_suggestion", "--max-query-length", args.max_query_length, *MTN_ARGS,
                 "--levels", args.levels], n_params(mtn)),
        "transformer": (["--task", "translation", *flat_flags], n_params(flat)),
    }
    results = {}
    for name, (flags, params) in runs.items():
        save = os.path.join(args.out, name)
        t0 = time.time()
        sh([os.path.join(BIN, "fairseq-train"), args.data, *flags, *common, "--save-dir", save],
           os.path.join(args.out, f"{name}.train.log"), done_marker="done training in")
        train_s = time.time() - t0
        task = flags[:2] + (flags[2:4] if name == "mtn" else [])
        gen = os.path.join(args.out, f"{name}.gen.txt")
        sh([os.path.join(BIN, "fairseq-generate"), args.data, *task, "--path", os.path.join(save, "checkpoint_last.pt"),
            "--beam", args.nbest, "--nbest", args.nbest, "--max-len-b", args.max_query_length + 1, "--cpu",
            "--batch-size", 64, "--user-dir", os.path.join(ROOT, "user_dir")], gen)
        scored = subprocess.run([sys.executable, os.path.join(ROOT, "preprocess/query_suggestion_score.py"), gen,
                                 "--k", str(args.nbest), "--ref", os.path.join(args.data, "raw", "test.tgt")],
                                capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        results[name] = {"params": params, "updates": args.updates, "train_wall_s": round(train_s, 1),
                         "scores": scored, "flags": " ".join(map(str, flags))}
        print(f"{name}: {params} params, {args.updates} updates, {train_s:.0f}s: {scored}", flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
