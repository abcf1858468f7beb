#!/usr/bin/env bash
# WMT17 Zh->En as in the paper: training pairs longer than 50 tokens dropped, newsdev2017 valid,
# newstest2017 test, BPE with 32K merges per language (separate dictionaries).
#   examples/capsule_transformer/prepare_wmt17_zh_en.sh RAW_DIR [DEST]
# RAW_DIR holds train.{zh,en}, newsdev2017.{zh,en}, newstest2017.{zh,en}. The Chinese side must
# already be word-segmented (e.g. with jieba or the Stanford segmenter): BPE and the 50-token length
# limit count space-separated tokens. DEST defaults to data-bin/wmt17_zh_en.
# The paper keeps only pairs shorter than 50 tokens for validation too: filter newsdev2017 yourself
# if you want that (the test set is never filtered).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
RAW=${1:?usage: prepare_wmt17_zh_en.sh RAW_DIR [DEST]}
DEST=${2:-data-bin/wmt17_zh_en}
[ -d "$RAW" ] || { echo "prepare_wmt17_zh_en: raw directory not found: $RAW" >&2; exit 2; }
"$PYTHON" preprocess/prepare_translation.py --raw "$RAW" --src zh --tgt en --dest "$DEST" \
  --train-pref train --valid-pref newsdev2017 --test-pref newstest2017 \
  --bpe subword-nmt --merges 32000 --no-joined-dictionary --max-len 50 \
  --workers "${WORKERS:-8}"
