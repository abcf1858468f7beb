"""Kernel (aten op) count of one beam-5 decode, capsule_transformer vs fairseq's transformer.

On a CPU at small sizes a beam-search step costs roughly its number of kernel launches, so this
count explains the generation ratio of ``speed.py`` without timing noise:

    OMP_NUM_THREADS=1 python benchmarks/capsule_transformer/count_ops.py
"""
import torch
from speed import PRESETS, batch, generate_rate
from torch.profiler import ProfilerActivity, profile

from user_dir.from_flags import build, toy_dictionary


def main():
    torch.set_num_threads(1)
    d = toy_dictionary(1000)
    b = batch(d, 32, 15, seed=5)
    for arch in ("transformer", "capsule_transformer"):
        model, _ = build(arch, PRESETS["demo"] + ["--dropout", "0.1"], dictionary=d, seed=1)
        generate_rate(model, d, b, 5)  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            generate_rate(model, d, b, 5)
        ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        print(f"{arch:22s} aten ops per beam-5 decode of 32 sentences: {ops}")


if __name__ == "__main__":
    main()
