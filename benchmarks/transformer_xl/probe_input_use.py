"""Does a trained ``transformer_xl_lm`` use its input?  Perplexity on a few validation batches (no memory,
each 70-token segment alone) with the real input tokens and with each segment's input tokens shuffled.

    OMP_NUM_THREADS=1 python benchmarks/transformer_xl/probe_input_use.py CHECKPOINT DATA_BIN

A model stuck on the unigram plateau scores about the same either way.
"""
import argparse
import math

import torch
from fairseq import checkpoint_utils

import user_dir  # noqa: F401


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("data")
    p.add_argument("--batches", type=int, nargs=2, default=[5, 15], help="range of validation batches")
    args = p.parse_args()
    torch.set_num_threads(1)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.checkpoint],
                                                                    arg_overrides={"data": args.data})
    model = models[0].eval()
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for shuffle in (False, True):
            total, n = 0.0, 0
            for i in range(*args.batches):
                sample = ds.collater([ds[i]])
                src = sample["net_input"]["src_tokens"]
                if shuffle:
                    src = src[:, torch.randperm(src.size(1), generator=g)]
                lp = model.get_normalized_probs(model(src), log_probs=True)
                nll = -lp.gather(-1, sample["target"].unsqueeze(-1))
                total += nll.sum().item()
                n += nll.numel()
            print(f"{'shuffled' if shuffle else 'real'} input: perplexity {math.exp(total / n):.1f}")


if __name__ == "__main__":
    main()
