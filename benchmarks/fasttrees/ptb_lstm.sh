#!/usr/bin/env bash
# Word-level PTB language modelling and unsupervised parsing with the recurrent models (the FastTrees paper's
# Table 1 setting, at a reduced budget): the same size, data, optimiser, seed and number of updates for every
# cell, then valid/test perplexity (fairseq-eval-lm) and sentence-level unlabelled parsing F1 on the NLTK PTB
# sample (all sentences, and those of at most 10 words) from every layer's syntactic distances, beside the
# left- and right-branching baselines.  One (arch, seed) per call:
#   benchmarks/fasttrees/ptb_lstm.sh ARCH SEED [WORK]
# ARCH: onlstm_lm_ptb | fasttrees_lstm_lm_ptb | fasttrees_lstm_lm_conv_ptb (the papers' presets: 3 layers, chunk 10,
# dropouts 0.45 / 0.3 / 0.5 / 0.1, weight drop 0.45, tied embeddings; SIZE_FLAGS, default
# "--embed-dim 200 --hidden-size 400", shrinks them for this CPU).  Training: truncated BPTT over 70-token
# segments of 20 streams (bptt_lm), SGD lr LR (30), clip 0.25, weight decay 1.2e-6, MAX_UPDATE (2000) updates.
# Resumable: run the same command again (fairseq-train continues from WORK's checkpoint_last.pt; a finished
# training, WORK/train.done, is not repeated).  Writes WORK/result.json and upserts its row in RESULTS (default
# benchmarks/fasttrees/results/ptb_lstm.json).
source "$(dirname "$0")/../../examples/fasttrees/common.sh"
shopt -s inherit_errexit
ARCH=${1:?usage: ptb_lstm.sh ARCH SEED [WORK]}
SEED=${2:?usage: ptb_lstm.sh ARCH SEED [WORK]}
case "$ARCH" in
  onlstm_lm_ptb | fasttrees_lstm_lm_ptb | fasttrees_lstm_lm_conv_ptb) ;;
  *) echo "ptb_lstm: ARCH must be onlstm_lm_ptb, fasttrees_lstm_lm_ptb or fasttrees_lstm_lm_conv_ptb, got '$ARCH'" >&2
     exit 2 ;;
esac
DATA=${DATA:-benchmarks/work/ptb/bin}
TREEBANK=${TREEBANK:-$SHARED/ptb-treebank-sample-nltk/treebank.zip}
WORK=${3:-benchmarks/work/ptb_lstm/${ARCH}_s$SEED}
LR=${LR:-30}
MAX_UPDATE=${MAX_UPDATE:-2000}
SIZE_FLAGS=${SIZE_FLAGS---embed-dim 200 --hidden-size 400}
RESULTS=${RESULTS-benchmarks/fasttrees/results/ptb_lstm.json}
read -r -a SIZE <<< "$SIZE_FLAGS"
[ -f "$DATA/dict.txt" ] || "$PY" preprocess/ptb_lm.py --ptb "$SHARED/ptb" --dest "$DATA" >&2
mkdir -p "$WORK"
if [ ! -f "$WORK/train.done" ]; then
  "$BIN/fairseq-train" "$DATA" --user-dir user_dir --task bptt_lm --arch "$ARCH" "${SIZE[@]}" \
    --tokens-per-sample 70 --batch-size 20 --optimizer sgd --lr "$LR" --weight-decay 1.2e-6 --clip-norm 0.25 \
    --lr-scheduler fixed --max-update "$MAX_UPDATE" --disable-validation --save-dir "$WORK/checkpoints" \
    --no-epoch-checkpoints --save-interval-updates 200 --keep-interval-updates 1 --seed "$SEED" --cpu \
    --num-workers 0 --log-format simple --log-interval 100 >> "$WORK/train.log" 2>&1
  touch "$WORK/train.done"
fi
for split in valid test; do
  "$BIN/fairseq-eval-lm" "$DATA" --user-dir user_dir --task bptt_lm --path "$WORK/checkpoints/checkpoint_last.pt" \
    --gen-subset "$split" --batch-size 10 --tokens-per-sample 70 --cpu --num-workers 0 > "$WORK/eval_$split.txt" 2>&1
done
"$PY" examples/fasttrees/eval_parsing.py --path "$WORK/checkpoints/checkpoint_last.pt" --data "$DATA" \
  --treebank "$TREEBANK" > "$WORK/parsing_all.txt"
"$PY" examples/fasttrees/eval_parsing.py --path "$WORK/checkpoints/checkpoint_last.pt" --data "$DATA" \
  --treebank "$TREEBANK" --max-len 10 > "$WORK/parsing_wsj10.txt"
"$PY" benchmarks/fasttrees/ptb_rows.py --work "$WORK" --arch "$ARCH" --seed "$SEED" --max-update "$MAX_UPDATE" \
  --size-flags "$SIZE_FLAGS" \
  --command "MAX_UPDATE=$MAX_UPDATE SIZE_FLAGS='$SIZE_FLAGS' benchmarks/fasttrees/ptb_lstm.sh $ARCH $SEED" \
  ${RESULTS:+--results "$RESULTS"}
