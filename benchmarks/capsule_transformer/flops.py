"""Matrix-product work of capsule_transformer relative to fairseq's transformer of identical size.

Counts the floating-point operations of matrix products (``mm``, ``bmm``, ``addmm``, attention
kernels; torch's ``FlopCounterMode``) on the batches of ``speed.py``: a training step's forward and
backward at each source length, and one incremental decoding step of 20 beam rows at target positions
30 and 300.  Element-wise work (softmax, masks, the routing's squash and coupling updates, copies of the
decoding state) is not counted.  The ratios are therefore what the time ratios of ``speed.py`` would be if
every product ran at the same speed and element-wise work were free: the part of routing's cost that
no implementation of the same algorithm avoids.  The rest of a measured ratio is efficiency (small
batched products, element-wise passes over the logit cube, fairseq's fused attention kernel, memory
traffic of the decoding state).

``--time-products N`` (CPU only) also times the training step's products where they run (CPU time inside
each product call, the memory it first touches included, element-wise work excluded; median of ``N``
steps per model, interleaved): the time ratio if element-wise work were free but each product ran at its
own measured speed.  It separates the two parts of the rest: products that run slower per FLOP than the
linear layers' (routing's batched ``M × M`` products) and everything else.

    python benchmarks/capsule_transformer/flops.py --preset multi30k --time-products 7 \\
        --out benchmarks/capsule_transformer/results/flops_multi30k.json
"""
import argparse
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import speed


def _cpu_flash(query, key, value, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out, query, key, value)


# fairseq's self-attention runs torch's fused CPU attention kernel, which FlopCounterMode does not count
CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward,
}


def counted(fn):
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        fn()
    return counter.get_total_flops()


PRODUCTS = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm, *CPU_ATTENTION}


class ProductTimer(TorchDispatchMode):
    """Sums the CPU time spent inside matrix-product ops (:data:`PRODUCTS`) while active."""

    def __init__(self):
        super().__init__()
        self.seconds, self.calls = 0.0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket not in PRODUCTS:
            return func(*args, **(kwargs or {}))
        start = time.process_time()
        out = func(*args, **(kwargs or {}))
        self.seconds += time.process_time() - start
        self.calls += 1
        return out


def product_seconds(fn):
    with ProductTimer() as timer:
        fn()
    return timer.seconds


def train_step_product_seconds(models, b, repeats):
    """CPU time inside products of ``repeats`` interleaved training steps per model: medians, the ratio of the
    medians, and the per-run ratios (their spread)."""
    def measure(name, model):
        model.train()
        seconds = product_seconds(lambda: speed.forward_backward(model, b))
        model.zero_grad(set_to_none=True)
        return seconds

    runs = speed.interleaved(models, measure, repeats)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["ratio"] = out["capsule_transformer"] / out["transformer"]
    out["run_ratios"] = sorted(c / v for c, v in zip(runs["capsule_transformer"], runs["transformer"]))
    return out


def train_step_flops(model, b):
    model.train()
    flops = counted(lambda: speed.forward_backward(model, b))
    model.zero_grad(set_to_none=True)
    return flops


def decode_step_flops(model, dictionary, rows, beam, steps):
    """Products of the incremental decoding step at each position of ``steps`` (:func:`speed.run_decoder`)."""
    out = {}

    def count(t, step):
        if t in steps:
            out[t] = counted(step)
        else:
            step()

    speed.run_decoder(model, dictionary, rows, beam, max(steps) + 1, count)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    speed.add_model_args(p)
    p.add_argument("--lengths", default="30,100,250")
    p.add_argument("--tokens", type=int, default=2000, help="tokens per side of a training batch")
    p.add_argument("--decode-steps", default="30,300")
    p.add_argument("--decode-rows", type=int, default=20)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--time-products", type=int, default=0, metavar="N",
                   help="also time the training step's products on the CPU (median of N steps per model)")
    p.add_argument("--out", help="write the counts to this JSON file")
    a = p.parse_args()
    if a.time_products and a.device != "cpu":
        p.error(f"--time-products times products by the CPU clock: it needs --device cpu, not {a.device}")
    vocab, d, models = speed.build_models(p, a)
    result = {"preset": a.preset, "vocab": vocab, "capsule_args": a.capsule_args, "train": {}, "decode": {}}
    print(f"preset={a.preset} vocab={vocab} capsule_args='{a.capsule_args}': GFLOP of matrix products, capsule / vanilla")
    for length in map(int, a.lengths.split(",")):
        b = speed.batch(d, max(1, a.tokens // length), length, seed=3)
        row = {k: train_step_flops(m, b) for k, m in models.items()}
        row["ratio"] = row["capsule_transformer"] / row["transformer"]
        result["train"][length] = row
        print(f"train step, length {length:4d}: {row['capsule_transformer'] / 1e9:8.1f} / {row['transformer'] / 1e9:8.1f}"
              f" = {row['ratio']:.3f}")
        if a.time_products:
            seconds = row["product_seconds"] = train_step_product_seconds(models, b, a.time_products)
            extra_seconds = seconds["capsule_transformer"] - seconds["transformer"]
            extra = (f"{(row['capsule_transformer'] - row['transformer']) / extra_seconds / 1e9:.1f}"
                     if extra_seconds > 0 else "n/a")
            print(f"  time inside products: {seconds['capsule_transformer'] * 1e3:8.1f} / "
                  f"{seconds['transformer'] * 1e3:8.1f} ms = {seconds['ratio']:.3f} (runs "
                  f"{seconds['run_ratios'][0]:.3f}-{seconds['run_ratios'][-1]:.3f}); GFLOP/s: vanilla's products "
                  f"{row['transformer'] / seconds['transformer'] / 1e9:.1f}, the capsule's extra ones {extra}")
    steps = [int(s) for s in a.decode_steps.split(",")]
    per_model = {k: decode_step_flops(m, d, a.decode_rows, a.beam, steps) for k, m in models.items()}
    for s in steps:
        row = {k: v[s] for k, v in per_model.items()}
        row["ratio"] = row["capsule_transformer"] / row["transformer"]
        result["decode"][s] = row
        print(f"decoding step {s:4d} ({a.decode_rows} rows): {row['capsule_transformer'] / 1e9:.3f} / "
              f"{row['transformer'] / 1e9:.3f} = {row['ratio']:.3f}")
    if len(steps) > 1:
        print(f"step-{steps[-1]} ratio / step-{steps[0]} ratio: "
              f"{result['decode'][steps[-1]]['ratio'] / result['decode'][steps[0]]['ratio']:.3f}")
    if a.out:
        speed.write_json(a.out, result)


if __name__ == "__main__":
    main()
