#!/usr/bin/env bash
# SNLI as a sentence-vector model ([r1; r2; |r1-r2|; r1-r2] -> MLP, the paper's; EXTRA="--nli-features mult" for r1*r2). shared/data has only dev+test:
# by default the dev file is split (first 1000 pairs: validation, rest: training). With the real
# 550k train file: TRAIN=/path/train.txt (paper budget: 120 epochs at bsz 128).
#   MAX_UPDATE=500 bash examples/star_transformer/run_snli.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED_DATA=${SHARED_DATA:-$ROOT/../shared/data}   # the datasets (shared/data); set it when elsewhere
PY=${PYTHON:-python}; BIN=$(dirname "$(command -v "$PY")")
MAX_UPDATE=${MAX_UPDATE:-2000}; SRC=$SHARED_DATA/snli-re2-preprocessed; WORK=${WORK:-$ROOT/benchmarks/work/snli}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
[ -d "$WORK/bin" ] || "$PY" "$ROOT/preprocess/snli_prepare.py" ${TRAIN:+--train "$TRAIN"} --dev "$SRC/dev.txt" --test "$SRC/test.txt" --dest "$WORK/bin"
"$BIN/fairseq-train" "$WORK/bin" --task sentence_pair_classification --criterion sentence_prediction --num-classes 3 \
    --arch star_transformer_snli --max-positions 128 --optimizer adam --lr 1e-4 --weight-decay 1e-5 --clip-norm 5 \
    --batch-size 128 --max-update "$MAX_UPDATE" --max-epoch 0 --num-workers 0 --log-format simple \
    --no-epoch-checkpoints --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric \
    --user-dir "$ROOT/user_dir" --save-dir "$WORK/ck" ${EXTRA:-} ${VECTORS:+--pretrained-embeddings "$VECTORS" --freeze-embeddings} > "$WORK/train.log" 2>&1
"$BIN/fairseq-validate" "$WORK/bin" --task sentence_pair_classification --criterion sentence_prediction --num-classes 3 \
    --path "$WORK/ck/checkpoint_best.pt" --valid-subset test --batch-size 128 --user-dir "$ROOT/user_dir" | grep "valid on"
