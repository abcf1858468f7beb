#!/usr/bin/env bash
# fasttrees_transformer_lm on word-level PTB, then unsupervised parsing on the NLTK PTB sample.
#   examples/fasttrees/ptb_lm_parsing.sh            # full budget (MAX_UPDATE=3000; 3 layers d 256)
#   # the ~18 CPU-minute budget that BENCHMARKS.md records (3 layers d 128, 659 updates, test ppl 196):
#   CK=benchmarks/work/ptb/ck_d128l3 MAX_UPDATE=100000 EXTRA="--decoder-embed-dim 128 --decoder-ffn-embed-dim 512 \
#     --decoder-layers 3 --max-tokens 2048 --lr 2e-3 --warmup-updates 100 --dropout 0.1 --clip-norm 1.0 \
#     --stop-time-hours 0.3" examples/fasttrees/ptb_lm_parsing.sh
source "$(dirname "$0")/common.sh"
WORK=${WORK:-benchmarks/work/ptb}
MAX_UPDATE=${MAX_UPDATE:-3000}
ARCH=${ARCH:-fasttrees_transformer_lm_ptb}
CK=${CK:-$WORK/ck_$ARCH}
mkdir -p "$WORK/raw"
if [ ! -f "$WORK/bin/dict.txt" ]; then
  xz -dc "$SHARED/ptb/ptb.train.txt.xz" > "$WORK/raw/train.txt"
  cp "$SHARED/ptb/ptb.valid.txt" "$WORK/raw/valid.txt"
  cp "$SHARED/ptb/ptb.test.txt" "$WORK/raw/test.txt"
  "$BIN/fairseq-preprocess" --only-source --trainpref "$WORK/raw/train.txt" --validpref "$WORK/raw/valid.txt" \
    --testpref "$WORK/raw/test.txt" --destdir "$WORK/bin" --workers 1
fi
"$BIN/fairseq-train" "$WORK/bin" --user-dir user_dir --task language_modeling --arch "$ARCH" \
  --sample-break-mode eos --tokens-per-sample 128 --max-tokens 4096 --optimizer adam --adam-betas '(0.9,0.98)' \
  --weight-decay 0.01 --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 --clip-norm 0.5 \
  --max-update "$MAX_UPDATE" --save-dir "$CK" --no-epoch-checkpoints --num-workers 0 --seed 1 \
  --log-format simple --log-interval 50 --validate-interval-updates "$MAX_UPDATE" ${EXTRA:-}
"$BIN/fairseq-eval-lm" "$WORK/bin" --user-dir user_dir --path "$CK/checkpoint_last.pt" \
  --sample-break-mode eos --tokens-per-sample 128 --max-tokens 4096 --gen-subset test
"$PY" examples/fasttrees/eval_parsing.py --path "$CK/checkpoint_last.pt" \
  --treebank "$SHARED/ptb-treebank-sample-nltk/treebank.zip"
"$PY" examples/fasttrees/eval_parsing.py --path "$CK/checkpoint_last.pt" \
  --treebank "$SHARED/ptb-treebank-sample-nltk/treebank.zip" --max-len 10
