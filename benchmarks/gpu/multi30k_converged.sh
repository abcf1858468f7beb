#!/usr/bin/env bash
# The Multi30k convergence table on one GPU: every (arch, routing, seed) of
# examples/translation/multi30k_converged.sh at once on the visible GPU (--fp16), each run to the same
# stopping rule, rows written to the same JSON as the CPU runs (with "device": "cuda").
#   benchmarks/gpu/multi30k_converged.sh [DATA_BIN] [WORK_ROOT]
# DATA_BIN defaults to data-bin/multi30k (examples/capsule_transformer/prepare_multi30k.sh), WORK_ROOT to
# benchmarks/work/m30k_converged_gpu.  CONFIGS (default: the four of the table) and SEEDS (default 1 2 3)
# choose the runs; DEVICE=cpu runs the same on the CPU (the smoke test does, with a tiny MAX_UPDATE);
# MAX_UPDATE, PATIENCE, AVERAGE, ... are handed on to each run.  Each run's output: WORK_ROOT/<run>.out.
# DEADLINE (seconds, default none) stops every run still training at that time (SIGTERM to each run's process
# group; exit status 3): the same command later resumes them from their checkpoint_last.pt, --patience's count
# included, so a table that needs more than one device call is trained in several.
# Measured: on one H100 (--fp16, 16 CPU cores) seed 1's four runs side by side stopped by patience after 36-51
# epochs, in 326-456 s of training (~9 s an epoch each); on one H200 the 12 runs side by side took ~20 s an epoch.
# So train one seed group per device call (SEEDS=1, then 2, then 3; ~8 minutes of training each, then averaging
# and beam-5 scoring; each group's rows land in the same JSON), or all of them over several calls with DEADLINE.
# Without fairseq on the GPU machine, carry wheels made here and install them there: benchmarks/gpu/wheels.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-data-bin/multi30k}
ROOT=${2:-benchmarks/work/m30k_converged_gpu}
CONFIGS=${CONFIGS:-"transformer capsule_transformer:enc_self capsule_transformer:default fasttrees_transformer"}
SEEDS=${SEEDS:-"1 2 3"}
export DEVICE=${DEVICE:-cuda}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$ROOT"
rm -f "$ROOT/.deadline"
pids=()
names=()
for config in $CONFIGS; do
  arch=${config%%:*}
  routing=""
  [ "$config" = "$arch" ] || routing=${config#*:}
  for seed in $SEEDS; do
    name=${arch}${routing:+_$routing}_s$seed
    setsid examples/translation/multi30k_converged.sh "$arch" "$seed" "$routing" "$DATA" "$ROOT/$name" \
      > "$ROOT/$name.out" 2>&1 &  # its own process group: DEADLINE stops the run with its fairseq-train
    pids+=($!)
    names+=("$name")
  done
done
running() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
if [ -n "${DEADLINE:-}" ]; then
  end=$((SECONDS + DEADLINE))
  while running && [ "$SECONDS" -lt "$end" ]; do sleep 1; done
  if running; then
    touch "$ROOT/.deadline"
    for pid in "${pids[@]}"; do kill -TERM -- -"$pid" 2>/dev/null || true; done
  fi
fi
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    if [ -f "$ROOT/.deadline" ]; then
      echo "multi30k_converged (gpu): run ${names[$i]} stopped at the DEADLINE; run the same command to resume it" >&2
      status=3
    else
      echo "multi30k_converged (gpu): run ${names[$i]} failed; see $ROOT/${names[$i]}.out" >&2
      [ "$status" = 3 ] || status=1
    fi
  fi
done
rm -f "$ROOT/.deadline"
exit $status
