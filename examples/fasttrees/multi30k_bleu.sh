#!/usr/bin/env bash
# Multi30k En->De: fasttrees_transformer vs fairseq's transformer of equal size (3+3 layers, d 256, FFN 1024,
# 4 heads, shared embeddings, joint BPE 8k), same seed, batch and updates; beam 5, sacrebleu on test_2016_flickr.
#   examples/fasttrees/multi30k_bleu.sh                       # full budget: 428 updates of 4096 tokens
#   MAX_UPDATE=60 MAX_TOKENS=2048 examples/fasttrees/multi30k_bleu.sh   # reduced budget
source "$(dirname "$0")/common.sh"
WORK=${WORK:-benchmarks/work/multi30k}
MAX_UPDATE=${MAX_UPDATE:-428}
MAX_TOKENS=${MAX_TOKENS:-4096}
WARMUP=${WARMUP:-400}
ARCHS=${ARCHS:-"transformer fasttrees_transformer_multi30k"}
if [ ! -f "$WORK/bin/dict.en.txt" ]; then
  "$PY" preprocess/prepare_translation.py --raw "$SHARED/multi30k/tok" --src en --tgt de --dest "$WORK/bin" \
    --bpe subword-nmt --merges 8000 --test-pref test_2016_flickr.lc.norm.tok
fi
SIZES="--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256
  --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings --dropout 0.3"
for ARCH in $ARCHS; do
  CK="$WORK/ck_${ARCH}_u${MAX_UPDATE}"
  /usr/bin/time -f "$ARCH train wall %e s" "$BIN/fairseq-train" "$WORK/bin" --user-dir user_dir --task translation \
    --arch "$ARCH" $SIZES --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --optimizer adam \
    --adam-betas '(0.9,0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" \
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --save-dir "$CK" --no-epoch-checkpoints --cpu \
    --num-workers 0 --seed 1 --log-format simple --log-interval 20 --disable-validation ${EXTRA:-}
  "$BIN/fairseq-generate" "$WORK/bin" --user-dir user_dir --path "$CK/checkpoint_last.pt" --gen-subset test \
    --beam 5 --max-tokens 4096 --remove-bpe --cpu > "$CK/generate.txt"
  grep -E "BLEU" "$CK/generate.txt" | tail -1 | sed "s/^/$ARCH fairseq-generate: /"
  "$PY" preprocess/score_generate.py "$CK/generate.txt" "$SHARED/multi30k/tok/test_2016_flickr.lc.norm.tok.de" \
    | tail -1 | sed "s/^/$ARCH sacrebleu: /"
done
