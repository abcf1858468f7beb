#!/usr/bin/env bash
# Capsule speed targets on one GPU: speed.py at the multi30k preset in float32 and float16 parameters
# (5 repeats each; its run time on a GPU has not been measured).  Usage: benchmarks/gpu/capsule_speed.sh [extra speed.py flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
test -x "$PY" || PY=python3
for dtype in float32 float16; do
  "$PY" benchmarks/capsule_transformer/speed.py --preset multi30k --device cuda --dtype "$dtype" --repeats 5 \
    --out "benchmarks/capsule_transformer/results/speed_multi30k_cuda_${dtype}.json" "$@"
done
