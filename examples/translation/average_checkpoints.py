#!/usr/bin/env python
"""Average the parameters of several fairseq checkpoints into one (as fairseq's own
``scripts/average_checkpoints.py``, which the fairseq wheel does not ship).

    python examples/translation/average_checkpoints.py --inputs DIR --num-epoch-checkpoints 5 --output avg.pt
    python examples/translation/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

The output keeps the first input's (with a directory: the newest epoch's) configuration, extra state and optimizer history (so
``fairseq-generate --path`` reads it as any checkpoint) with the element-wise mean of the
models' parameters; floating-point tensors are averaged in float64 and cast back, integer
buffers (e.g. step counters) must agree and are copied.  Every input must hold the same
parameter names and shapes: a mismatch is an error naming both files.
"""
import argparse
import os
import re
import sys

import torch

import user_dir  # noqa: F401  (the plugin's archs and safe checkpoint loading)
from fairseq import checkpoint_utils
from omegaconf import OmegaConf


def epoch_checkpoints(directory, n):
    """The ``n`` newest ``checkpoint<epoch>.pt`` of ``directory``, newest first."""
    found = []
    for name in os.listdir(directory):
        m = re.fullmatch(r"checkpoint(\d+)\.pt", name)
        if m:
            found.append((int(m.group(1)), os.path.join(directory, name)))
    found.sort(reverse=True)
    if len(found) < n:
        raise SystemExit(f"average_checkpoints: {directory} holds {len(found)} epoch checkpoints, "
                         f"fewer than --num-epoch-checkpoints {n}")
    return [path for _, path in found[:n]]


def average(paths):
    """The newest checkpoint's state with the mean of all ``paths``' model parameters."""
    total, first, newest = None, None, None
    for path in paths:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        params = state["model"]
        if total is None:
            first, newest = path, state
            dtypes = {k: v.dtype for k, v in params.items()}
            total = {k: v.double().clone() if v.is_floating_point() else v.clone() for k, v in params.items()}
            continue
        if params.keys() != total.keys():
            raise SystemExit(f"average_checkpoints: {path} and {first} hold different parameters "
                             f"({sorted(set(params) ^ set(total))[:5]} ...)")
        for k, v in params.items():
            if v.shape != total[k].shape:
                raise SystemExit(f"average_checkpoints: parameter {k} is {tuple(v.shape)} in {path} but "
                                 f"{tuple(total[k].shape)} in {first}")
            if v.is_floating_point():
                total[k] += v.double()
            elif not torch.equal(v, total[k]):
                raise SystemExit(f"average_checkpoints: integer buffer {k} differs between {path} and {first}")
    newest["model"] = {k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v
                       for k, v in total.items()}
    if OmegaConf.is_config(newest.get("cfg")):  # the loader's DictConfig, saved as fairseq saves it: plain data
        newest["cfg"] = OmegaConf.to_container(newest["cfg"], resolve=True, enum_to_str=True)
    return newest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="checkpoint files, or one directory with --num-epoch-checkpoints")
    parser.add_argument("--num-epoch-checkpoints", type=int, default=None,
                        help="average the N newest checkpoint<epoch>.pt of the --inputs directory")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    if args.num_epoch_checkpoints is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error("--num-epoch-checkpoints needs exactly one directory as --inputs")
        if args.num_epoch_checkpoints < 1:
            parser.error("--num-epoch-checkpoints must be at least 1")
        paths = epoch_checkpoints(args.inputs[0], args.num_epoch_checkpoints)
    else:
        paths = args.inputs
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            parser.error(f"no such checkpoint: {missing[0]}")
    state = average(paths)
    tmp = args.output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)}) into {args.output}")


if __name__ == "__main__":
    sys.exit(main())
