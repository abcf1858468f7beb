# Sourced by the FastTrees recipes: repository root, interpreter, shared data, single-threaded BLAS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")
SHARED=${SHARED:-../shared/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
