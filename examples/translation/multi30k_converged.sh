#!/usr/bin/env bash
# Multi30k En->De trained to convergence: one (arch, routing, seed) per call, the same batch, schedule and
# stopping rule for every arch, so the rows of benchmarks/translation/results/multi30k_converged.json compare.
#   examples/translation/multi30k_converged.sh ARCH SEED [ROUTING] [DATA_BIN] [WORK]
# ARCH: transformer | capsule_transformer | fasttrees_transformer (equal parameters: FFN 366).
# ROUTING (capsule_transformer only): enc_self | default (routing in encoder + decoder self-attention).
# Model: 3+3 layers, d 256, FFN 1024, 4 heads, shared embeddings (prepare_multi30k.sh's joint BPE).
# Training: Adam (0.9, 0.98), lr 1e-3, inverse_sqrt with WARMUP (400) warm-up updates, clip 1.0, dropout
# DROPOUT (0.3), label smoothing 0.1, MAX_TOKENS (4096) per batch; validation loss after every epoch;
# stops when it has not improved for PATIENCE (5) validations (fairseq's --patience), or at MAX_UPDATE
# (8000).  Then the last AVERAGE (5) epoch checkpoints are averaged and scored with beam 5 (length
# penalty LENPEN, 1.0) and sacreBLEU on valid and on test_2016_flickr.
# DEVICE=cpu (default: --cpu, one thread) or cuda (the visible GPU, --fp16; fairseq's dynamic loss scaling).
# Resumable: run the same command again after an interruption; fairseq-train continues from WORK's
# checkpoint_last.pt, and a finished training (WORK/train.done) is not repeated.
# Writes WORK/result.json and, with RESULTS (default benchmarks/translation/results/multi30k_converged.json),
# upserts its row there (benchmarks/translation/converged_rows.py).
set -euo pipefail
shopt -s inherit_errexit  # a failing step inside $(...) stops the run too
cd "$(dirname "$0")/../.."
ARCH=${1:?usage: multi30k_converged.sh ARCH SEED [ROUTING] [DATA_BIN] [WORK]}
SEED=${2:?usage: multi30k_converged.sh ARCH SEED [ROUTING] [DATA_BIN] [WORK]}
ROUTING=${3:-}
DATA=${4:-data-bin/multi30k}
PYTHON=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PYTHON")
MAX_UPDATE=${MAX_UPDATE:-8000}
PATIENCE=${PATIENCE:-5}
AVERAGE=${AVERAGE:-5}
WARMUP=${WARMUP:-400}
DROPOUT=${DROPOUT:-0.3}
MAX_TOKENS=${MAX_TOKENS:-4096}
LENPEN=${LENPEN:-1.0}
RESULTS=${RESULTS-benchmarks/translation/results/multi30k_converged.json}
DEVICE=${DEVICE:-cpu}
case "$DEVICE" in
  cpu) device=(--cpu) ;;
  cuda) device=(--fp16) ;;
  *) echo "multi30k_converged: DEVICE must be cpu or cuda, got '$DEVICE'" >&2; exit 2 ;;
esac
extra=()
case "$ARCH" in
  transformer) [ -z "$ROUTING" ] || { echo "multi30k_converged: ROUTING is for capsule_transformer only" >&2; exit 2; } ;;
  capsule_transformer)
    case "$ROUTING" in
      enc_self) extra=(--routed-attention enc_self) ;;
      default) ;;
      *) echo "multi30k_converged: capsule_transformer needs ROUTING enc_self or default, got '$ROUTING'" >&2; exit 2 ;;
    esac ;;
  fasttrees_transformer)
    [ -z "$ROUTING" ] || { echo "multi30k_converged: ROUTING is for capsule_transformer only" >&2; exit 2; }
    extra=(--encoder-ffn-embed-dim 366 --decoder-ffn-embed-dim 366) ;;  # parameters equal to vanilla's
  *) echo "multi30k_converged: ARCH must be transformer, capsule_transformer or fasttrees_transformer, got '$ARCH'" >&2; exit 2 ;;
esac
WORK=${5:-benchmarks/work/m30k_converged/${ARCH}${ROUTING:+_$ROUTING}_s$SEED}
[ -f "$DATA/dict.en.txt" ] || { echo "multi30k_converged: no binarized data in $DATA (run examples/capsule_transformer/prepare_multi30k.sh)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
mkdir -p "$WORK"
train_cmd=("$BIN/fairseq-train" "$DATA" --user-dir user_dir --task translation --source-lang en --target-lang de
  --arch "$ARCH" --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256
  --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4
  --decoder-attention-heads 4 --share-all-embeddings --dropout "$DROPOUT" "${extra[@]}"
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 --lr 1e-3 --lr-scheduler inverse_sqrt
  --warmup-updates "$WARMUP" --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --patience "$PATIENCE" --seed "$SEED"
  --save-dir "$WORK/checkpoints" --keep-last-epochs "$AVERAGE" --log-format simple --log-interval 50
  --num-workers 0 "${device[@]}")
if [ ! -f "$WORK/train.done" ]; then
  "${train_cmd[@]}" >> "$WORK/train.log" 2>&1
  touch "$WORK/train.done"
fi
"$PYTHON" examples/translation/average_checkpoints.py --inputs "$WORK/checkpoints" \
  --num-epoch-checkpoints "$AVERAGE" --output "$WORK/averaged.pt"
score() {  # split -> sacreBLEU of the averaged model, beam 5
  "$BIN/fairseq-generate" "$DATA" --user-dir user_dir --path "$WORK/averaged.pt" --gen-subset "$1" \
    --beam 5 --lenpen "$LENPEN" --batch-size 128 --remove-bpe subword_nmt "${device[@]}" > "$WORK/$1.generate.txt"
  grep ^H- "$WORK/$1.generate.txt" | sort -V | cut -f3 > "$WORK/$1.hyp"
  grep ^T- "$WORK/$1.generate.txt" | sort -V | cut -f2 > "$WORK/$1.ref"
  "$BIN/sacrebleu" "$WORK/$1.ref" -i "$WORK/$1.hyp" -b -w 2
}
valid_bleu=$(score valid)
test_bleu=$(score test)
"$PYTHON" benchmarks/translation/converged_rows.py --work "$WORK" --arch "$ARCH" --routing "$ROUTING" \
  --seed "$SEED" --device "$DEVICE" --valid-bleu "$valid_bleu" --test-bleu "$test_bleu" --max-update "$MAX_UPDATE" \
  --command "examples/translation/multi30k_converged.sh $ARCH $SEED${ROUTING:+ $ROUTING}" \
  ${RESULTS:+--results "$RESULTS"}
