#!/usr/bin/env bash
# Propositional-logic inference (Bowman et al. 2015): train on <= 6 operators, accuracy per operator count 1-12.
# Conv. FastTrees encoder (fasttrees_roberta_conv_logic, bidirectional scan) vs fairseq's roberta at equal sizes
# (2 layers, d 128, FFN 512, 4 heads), same seed, batch and updates; sentence-pair input <s> premise </s> hypothesis.
#   examples/fasttrees/logic.sh                                    # full budget: all data, 30000 updates
#   MAX_TRAIN=30000 MAX_UPDATE=500 examples/fasttrees/logic.sh     # reduced budget
source "$(dirname "$0")/common.sh"
MAX_TRAIN=${MAX_TRAIN:-0}
MAX_UPDATE=${MAX_UPDATE:-30000}
BATCH=${BATCH:-128}
LR=${LR:-4e-4}
WARMUP=${WARMUP:-1000}
WORK=${WORK:-benchmarks/work/logic_n${MAX_TRAIN}}
if [ ! -f "$WORK/bin/label/dict.txt" ]; then
  "$PY" preprocess/propositionallogic_prepare.py --data "$SHARED/propositionallogic" --dest "$WORK/bin" \
    --train-max-ops 6 --max-train "$MAX_TRAIN" --max-valid 2000
fi
TASK="--task sentence_prediction --num-classes 7 --init-token 0 --separator-token 2 --max-positions 256"
SIZES="--encoder-layers 2 --encoder-embed-dim 128 --encoder-ffn-embed-dim 512 --encoder-attention-heads 4
  --dropout 0.2 --attention-dropout 0.1"
SUBSETS=$(echo test_ops{1..12} | tr ' ' ',')
for ARCH in ${ARCHS:-roberta fasttrees_roberta_conv_logic}; do
  CK="$WORK/ck_${ARCH}_u${MAX_UPDATE}"
  EXTRA_ARCH=""
  [ "$ARCH" = roberta ] || EXTRA_ARCH="--chunk-size 8 --fasttrees-bidirectional"
  /usr/bin/time -f "$ARCH train wall %e s" "$BIN/fairseq-train" "$WORK/bin" --user-dir user_dir $TASK \
    --criterion sentence_prediction --arch "$ARCH" $SIZES $EXTRA_ARCH --optimizer adam --adam-betas '(0.9,0.98)' \
    --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --batch-size "$BATCH" --max-update "$MAX_UPDATE" \
    --save-dir "$CK" --no-epoch-checkpoints --cpu --num-workers 0 --seed 1 --log-format simple --log-interval 50 \
    --disable-validation
  "$BIN/fairseq-validate" "$WORK/bin" --user-dir user_dir $TASK --criterion sentence_prediction \
    --path "$CK/checkpoint_last.pt" --valid-subset "$SUBSETS" --batch-size 256 --cpu > "$CK/validate.txt" 2>&1
  echo "$ARCH: accuracy per operator count (test_ops1..12)"
  grep -oE "valid on 'test_ops[0-9]+' subset \| loss [0-9.]+ \| nll_loss [0-9.]+ \| accuracy [0-9.]+" "$CK/validate.txt" \
    | sed -E "s/valid on '(test_ops[0-9]+)' subset.*accuracy ([0-9.]+)/\1 \2/"
done
