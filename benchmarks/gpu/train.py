"""``fairseq-train`` with two additions for the mixed-precision check.

1. ``--bf16`` without ``--tpu``.  fairseq 0.12.3's command line makes ``--bf16`` imply
   ``--tpu`` (``fairseq/options.py``), so ``fairseq-train --bf16`` needs torch_xla even on a
   GPU; its trainer and ``FP16Optimizer`` support bfloat16 on CUDA (and CPU) without it, as
   ``fairseq-hydra-train common.bf16=true`` shows.  This launcher parses the same flags and
   clears the implied ``--tpu`` before training.
2. One JSON line at the end: peak accelerator memory (``torch.cuda.max_memory_allocated``,
   or the process's peak RSS on CPU), prefixed ``PEAK_MEMORY``.

Usage: ``python benchmarks/gpu/train.py <fairseq-train arguments>``.
"""
import json
import resource
import sys

import torch
from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train


def peak_memory_gib():
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def main(argv):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    if args.bf16 and not any(a == "--tpu" for a in argv):
        args.tpu = False  # the implication fairseq's argparse path adds; bf16 itself needs no TPU
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, train.main)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    print("PEAK_MEMORY " + json.dumps({"device": device, "peak_gib": round(peak_memory_gib(), 3)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
