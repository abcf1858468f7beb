#!/usr/bin/env python
"""The FastTrees scan of an earlier commit against the current one, forward + backward, in one process.

    OMP_NUM_THREADS=1 python benchmarks/fasttrees/scan_versions.py --old REVISION [--repeats 15]

``--old`` names a commit whose ``user_dir/modules/fasttrees_layer.py`` is loaded (via ``git show``) beside
the working tree's; both ``linear_scan`` functions and the sequential loop are timed in alternation on the
same inputs (T × B × 256), medians.
"""
import argparse
import os
import subprocess
import types

import torch
from speed import interleaved

from user_dir.modules import fasttrees_layer as current

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_old(commit):
    source = subprocess.run(["git", "show", f"{commit}:user_dir/modules/fasttrees_layer.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("fasttrees_layer_old")
    exec(compile(source, f"{commit}:user_dir/modules/fasttrees_layer.py", "exec"), module.__dict__)
    return module


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True, help="commit of the scan to compare with")
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args()
    old = load_old(a.old)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for T, B in [(20, 200), (20, 32), (256, 16)]:
        x = torch.rand(T, B, 256).requires_grad_()
        y = torch.randn(T, B, 256).requires_grad_()
        fns = {"old": lambda: old.linear_scan(x, y).sum().backward(),
               "new": lambda: current.linear_scan(x, y).sum().backward(),
               "loop": lambda: current.sequential_scan(x, y).sum().backward()}
        m = {k: v * 1e3 for k, v in interleaved(fns, a.repeats).items()}
        print(f"T {T} B {B}: old {m['old']:.1f} ms  new {m['new']:.1f} ms  loop {m['loop']:.1f} ms  "
              f"old/new {m['old'] / m['new']:.2f}x  loop/new {m['loop'] / m['new']:.2f}x")


if __name__ == "__main__":
    main()
