"""Short PTB training curves of several LM variants on identical batches (diagnostics).

    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/ptb_curves.py --data benchmarks/work/ptb/bin \
        --variants txl:mem_len=0 txl:mem_len=70 lm --steps 300

Every variant trains in this process on the same batches of the ``bptt_lm``
stream layout (batch ``--bsz`` x ``--tgt-len``; Transformer-XL carries its
memory through ``stream_pos``; ``transformer_lm`` sees each 70-token block
alone), with Adam, linear warmup then cosine decay, clipping 0.25, and
prints the training loss (nats, mean over ``--log-every`` steps) and the
validation perplexity on the first ``--valid-batches`` batches.

A variant is ``txl`` or ``lm`` followed by ``:key=value,...``: model
options (``mem_len``, ``dropout``, ``pre_lnorm``, ``init_std``, ...), and
``lr`` / ``warmup`` for the optimiser.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from fairseq.data import Dictionary, data_utils

from user_dir.from_flags import build
from user_dir.tasks.bptt_lm import StreamDataset


def parse_variant(text):
    kind, _, rest = text.partition(":")
    opts = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        opts[key] = value
    return kind, opts


def model_for(kind, opts, d, args):
    L, D, H, DH, F_ = args.layers, args.dim, args.heads, args.dim // args.heads, args.ffn
    if kind == "txl":
        flags = ["--n-layer", L, "--d-model", D, "--n-head", H, "--d-head", DH, "--d-inner", F_,
                 "--dropout", args.dropout]
    elif kind == "lm":
        flags = ["--decoder-layers", L, "--decoder-embed-dim", D, "--decoder-attention-heads", H,
                 "--decoder-ffn-embed-dim", F_, "--dropout", args.dropout, "--tokens-per-sample", args.tgt_len,
                 "--share-decoder-input-output-embed"]
    else:
        raise ValueError(f"unknown variant kind {kind}")
    for key, value in opts.items():
        if key in ("lr", "warmup"):
            continue
        flags += ["--" + key.replace("_", "-")] + ([] if value == "" else [value])
    arch = "transformer_xl_lm" if kind == "txl" else "transformer_lm"
    return build(arch, flags, task="language_modeling", dictionary=d, seed=args.seed)[0]


def stream(d, data, split, bsz, tgt_len):
    ds = data_utils.load_indexed_dataset(os.path.join(data, split), d)
    tokens = torch.cat([torch.tensor([d.eos()])] + [ds[i].long() for i in range(len(ds))])
    return StreamDataset(tokens, bsz, tgt_len, d.pad())


def nll(model, sample, kind):
    net = sample["net_input"]
    out = model(net["src_tokens"], stream_pos=net["stream_pos"]) if kind == "txl" else model(net["src_tokens"])
    lp = model.get_normalized_probs(out, log_probs=True)
    return F.nll_loss(lp.view(-1, lp.size(-1)), sample["target"].view(-1), ignore_index=d_pad, reduction="sum")


def main():
    global d_pad
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--variants", nargs="+", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--bsz", type=int, default=16)
    p.add_argument("--tgt-len", type=int, default=70)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--valid-batches", type=int, default=40)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)
    d = Dictionary.load(os.path.join(args.data, "dict.txt"))
    d_pad = d.pad()
    train = stream(d, args.data, "train", args.bsz, args.tgt_len)
    valid = stream(d, args.data, "valid", 10, args.tgt_len)
    for text in args.variants:
        kind, opts = parse_variant(text)
        model = model_for(kind, opts, d, args)
        lr, warmup = float(opts.get("lr", args.lr)), int(opts.get("warmup", args.warmup))
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warmup if s < warmup else
                                                  0.5 * (1 + math.cos(math.pi * (s - warmup) / (args.steps - warmup))))
        model.train()
        if hasattr(model, "reset_memory"):
            model.reset_memory()
        curve, acc, n, start = [], 0.0, 0, time.time()
        for step in range(args.steps):
            sample = train.collater([train[step % len(train)]])
            loss = nll(model, sample, kind) / sample["ntokens"]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            sched.step()
            acc += loss.item()
            n += 1
            if n == args.log_every:
                curve.append(round(acc / n, 3))
                acc, n = 0.0, 0
        model.eval()
        if hasattr(model, "reset_memory"):
            model.reset_memory()
        tot, ntok = 0.0, 0
        with torch.no_grad():
            for i in range(min(args.valid_batches, len(valid))):
                sample = valid.collater([valid[i]])
                tot += nll(model, sample, kind).item()
                ntok += sample["ntokens"]
        print(json.dumps({"variant": text, "train_loss_curve": curve, "valid_ppl": round(math.exp(tot / ntok), 1),
                          "seconds": round(time.time() - start)}), flush=True)


if __name__ == "__main__":
    main()
