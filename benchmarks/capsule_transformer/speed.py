"""Speed of capsule_transformer relative to fairseq's transformer of identical size, in one process.

At each source length of ``--lengths`` (default 30, 100, 250 tokens):

* training step: forward + backward + Adam step on the same random batch of about
  ``--tokens`` tokens per side (``tokens // length`` sentences), median over ``--repeats``
  interleaved measurements;
* generation: fairseq's ``SequenceGenerator`` with beam ``--beam`` on about ``--gen-tokens``
  source tokens, every hypothesis forced to ``length + 5`` tokens (untrained models would
  otherwise stop at different lengths), sentences/s, median over repeats.

Then the per-token cost of decoding late in a long output: the decoder alone, incremental,
on ``--decode-rows`` beam rows (a source of 30 tokens), reordered at every step as beam
search does; the median time of the 10 steps around each of ``--decode-steps`` (30, 300).

The dictionary has ``--vocab`` symbols, by default the size of the data the ``base`` and ``multi30k``
presets stand for (``VOCABULARY``): the output layer, its softmax and beam search's top-k over it cost both models alike,
so a small vocabulary gives routing its largest share of a step.

Both models share seed, sizes, dictionary and batches; measurements are interleaved (vanilla, capsule,
vanilla, ...) so that load from other jobs hits both alike.  Times are the process's CPU
time (``time.process_time``; one thread), so time spent descheduled by other jobs on a
shared machine is not counted.  ``--device cuda`` runs both models on the GPU and times them by the
wall clock, the device synchronised at each start and stop (``--dtype float16`` / ``bfloat16``: the
models' parameters in that type, as after fairseq's ``--fp16`` / ``--bf16`` conversion; routing itself
still runs in float32).  ``--out`` writes every figure as JSON.

    OMP_NUM_THREADS=1 python benchmarks/capsule_transformer/speed.py --preset multi30k \\
        --out benchmarks/capsule_transformer/results/speed_multi30k.json
"""
import argparse
import json
import os
import statistics

import torch
from fairseq.data import data_utils
from fairseq.sequence_generator import SequenceGenerator

from user_dir import timing
from user_dir.from_flags import build, random_sentences, toy_dictionary

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

# joined-dictionary size of the data each preset stands for: the output projection, softmax and beam
# search over it are part of every step, of both models
VOCABULARY = {
    "demo": 1004,  # a toy size (make demo's own dictionary has 176 symbols); the demo row is no target
    "multi30k": 7872,  # examples/capsule_transformer/prepare_multi30k.sh (8,000 merges)
    "base": 32768,  # WMT'16 En-De, BPE of 32K merges (the data of Vaswani et al.'s base and fairseq's scaling_nmt)
}


DEVICE = torch.device("cpu")  # set by --device


def clock():
    return timing.clock(DEVICE)


def batch(dictionary, n, length, seed):
    src = random_sentences(dictionary, [length] * n, seed=seed)
    tgt = random_sentences(dictionary, [length] * n, seed=seed + 1)
    pad, eos = dictionary.pad(), dictionary.eos()
    b = {
        "src_tokens": data_utils.collate_tokens(src, pad, left_pad=True),
        "src_lengths": torch.tensor([len(s) for s in src]),
        "prev_output_tokens": data_utils.collate_tokens(tgt, pad, eos, move_eos_to_beginning=True),
        "target": data_utils.collate_tokens(tgt, pad),
    }
    return {k: v.to(DEVICE) for k, v in b.items()}


def forward_backward(model, b):
    """Training forward (cross-entropy on the batch's targets) and backward."""
    out = model(b["src_tokens"], b["src_lengths"], b["prev_output_tokens"])[0]
    torch.nn.functional.cross_entropy(out.view(-1, out.size(-1)), b["target"].view(-1)).backward()


def train_step_time(model, opt, b):
    model.train()
    t0 = clock()
    opt.zero_grad()
    forward_backward(model, b)
    opt.step()
    return clock() - t0


def generate_rate(model, dictionary, b, beam):
    model.eval()
    # a fixed output length (min_len = max_len) so both models decode the same number of steps
    steps = b["src_tokens"].size(1) + 5
    gen = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=steps, min_len=steps)
    t0 = clock()
    with torch.no_grad():
        gen.forward({"net_input": {"src_tokens": b["src_tokens"], "src_lengths": b["src_lengths"]}})
    return b["src_tokens"].size(0) / (clock() - t0)


def run_decoder(model, dictionary, rows, beam, steps, each_step, seed=7):
    """Incremental decoding of ``steps`` tokens on ``rows`` beam rows (encoder once; rows reordered within
    their beam at every step, as beam search does): ``each_step(t, step)`` runs step ``t`` by calling ``step()``.
    Returns the incremental state after the last step."""
    model.eval()
    b = batch(dictionary, rows // beam, 30, seed)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (rows, steps), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = dictionary.eos()
    tokens = tokens.to(DEVICE)
    order = torch.arange(rows).view(-1, beam).roll(1, dims=1).reshape(-1).to(DEVICE)  # rows move inside their beam
    state = {}
    with torch.no_grad():
        enc = model.encoder(b["src_tokens"], src_lengths=b["src_lengths"])
        enc = model.encoder.reorder_encoder_out(enc, torch.arange(rows // beam, device=DEVICE).repeat_interleave(beam))
        for t in range(steps):
            def step():
                if t:
                    model.decoder.reorder_incremental_state_scripting(state, order)
                out = model.decoder(tokens[:, :t + 1], encoder_out=enc, incremental_state=state)
                model.get_normalized_probs(out, log_probs=True)
            each_step(t, step)
    return state


def decode_step_times(model, dictionary, rows, beam, steps, seed=7):
    """CPU time of each incremental decoder step (:func:`run_decoder`), and the state after the last."""
    times = []

    def timed(t, step):
        t0 = clock()
        step()
        times.append(clock() - t0)

    return times, run_decoder(model, dictionary, rows, beam, steps, timed, seed)


def interleaved(models, measure, repeats):
    """``{name: [figure per repeat]}``, the models taking turns."""
    out = {k: [] for k in models}
    for _ in range(repeats):
        for k, m in models.items():
            out[k].append(measure(k, m))
    return out


def ratio_row(figures):
    med = {k: statistics.median(v) for k, v in figures.items()}
    cap, van = med["capsule_transformer"], med["transformer"]
    return {"transformer": van, "capsule_transformer": cap, "ratio": cap / van,
            "capsule_runs": figures["capsule_transformer"], "transformer_runs": figures["transformer"]}


def write_json(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def add_model_args(p):
    """The flags that choose the two models and their dictionary."""
    p.add_argument("--preset", choices=PRESETS, default="demo")
    p.add_argument("--vocab", type=int, help="dictionary size, specials included (default: the preset's "
                   f"data: {VOCABULARY}); a small one gives routing its largest share of a step")
    p.add_argument("--routing-iters", type=int, default=3)
    p.add_argument("--capsule-args", default="", help="extra flags for capsule_transformer, space separated")
    p.add_argument("--device", default="cpu", help="cpu, or cuda[:N]: both models on that GPU, wall-clock times")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="the models' parameter type (half precision is meant for a GPU)")


def build_models(p, a):
    """``(vocab, dictionary, {"transformer": ..., "capsule_transformer": ...})``: same seed, sizes and dictionary."""
    global DEVICE
    vocab = a.vocab or VOCABULARY[a.preset]
    if vocab <= 4:
        p.error(f"--vocab {vocab}: the dictionary needs more than its 4 special symbols")
    DEVICE = timing.device_from_flag(p, a.device)
    d = toy_dictionary(vocab - 4)  # + bos, pad, eos, unk
    sizes = PRESETS[a.preset] + ["--dropout", "0.1"]
    vanilla, _ = build("transformer", sizes, dictionary=d, seed=1)
    capsule, _ = build("capsule_transformer", sizes + ["--routing-iters", a.routing_iters] + a.capsule_args.split(),
                       dictionary=d, seed=1)
    dtype = getattr(torch, a.dtype)
    return vocab, d, {"transformer": vanilla.to(DEVICE, dtype), "capsule_transformer": capsule.to(DEVICE, dtype)}


def decoding_steps(p, flag, value):
    """The comma-separated decoding steps of ``flag``; a clear error unless each is a number of at least 5."""
    try:
        steps = [int(s) for s in value.split(",")]
    except ValueError:
        steps = []
    if not steps or min(steps) < 5:
        p.error(f"{flag} {value}: comma-separated steps of at least 5 (each figure is the median of the 10 steps "
                "around it)")
    return steps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--lengths", default="30,100,250", help="source (and target) lengths, comma separated")
    p.add_argument("--tokens", type=int, default=2000, help="tokens per side of a training batch")
    p.add_argument("--gen-tokens", type=int, default=500, help="source tokens of a generation batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--decode-steps", default="30,300", help="steps whose per-token decoding time is reported")
    p.add_argument("--decode-rows", type=int, default=20, help="beam rows of the per-token measurement")
    p.add_argument("--out", help="write every figure to this JSON file")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    steps = decoding_steps(p, "--decode-steps", a.decode_steps)
    vocab, d, models = build_models(p, a)
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4) for k, m in models.items()}
    result = {"preset": a.preset, "vocab": vocab, "routing_iters": a.routing_iters, "capsule_args": a.capsule_args,
              "device": str(DEVICE), "dtype": a.dtype, "threads": torch.get_num_threads(), "repeats": a.repeats,
              "beam": a.beam, "train": {}, "generate": {}, "decode": {}}
    print(f"preset={a.preset} vocab={vocab} routing_iters={a.routing_iters} capsule_args='{a.capsule_args}' "
          f"device={DEVICE} dtype={a.dtype} threads={torch.get_num_threads()} repeats={a.repeats} "
          f"(medians; {timing.timing_name(DEVICE)})")
    for length in map(int, a.lengths.split(",")):
        train_b = batch(d, max(1, a.tokens // length), length, seed=3)
        gen_b = batch(d, max(1, a.gen_tokens // length), length, seed=5)
        for k, m in models.items():  # warm-up
            train_step_time(m, opts[k], train_b)
        step = ratio_row(interleaved(models, lambda k, m: train_step_time(m, opts[k], train_b), a.repeats))
        rate = ratio_row(interleaved(models, lambda k, m: generate_rate(m, d, gen_b, a.beam), a.repeats))
        step["sentences"], rate["sentences"] = train_b["src_tokens"].size(0), gen_b["src_tokens"].size(0)
        result["train"][length], result["generate"][length] = step, rate
        print(f"length {length:4d}: train step {step['transformer'] * 1e3:8.1f} / {step['capsule_transformer'] * 1e3:8.1f}"
              f" ms ({step['sentences']} sent.), ratio capsule/vanilla {step['ratio']:.3f} (target <= 1.3); "
              f"beam-{a.beam} generation {rate['transformer']:6.2f} / {rate['capsule_transformer']:6.2f} sent/s "
              f"({rate['sentences']} sent.), speed ratio {rate['ratio']:.3f} (target >= 0.75)")
    windows = interleaved(models, lambda k, m: decode_step_times(m, d, a.decode_rows, a.beam, max(steps) + 6)[0],
                          a.repeats)
    for s in steps:
        per_step = {k: [statistics.median(run[s - 5:s + 5]) for run in runs] for k, runs in windows.items()}
        row = ratio_row(per_step)
        result["decode"][s] = row
        print(f"decoding step {s:4d} ({a.decode_rows} rows): {row['transformer'] * 1e3:.2f} / "
              f"{row['capsule_transformer'] * 1e3:.2f} ms per token, ratio capsule/vanilla {row['ratio']:.3f}")
    if len(steps) > 1:
        first, last = result["decode"][steps[0]]["ratio"], result["decode"][steps[-1]]["ratio"]
        print(f"step-{steps[-1]} ratio / step-{steps[0]} ratio: {last / first:.3f} (target <= 1.5)")
    if a.out:
        write_json(a.out, result)


if __name__ == "__main__":
    main()
