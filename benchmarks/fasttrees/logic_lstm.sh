#!/usr/bin/env bash
# Propositional-logic inference with the recurrent models (the FastTrees paper's Table 2 setup): train on formulas
# with <= 6 operators, accuracy per operator count 1-12; siamese encoders (each formula encoded alone, MLP on
# [u; v; u*v; |u-v|]), one (arch, seed) per call, the same data, batch, schedule and stopping rule for every arch.
#   benchmarks/fasttrees/logic_lstm.sh ARCH SEED [WORK]
# ARCH: onlstm_classifier_logic | fasttrees_lstm_classifier_logic | fasttrees_lstm_classifier_conv_logic (the presets:
# one layer, embedding 128, hidden 400, chunk 10, dropout 0.2) | lstm_classifier_logic (the control: the same
# classifier without master gates, a standard LSTM).  SIZE_FLAGS adds or overrides flags for every arch;
# its default "--hidden-size 200" halves the hidden size, so that an epoch takes ~4.5 minutes of one core (the
# paper's 400 takes ~7 CPU-minutes an epoch here).
# Training: Adam lr LR (3e-3; a run per LR, in its own WORK: summarize_lstm.py reports each model at the LR with
# its best validation accuracy), clip 1.0, batch BATCH (128); validation accuracy (the 10% held out) after every
# epoch; stops when it has not improved for PATIENCE (5) epochs or after MAX_EPOCH (100), but never before
# MIN_EPOCH (20) epochs: the models can sit near the majority class for several epochs before they learn, and
# patience alone could end a run on that plateau (the count runs from the first epoch; the first MIN_EPOCH - 1
# epochs are trained with the stop switched off).  checkpoint_best.pt is scored on test_ops1..test_ops12.
# Brackets are kept (without them many labels are ambiguous).
# Resumable: run the same command again (fairseq-train continues from WORK's checkpoint_last.pt, saved after every
# epoch: no mid-epoch saves, since fairseq validates at every save and --patience counts validations, not epochs;
# a finished training, WORK/train.done, is not repeated; one that stopped at its MAX_EPOCH rather than by the
# patience rule is continued when the command is run again with a larger MAX_EPOCH, and one that the patience rule
# stopped before a larger MIN_EPOCH when it is run again with that MIN_EPOCH: the patience count is kept, so the
# run then stops as if it had run under the larger minimum from the start).
# Writes WORK/result.json and upserts its row in RESULTS (default benchmarks/fasttrees/results/logic_lstm.json).
source "$(dirname "$0")/../../examples/fasttrees/common.sh"
source "$(dirname "$0")/../min_epoch.sh"
shopt -s inherit_errexit
ARCH=${1:?usage: logic_lstm.sh ARCH SEED [WORK]}
SEED=${2:?usage: logic_lstm.sh ARCH SEED [WORK]}
case "$ARCH" in
  onlstm_classifier_logic | fasttrees_lstm_classifier_logic | fasttrees_lstm_classifier_conv_logic | \
  lstm_classifier_logic) ;;
  *) echo "logic_lstm: ARCH must be onlstm_classifier_logic, fasttrees_lstm_classifier_logic," \
          "fasttrees_lstm_classifier_conv_logic or lstm_classifier_logic, got '$ARCH'" >&2; exit 2 ;;
esac
LOGIC=${LOGIC:-$SHARED/propositionallogic}
DATA=${DATA:-benchmarks/work/logic_lstm_bin}
LR=${LR:-3e-3}
lr_tag=; [ "$LR" != 3e-3 ] && lr_tag=_lr$LR
WORK=${3:-benchmarks/work/logic_lstm/${ARCH}_s$SEED$lr_tag}
BATCH=${BATCH:-128}
PATIENCE=${PATIENCE:-5}
MIN_EPOCH=${MIN_EPOCH:-20}
MAX_EPOCH=${MAX_EPOCH:-100}  # the paper trained 50-100 epochs
MAX_TRAIN=${MAX_TRAIN:-0}
RESULTS=${RESULTS-benchmarks/fasttrees/results/logic_lstm.json}
SIZE_FLAGS=${SIZE_FLAGS---hidden-size 200}
read -r -a SIZE <<< "$SIZE_FLAGS"
if [ ! -f "$DATA/label/dict.txt" ]; then
  "$PY" preprocess/propositionallogic_prepare.py --data "$LOGIC" --dest "$DATA" --train-max-ops 6 --keep-brackets \
    --max-train "$MAX_TRAIN"
fi
TASK=(--task sentence_pair_classification --num-classes 7 --max-positions 1024 --criterion sentence_prediction)
mkdir -p "$WORK"
if [ -f "$WORK/train.done" ]; then
  if stopped_before_min_epoch "$MIN_EPOCH" "$WORK/train.log"; then
    rm "$WORK/train.done"  # stopped by the rule before a larger MIN_EPOCH than it ran under: continue to it
  elif ! stopped_by_patience "$WORK/train.log" && [ "$MAX_EPOCH" -gt "$(cat "$WORK/train.done")" ] 2> /dev/null; then
    rm "$WORK/train.done"  # capped at a smaller MAX_EPOCH: fairseq-train continues from checkpoint_last.pt
  fi
fi
train=("$BIN/fairseq-train" "$DATA" --user-dir user_dir "${TASK[@]}" --arch "$ARCH" "${SIZE[@]}"
  --optimizer adam --lr "$LR" --clip-norm 1.0 --batch-size "$BATCH"
  --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric
  --save-dir "$WORK/checkpoints" --no-epoch-checkpoints --seed "$SEED" --num-workers 0 --cpu
  --log-format simple --log-interval 100)
if [ ! -f "$WORK/train.done" ]; then
  train_min_epoch "$MIN_EPOCH" "$MAX_EPOCH" "$PATIENCE" "$WORK/train.log" "${train[@]}"
  echo "$MAX_EPOCH" > "$WORK/train.done"
fi
SUBSETS=$(echo test_ops{1..12} | tr ' ' ',')
"$BIN/fairseq-validate" "$DATA" --user-dir user_dir "${TASK[@]}" --path "$WORK/checkpoints/checkpoint_best.pt" \
  --valid-subset "$SUBSETS" --batch-size 256 --cpu --num-workers 0 > "$WORK/validate.txt" 2>&1
"$PY" benchmarks/fasttrees/logic_rows.py --work "$WORK" --arch "$ARCH" --seed "$SEED" --max-epoch "$MAX_EPOCH" \
  --min-epoch "$MIN_EPOCH" \
  --command "$([ -n "$lr_tag" ] && echo "LR=$LR ")MIN_EPOCH=$MIN_EPOCH MAX_EPOCH=$MAX_EPOCH PATIENCE=$PATIENCE benchmarks/fasttrees/logic_lstm.sh $ARCH $SEED" \
  ${SIZE_FLAGS:+--size-flags "$SIZE_FLAGS"} \
  ${RESULTS:+--results "$RESULTS"}
