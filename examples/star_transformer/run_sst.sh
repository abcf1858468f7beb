#!/usr/bin/env bash
# SST-5 / SST-2: Star-Transformer vs fairseq's Transformer encoder (roberta arch, equal size), same budget.
#   CLASSES=5 bash examples/star_transformer/run_sst.sh          # full budget: 20 epochs ~ 2680 updates (bsz 64)
#   CLASSES=2 MAX_UPDATE=300 bash examples/star_transformer/run_sst.sh   # reduced budget
# LR_STAR / LR_TRANSFORMER: Adam learning rates, default 1e-3 for both.  Grid {1e-4, 1e-3} for both on SST-5
# at 400 updates (random embeddings): Star dev 27.3 / 37.6, Transformer dev 37.6 / 37.1 (test 35.7 / 38.8);
# see docs/star_transformer.md "Learning rate".  The fastNLP reproduction uses 1e-4 with frozen GloVe.  MODELS="star transformer" (default) or one of them (to run the two in parallel).
# Pre-trained vectors (paper: GloVe 840B, frozen): VECTORS=/path/glove.840B.300d.txt
# Until convergence: MAX_EPOCH=50 PATIENCE=5 MAX_UPDATE=1000000 (stops when dev accuracy has not improved for 5 epochs).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED_DATA=${SHARED_DATA:-$ROOT/../shared/data}   # the datasets (shared/data); set it when elsewhere
PY=${PYTHON:-python}; BIN=$(dirname "$(command -v "$PY")")
CLASSES=${CLASSES:-5}; MAX_UPDATE=${MAX_UPDATE:-2680}; SEED=${SEED:-1}
LR_STAR=${LR_STAR:-1e-3}; LR_TRANSFORMER=${LR_TRANSFORMER:-1e-3}; MODELS=${MODELS:-star transformer}
STAR_ARGS=${STAR_ARGS:-}; TAG=${TAG:-}   # extra flags of the Star model; TAG names the run
RAW=${RAW:-$SHARED_DATA/sst/stsa}; WORK=${WORK:-$ROOT/benchmarks/work/sst$CLASSES}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
[ -d "$WORK/bin" ] || "$PY" "$ROOT/preprocess/sst_prepare.py" --raw "$RAW" --classes "$CLASSES" --dest "$WORK/bin"
COMMON=(--task sentence_prediction --criterion sentence_prediction --num-classes "$CLASSES" --max-positions 256
        --shorten-method truncate --optimizer adam --weight-decay 5e-5 --clip-norm 5 --batch-size 64
        --max-update "$MAX_UPDATE" --max-epoch "${MAX_EPOCH:-0}" ${PATIENCE:+--patience "$PATIENCE"} --seed "$SEED" --num-workers 0 --log-format simple
        --log-interval 100 --no-epoch-checkpoints --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric
        --user-dir "$ROOT/user_dir" --dropout 0.4 --pooler-dropout 0.4)
VEC=(); [ -n "${VECTORS:-}" ] && VEC=(--pretrained-embeddings "$VECTORS" --freeze-embeddings)
train_eval() {  # model, lr, extra args...
  local model=$1 lr=$2; shift 2
  case " $MODELS " in *" $model "*) ;; *) return 0 ;; esac
  local name start end
  name=${model}_lr${lr}_u$MAX_UPDATE${TAG:+_$TAG}
  start=$(date +%s)
  "$BIN/fairseq-train" "$WORK/bin" "${COMMON[@]}" --lr "$lr" --save-dir "$WORK/ck_$name" "$@" \
      >> "$WORK/train_$name.log" 2>&1  # appended: a run resumed from its checkpoint keeps its earlier epochs
  end=$(date +%s)
  "$BIN/fairseq-validate" "$WORK/bin" --task sentence_prediction --criterion sentence_prediction \
      --num-classes "$CLASSES" --path "$WORK/ck_$name/checkpoint_best.pt" --valid-subset test --batch-size 64 \
      --user-dir "$ROOT/user_dir" $( [ "$model" = transformer ] && echo --init-token 0 ) \
      > "$WORK/test_$name.log" 2>&1
  local dev test
  dev=$(grep "valid on 'valid'" "$WORK/train_$name.log" | sed -E 's/.*accuracy ([0-9.]+).*/\1/' | sort -g | tail -1)
  test=$(grep "valid on 'test'" "$WORK/test_$name.log" | sed -E 's/.*accuracy ([0-9.]+).*/\1/')
  echo "SST-$CLASSES $model lr $lr: best dev acc $dev, test acc (best-dev checkpoint) $test, updates $MAX_UPDATE, train wall $((end-start)) s"
}
train_eval star "$LR_STAR" --arch star_transformer_sst $STAR_ARGS "${VEC[@]}"
train_eval transformer "$LR_TRANSFORMER" --arch roberta --encoder-layers 2 --encoder-embed-dim 300 \
    --encoder-ffn-embed-dim 1200 --encoder-attention-heads 6 --init-token 0 --pooler-activation-fn tanh
