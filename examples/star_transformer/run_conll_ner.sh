#!/usr/bin/env bash
# CoNLL-2003 NER (span F1) or POS tagging: Star-Transformer vs fairseq's TransformerEncoder of equal size
# (--encoder-type transformer: same tagging head, same data and updates).
#   bash examples/star_transformer/run_conll_ner.sh                    # full budget: 25 epochs ~ 5500 updates (bsz 64)
#   MAX_UPDATE=400 bash examples/star_transformer/run_conll_ner.sh     # reduced budget
#   TAG_COLUMN=1 NAME=conll03-pos bash examples/star_transformer/run_conll_ner.sh     # POS from the same files
#   PTB=1 bash examples/star_transformer/run_conll_ner.sh                             # PTB POS sample (NLTK)
#   CRF=1 ...  adds a CRF layer
#   MAX_EPOCH=50 PATIENCE=5 MAX_UPDATE=1000000 ...   until dev F1 has not improved for 5 epochs
# LR: Adam learning rate of both models (default 1e-3, as chosen on SST; the fastNLP POS reproduction
# uses 3e-4 with GloVe).  MODELS="star transformer" (default) or one of them (to run the two in parallel).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED_DATA=${SHARED_DATA:-$ROOT/../shared/data}   # the datasets (shared/data); set it when elsewhere
PY=${PYTHON:-python}; BIN=$(dirname "$(command -v "$PY")")
MAX_UPDATE=${MAX_UPDATE:-5500}; SEED=${SEED:-1}; TAG_COLUMN=${TAG_COLUMN:-3}
LR=${LR:-1e-3}; MODELS=${MODELS:-star transformer}
NAME=${NAME:-$([ -n "${PTB:-}" ] && echo ptb-pos || echo conll03-ner)}
WORK=${WORK:-$ROOT/benchmarks/work/$NAME}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
if [ ! -d "$WORK/data" ]; then
  if [ -n "${PTB:-}" ]; then
    "$PY" "$ROOT/preprocess/conll_tagging_prepare.py" --ptb-zip "$SHARED_DATA/ptb-treebank-sample-nltk/treebank.zip" --dest "$WORK/data"
  else
    "$PY" "$ROOT/preprocess/conll_tagging_prepare.py" --conll "$SHARED_DATA/conll2003" --tag-column "$TAG_COLUMN" --dest "$WORK/data"
  fi
fi
EXTRA=(); [ -n "${CRF:-}" ] && EXTRA+=(--crf); [ -n "${VECTORS:-}" ] && EXTRA+=(--pretrained-embeddings "$VECTORS" --freeze-embeddings)
COMMON=(--task sequence_tagging --criterion sequence_tagging --max-positions 256 --optimizer adam --lr "$LR"
        --weight-decay 2e-5 --clip-norm 5 --batch-size 64 --max-update "$MAX_UPDATE" --max-epoch "${MAX_EPOCH:-0}" --seed "$SEED"
        --num-workers 0 --log-format simple --log-interval 100 --no-epoch-checkpoints
        --best-checkpoint-metric span_f1 --maximize-best-checkpoint-metric --user-dir "$ROOT/user_dir"
        --arch star_transformer_tagging "${EXTRA[@]}" ${PATIENCE:+--patience "$PATIENCE"})
[ -n "${PTB:-}" ] && COMMON+=(--best-checkpoint-metric accuracy)
for enc in $MODELS; do
  start=$(date +%s)
  "$BIN/fairseq-train" "$WORK/data" "${COMMON[@]}" --encoder-type "$enc" --save-dir "$WORK/ck_$enc" \
      ${VALIDATE_INTERVAL_UPDATES:+--validate-interval-updates $VALIDATE_INTERVAL_UPDATES} >> "$WORK/train_$enc.log" 2>&1
  end=$(date +%s)
  "$BIN/fairseq-validate" "$WORK/data" --task sequence_tagging --criterion sequence_tagging --path "$WORK/ck_$enc/checkpoint_best.pt" \
      --valid-subset test --batch-size 64 --user-dir "$ROOT/user_dir" > "$WORK/test_$enc.log" 2>&1
  echo "$NAME $enc lr $LR: test $(grep "valid on 'test'" "$WORK/test_$enc.log" | grep -oE '(accuracy|span_f1) [0-9.]+' | tr '\n' ' ')updates $MAX_UPDATE, train wall $((end-start)) s"
done
case " $MODELS " in *" star "*) ;; *) exit 0 ;; esac
"$PY" "$ROOT/examples/star_transformer/predict_tags.py" --path "$WORK/ck_star/checkpoint_best.pt" \
    --input "$WORK/data/test.txt" --output "$WORK/test.star.pred.txt" > /dev/null
