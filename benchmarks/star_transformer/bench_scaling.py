#!/usr/bin/env python
"""Star-Transformer vs fairseq's TransformerEncoder: forward+backward time and activation memory vs n.

Both models run in this process on the same inputs (batch 1, random tokens, train mode,
dropout 0): the plugin's ``StarTransformerEncoder`` (paper block: no FFN) and fairseq's
``TransformerEncoder`` with equal d, heads and layers and its usual FFN of 4d.  For each
length n it reports

* the median forward+backward wall time over ``--repeats`` runs (fewer at large n,
  ``--max-repeat-seconds``), after one warm-up run (none from ``--no-warmup-from`` on);
* activation memory: the bytes of all distinct tensors autograd saves for the backward
  pass (``torch.autograd.graph.saved_tensors_hooks``; parameters excluded) — what a
  training step must keep alive between forward and backward;
* the FLOP bound: forward FLOPs of the baseline / forward FLOPs of the Star model
  (matrix products only; the backward pass is about 2x the forward for both, so the
  ratio is the same) — the speed-up the arithmetic allows on the same hardware.

Example::

    OMP_NUM_THREADS=1 python benchmarks/star_transformer/bench_scaling.py --lengths 128 512 1024 2048 4096 8192 16384
"""
import argparse
import json
import statistics
import time
from argparse import Namespace

import torch


def transformer_flops(n, d, layers, ffn):
    # q, k, v, o projections + QK^T and AV + FFN
    return layers * (2 * n * d * d * 4 + 2 * n * n * d * 2 + 2 * n * d * ffn * 2)


def build_models(d, heads, layers, vocab=1000):
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerEncoder, base_architecture

    from user_dir.models.star_transformer import StarTransformerConfig, StarTransformerEncoder

    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    cfg = StarTransformerConfig(encoder_embed_dim=d, encoder_layers=layers, encoder_attention_heads=heads,
                                max_positions=1 << 15, dropout=0.0)
    star = StarTransformerEncoder(cfg, dictionary)
    cfg_ckpt = StarTransformerConfig(**{**cfg.__dict__, "checkpoint_activations": True})
    star_ckpt = StarTransformerEncoder(cfg_ckpt, dictionary)
    star_ckpt.load_state_dict(star.state_dict())
    args = Namespace(encoder_embed_dim=d, encoder_ffn_embed_dim=4 * d, encoder_layers=layers,
                     encoder_attention_heads=heads, max_source_positions=1 << 15, dropout=0.0,
                     attention_dropout=0.0, activation_dropout=0.0, encoder_learned_pos=True,
                     no_token_positional_embeddings=False)
    base_architecture(args)
    emb = torch.nn.Embedding(len(dictionary), d, padding_idx=dictionary.pad())
    baseline = TransformerEncoder(args, dictionary, emb)
    return star.train(), star_ckpt.train(), baseline.train(), dictionary


def saved_bytes(model, tokens, lengths):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    def keep_inputs(module, args):  # a checkpointed cycle keeps its inputs alive for the recompute
        for t in args:
            if torch.is_tensor(t) and t.is_floating_point():
                pack(t)

    handles = [m.register_forward_pre_hook(keep_inputs) for name, m in model.named_modules()
               if name.count(".") == 2 and ".cycles." in f".{name}"]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(tokens, src_lengths=lengths)
    del out
    for h in handles:
        h.remove()
    return sum(seen.values())


def step(model, tokens, lengths):
    out = model(tokens, src_lengths=lengths)["encoder_out"][0]
    out.float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)


def time_model(model, tokens, lengths, repeats, budget, warmup=True):
    if warmup:
        step(model, tokens, lengths)
    times = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(model, tokens, lengths)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget:
            break
    return statistics.median(times), len(times)


def star_flops(n, d, layers, heads):
    from user_dir.modules.star_transformer_layer import star_flops as flops

    return flops(n, d, layers, heads)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--d", type=int, default=300)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-repeat-seconds", type=float, default=20.0, help="stop repeating a model after this")
    p.add_argument("--no-warmup-from", type=int, default=4096, help="no warm-up run from this length on")
    p.add_argument("--skip-baseline-above", type=int, default=1 << 30, help="only Star above this length")
    p.add_argument("--json", help="append one JSON line per length here")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    star, star_ckpt, baseline, dictionary = build_models(a.d, a.heads, a.layers)
    print(f"# d={a.d} heads={a.heads} layers={a.layers} batch=1 threads={torch.get_num_threads()} "
          f"torch={torch.__version__}")
    print("| n | Star fwd+bwd s | Transformer fwd+bwd s | measured speed-up | FLOP bound | measured/bound "
          "| Star act. MB | Transformer act. MB | memory ratio | Star+ckpt s | Star+ckpt act. MB | ckpt memory ratio "
          "| repeats (S/T/C) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in a.lengths:
        tokens = torch.randint(dictionary.nspecial, len(dictionary), (1, n))
        lengths = torch.tensor([n])
        ts, rs = time_model(star, tokens, lengths, a.repeats, a.max_repeat_seconds, n < a.no_warmup_from)
        ms = saved_bytes(star, tokens, lengths) / 2 ** 20
        tc, rc = time_model(star_ckpt, tokens, lengths, a.repeats, a.max_repeat_seconds, n < a.no_warmup_from)
        mc = saved_bytes(star_ckpt, tokens, lengths) / 2 ** 20
        bound = transformer_flops(n, a.d, a.layers, 4 * a.d) / star_flops(n, a.d, a.layers, a.heads)
        row = {"n": n, "star_s": ts, "star_mb": ms, "flop_bound": bound, "star_repeats": rs,
               "star_ckpt_s": tc, "star_ckpt_mb": mc}
        ck = f"| {tc:.4f} | {mc:.1f} |"
        if n <= a.skip_baseline_above:
            tb, rb = time_model(baseline, tokens, lengths, a.repeats, a.max_repeat_seconds, n < a.no_warmup_from)
            mb = saved_bytes(baseline, tokens, lengths) / 2 ** 20
            row.update(transformer_s=tb, transformer_mb=mb, transformer_repeats=rb)
            print(f"| {n} | {ts:.4f} | {tb:.4f} | {tb / ts:.2f}x | {bound:.2f}x | {tb / ts / bound:.0%} "
                  f"| {ms:.1f} | {mb:.1f} | {mb / ms:.2f}x {ck} {mb / mc:.2f}x | {rs}/{rb}/{rc} |", flush=True)
        else:
            print(f"| {n} | {ts:.4f} | (skipped) | | {bound:.2f}x | | {ms:.1f} | | {ck} | {rs}/0/{rc} |", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
