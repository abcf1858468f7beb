#!/usr/bin/env bash
# The Multi30k convergence table on one GPU: every (arch, routing, seed) of
# examples/translation/multi30k_converged.sh at once on the visible GPU (--fp16), each run to the same
# stopping rule, rows written to the same JSON as the CPU runs (with "device": "cuda").
#   benchmarks/gpu/multi30k_converged.sh [DATA_BIN] [WORK_ROOT]
# DATA_BIN defaults to data-bin/multi30k (examples/capsule_transformer/prepare_multi30k.sh), WORK_ROOT to
# benchmarks/work/m30k_converged_gpu.  CONFIGS (default: the four of the table) and SEEDS (default 1 2 3)
# choose the runs; DEVICE=cpu runs the same on the CPU (the smoke test does, with a tiny MAX_UPDATE);
# MAX_UPDATE, PATIENCE, AVERAGE, ... are handed on to each run.  Each run's output: WORK_ROOT/<run>.out.
# Measured on one H200 (--fp16, 16 CPU cores): the 12 runs side by side take ~20 s per epoch each (validation
# included) and reach epochs 22-25 in 470 s, none stopped by patience yet (the CPU vanilla run still improves at
# epoch 30), so the whole table needs ~15-20 minutes of GPU: more than one 10-minute call.
# Without fairseq on the GPU machine (Python 3.12 there), carry wheels made here: ve-fairseq==0.12.3,
# bitarray, hydra-core, omegaconf (cp312 manylinux, pip download --only-binary) and antlr4-python3-runtime==4.9.3
# (pip wheel), install them with pip --target, put the console scripts and a `python` link in one folder and
# pass PYTHON=<that folder>/python.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-data-bin/multi30k}
ROOT=${2:-benchmarks/work/m30k_converged_gpu}
CONFIGS=${CONFIGS:-"transformer capsule_transformer:enc_self capsule_transformer:default fasttrees_transformer"}
SEEDS=${SEEDS:-"1 2 3"}
export DEVICE=${DEVICE:-cuda}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$ROOT"
pids=()
names=()
for config in $CONFIGS; do
  arch=${config%%:*}
  routing=""
  [ "$config" = "$arch" ] || routing=${config#*:}
  for seed in $SEEDS; do
    name=${arch}${routing:+_$routing}_s$seed
    examples/translation/multi30k_converged.sh "$arch" "$seed" "$routing" "$DATA" "$ROOT/$name" \
      > "$ROOT/$name.out" 2>&1 &
    pids+=($!)
    names+=("$name")
  done
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "multi30k_converged (gpu): run ${names[$i]} failed; see $ROOT/${names[$i]}.out" >&2
    failed=1
  fi
done
exit $failed
