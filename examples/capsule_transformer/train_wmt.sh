#!/usr/bin/env bash
# The paper's training setups (Duan et al. 2020, §4): Transformer-base with batches of <= 2,048 tokens
# and 12 accumulation steps; Transformer-big with 1,024 tokens x 24 steps and dropout 0.3; r = 3.
#   examples/capsule_transformer/train_wmt.sh DATA_BIN SIZE [extra fairseq-train flags]
# SIZE: base | big.  Shares all embeddings when the dictionaries are joined (WMT14 En-De); for
# WMT17 Zh-En pass DATA_BIN of prepare_wmt17_zh_en.sh (separate dictionaries are detected).
# Set ARCH=transformer (and the matching size preset) for the baseline.
# --max-tokens counts per GPU; the paper trains base on 2 GPUs and big on 3 without saying whether its
# batch is per GPU: run on that many GPUs for the per-GPU reading, or on one GPU with --update-freq 24
# (base) / 72 (big) among the extra flags for the same tokens per update.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PYTHON")
DATA=${1:?usage: train_wmt.sh DATA_BIN base|big [flags]}
SIZE=${2:?usage: train_wmt.sh DATA_BIN base|big [flags]}
shift 2
case "$SIZE" in
  base) PRESET=capsule_transformer; TOKENS=2048; FREQ=12; DROPOUT=0.1 ;;
  big) PRESET=capsule_transformer_wmt_en_de_big; TOKENS=1024; FREQ=24; DROPOUT=0.3 ;;
  *) echo "train_wmt: SIZE must be base or big, got $SIZE" >&2; exit 2 ;;
esac
ARCH=${ARCH:-$PRESET}
ROUTING=()
case "$ARCH" in capsule_*) ROUTING=(--routing-iters "${ROUTING_ITERS:-3}") ;; esac
SHARE=()
langs=$(ls "$DATA"/dict.*.txt | sed 's/.*dict\.\(.*\)\.txt/\1/' | tr '\n' ' ')
if cmp -s "$DATA/dict.$(echo $langs | cut -d' ' -f1).txt" "$DATA/dict.$(echo $langs | cut -d' ' -f2).txt"; then
  SHARE=(--share-all-embeddings)
fi
"$BIN/fairseq-train" "$DATA" --user-dir user_dir --task translation --arch "$ARCH" "${SHARE[@]}" \
  --dropout "$DROPOUT" "${ROUTING[@]}" \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 7e-4 --lr-scheduler inverse_sqrt \
  --warmup-updates 4000 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens "$TOKENS" --update-freq "$FREQ" --max-update "${MAX_UPDATE:-100000}" \
  --save-dir "${SAVE_DIR:-checkpoints/$(basename "$DATA")_$ARCH}" --keep-last-epochs 5 \
  --log-format simple --log-interval 100 "$@"
