"""Transformer-XL speed and memory benchmarks (ratios measured in one process, medians over repeats).

    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/bench_speed.py train   # (b) vs fairseq's HF wrapper
    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/bench_speed.py eval    # (a) vs vanilla sliding window
    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/bench_speed.py memory  # (c) peak memory vs mem_len
    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/bench_speed.py profile --steps 3  # where a step's time goes
    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/bench_speed.py faults  # page faults per training step

Model of the issue's calibration setting: PTB vocabulary (10k words; the
binarized dictionary of ``preprocess/ptb_lm.py`` when ``--data`` is given,
else a synthetic one of the same size), 4 layers, d 256, 4 heads x 64,
FFN 1024, batch 16 x 70 tokens, memory 70.

* ``train``: tokens/s of full training steps (forward, log-softmax, NLL,
  backward, clipping, Adam) of ``transformer_xl_lm`` (memory carried over
  through ``stream_pos``), of fairseq's ``examples/truncated_bptt``
  ``transformer_xl`` (HF ``TransfoXLLMHeadModel`` wrapper, its own memory)
  and of fairseq's ``transformer_lm`` of the same size (no memory),
  interleaved, ``--repeats`` times.
* ``eval``: scored tokens/s at attention length L of ``transformer_xl_lm``
  (``mem_len = L``, ``same_length``: every query attends to exactly L keys;
  segments of ``--tgt-len`` tokens) against fairseq's ``transformer_lm``
  evaluated as the paper's vanilla model: one forward over a window of L
  tokens per scored token.  ``--vocab 204`` replaces the PTB vocabulary by a
  synthetic one of 204 symbols: the paper's speed table compares against
  Al-Rfou et al.'s character-level model (enwik8, ~200 symbols), where the
  output softmax, paid once per token by both models, is negligible; with
  a 10k-word vocabulary it is ~30% of Transformer-XL's per-token cost.
* ``memory``: peak resident memory of a training step, one subprocess per
  ``mem_len`` (``ru_maxrss`` minus the resident size before the first step).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from fairseq import utils as fairseq_utils
from fairseq.data import Dictionary

from user_dir.from_flags import build, toy_dictionary
from user_dir.tasks.bptt_lm import StreamDataset

# model sizes (--size): the calibration setting, and the paper's enwik8 base model (its speed table's setting)
SIZES = {"ptb_small": dict(layers=4, dim=256, heads=4, head_dim=64, ffn=1024),
         "enwik8_base": dict(layers=12, dim=512, heads=8, head_dim=64, ffn=2048)}


def dictionary(args):
    if getattr(args, "vocab", None):  # a synthetic vocabulary of this size (e.g. ~200: character level)
        return toy_dictionary(args.vocab - 4)
    if args.data:
        return Dictionary.load(os.path.join(args.data, "dict.txt"))
    return toy_dictionary(10000)


def txl(d, mem_len, s, dropout=0.1, extra=()):
    flags = ["--n-layer", s["layers"], "--d-model", s["dim"], "--n-head", s["heads"], "--d-head", s["head_dim"],
             "--d-inner", s["ffn"], "--mem-len", mem_len, "--dropout", dropout, "--untie-r", *extra]
    return build("transformer_xl_lm", flags, task="language_modeling", dictionary=d)[0]


def hf_wrapper(d, mem_len, s, dropout=0.1):
    from argparse import Namespace

    path = os.path.join(os.path.dirname(fairseq_utils.__file__), "examples", "truncated_bptt")
    fairseq_utils.import_user_module(Namespace(user_dir=path))
    flags = ["--n-layer", s["layers"], "--d-model", s["dim"], "--n-head", s["heads"], "--d-head", s["head_dim"],
             "--d-inner", s["ffn"], "--mem-len", mem_len, "--dropout", dropout]
    return build("transformer_xl", flags + ["--tokens-per-sample", 70, "--batch-size", 16], task="truncated_bptt_lm", dictionary=d)[0]


def vanilla(d, max_positions, s, dropout=0.1):
    flags = ["--decoder-layers", s["layers"], "--decoder-embed-dim", s["dim"], "--decoder-attention-heads",
             s["heads"], "--decoder-ffn-embed-dim", s["ffn"], "--dropout", dropout, "--tokens-per-sample",
             max_positions, "--share-decoder-input-output-embed"]
    return build("transformer_lm", flags, task="language_modeling", dictionary=d)[0]


def stream_batches(d, n_batches, bsz, tgt_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(d.nspecial, len(d), (n_batches * bsz * tgt_len + 1,), generator=g)
    ds = StreamDataset(tokens, bsz, tgt_len, d.pad())
    return [ds.collater([ds[i]]) for i in range(len(ds))]


def train_steps(model, batches, pass_stream_pos):
    model.train()
    opt = getattr(model, "_bench_opt", None) or torch.optim.Adam(model.parameters(), lr=2.5e-4)
    model._bench_opt = opt
    n = 0
    start = time.perf_counter()
    for sample in batches:
        net = dict(sample["net_input"])
        if not pass_stream_pos:
            net = {"src_tokens": net["src_tokens"]}
        out = model(**net)
        lp = model.get_normalized_probs(out, log_probs=True)
        loss = F.nll_loss(lp.view(-1, lp.size(-1)), sample["target"].view(-1), ignore_index=1, reduction="sum")
        opt.zero_grad()
        (loss / sample["ntokens"]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        n += sample["ntokens"]
    return n / (time.perf_counter() - start)


def cmd_train(args):
    d = dictionary(args)
    torch.manual_seed(0)
    models = {"transformer_xl_lm (ours)": (txl(d, args.mem_len, SIZES[args.size]), True),
              "truncated_bptt transformer_xl (HF wrapper)": (hf_wrapper(d, args.mem_len, SIZES[args.size]), False),
              "transformer_lm (no memory)": (vanilla(d, args.tgt_len, SIZES[args.size]), False)}
    batches = stream_batches(d, args.steps * (args.repeats + 1), args.bsz, args.tgt_len)
    rates = {k: [] for k in models}
    for rep in range(args.repeats + 1):  # the first round warms up
        chunk = batches[rep * args.steps:(rep + 1) * args.steps]
        for name, (model, stream) in models.items():
            r = train_steps(model, chunk, stream)
            if rep > 0:
                rates[name].append(r)
    base = statistics.median(rates["truncated_bptt transformer_xl (HF wrapper)"])
    result = {"setting": dict(SIZES[args.size], size=args.size, bsz=args.bsz, tgt_len=args.tgt_len, mem_len=args.mem_len, vocab=len(d),
                              steps_per_repeat=args.steps, repeats=args.repeats,
                              threads=torch.get_num_threads()),
              "tokens_per_s_median": {k: round(statistics.median(v), 1) for k, v in rates.items()},
              "tokens_per_s_all": {k: [round(x, 1) for x in v] for k, v in rates.items()},
              "ratio_vs_hf_wrapper": {k: round(statistics.median(v) / base, 3) for k, v in rates.items()}}
    write_result(result, args.out)


def write_result(result, path):
    """Prints ``result`` as JSON and, with ``--out``, writes it there too."""
    print(json.dumps(result, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


def cmd_profile(args):
    """``torch.profiler`` table of our training step (the ops that take the time), ``--steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    d = dictionary(args)
    torch.manual_seed(0)
    model = txl(d, args.mem_len, SIZES[args.size])
    batches = stream_batches(d, args.steps + 2, args.bsz, args.tgt_len)
    train_steps(model, batches[:2], True)  # warm-up, memory filled
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_steps(model, batches[2:], True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def cmd_faults(args):
    """Minor page faults and system time per training step, ours and the HF wrapper (fresh large
    buffers are mapped anew by glibc at every allocation: ~11k faults per 45 MB (N, V) tensor)."""
    d = dictionary(args)
    for name, build_model, stream in (("transformer_xl_lm (ours)", txl, True),
                                      ("truncated_bptt transformer_xl (HF wrapper)", hf_wrapper, False)):
        torch.manual_seed(0)
        model = build_model(d, args.mem_len)
        batches = stream_batches(d, args.steps + 3, args.bsz, args.tgt_len)
        train_steps(model, batches[:3], stream)  # warm-up, memory filled
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        train_steps(model, batches[3:], stream)
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
        print(json.dumps({"model": name, "minor_faults_per_step": round((after.ru_minflt - before.ru_minflt) / args.steps),
                          "system_s_per_step": round((after.ru_stime - before.ru_stime) / args.steps, 3),
                          "user_s_per_step": round((after.ru_utime - before.ru_utime) / args.steps, 3),
                          "wall_s_per_step": round(wall / args.steps, 3)}), flush=True)


def cmd_eval(args):
    d = dictionary(args)
    torch.manual_seed(0)
    out = []
    g = torch.Generator().manual_seed(1)
    for L in args.lengths:
        model_v = vanilla(d, L, SIZES[args.size]).eval()
        v_stream = torch.randint(d.nspecial, len(d), (1, L + args.vanilla_tokens * args.repeats), generator=g)
        T = args.tgt_len
        model_x = txl(d, L, SIZES[args.size], extra=["--same-length"]).eval()
        n_seg = -(-L // T)  # segments that fill the memory before timing
        x_stream = torch.randint(d.nspecial, len(d), (1, T * (n_seg + args.txl_segments * args.repeats)),
                                 generator=g)
        v_rates, x_rates = [], []
        with torch.no_grad():
            model_v(v_stream[:, :L], features_only=True)  # warm-up
            model_x.reset_memory()
            for i in range(n_seg):
                model_x(x_stream[:, i * T:(i + 1) * T], stream_pos=i)
            for rep in range(args.repeats):  # interleaved: both see the same machine load
                start = time.perf_counter()
                for k in range(args.vanilla_tokens):
                    s = rep * args.vanilla_tokens + k
                    feats = model_v(v_stream[:, s:s + L], features_only=True)[0]
                    logits = model_v.decoder.output_layer(feats[:, -1:])  # only the scored position
                    model_v.get_normalized_probs((logits, None), log_probs=True)
                v_rates.append(args.vanilla_tokens / (time.perf_counter() - start))
                start = time.perf_counter()
                for k in range(args.txl_segments):
                    i = n_seg + rep * args.txl_segments + k
                    net = model_x(x_stream[:, i * T:(i + 1) * T], stream_pos=i)
                    model_x.get_normalized_probs(net, log_probs=True)
                x_rates.append(args.txl_segments * T / (time.perf_counter() - start))
        v, x = statistics.median(v_rates), statistics.median(x_rates)
        ratios = sorted(a / b for a, b in zip(x_rates, v_rates))
        out.append({"attention_length": L, "tgt_len": T, "vanilla_tokens_per_s": round(v, 2),
                    "txl_tokens_per_s": round(x, 1), "speedup_of_medians": round(x / v, 1),
                    "paired_speedups": [round(r, 1) for r in ratios]})
        print(json.dumps(out[-1]), flush=True)
    result = {"setting": dict(SIZES[args.size], size=args.size, vocab=len(d), batch=1, repeats=args.repeats,
                              vanilla_tokens=args.vanilla_tokens, txl_segments=args.txl_segments,
                              threads=torch.get_num_threads()),
              "command": "OMP_NUM_THREADS=1 python benchmarks/transformer_xl/bench_speed.py " + " ".join(sys.argv[1:]),
              "results": out}
    write_result(result, args.out)


def _memory_child(args):
    d = dictionary(args)
    torch.manual_seed(0)
    model = txl(d, args.mem_len, SIZES[args.size])
    n_fill = -(-args.mem_len // args.tgt_len)  # segments that fill the memory
    batches = stream_batches(d, 1 + n_fill + args.steps, args.bsz, args.tgt_len)
    train_steps(model, batches[:1], True)  # allocate optimiser state etc.
    with torch.no_grad():  # fill the memory (training mode, no backward)
        for sample in batches[1:1 + n_fill]:
            model(**sample["net_input"])
    before = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    rusage_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    train_steps(model, batches[1 + n_fill:], True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    state = model.decoder._stream_mems.get("train") or {"mems": []}
    mem_state = sum(m.numel() * m.element_size() for m in state["mems"]) // 1024
    print(json.dumps({"mem_len": args.mem_len, "peak_rss_mb": round(peak / 1024, 1),
                      "rss_before_mb": round(before / 1024, 1),
                      "step_peak_over_resident_mb": round((peak - min(before, rusage_before)) / 1024, 1),
                      "memory_state_mb": round(mem_state / 1024, 2)}))


def cmd_memory(args):
    rows = []
    for m in args.mem_lens:
        cmd = [sys.executable, os.path.abspath(__file__), "_memory_child", "--mem-len", str(m), "--steps",
               str(args.steps), "--bsz", str(args.bsz), "--tgt-len", str(args.tgt_len)]
        if args.data:
            cmd += ["--data", args.data]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["train", "eval", "memory", "profile", "faults", "_memory_child"])
    p.add_argument("--data", help="binarized PTB (preprocess/ptb_lm.py) for the real dictionary")
    p.add_argument("--vocab", type=int, help="a synthetic vocabulary of this many symbols instead (specials "
                                             "included), e.g. 204 for the paper's character-level setting")
    p.add_argument("--size", choices=sorted(SIZES), default="ptb_small",
                   help="model size: ptb_small (4L, d 256) or enwik8_base (the paper's speed table: 12L, d 512)")
    p.add_argument("--out", help="also write the results (train, eval) to this JSON file")
    p.add_argument("--bsz", type=int, default=16)
    p.add_argument("--tgt-len", type=int, default=70)
    p.add_argument("--mem-len", type=int, default=70)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lengths", type=int, nargs="+", default=[100, 200, 400, 800])
    p.add_argument("--mem-lens", type=int, nargs="+", default=[0, 70, 140, 280, 560, 1120])
    p.add_argument("--vanilla-tokens", type=int, default=4, help="windows timed per repeat (eval)")
    p.add_argument("--txl-segments", type=int, default=2, help="segments timed per repeat (eval)")
    args = p.parse_args()
    if args.what == "eval" and args.tgt_len == 70:
        args.tgt_len = 64
    {"train": cmd_train, "eval": cmd_eval, "memory": cmd_memory, "profile": cmd_profile, "faults": cmd_faults,
     "_memory_child": _memory_child}[args.what](args)


if __name__ == "__main__":
    main()
