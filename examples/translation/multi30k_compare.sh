#!/usr/bin/env bash
# Multi30k En->De: one of this plugin's translation archs vs fairseq's transformer of identical size
# (3+3 layers, d 256, FFN 1024, 4 heads, shared embeddings), same seed, batch size and number of updates;
# beam-5 sacreBLEU on test_2016_flickr; wall time beside BLEU.  Shared by the capsule_transformer and
# fasttrees_transformer comparisons (examples/capsule_transformer/multi30k_compare.sh,
# examples/fasttrees/multi30k_bleu.sh choose ARCHS).
#   examples/translation/multi30k_compare.sh [DATA_BIN] [WORK]
# Full budget (the issues'): MAX_UPDATE=428 WARMUP=400 MAX_TOKENS=4096 (defaults). Reduced budgets: set
# MAX_UPDATE (and WARMUP) lower; ARCHS chooses the runs (default "transformer capsule_transformer"); EXTRA
# adds flags to every arch but fairseq's transformer (e.g. EXTRA="--routing-iters 1"); SEED (default 1)
# sets the seed of all runs; DROPOUT (default 0.1); LENPEN (default 1.0) is beam search's length penalty;
# ROUTED, if set, is --routed-attention for the capsule_transformer runs (examples/capsule_transformer/
# multi30k_compare.sh sets enc_self).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PYTHON")
DATA=${1:-data-bin/multi30k}
WORK=${2:-work/multi30k_compare}
MAX_UPDATE=${MAX_UPDATE:-428}
WARMUP=${WARMUP:-400}
ARCHS=${ARCHS:-"transformer capsule_transformer"}
SEED=${SEED:-1}
MAX_TOKENS=${MAX_TOKENS:-4096}
DROPOUT=${DROPOUT:-0.1}
LENPEN=${LENPEN:-1.0}
[ -f "$DATA/dict.en.txt" ] || { echo "multi30k_compare: no binarized data in $DATA (run prepare_multi30k.sh)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
mkdir -p "$WORK"
for ARCH in $ARCHS; do
  extra=()
  [ "$ARCH" != transformer ] && extra=(${EXTRA:-})
  [ "$ARCH" = capsule_transformer ] && [ -n "${ROUTED:-}" ] && extra=(--routed-attention "$ROUTED" "${extra[@]}")
  start=$(date +%s)
  "$BIN/fairseq-train" "$DATA" --user-dir user_dir --task translation --source-lang en --target-lang de \
    --arch "$ARCH" --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 \
    --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 \
    --decoder-attention-heads 4 --share-all-embeddings --dropout "$DROPOUT" "${extra[@]}" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 --lr 1e-3 --lr-scheduler inverse_sqrt \
    --warmup-updates "$WARMUP" --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED" --save-dir "$WORK/$ARCH" --no-epoch-checkpoints \
    --validate-interval 1000 --log-format simple --log-interval 25 --num-workers 0 \
    > "$WORK/$ARCH.train.log" 2>&1
  train_s=$(( $(date +%s) - start ))
  "$BIN/fairseq-generate" "$DATA" --user-dir user_dir --path "$WORK/$ARCH/checkpoint_last.pt" \
    --gen-subset test --beam 5 --lenpen "$LENPEN" --batch-size 128 --remove-bpe subword_nmt > "$WORK/$ARCH.generate.txt"
  bleu=$(grep ^H- "$WORK/$ARCH.generate.txt" | sort -V | cut -f3 > "$WORK/$ARCH.hyp" && \
         grep ^T- "$WORK/$ARCH.generate.txt" | sort -V | cut -f2 > "$WORK/$ARCH.ref" && \
         "$BIN/sacrebleu" "$WORK/$ARCH.ref" -i "$WORK/$ARCH.hyp" -b)
  echo "$ARCH seed=$SEED lenpen=$LENPEN updates=$MAX_UPDATE warmup=$WARMUP train_wall_s=$train_s test_2016_flickr_BLEU=$bleu" | tee -a "$WORK/results.txt"
done
