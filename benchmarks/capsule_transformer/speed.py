"""Speed of capsule_transformer relative to fairseq's transformer of identical size, in one process.

* training step: forward + backward + Adam step on the same random batches
  (``--batch-sentences`` × ``--length`` tokens on each side), median over
  ``--repeats`` interleaved measurements;
* generation: fairseq's ``SequenceGenerator`` with beam 5 on the same source
  sentences, every hypothesis forced to the same length (untrained models
  would otherwise stop at different lengths), sentences/s, median over repeats.

Both models share seed, sizes and batches; measurements are interleaved
(vanilla, capsule, vanilla, ...) so that load from other jobs hits both alike.
Times are the process's CPU time (``time.process_time``; one thread), so that
time spent descheduled by other jobs on a shared machine is not counted.

    OMP_NUM_THREADS=1 python benchmarks/capsule_transformer/speed.py            # demo sizes
    OMP_NUM_THREADS=1 python benchmarks/capsule_transformer/speed.py --preset base
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import user_dir  # noqa: E402,F401
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402
from tests.helpers.models import build, random_sentences, toy_dictionary  # noqa: E402
from fairseq.data import data_utils  # noqa: E402

PRESETS = {
    # the demo's sizes (examples/demo/run_demo.sh)
    "demo": ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "128",
             "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
             "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings"],
    # the Multi30k comparison's sizes
    "multi30k": ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
                 "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
                 "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings"],
    "base": ["--share-all-embeddings"],
}


def batch(dictionary, n, length, seed):
    src = random_sentences(dictionary, [length] * n, seed=seed)
    tgt = random_sentences(dictionary, [length] * n, seed=seed + 1)
    pad, eos = dictionary.pad(), dictionary.eos()
    return {
        "src_tokens": data_utils.collate_tokens(src, pad, left_pad=True),
        "src_lengths": torch.tensor([len(s) for s in src]),
        "prev_output_tokens": data_utils.collate_tokens(tgt, pad, eos, move_eos_to_beginning=True),
        "target": data_utils.collate_tokens(tgt, pad),
    }


def train_step_time(model, opt, b):
    model.train()
    t0 = time.process_time()
    opt.zero_grad()
    out = model(b["src_tokens"], b["src_lengths"], b["prev_output_tokens"])[0]
    loss = torch.nn.functional.cross_entropy(out.view(-1, out.size(-1)), b["target"].view(-1))
    loss.backward()
    opt.step()
    return time.process_time() - t0


def generate_rate(model, dictionary, b, beam):
    model.eval()
    # a fixed output length (min_len = max_len) so both models decode the same number of steps
    steps = b["src_tokens"].size(1) + 5
    gen = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=steps, min_len=steps)
    t0 = time.process_time()
    with torch.no_grad():
        gen.forward({"net_input": {"src_tokens": b["src_tokens"], "src_lengths": b["src_lengths"]}})
    return b["src_tokens"].size(0) / (time.process_time() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=PRESETS, default="demo")
    p.add_argument("--batch-sentences", type=int, default=64)
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--gen-sentences", type=int, default=32)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--routing-iters", type=int, default=3)
    p.add_argument("--capsule-args", default="", help="extra flags for capsule_transformer, space separated")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    d = toy_dictionary(1000)
    sizes = PRESETS[a.preset]
    vanilla, _ = build("transformer", sizes + ["--dropout", "0.1"], dictionary=d, seed=1)
    capsule, _ = build("capsule_transformer", sizes + ["--dropout", "0.1", "--routing-iters", a.routing_iters]
                       + a.capsule_args.split(), dictionary=d, seed=1)
    models = {"transformer": vanilla, "capsule_transformer": capsule}
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4) for k, m in models.items()}
    train_b = batch(d, a.batch_sentences, a.length, seed=3)
    gen_b = batch(d, a.gen_sentences, a.length // 2, seed=5)
    step = {k: [] for k in models}
    rate = {k: [] for k in models}
    for k, m in models.items():  # warm-up
        train_step_time(m, opts[k], train_b)
    for _ in range(a.repeats):
        for k, m in models.items():
            step[k].append(train_step_time(m, opts[k], train_b))
    for _ in range(max(3, a.repeats // 2)):
        for k, m in models.items():
            rate[k].append(generate_rate(m, d, gen_b, a.beam))
    med_step = {k: statistics.median(v) for k, v in step.items()}
    med_rate = {k: statistics.median(v) for k, v in rate.items()}
    print(f"preset={a.preset} routing_iters={a.routing_iters} capsule_args='{a.capsule_args}' "
          f"batch={a.batch_sentences}x{a.length} threads={torch.get_num_threads()}")
    for k in models:
        print(f"{k:22s} train step median {med_step[k] * 1000:8.1f} ms   beam-{a.beam} generation "
              f"median {med_rate[k]:7.2f} sent/s")
    print(f"step-time ratio capsule/vanilla: {med_step['capsule_transformer'] / med_step['transformer']:.3f} "
          f"(target <= 1.3)")
    print(f"generation speed ratio capsule/vanilla: "
          f"{med_rate['capsule_transformer'] / med_rate['transformer']:.3f} (target >= 0.75)")


if __name__ == "__main__":
    main()
