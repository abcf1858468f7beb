#!/usr/bin/env bash
# Mixed-precision check on one (or two) GPUs: every architecture under --fp16, --amp, --bf16.
# Usage: benchmarks/gpu/check.sh [extra check.py flags]   (e.g. --archs capsule_transformer --updates 300)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
test -x "$PY" || PY=python3
exec "$PY" benchmarks/gpu/check.py --out benchmarks/gpu/results.json "$@"
