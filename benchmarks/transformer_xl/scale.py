"""Transformer-XL at WT103-base scale: the training loss through the full log-probs vs target-only.

    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/scale.py --bsz 4 --tgt-len 150 --steps 3

Model: the ``transformer_xl_lm_wt103_base`` preset (16 layers, d 410, 10 x 41, FFN
2100, memory 150, adaptive input/softmax with cutoffs 20k/40k/200k, div_val 1) over
a vocabulary of WT103's size, V = 267,735 (a synthetic dictionary).  Each variant
runs in its own subprocess, so its peak resident memory (``ru_maxrss``) is its own:

* ``full``: fairseq's ``cross_entropy`` (``get_normalized_probs``: the (N, V)
  log-probability matrix, as training did before ``projected_adaptive_loss``);
* ``target``: ``--criterion projected_adaptive_loss`` (the head band for every
  position, each tail cluster for its targets only);
* ``hf``: fairseq's ``examples/truncated_bptt`` ``transformer_xl`` (the HF
  ``TransfoXLLMHeadModel`` wrapper, its own memory; ``cross_entropy`` on its full
  output) at the same size, for tokens/s.

An update is forward, loss, backward, clipping (0.25) and an Adam step, carrying
the memory from batch to batch; the first update warms up, the next ``--steps``
are timed (median and spread reported).  The targets follow a Zipf law over the
vocabulary (word frequencies do; with uniform targets almost every position would
fall in a tail cluster, which no text does).  Peak RSS is reported for the whole
process and as the growth over the resident size before the first update (the
model and data are built by then; the Adam state is allocated in the first step).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

V = 267735  # WT103's vocabulary (the reference's corpus.vocab + <eos>)
PRESET = dict(n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100, mem_len=150, dropout=0.1)
VARIANTS = ("full", "target", "hf")


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def zipf_batches(d, n_batches, bsz, tgt_len, seed=0):
    import torch

    from user_dir.tasks.bptt_lm import StreamDataset

    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, len(d) - d.nspecial + 1, dtype=torch.float64)
    tokens = torch.multinomial(weights, n_batches * bsz * tgt_len + 1, replacement=True, generator=g) + d.nspecial
    ds = StreamDataset(tokens, bsz, tgt_len, d.pad())
    return [ds.collater([ds[i]]) for i in range(len(ds))]


def build_variant(variant, d, bsz, tgt_len):
    from argparse import Namespace

    from fairseq import utils as fairseq_utils
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    from user_dir.criterions.projected_adaptive_loss import ProjectedAdaptiveLossCriterion
    from user_dir.from_flags import build

    task = Namespace(target_dictionary=d)
    if variant == "hf":
        path = os.path.join(os.path.dirname(fairseq_utils.__file__), "examples", "truncated_bptt")
        fairseq_utils.import_user_module(Namespace(user_dir=path))
        flags = [x for k, v in PRESET.items() for x in (f"--{k.replace('_', '-')}", v)]
        model = build("transformer_xl", flags + ["--cutoffs", "20000,40000,200000", "--tokens-per-sample", tgt_len,
                                                 "--batch-size", bsz], task="truncated_bptt_lm", dictionary=d)[0]
        return model, CrossEntropyCriterion(task, False), False
    model = build("transformer_xl_lm_wt103_base", [], task="language_modeling", dictionary=d)[0]
    crit = CrossEntropyCriterion(task, False) if variant == "full" else ProjectedAdaptiveLossCriterion(task, False)
    return model, crit, True


def child(args):
    import torch

    from user_dir.from_flags import toy_dictionary

    torch.manual_seed(0)
    d = toy_dictionary(V - 4)
    model, crit, stream = build_variant(args.variant, d, args.bsz, args.tgt_len)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    batches = zipf_batches(d, args.steps + 1, args.bsz, args.tgt_len)
    rss_before = _rss_mib()
    times, ntokens, losses = [], 0, []
    for i, sample in enumerate(batches[: args.steps + 1]):
        if not stream:
            sample = {**sample, "net_input": {"src_tokens": sample["net_input"]["src_tokens"]}}
        start = time.perf_counter()
        loss, sample_size, _ = crit(model, sample)
        opt.zero_grad()
        (loss / sample_size).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        elapsed = time.perf_counter() - start
        losses.append(loss.item() / sample_size)
        if i > 0:
            times.append(elapsed)
            ntokens += sample["ntokens"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"variant": args.variant, "peak_rss_mib": peak, "rss_before_mib": rss_before,
                      "step_growth_mib": peak - rss_before, "sec_per_update": times,
                      "tokens_per_s": ntokens / sum(times), "losses": losses,
                      "params": sum(p.numel() for p in model.parameters())}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bsz", type=int, default=4, help="streams per batch (the paper: 60)")
    p.add_argument("--tgt-len", type=int, default=150, help="segment length (the paper: 150)")
    p.add_argument("--steps", type=int, default=3, help="timed updates per variant (after one warm-up)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        return child(args)
    results = {}
    for variant in args.variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--bsz", str(args.bsz),
               "--tgt-len", str(args.tgt_len), "--steps", str(args.steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"bsz {args.bsz} x tgt_len {args.tgt_len}, V {V}, torch threads {os.environ.get('OMP_NUM_THREADS')}")
    print("| variant | peak RSS (GiB) | growth over pre-step RSS (GiB) | s/update median (min-max) | tokens/s |")
    print("|---|---|---|---|---|")
    for variant, r in results.items():
        t = r["sec_per_update"]
        print(f"| {variant} | {r['peak_rss_mib'] / 1024:.2f} | {r['step_growth_mib'] / 1024:.2f} | "
              f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) | {r['tokens_per_s']:.0f} |")
    if "full" in results and "target" in results:
        f, t = results["full"], results["target"]
        print(f"target/full: peak RSS {t['peak_rss_mib'] / f['peak_rss_mib']:.2f}, growth "
              f"{t['step_growth_mib'] / f['step_growth_mib']:.2f}, s/update "
              f"{statistics.median(t['sec_per_update']) / statistics.median(f['sec_per_update']):.2f}; "
              f"same first loss: {abs(t['losses'][0] - f['losses'][0]) < 1e-4}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
