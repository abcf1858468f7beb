"""Loading a bptt_lm split: read in place (TokenStream) against the lines concatenated into a LongTensor.

Writes a synthetic corpus the way fairseq-preprocess does (memory-mapped .bin/.idx, ids of a
``--vocab``-word dictionary, ``--lines`` lines of 20-99 tokens + ``</s>``), then, in one process,
times each way of building the stream (median of ``--repeats``) and the resident memory it adds
(the stream kept alive, as the task keeps it).

    python benchmarks/transformer_xl/stream_load.py --work /tmp/stream_load --lines 180000
"""
import argparse
import os
import resource
import statistics
import time

import numpy as np
import torch
from fairseq.data import data_utils, indexed_dataset

from user_dir.tasks.bptt_lm import TokenStream, concatenated_lines, token_stream


def write_corpus(prefix, lines, vocab, seed=0):
    rng = np.random.default_rng(seed)
    builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=vocab)
    for length in rng.integers(20, 100, lines):
        builder.add_item(torch.from_numpy(np.append(rng.integers(4, vocab, length), 2)))
    builder.finalize(prefix + ".idx")


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="directory for the synthetic corpus")
    p.add_argument("--lines", type=int, default=180000)
    p.add_argument("--vocab", type=int, default=267735, help="dictionary size (WikiText-103: 267,735)")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    prefix = os.path.join(a.work, "train")
    if not os.path.exists(prefix + ".idx"):
        write_corpus(prefix, a.lines, a.vocab)
    data = data_utils.load_indexed_dataset(prefix, None, dataset_impl="mmap")
    tokens = int(data.sizes.sum())
    print(f"{len(data)} lines, {tokens} tokens, {a.vocab}-word dictionary ({data._index.dtype} ids)")
    for name, build in (("in place (TokenStream)", lambda: token_stream(data, 2)),
                        ("concatenated LongTensor", lambda: concatenated_lines(data, 2))):
        times, added = [], []
        for _ in range(a.repeats):
            before = rss_mb()
            t0 = time.perf_counter()
            stream = build()
            if isinstance(stream, TokenStream):
                stream.max_id()  # the task's id check reads the whole file once
            else:
                int(stream.max())
            times.append(time.perf_counter() - t0)
            added.append(rss_mb() - before)
            del stream
        print(f"{name:24}: {statistics.median(times):7.3f} s (runs {', '.join(f'{t:.3f}' for t in times)}), "
              f"resident memory +{statistics.median(added):6.1f} MB")


if __name__ == "__main__":
    main()
