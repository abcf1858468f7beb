#!/usr/bin/env bash
# Mathematical language understanding (the FastTrees paper's Table 6, Transformer form): fasttrees_transformer
# against fairseq's transformer at the same tiny size, the same data, updates and seed; accuracy per sequence on
# the held-out split (greedy decoding).  One (arch, seed) per call:
#   benchmarks/fasttrees/mlu.sh ARCH SEED [WORK]          ARCH: transformer | fasttrees_transformer
# Data: preprocess/mlu_prepare.py (TRAIN 100000 / 2000 / TEST 10000 examples, data seed 1) in DATA.
# Model: 2+2 layers, d 128, FFN 512, 4 heads (FastTrees: chunk 8); Adam lr 1e-3, inverse_sqrt, warm-up 1000,
# MAX_TOKENS (4096) per batch, MAX_UPDATE (10000) updates, label smoothing 0.1, no dropout.
# Resumable: run the same command again (fairseq-train continues from WORK's checkpoint_last.pt).
source "$(dirname "$0")/../../examples/fasttrees/common.sh"
shopt -s inherit_errexit
ARCH=${1:?usage: mlu.sh ARCH SEED [WORK]}
SEED=${2:?usage: mlu.sh ARCH SEED [WORK]}
case "$ARCH" in
  transformer) extra=() ;;
  fasttrees_transformer) extra=(--chunk-size 8) ;;
  *) echo "mlu: ARCH must be transformer or fasttrees_transformer, got '$ARCH'" >&2; exit 2 ;;
esac
TRAIN=${TRAIN:-100000}
TEST=${TEST:-10000}
DATA=${DATA:-benchmarks/work/mlu_bin_${TRAIN}}
MAX_UPDATE=${MAX_UPDATE:-10000}
MAX_TOKENS=${MAX_TOKENS:-4096}
WORK=${3:-benchmarks/work/mlu/${ARCH}_s${SEED}_u${MAX_UPDATE}}
RESULTS=${RESULTS-benchmarks/fasttrees/results/mlu.json}
if [ ! -f "$DATA/dict.src.txt" ]; then
  "$PY" preprocess/mlu_prepare.py --out "$DATA.raw" --train "$TRAIN" --valid 2000 --test "$TEST" --seed 1 --dest "$DATA"
fi
mkdir -p "$WORK"
if [ ! -f "$WORK/train.done" ]; then
  "$BIN/fairseq-train" "$DATA" --user-dir user_dir --task translation --source-lang src --target-lang tgt \
    --arch "$ARCH" --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128 \
    --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4 --decoder-attention-heads 4 \
    --share-all-embeddings --dropout 0.0 "${extra[@]}" --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 \
    --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-1000}" --criterion label_smoothed_cross_entropy \
    --label-smoothing 0.1 --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED" \
    --save-dir "$WORK/checkpoints" --no-epoch-checkpoints --save-interval-updates 1000 --keep-interval-updates 1 \
    --num-workers 0 --cpu --log-format simple --log-interval 200 >> "$WORK/train.log" 2>&1
  touch "$WORK/train.done"
fi
"$BIN/fairseq-generate" "$DATA" --user-dir user_dir --source-lang src --target-lang tgt \
  --path "$WORK/checkpoints/checkpoint_last.pt" --gen-subset test --beam 1 --batch-size 256 --cpu \
  > "$WORK/test.generate.txt"
"$PY" benchmarks/fasttrees/mlu_rows.py --work "$WORK" --arch "$ARCH" --seed "$SEED" --updates "$MAX_UPDATE" \
  --command "benchmarks/fasttrees/mlu.sh $ARCH $SEED" ${RESULTS:+--results "$RESULTS"}
