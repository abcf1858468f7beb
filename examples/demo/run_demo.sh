#!/usr/bin/env bash
# The demo: synthetic (or user-given) parallel corpus -> BPE -> fairseq-preprocess
# -> fairseq-train --user-dir user_dir -> fairseq-generate --beam 5 -> sacrebleu.
# The last line printed is the BLEU score.
#
#   examples/demo/run_demo.sh                 # built-in synthetic corpus
#   DATA=../shared/data/multi30k/tok SRC=en TGT=de examples/demo/run_demo.sh
#
# Variables: DATA (raw train/valid/test files), SRC, TGT, ARCH, WORK (output
# directory), MAX_UPDATE, BPE (subword-nmt|sentencepiece), MERGES, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PYTHON")
ARCH=${ARCH:-capsule_transformer}
SRC=${SRC:-en}
TGT=${TGT:-de}
BPE=${BPE:-subword-nmt}
WORK=${WORK:-demo-work}
MAX_UPDATE=${MAX_UPDATE:-}
# Small models train fastest on one thread per process, and OpenMP's spinning threads slow to a
# crawl when another job shares the cores; set OMP_NUM_THREADS to use more.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

fail() { echo "demo: error: $*" >&2; exit 2; }

if [ -z "${DATA:-}" ]; then
  RAW=$WORK/raw
  MERGES=${MERGES:-800}
  MAX_UPDATE=${MAX_UPDATE:-400}  # the synthetic corpus is learnt by then (BLEU 100 in 350-700 updates)
  echo "| generating the synthetic parallel corpus in $RAW" >&2
  "$PYTHON" preprocess/toy_translation_corpus.py --out "$RAW" --train 4000 --valid 200 --test 300 --seed 1
else
  [ -d "$DATA" ] || fail "DATA directory not found: $DATA"
  RAW=$DATA
  MERGES=${MERGES:-8000}
  MAX_UPDATE=${MAX_UPDATE:-3000}
fi

rm -rf "$WORK/bin" "$WORK/checkpoints" "$WORK/generate.txt"
"$PYTHON" preprocess/prepare_translation.py --raw "$RAW" --src "$SRC" --tgt "$TGT" \
  --dest "$WORK/bin" --bpe "$BPE" --merges "$MERGES"

echo "| training --arch $ARCH for $MAX_UPDATE updates" >&2
"$BIN/fairseq-train" "$WORK/bin" --user-dir user_dir --task translation --arch "$ARCH" \
  --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128 \
  --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 \
  --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --dropout 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
  --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 2048 --max-update "$MAX_UPDATE" --seed 1 \
  --save-dir "$WORK/checkpoints" --no-epoch-checkpoints --validate-interval 1000 \
  --log-format simple --log-interval 50 --num-workers 0

echo "| translating the test set with beam 5" >&2
"$BIN/fairseq-generate" "$WORK/bin" --user-dir user_dir --path "$WORK/checkpoints/checkpoint_last.pt" \
  --beam 5 --batch-size 64 --remove-bpe "$([ "$BPE" = sentencepiece ] && echo sentencepiece || echo subword_nmt)" \
  > "$WORK/generate.txt"

"$PYTHON" preprocess/score_generate.py "$WORK/generate.txt" "$WORK/bin/test.raw.$TGT"
