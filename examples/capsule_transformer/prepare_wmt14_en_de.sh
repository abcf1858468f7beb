#!/usr/bin/env bash
# WMT14 En->De as in the paper: all training pairs, newstest2013 valid, newstest2014 test,
# Moses tokenisation, joint BPE with 32K merges, joined dictionary.
#   examples/capsule_transformer/prepare_wmt14_en_de.sh RAW_DIR [DEST]
# RAW_DIR holds plain-text parallel files train.{en,de}, newstest2013.{en,de}, newstest2014.{en,de}
# (e.g. the concatenation of Europarl v7, Common Crawl and News Commentary v9, and the SGML-stripped
# test sets). DEST defaults to data-bin/wmt14_en_de.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
RAW=${1:?usage: prepare_wmt14_en_de.sh RAW_DIR [DEST]}
DEST=${2:-data-bin/wmt14_en_de}
[ -d "$RAW" ] || { echo "prepare_wmt14_en_de: raw directory not found: $RAW" >&2; exit 2; }
"$PYTHON" preprocess/prepare_translation.py --raw "$RAW" --src en --tgt de --dest "$DEST" \
  --train-pref train --valid-pref newstest2013 --test-pref newstest2014 \
  --tokenize --bpe subword-nmt --merges 32000 --joined-dictionary --max-len 250 \
  --workers "${WORKERS:-8}"
