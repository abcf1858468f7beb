"""Decoding at long target lengths: the per-token cost of a capsule decoding step with the ``M×M`` Gram
kept at every length, and with the default switch to Gram-free routing past ``GRAM_FREE_DECODING·D``
target tokens (``capsule_routing.decode_agreement``), against fairseq's transformer of the same size.

The decoder alone, incremental, on ``--rows`` beam rows reordered at every step
(``speed.run_decoder``); at each of ``--at`` the median CPU time of the 10 steps around it, median over
``--repeats`` interleaved runs (the two capsule runs alternate which goes first).  Also the routing
state that a step reads and copies, per beam row and routed decoder module, at the last step.

    OMP_NUM_THREADS=1 python benchmarks/capsule_transformer/long_decoding.py --preset demo \\
        --out benchmarks/capsule_transformer/results/long_decoding_demo.json
"""
import argparse
import math
import os
import statistics

import torch

import speed
from user_dir.modules import capsule_routing


def routing_state_floats(state):
    """Floats of routing state per beam row and routed module (tensors under ``capsule_state`` keys)."""
    modules = [v for k, v in state.items() if k.endswith("capsule_state")]
    floats = sum(t.numel() for v in modules for t in v.values() if torch.is_tensor(t) and t.is_floating_point())
    rows = next(iter(modules[0].values())).size(0)
    return floats / rows / len(modules)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    speed.add_model_args(p)
    p.add_argument("--at", default="250,500,750,1000", help="target positions to report, comma separated")
    p.add_argument("--rows", type=int, default=20, help="beam rows (beams of 5)")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--out", help="write every figure to this JSON file")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    at = speed.decoding_steps(p, "--at", a.at)
    vocab, d, models = speed.build_models(p, a)
    switch = capsule_routing.GRAM_FREE_DECODING
    capsule = models.pop("capsule_transformer")
    width = capsule.decoder.embed_dim
    runs = {"transformer": models["transformer"], "capsule, Gram kept": capsule, "capsule, default": capsule}
    steps = max(at) + 6
    times, state_floats = {k: [] for k in runs}, {}
    for repeat in range(a.repeats):
        names = list(runs)
        if repeat % 2:  # the two capsule runs take turns going first: a run right after its twin is faster
            names[1], names[2] = names[2], names[1]
        for name in names:
            model = runs[name]
            capsule_routing.GRAM_FREE_DECODING = math.inf if name == "capsule, Gram kept" else switch
            per_step, state = speed.decode_step_times(model, d, a.rows, 5, steps)
            times[name].append(per_step)
            if name != "transformer":
                state_floats[name] = routing_state_floats(state)
    capsule_routing.GRAM_FREE_DECODING = switch
    result = {"preset": a.preset, "vocab": vocab, "width": width, "gram_free_from": switch * width, "rows": a.rows,
              "repeats": a.repeats, "steps": {}, "routing_state_floats_per_row_and_module": state_floats}
    print(f"preset={a.preset} width D={width}: Gram-free decoding past {switch * width} target tokens; "
          f"{a.rows} beam rows, medians of {a.repeats} (CPU time, ms per step)")
    for s in at:
        row = {k: statistics.median(statistics.median(run[s - 5:s + 5]) for run in v) for k, v in times.items()}
        result["steps"][s] = row
        print(f"step {s:5d}: " + ", ".join(f"{k} {v * 1e3:8.2f}" for k, v in row.items()) +
              f"; default / Gram kept {row['capsule, default'] / row['capsule, Gram kept']:.3f}")
    print(f"routing state at step {steps} per beam row and module (floats): " +
          ", ".join(f"{k} {v:,.0f}" for k, v in state_floats.items()))
    if a.out:
        speed.write_json(a.out, result)


if __name__ == "__main__":
    main()
