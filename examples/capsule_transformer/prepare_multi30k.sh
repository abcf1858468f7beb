#!/usr/bin/env bash
# Multi30k Task 1 En->De for the CPU-scale comparison: the repository's lowercased, Moses-tokenized
# files -> joint subword-nmt BPE (8,000 merges) -> fairseq-preprocess (joined dictionary).
#   examples/capsule_transformer/prepare_multi30k.sh [RAW_DIR] [DEST]
# RAW_DIR defaults to ../shared/data/multi30k/tok, DEST to data-bin/multi30k.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
RAW=${1:-../shared/data/multi30k/tok}
DEST=${2:-data-bin/multi30k}
[ -d "$RAW" ] || { echo "prepare_multi30k: raw directory not found: $RAW" >&2; exit 2; }
"$PYTHON" preprocess/prepare_translation.py --raw "$RAW" --src en --tgt de --dest "$DEST" \
  --bpe subword-nmt --merges "${MERGES:-8000}" --joined-dictionary
