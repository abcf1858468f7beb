#!/usr/bin/env bash
# The recurrent FastTrees cell against ON-LSTM on one GPU (the paper's speed claim, "29-42% faster", was measured
# on a GPU): lstm_speed.py at the PTB preset (writes the fasttrees_lstm_speed claim row) and at the logic size,
# float32, 20 interleaved repeats each.  Usage: benchmarks/gpu/fasttrees_lstm_speed.sh [extra lstm_speed.py flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
test -x "$PY" || PY=python3
"$PY" benchmarks/fasttrees/lstm_speed.py --setting ptb --device cuda --repeats 20 \
  --out benchmarks/fasttrees/results/lstm_speed_ptb_cuda.json --claims benchmarks/results/paper_claims.json "$@"
"$PY" benchmarks/fasttrees/lstm_speed.py --setting logic --device cuda --repeats 20 \
  --out benchmarks/fasttrees/results/lstm_speed_logic_cuda.json "$@"
