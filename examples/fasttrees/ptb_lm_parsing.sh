#!/usr/bin/env bash
# fasttrees_transformer_lm on word-level PTB, then unsupervised parsing on the NLTK PTB sample.
#   examples/fasttrees/ptb_lm_parsing.sh            # full budget (MAX_UPDATE=3000)
#   MAX_UPDATE=300 examples/fasttrees/ptb_lm_parsing.sh   # reduced budget (what BENCHMARKS.md records)
source "$(dirname "$0")/common.sh"
WORK=${WORK:-benchmarks/work/ptb}
MAX_UPDATE=${MAX_UPDATE:-3000}
ARCH=${ARCH:-fasttrees_transformer_lm_ptb}
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
  --max-update "$MAX_UPDATE" --save-dir "$WORK/ck_$ARCH" --no-epoch-checkpoints --cpu --num-workers 0 --seed 1 \
  --log-format simple --log-interval 50 --validate-interval-updates "$MAX_UPDATE" ${EXTRA:-}
"$BIN/fairseq-eval-lm" "$WORK/bin" --user-dir user_dir --path "$WORK/ck_$ARCH/checkpoint_last.pt" --cpu \
  --sample-break-mode eos --tokens-per-sample 128 --max-tokens 4096 --gen-subset test
"$PY" examples/fasttrees/eval_parsing.py --path "$WORK/ck_$ARCH/checkpoint_last.pt" \
  --treebank "$SHARED/ptb-treebank-sample-nltk/treebank.zip"
"$PY" examples/fasttrees/eval_parsing.py --path "$WORK/ck_$ARCH/checkpoint_last.pt" \
  --treebank "$SHARED/ptb-treebank-sample-nltk/treebank.zip" --max-len 10
