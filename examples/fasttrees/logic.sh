#!/usr/bin/env bash
# Propositional-logic inference (Bowman et al. 2015): train on <= 6 operators, accuracy per operator count 1-12.
# Conv. FastTrees encoder (fasttrees_roberta_conv_logic, bidirectional scan) vs fairseq's roberta at equal sizes,
# same seed, batch and updates; sentence-pair input <s> premise </s></s> hypothesis </s>, head on <s>.
#   examples/fasttrees/logic.sh                         # full budget: all 122k training lines, 30000 updates
#   MAX_UPDATE=8000 examples/fasttrees/logic.sh         # the budget BENCHMARKS.md records (~15 CPU-min for FastTrees)
#   ARCHS=roberta examples/fasttrees/logic.sh           # one model only (run the two in parallel)
# Defaults: 2 layers, d 64, FFN 256, 4 heads, pre-LN, no dropout, batch 32, lr 1e-3 (inverse sqrt, warm-up 500);
# KEEP_BRACKETS=1 (default) keeps the formulas' brackets; KEEP_BRACKETS=0 removes them, which makes many labels
# ambiguous (the label depends on a bracketing the input no longer shows; BENCHMARKS.md, logic section).
source "$(dirname "$0")/common.sh"
MAX_TRAIN=${MAX_TRAIN:-0}
MAX_UPDATE=${MAX_UPDATE:-30000}
BATCH=${BATCH:-32}
LR=${LR:-1e-3}
WARMUP=${WARMUP:-500}
DIM=${DIM:-64}
KEEP_BRACKETS=${KEEP_BRACKETS:-1}
WORK=${WORK:-benchmarks/work/logic_n${MAX_TRAIN}_br${KEEP_BRACKETS}}
if [ ! -f "$WORK/bin/label/dict.txt" ]; then
  BR=""; [ "$KEEP_BRACKETS" = 1 ] && BR="--keep-brackets"
  "$PY" preprocess/propositionallogic_prepare.py --data "$SHARED/propositionallogic" --dest "$WORK/bin" \
    --train-max-ops 6 --max-train "$MAX_TRAIN" --max-valid 2000 $BR
fi
TASK="--task sentence_prediction --num-classes 7 --init-token 0 --separator-token 2 --max-positions 256"
SIZES="--encoder-layers ${LAYERS:-2} --encoder-embed-dim $DIM --encoder-ffn-embed-dim $((4 * DIM))
  --encoder-attention-heads 4 --encoder-normalize-before --dropout ${DROPOUT:-0.0} --attention-dropout 0.0"
SUBSETS=$(echo test_ops{1..12} | tr ' ' ',')
for ARCH in ${ARCHS:-roberta fasttrees_roberta_conv_logic}; do
  CK="$WORK/ck_${ARCH}_d${DIM}_u${MAX_UPDATE}"
  EXTRA_ARCH=""
  [ "$ARCH" = roberta ] || EXTRA_ARCH="--chunk-size 8 --fasttrees-bidirectional"
  /usr/bin/time -f "$ARCH train wall %e s" "$BIN/fairseq-train" "$WORK/bin" --user-dir user_dir $TASK \
    --criterion sentence_prediction --arch "$ARCH" $SIZES $EXTRA_ARCH --optimizer adam --adam-betas '(0.9,0.98)' \
    --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --batch-size "$BATCH" --max-update "$MAX_UPDATE" \
    --save-dir "$CK" --no-epoch-checkpoints --num-workers 0 --seed 1 --log-format simple --log-interval 200 \
    --validate-interval-updates 2000 --validate-interval 1000
  "$BIN/fairseq-validate" "$WORK/bin" --user-dir user_dir $TASK --criterion sentence_prediction \
    --path "$CK/checkpoint_last.pt" --valid-subset "$SUBSETS" --batch-size 256 > "$CK/validate.txt" 2>&1
  echo "$ARCH: accuracy per operator count (test_ops1..12)"
  grep -oE "valid on 'test_ops[0-9]+' subset \| loss [0-9.]+ \| nll_loss [0-9.]+ \| accuracy [0-9.]+" "$CK/validate.txt" \
    | sed -E "s/valid on '(test_ops[0-9]+)' subset.*accuracy ([0-9.]+)/\1 \2/"
done
