#!/usr/bin/env python
"""FastTrees speed ratios, each measured against its baseline in the same process (medians).

    OMP_NUM_THREADS=1 python benchmarks/fasttrees/speed.py [--repeats 7]

1. training step (forward + backward + Adam) of ``fasttrees_transformer`` vs fairseq's ``transformer``
   at the same sizes (3+3 layers, d 256, FFN 1024, 4 heads; batch 32 × 20 tokens, or ``--batch-size`` ×
   ``--length``: 200 × 20 is the Multi30k runs' 4,096-token batch);  target ≤ 1.2x;
   1b. the same at equal parameter count (FastTrees with its FFN dim reduced by the FastTrees sublayers'
   parameters, same d and layers);
2. training step of an ON-LSTM LM (``onlstm_lm``, no dropout) vs a FastTrees LM of equal hidden size
   and depth whose layers are FastTrees sublayers (the paper's Table 1 comparison), and vs the full
   ``fasttrees_transformer_lm`` (3 layers, hidden 256, batch 16 × 70 tokens);  target ≥ 1.3x faster;
3. the FastTrees recurrence at length 256 (batch 16, d 256): parallel scan vs a sequential loop over
   time that indexes x[t] as the released ON-LSTM/FastTrees code (forward + backward; the raw
   recurrence and the whole sublayer);  target ≥ 5x.  A leaner loop (unbind) is timed too.
"""
import argparse
import os
import statistics
import time

import torch

from user_dir.from_flags import build, toy_dictionary
from user_dir.modules.fasttrees_layer import FastTreesConfig, FastTreesSublayer, linear_scan, sequential_scan

SIZES = ["--encoder-layers", 3, "--decoder-layers", 3, "--encoder-embed-dim", 256, "--decoder-embed-dim", 256,
         "--encoder-ffn-embed-dim", 1024, "--decoder-ffn-embed-dim", 1024, "--encoder-attention-heads", 4,
         "--decoder-attention-heads", 4, "--share-all-embeddings", "--dropout", 0.1, "--chunk-size", 8]


def median_time(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(fns, repeats):
    """Medians of several functions, run in alternation so that load changes hit all alike."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def train_step_fn(model, loss_fn):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()

    def step():
        opt.zero_grad()
        loss_fn(model).backward()
        opt.step()

    return step


def translation_loss(d, B, T):
    """Cross-entropy of a model on one fixed random B × T translation batch (teacher forcing)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, len(d), (B, T), generator=g)
    tgt = torch.randint(4, len(d), (B, T), generator=g)
    prev = torch.cat([torch.full((B, 1), d.eos()), tgt[:, :-1]], 1)
    lengths = torch.full((B,), T)

    def loss(m):
        logits = m(src, lengths, prev)[0]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))

    return loss


def sizes_with_ffn(ffn):
    """SIZES with the FFN dim (1024) of encoder and decoder replaced by ``ffn``."""
    return [str(ffn) if str(v) == "1024" else v for v in SIZES]


def translation_ratio(repeats, B=32, T=20):
    d = toy_dictionary(8000)
    loss = translation_loss(d, B, T)
    steps, params = {}, {}
    for arch in ("transformer", "fasttrees_transformer"):
        extra = SIZES if arch.startswith("fasttrees") else SIZES[:-2]
        model, _ = build(arch, extra, dictionary=d)
        steps[arch], params[arch] = train_step_fn(model, loss), n_params(model)
    # equal parameter count: the FastTrees model's FFN shrunk by the FastTrees sublayers' parameters
    # (6 FFNs of (2d + 1) parameters per FFN unit; d = 256)
    ffn = round(1024 - (params["fasttrees_transformer"] - params["transformer"]) / (6 * (2 * 256 + 1)))
    model, _ = build("fasttrees_transformer", sizes_with_ffn(ffn), dictionary=d)
    steps["fasttrees_equal_params"], params["fasttrees_equal_params"] = train_step_fn(model, loss), n_params(model)
    return interleaved(steps, repeats), params, ffn


def n_params(model):
    return sum(p.numel() for p in model.parameters())


class FastTreesRNNLanguageModel(torch.nn.Module):
    """The paper's LM setting (Table 1): ON-LSTM layers replaced by FastTrees layers (no attention, no FFN)."""

    def __init__(self, vocab, hidden, layers, chunk_size):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(FastTreesSublayer(hidden, FastTreesConfig(chunk_size=chunk_size))
                                          for _ in range(layers))
        self.out = torch.nn.Linear(hidden, vocab)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens).transpose(0, 1)
        for layer in self.layers:
            x = layer(x)
        return self.out(x.transpose(0, 1))


def onlstm_ratio(repeats):
    d = toy_dictionary(10000)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, len(d), (16, 70), generator=g)
    target = torch.randint(4, len(d), (16, 70), generator=g)

    def loss(m):
        out = m(tokens)
        logits = out[0] if isinstance(out, tuple) else out
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    ft, _ = build("fasttrees_transformer_lm", ["--decoder-layers", 3, "--decoder-embed-dim", 256,
                                               "--decoder-ffn-embed-dim", 1024, "--decoder-attention-heads", 4,
                                               "--share-decoder-input-output-embed", "--chunk-size", 8,
                                               "--dropout", 0.1], task="language_modeling", dictionary=d)
    on, _ = build("onlstm_lm", ["--embed-dim", 256, "--hidden-size", 256, "--num-layers", 3, "--chunk-size", 8,
                                "--dropout", 0, "--hidden-dropout", 0, "--input-dropout", 0, "--embed-dropout", 0,
                                "--weight-drop", 0], task="language_modeling", dictionary=d)
    torch.manual_seed(0)
    rnn = FastTreesRNNLanguageModel(len(d), 256, 3, 8)
    return interleaved({"onlstm": train_step_fn(on, loss), "fasttrees_rnn": train_step_fn(rnn, loss),
                        "fasttrees_transformer_lm": train_step_fn(ft, loss)}, repeats)


def unbind_loop(a, b):
    """A leaner sequential loop (unbind instead of indexing: no full-size gradient per step)."""
    c, out = torch.zeros_like(b[0]), []
    for at, bt in zip(a.unbind(0), b.unbind(0)):
        c = torch.addcmul(bt, at, c)
        out.append(c)
    return torch.stack(out, 0)


def scan_ratio(repeats, T=256, B=16, D=256):
    g = torch.Generator().manual_seed(0)
    a = torch.rand(T, B, D, generator=g).requires_grad_()
    b = torch.randn(T, B, D, generator=g).requires_grad_()

    def run(fn):
        return lambda: fn().sum().backward()

    raw = interleaved({"loop": run(lambda: sequential_scan(a, b)), "unbind": run(lambda: unbind_loop(a, b)),
                       "scan": run(lambda: linear_scan(a, b))}, repeats)
    layers = {}
    for mode in ("loop", "parallel"):
        torch.manual_seed(0)  # the same weights for both scans
        layers[mode] = FastTreesSublayer(D, FastTreesConfig(chunk_size=8), causal=True, scan=mode)
    x = torch.randn(T, B, D, generator=g)
    whole = interleaved({"loop": run(lambda: layers["loop"](x)), "scan": run(lambda: layers["parallel"](x))}, repeats)
    return raw, whole


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--only", choices=["1", "2", "3"], help="run one comparison only")
    p.add_argument("--batch-size", type=int, default=32, help="comparison 1: sentences per batch (default 32)")
    p.add_argument("--length", type=int, default=20, help="comparison 1: tokens per sentence, each side (default 20)")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {args.repeats} (medians)")
    if args.only in (None, "1"):
        t, n, ffn = translation_ratio(args.repeats, args.batch_size, args.length)
        print(f"1. batch {args.batch_size} x {args.length} tokens per side")
        print(f"1. train step  transformer {t['transformer'] * 1e3:.0f} ms ({n['transformer'] / 1e6:.3f} M params)  "
              f"fasttrees_transformer {t['fasttrees_transformer'] * 1e3:.0f} ms ({n['fasttrees_transformer'] / 1e6:.3f} M)"
              f"  ratio {t['fasttrees_transformer'] / t['transformer']:.2f}x  (equal dims; target <= 1.2x)")
        print(f"1b. train step at equal parameter count: fasttrees_transformer with FFN {ffn} "
              f"({n['fasttrees_equal_params'] / 1e6:.3f} M params, {n['fasttrees_equal_params'] / n['transformer']:.3f} "
              f"of the vanilla count) {t['fasttrees_equal_params'] * 1e3:.0f} ms  ratio "
              f"{t['fasttrees_equal_params'] / t['transformer']:.2f}x  (target <= 1.2x)")
    if args.only in (None, "2"):
        o = onlstm_ratio(args.repeats)
        print(f"2. train step  ON-LSTM LM {o['onlstm'] * 1e3:.0f} ms;  FastTrees LM (FastTrees layers in place of the "
              f"ON-LSTM layers, the paper's Table 1 setting) {o['fasttrees_rnn'] * 1e3:.0f} ms  speed-up "
              f"{o['onlstm'] / o['fasttrees_rnn']:.2f}x  (target >= 1.3x);  fasttrees_transformer_lm "
              f"{o['fasttrees_transformer_lm'] * 1e3:.0f} ms  speed-up {o['onlstm'] / o['fasttrees_transformer_lm']:.2f}x")
    if args.only in (None, "3"):
        raw, whole = scan_ratio(args.repeats)
        print(f"3. length 256, fwd+bwd  raw recurrence: loop {raw['loop'] * 1e3:.0f} ms  scan {raw['scan'] * 1e3:.0f} ms"
              f"  speed-up {raw['loop'] / raw['scan']:.2f}x  (lean unbind loop {raw['unbind'] * 1e3:.0f} ms: "
              f"{raw['unbind'] / raw['scan']:.2f}x);  whole sublayer: loop {whole['loop'] * 1e3:.0f} ms  scan "
              f"{whole['scan'] * 1e3:.0f} ms  speed-up {whole['loop'] / whole['scan']:.2f}x  (target >= 5x)")


if __name__ == "__main__":
    main()
