#!/usr/bin/env python
"""Training step time of MTN / fairseq ``transformer`` on the flattened session, equal size, in one process.

Both models (parameter counts matched, see ``common.build_pair``) take Adam
steps (forward, label-smoothed loss, backward, update) on the same batches of
the binarized data, alternating model by model so that load from other jobs
hits both alike; the ratio of the median step times is printed.

    python benchmarks/mtn/speed.py --data benchmarks/work/syn_bin --max-query-length 8
"""
import argparse
import statistics
import time

from common import build_pair, n_params


def batches(data, max_query_length, n, max_tokens):
    from fairseq.tasks import setup_task

    from user_dir.from_flags import parse_cfg

    cfg = parse_cfg("mtn_tiny", task="query_suggestion", extra=["--max-query-length", max_query_length]).task
    cfg.data = data
    task = setup_task(cfg)
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, seed=1).next_epoch_itr(shuffle=True)
    return task, [next(itr) for _ in range(n)]


def step_fn(model, layout=False):
    """An Adam step on a batch; with ``layout`` the model also gets the collater's ``session_layout`` (MTN)."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(sample):
        net = sample["net_input"]
        extra = {"session_layout": net["session_layout"]} if layout else {}
        logits = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"], **extra)[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), sample["target"].reshape(-1),
                                                 ignore_index=1, label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--max-query-length", type=int, default=16)
    p.add_argument("--levels", type=int, default=2)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=2000)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    task, samples = batches(args.data, args.max_query_length, args.batches, args.max_tokens)
    mtn, flat, _ = build_pair(task.source_dictionary, args.max_query_length, args.levels)
    steps = {"mtn": step_fn(mtn.train(), layout="session_layout" in samples[0]["net_input"]),
             "transformer": step_fn(flat.train())}
    for step in steps.values():  # warm-up
        step(samples[0])
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for s in samples:
                step(s)
            times[name].append((time.perf_counter() - t0) / len(samples))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"params: mtn {n_params(mtn)}, transformer {n_params(flat)}; batches of <= {args.max_tokens} tokens")
    for name, m in med.items():
        print(f"{name}: median step {1000 * m:.1f} ms over {args.repeats} repeats x {args.batches} batches")
    print(f"step time ratio mtn / transformer = {med['mtn'] / med['transformer']:.2f}")


if __name__ == "__main__":
    main()
