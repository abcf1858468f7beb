#!/usr/bin/env bash
# Star-Transformer vs the Transformer encoder of equal size at convergence (the Star-Transformer paper's SST-5,
# CoNLL-2003 and masked-summation experiments): one (task, model, seed) per call, trained until the dev metric has
# not improved for PATIENCE (5) epochs (at most MAX_EPOCH, 50), the best-dev checkpoint scored on test.
# Masked summation: MIN_EPOCH (default 1: no minimum) keeps the patience rule from stopping a run before that epoch
# (a model can sit at the mean predictor's error for several epochs before it learns; the count still runs).
#   benchmarks/star_transformer/converged.sh TASK MODEL SEED [WORK]
# TASK: sst5 (accuracy; examples/star_transformer/run_sst.sh) | conll03 (span F1; run_conll_ner.sh) |
#       masked_sum (test MSE; sequence length N, default 200, k = 10 columns, SAMPLES (10k) per split generated
#       from SEED; d 100, 2 layers, 4 heads, Adam lr LR (1e-3), batch 64; the Transformer with fairseq's FFN of 4d;
#       a run per LR, its own WORK; summarize_converged.py reports each model at the LR with its best dev MSE).
# MODEL: star | transformer, or (masked_sum only) lstm | bilstm: the paper's recurrent baselines there, 2 layers of
# width 100 (a BiLSTM 50 per direction).  Random embeddings (the paper's GloVe is not available here).
# Resumable: run the same command again (fairseq-train continues from the run's checkpoint_last.pt; a run with a
# row in WORK/result.json is not repeated, except a masked_sum run the patience rule stopped before a larger
# MIN_EPOCH than it ran under: run again with that minimum, it continues to it, its patience count kept, and
# stops as if it had run under the larger minimum from the start).  Upserts its row in RESULTS (default
# benchmarks/star_transformer/results/converged.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/min_epoch.sh
TASK=${1:?usage: converged.sh TASK MODEL SEED [WORK]}
MODEL=${2:?usage: converged.sh TASK MODEL SEED [WORK]}
SEED=${3:?usage: converged.sh TASK MODEL SEED [WORK]}
case "$TASK" in sst5 | conll03 | masked_sum) ;; *) echo "converged.sh: TASK must be sst5, conll03 or masked_sum, got '$TASK'" >&2; exit 2 ;; esac
case "$MODEL" in star | transformer) ;; lstm | bilstm)
  [ "$TASK" = masked_sum ] || { echo "converged.sh: MODEL $MODEL runs masked_sum only (the paper's recurrent baselines there)" >&2; exit 2; } ;;
  *) echo "converged.sh: MODEL must be star, transformer, lstm or bilstm, got '$MODEL'" >&2; exit 2 ;; esac
N=${N:-200}
SAMPLES=${SAMPLES:-10000}  # masked_sum: samples per split (the paper's 10k)
LR=${LR:-1e-3}  # masked_sum: Adam's learning rate; summarize_converged.py picks each model's on dev among those run
lr_tag=; [ "$LR" != 1e-3 ] && lr_tag=_lr$LR
[ "$TASK" = masked_sum ] && name=${TASK}_n${N}_${MODEL}_s$SEED$lr_tag || name=${TASK}_${MODEL}_s$SEED
export PYTHON=${PYTHON:-.venv/bin/python} WORK=${4:-benchmarks/work/star_converged/$name}
unset VALIDATE_INTERVAL_UPDATES  # --patience counts validations: one per epoch
export MODELS=$MODEL SEED MAX_EPOCH=${MAX_EPOCH:-50} PATIENCE=${PATIENCE:-5} MAX_UPDATE=${MAX_UPDATE:-1000000}
MIN_EPOCH=${MIN_EPOCH:-1}
[ "$MIN_EPOCH" = 1 ] || [ "$TASK" = masked_sum ] || { echo "converged.sh: MIN_EPOCH is for masked_sum only" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
default_results=benchmarks/star_transformer/results/converged.json
RESULTS=${RESULTS-$default_results}
if [ -f "$WORK/result.json" ]; then
  if [ "$TASK" = masked_sum ] && stopped_before_min_epoch "$MIN_EPOCH" "$WORK/train_masked_sum.log"; then
    rm "$WORK/result.json"  # stopped by the rule before a larger MIN_EPOCH than it ran under: continue to it
  else
    cat "$WORK/result.json"; exit 0  # finished
  fi
fi
mkdir -p "$WORK"
BIN=$(dirname "$PYTHON")
masked_sum() {
  local data=(--user-dir user_dir --task masked_summation --criterion masked_summation_mse --seq-len "$N"
              --num-columns 10 --train-size "$SAMPLES" --valid-size "$SAMPLES" --test-size "$SAMPLES" --seed "$SEED"
              --batch-size 64 --num-workers 0 --log-format simple)
  local train=("$BIN/fairseq-train" "${data[@]}" --arch star_transformer --encoder-type "$MODEL" --encoder-embed-dim 100
      --encoder-layers 2 --encoder-attention-heads 4 --max-positions "$N" --dropout 0.1 --optimizer adam
      --lr "$LR" --max-update "$MAX_UPDATE" --no-epoch-checkpoints --log-interval 50 --save-dir "$WORK/ck")
  train_min_epoch "$MIN_EPOCH" "$MAX_EPOCH" "$PATIENCE" "$WORK/train_masked_sum.log" "${train[@]}"  # log appended
  "$BIN/fairseq-validate" "${data[@]}" --path "$WORK/ck/checkpoint_best.pt" --valid-subset test \
      > "$WORK/test_masked_sum.log" 2>&1
}
case "$TASK" in
  sst5) CLASSES=5 bash examples/star_transformer/run_sst.sh ;;
  conll03) bash examples/star_transformer/run_conll_ner.sh ;;
  masked_sum) masked_sum ;;
esac
n_flag=(); [ "$TASK" = masked_sum ] && n_flag=(--n "$N" --lr "$LR")
"$PYTHON" benchmarks/star_transformer/converged_rows.py --work "$WORK" --task "$TASK" --model "$MODEL" --seed "$SEED" \
  "${n_flag[@]}" --max-epoch "$MAX_EPOCH" --min-epoch "$MIN_EPOCH" \
  --command "$([ "$TASK" = masked_sum ] && echo "N=$N ")$([ -n "$lr_tag" ] && echo "LR=$LR ")$([ "$SAMPLES" != 10000 ] && echo "SAMPLES=$SAMPLES ")$([ "$MIN_EPOCH" != 1 ] && echo "MIN_EPOCH=$MIN_EPOCH ")MAX_EPOCH=$MAX_EPOCH PATIENCE=$PATIENCE$([ "$RESULTS" != "$default_results" ] && echo " RESULTS=$RESULTS") benchmarks/star_transformer/converged.sh $TASK $MODEL $SEED${4:+ $4}" \
  ${RESULTS:+--results "$RESULTS"}
