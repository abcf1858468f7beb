"""Decoding at long target lengths: the per-token cost of a capsule decoding step against fairseq's
transformer of the same size, and the routing state a step reads and copies.

The decoder alone, incremental, on ``--rows`` beam rows reordered at every step
(``speed.run_decoder``); at each of ``--at`` the median CPU time of the 10 steps around it, median over
``--repeats`` interleaved runs.  Also the routing state per beam row and routed decoder module at the last
step (the fast implementation keeps the ``M×M`` Gram, ``q`` and ``u`` rows and in-block logits:
``capsule_routing_fast``).

    OMP_NUM_THREADS=1 python benchmarks/capsule_transformer/long_decoding.py --preset demo \\
        --out benchmarks/capsule_transformer/results/long_decoding_demo.json
"""
import argparse
import os
import statistics

import torch

import speed


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
    steps = max(at) + 6
    times, state_floats = {k: [] for k in models}, None
    for _ in range(a.repeats):
        for name, model in models.items():
            per_step, state = speed.decode_step_times(model, d, a.rows, 5, steps)
            times[name].append(per_step)
            if name == "capsule_transformer":
                state_floats = routing_state_floats(state)
    width = models["capsule_transformer"].decoder.embed_dim
    result = {"preset": a.preset, "vocab": vocab, "width": width, "rows": a.rows, "repeats": a.repeats, "steps": {},
              "routing_state_floats_per_row_and_module": state_floats}
    print(f"preset={a.preset} width D={width}; {a.rows} beam rows, medians of {a.repeats} (CPU time, ms per step)")
    for s in at:
        row = {k: statistics.median(statistics.median(run[s - 5:s + 5]) for run in v) for k, v in times.items()}
        result["steps"][s] = row
        print(f"step {s:5d}: " + ", ".join(f"{k} {v * 1e3:8.2f}" for k, v in row.items()) +
              f"; capsule / vanilla {row['capsule_transformer'] / row['transformer']:.3f}")
    print(f"routing state at step {steps} per beam row and module (floats): {state_floats:,.0f}")
    if a.out:
        speed.write_json(a.out, result)


if __name__ == "__main__":
    main()
