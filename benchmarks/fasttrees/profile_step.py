#!/usr/bin/env python
"""Where the training step of the equal-parameter FastTrees model (speed.py comparison 1b) spends its time.

    OMP_NUM_THREADS=1 python benchmarks/fasttrees/profile_step.py [--batch-size 200] [--length 20] [--steps 3]

Prints ``torch.profiler``'s table of ops by self CPU time over ``--steps`` training steps; the scan's share is
the ``_LinearScan`` / ``_LinearScanBackward`` rows (CPU total).
"""
import argparse
import os

import torch
from speed import sizes_with_ffn, train_step_fn, translation_loss
from torch.profiler import ProfilerActivity, profile

from user_dir.from_flags import build, toy_dictionary


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--ffn", type=int, default=366, help="FFN dim of the FastTrees model (366: equal parameters)")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    d = toy_dictionary(8000)
    model, _ = build("fasttrees_transformer", sizes_with_ffn(a.ffn), dictionary=d)
    step = train_step_fn(model, translation_loss(d, a.batch_size, a.length))
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


if __name__ == "__main__":
    main()
