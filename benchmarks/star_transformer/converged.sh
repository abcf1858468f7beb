#!/usr/bin/env bash
# Star-Transformer vs the Transformer encoder of equal size at convergence (the Star-Transformer paper's SST-5 and
# CoNLL-2003 experiments): one (task, model, seed) per call, trained until the dev metric has not improved for
# PATIENCE (5) epochs (at most MAX_EPOCH, 50), the best-dev checkpoint scored on test.
#   benchmarks/star_transformer/converged.sh TASK MODEL SEED [WORK]
# TASK: sst5 (accuracy; examples/star_transformer/run_sst.sh) | conll03 (span F1; run_conll_ner.sh).
# MODEL: star | transformer.  Random embeddings (the paper's GloVe is not available here).
# Resumable: run the same command again (fairseq-train continues from the run's checkpoint_last.pt; a run with a
# row in WORK/result.json is not repeated).  Upserts its row in RESULTS (default
# benchmarks/star_transformer/results/converged.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
TASK=${1:?usage: converged.sh TASK MODEL SEED [WORK]}
MODEL=${2:?usage: converged.sh TASK MODEL SEED [WORK]}
SEED=${3:?usage: converged.sh TASK MODEL SEED [WORK]}
case "$TASK" in sst5 | conll03) ;; *) echo "converged.sh: TASK must be sst5 or conll03, got '$TASK'" >&2; exit 2 ;; esac
case "$MODEL" in star | transformer) ;; *) echo "converged.sh: MODEL must be star or transformer, got '$MODEL'" >&2; exit 2 ;; esac
export PYTHON=${PYTHON:-.venv/bin/python} WORK=${4:-benchmarks/work/star_converged/${TASK}_${MODEL}_s$SEED}
unset VALIDATE_INTERVAL_UPDATES  # --patience counts validations: one per epoch
export MODELS=$MODEL SEED MAX_EPOCH=${MAX_EPOCH:-50} PATIENCE=${PATIENCE:-5} MAX_UPDATE=${MAX_UPDATE:-1000000}
RESULTS=${RESULTS-benchmarks/star_transformer/results/converged.json}
[ -f "$WORK/result.json" ] && { cat "$WORK/result.json"; exit 0; }
mkdir -p "$WORK"
start=$(date +%s)
case "$TASK" in
  sst5) CLASSES=5 bash examples/star_transformer/run_sst.sh ;;
  conll03) bash examples/star_transformer/run_conll_ner.sh ;;
esac
echo $(( $(date +%s) - start )) >> "$WORK/train_seconds"
"$PYTHON" benchmarks/star_transformer/converged_rows.py --work "$WORK" --task "$TASK" --model "$MODEL" --seed "$SEED" \
  --max-epoch "$MAX_EPOCH" --command "MAX_EPOCH=$MAX_EPOCH PATIENCE=$PATIENCE benchmarks/star_transformer/converged.sh $TASK $MODEL $SEED" \
  ${RESULTS:+--results "$RESULTS"}
