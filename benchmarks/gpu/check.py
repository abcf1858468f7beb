"""Mixed-precision check on a GPU: every architecture trains under --fp16, --amp and --bf16.

For each architecture (at a paper-size preset) and each precision mode, a few hundred
``fairseq-train`` updates on generated data; prints one table row per run: final train
loss, median updates/s, peak GPU memory, gradient-overflow count and whether any loss
was NaN/inf.  Each translation model is then decoded by ``fairseq-generate --beam 5`` from the
checkpoint it saved (in float16 after an ``--fp16`` run, float32 otherwise): incremental decoding
and beam reordering on the device, with sentences/s.  With two or more GPUs it also runs fairseq's
own launcher with ``--distributed-world-size 2`` (fp16) for every architecture.  Results go to
``--out`` as JSON.  The training runs are sized to finish in under 10 minutes on one modern GPU
(``--updates 150``); each beam search adds a ``fairseq-generate`` start-up (about 6 s per run in the
CPU smoke run) and its decoding of the 100 test pairs.  ``--smoke`` runs the same commands on CPU with tiny models and 3
updates (the CI test does this, so the commands are known to parse and run).

    python benchmarks/gpu/check.py --out benchmarks/gpu/results.json
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "benchmarks", "gpu", "train.py")
BIN = os.path.dirname(sys.executable)

# precision mode -> fairseq flags (bf16 through train.py, which drops fairseq's implied --tpu)
MODES = {
    "fp32": [],
    "fp16": ["--fp16"],
    "amp": ["--amp"],
    "bf16": ["--bf16"],
}
# on CPU (--smoke) fairseq's flattened FP16Optimizer calls torch.cuda; the unflattened one runs
# (and fairseq's trainer calls .cuda() on a gradient overflow: a loss scale of 1 avoids one in 3 updates)
CPU_MODE_EXTRA = {"fp16": ["--fp16-no-flatten-grads", "--fp16-init-scale", "1"]}
WT103_VOCAB = 267735  # the paper's WikiText-103 vocabulary: the adaptive softmax runs at its real size

MT = ["--task", "translation", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
      "--share-all-embeddings", "--max-tokens", "4096"]
# architecture -> (data kind, flags at the paper-size preset, flags of the tiny --smoke model);
# --rotate-modes gives the i-th one the i-th mode: capsule_transformer (routing in float32) gets --fp16
ARCHS = {
    "capsule_transformer": ("mt", ["--arch", "capsule_transformer", *MT],
                            ["--encoder-layers", "1", "--decoder-layers", "1"]),
    "transformer": ("mt", ["--arch", "transformer", *MT], ["--encoder-layers", "1", "--decoder-layers", "1"]),
    "star_transformer_nmt": ("mt", ["--arch", "star_transformer_nmt", *MT],
                             ["--encoder-layers", "1", "--decoder-layers", "1"]),
    "fasttrees_transformer": ("mt", ["--arch", "fasttrees_transformer", *MT],
                              ["--encoder-layers", "1", "--decoder-layers", "1"]),
    "star_transformer": ("none", ["--arch", "star_transformer_base", "--task", "masked_summation",
                                  "--criterion", "masked_summation_mse", "--seq-len", "1200",
                                  "--min-seq-len", "1000", "--num-columns", "3", "--train-size", "4096",
                                  "--valid-size", "64", "--test-size", "64", "--batch-size", "16"],
                         ["--seq-len", "40", "--min-seq-len", "20", "--encoder-layers", "1"]),
    "transformer_xl_lm": ("lm", ["--arch", "transformer_xl_lm_wt103_base", "--task", "bptt_lm",
                                 "--criterion", "projected_adaptive_loss", "--tokens-per-sample", "150", "--mem-len", "150", "--batch-size", "16"],
                          ["--tokens-per-sample", "16", "--mem-len", "16", "--batch-size", "4",
                           "--n-layer", "1", "--d-model", "16", "--n-head", "2", "--d-head", "8",
                           "--d-inner", "32", "--cutoffs", "200,500"]),
    "mtn": ("sessions", ["--arch", "mtn_base", "--task", "query_suggestion", "--max-tokens", "4096",
                         "--max-query-length", "12"],
            ["--arch", "mtn_tiny"]),
}
SMOKE_DIMS = {"mt": ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                     "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
                     "--decoder-attention-heads", "2"]}


def run(cmd, timeout, log):
    start = time.time()
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode(), "timeout"
    with open(log, "w") as f:
        f.write(text)
    return text, rc, time.time() - start


def prepare_data(work, smoke):
    """Generated corpora: translation pairs, the target side as an LM stream, query sessions."""
    py = sys.executable
    pairs = "400" if smoke else "40000"
    data = {"none": None, "mt": os.path.join(work, "mt-bin"), "lm": os.path.join(work, "lm-bin"),
            "sessions": os.path.join(work, "ses-bin")}
    if not os.path.exists(os.path.join(data["mt"], "dict.en.txt")):
        raw = os.path.join(work, "mt-raw")
        subprocess.run([py, "preprocess/toy_translation_corpus.py", "--out", raw, "--train", pairs,
                        "--valid", "100", "--test", "100"], check=True, cwd=ROOT, capture_output=True)
        subprocess.run([py, "preprocess/prepare_translation.py", "--raw", raw, "--src", "en", "--tgt", "de",
                        "--dest", data["mt"], "--merges", "2000", "--joined-dictionary"], check=True, cwd=ROOT,
                       capture_output=True)
    if not os.path.exists(os.path.join(data["lm"], "dict.txt")):
        zipf_lm_data(data["lm"], 1000 if smoke else WT103_VOCAB, 60_000 if smoke else 3_000_000)
    if not os.path.exists(os.path.join(data["sessions"], "dict.txt")):
        ses = os.path.join(work, "ses-raw")
        subprocess.run([py, "preprocess/synthetic_sessions.py", "--out", ses, "--train", "400" if smoke else "20000",
                        "--valid", "50", "--test", "50"], check=True, cwd=ROOT, capture_output=True)
        subprocess.run([py, "preprocess/query_suggestion_prepare.py", "--ses-dir", ses, "--dest",
                        data["sessions"], "--max-query-length", "12"], check=True, cwd=ROOT, capture_output=True)
    return data


def zipf_lm_data(dest, vocab, tokens, seed=0):
    """A binarized LM corpus of ``tokens`` Zipf-distributed words over ``vocab`` types (+ fairseq's
    4 specials), written straight with fairseq's dictionary and indexed-dataset writers."""
    import numpy as np
    import torch
    from fairseq.data import Dictionary, indexed_dataset

    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.1, size=tokens), vocab) - 1
    counts = np.bincount(ranks, minlength=vocab)
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}", n=int(counts[i]) + 1)
    os.makedirs(dest, exist_ok=True)
    d.save(os.path.join(dest, "dict.txt"))
    ids = ranks + d.nspecial  # w{i} has index nspecial + i: added in order, equal counts never reorder
    for split, part in (("train", ids[: -2 * 10_000]), ("valid", ids[-20_000:-10_000]), ("test", ids[-10_000:])):
        builder = indexed_dataset.MMapIndexedDatasetBuilder(os.path.join(dest, f"{split}.bin"), dtype=np.int32)
        for line in np.array_split(part, max(1, len(part) // 100)):
            builder.add_item(torch.from_numpy(np.append(line, d.eos()).astype(np.int32)))
        builder.finalize(os.path.join(dest, f"{split}.idx"))


def last_error(text, rc=None):
    """Why a run failed, in one line of at most 200 characters: its last ``SomethingError: ...`` or
    command-line ``error: ...`` line, else the signal that ended it, else "see log"."""
    found = re.findall(r"(\w+Error: .*|^\S+: error: .*)", text, flags=re.MULTILINE)
    if found:
        return found[-1][:200]
    if isinstance(rc, int) and rc < 0:
        return f"killed by signal {-rc}"
    return "see log"


def generate(data, ckpt, mode, smoke, timeout, log):
    """``fairseq-generate --beam 5`` on the test split from ``ckpt``: ``{gen_ok, gen_sentences_per_s, gen_error}``."""
    cmd = [sys.executable, "-m", "fairseq_cli.generate", data, "--path", ckpt, "--user-dir",
           os.path.join(ROOT, "user_dir"), "--gen-subset", "test", "--beam", "5", "--max-tokens", "4096",
           "--max-len-a", "1.2", "--max-len-b", "10", "--num-workers", "0", "--quiet"]
    cmd += ["--fp16"] if mode == "fp16" else []
    cmd += ["--cpu"] if smoke else []
    text, rc, _ = run(cmd, timeout, log)
    rate = re.search(r"Translated [\d,]+ sentences .*?\(([\d.]+) sentences/s", text)
    return {"gen_ok": rc == 0 and rate is not None, "gen_sentences_per_s": float(rate.group(1)) if rate else None,
            "gen_error": None if rc == 0 else last_error(text, rc)}


def beam_column(res):
    """The table's beam-search column: sentences/s, the error, or nothing (no beam search ran)."""
    if "gen_ok" not in res:
        return ""
    if not res["gen_ok"]:
        return f"FAILED {res['gen_error']}"
    return format(res["gen_sentences_per_s"], "8.1f")  # gen_ok: the rate was read


def summarise(text, rc):
    """Final loss, median updates/s, overflow count, NaN/inf seen, peak memory, from a json-format log."""
    losses, ups = [], []
    for m in re.finditer(r"\{[^{}]*\"loss\"[^{}]*\}", text):
        try:
            rec = json.loads(m.group(0))
        except ValueError:
            continue
        if "train_inner" in text[max(0, m.start() - 40):m.start()] or "train_ups" in rec or "ups" in rec:
            losses.append(str(rec.get("loss", rec.get("train_loss"))))
            if "ups" in rec:
                ups.append(float(rec["ups"]))
    peak = re.search(r"PEAK_MEMORY (\{.*\})", text)
    bad = [x for x in losses if x.lower() in ("nan", "inf", "-inf")]
    return {
        "ok": rc == 0,
        "rc": rc,
        "final_loss": float(losses[-1]) if losses and not bad else None,
        "median_ups": statistics.median(ups) if ups else None,
        "overflows": len(re.findall(r"gradient overflow detected", text)),
        "nan_or_inf_loss": bool(bad) or "FloatingPointError" in text,
        "peak_gib": json.loads(peak.group(1))["peak_gib"] if peak else None,
        "error": None if rc == 0 else last_error(text, rc),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", default=",".join(ARCHS), help="comma-separated, from: " + ", ".join(ARCHS))
    p.add_argument("--modes", default="fp16,amp,bf16", help="comma-separated, from: " + ", ".join(MODES))
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--timeout", type=int, default=90, help="seconds per run")
    p.add_argument("--work", default=os.path.join(ROOT, "benchmarks", "work", "gpu_check"))
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models, 3 updates: checks the commands")
    p.add_argument("--rotate-modes", action="store_true",
                   help="one mode per architecture, in turn (a quicker smoke run that still uses every mode)")
    p.add_argument("--ddp", choices=("auto", "yes", "no"), default="auto",
                   help="also run --distributed-world-size 2 (auto: when 2+ GPUs are visible)")
    args = p.parse_args()
    archs, modes = args.archs.split(","), args.modes.split(",")
    for name in archs:
        if name not in ARCHS:
            p.error(f"--archs: unknown architecture {name!r}; choose from {', '.join(ARCHS)}")
    for mode in modes:
        if mode not in MODES:
            p.error(f"--modes: unknown mode {mode!r}; choose from {', '.join(MODES)}")
    import torch

    gpus = 0 if args.smoke else torch.cuda.device_count()
    if not gpus and not args.smoke:
        p.error("no CUDA device visible; --smoke runs the same commands on CPU")
    os.makedirs(args.work, exist_ok=True)
    data = prepare_data(args.work, args.smoke)
    updates = 3 if args.smoke else args.updates
    common = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler",
              "inverse_sqrt", "--warmup-updates", "50", "--clip-norm", "1.0", "--max-update", updates,
              "--log-format", "json", "--log-interval", "1" if args.smoke else "10", "--no-save",
              "--disable-validation", "--num-workers", "0", "--seed", "1", "--user-dir",
              os.path.join(ROOT, "user_dir")]
    if args.rotate_modes:
        runs = [(a, modes[i % len(modes)], 1) for i, a in enumerate(archs)]
    else:
        runs = [(a, m, 1) for a in archs for m in modes]
    if args.ddp == "yes" or (args.ddp == "auto" and gpus >= 2):
        runs += [(a, "fp16", 2) for a in archs]
    results = []
    print(f"{'arch':24} {'mode':5} {'gpus':4} {'ok':3} {'loss':>8} {'upd/s':>7} {'peak GiB':>8} "
          f"{'overflows':>9} nan/inf  beam-5 sent/s", flush=True)
    for name, mode, world in runs:
        kind, flags, smoke_flags = ARCHS[name]
        cmd = [sys.executable, TRAIN] + ([data[kind]] if data[kind] else []) + flags + common + MODES[mode]
        if args.smoke:
            cmd += SMOKE_DIMS.get(kind, []) + smoke_flags + ["--cpu"] + CPU_MODE_EXTRA.get(mode, [])
        if world > 1:
            cmd += ["--distributed-world-size", world, "--ddp-backend", "pytorch_ddp"]
        log = os.path.join(args.work, f"{name}.{mode}.{world}gpu.log")
        ckpt_dir = os.path.join(args.work, f"{name}.{mode}.{world}gpu.ckpt")
        if kind == "mt":  # keep the last checkpoint for the beam search below
            cmd = [c for c in cmd if c != "--no-save"] + ["--save-dir", ckpt_dir, "--no-epoch-checkpoints",
                                                          "--no-save-optimizer-state"]
        text, rc, wall = run(cmd, args.timeout, log)
        res = dict(arch=name, mode=mode, gpus=world, wall_s=round(wall, 1), log=log, **summarise(text, rc))
        if kind == "mt" and res["ok"]:
            res.update(generate(data[kind], os.path.join(ckpt_dir, "checkpoint_last.pt"), mode, args.smoke,
                                args.timeout, log.replace(".log", ".generate.log")))
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        results.append(res)
        fmt = lambda v, f: format("-", ">" + f.split(".")[0]) if v is None else format(v, f)  # noqa: E731
        print(f"{name:24} {mode:5} {world:<4} {'yes' if res['ok'] else 'NO':3} {fmt(res['final_loss'], '8.3f')} "
              f"{fmt(res['median_ups'], '7.2f')} {fmt(res['peak_gib'], '8.2f')} {res['overflows']:9d} "
              f"{'YES' if res['nan_or_inf_loss'] else 'no':7} {beam_column(res)}"
              + ("" if res["ok"] else f"  {res['error']}"), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(0),
                       "torch": torch.__version__, "updates": updates, "runs": results}, f, indent=1)
    failed = [r for r in results if not r["ok"] or r["nan_or_inf_loss"] or r.get("gen_ok") is False]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
