#!/usr/bin/env bash
# Beam-5 BLEU against the length penalty, for the checkpoints of a Multi30k comparison run
# (examples/translation/multi30k_compare.sh): is a BLEU gap a matter of output length?
#   benchmarks/capsule_transformer/lenpen_sweep.sh WORK [SUBSET] ["LENPENS"] ["ARCHS"] [DATA_BIN]
#   e.g. benchmarks/capsule_transformer/lenpen_sweep.sh benchmarks/work/m30k valid "0.6 1.0 1.5 2.0 2.5 3.0"
# Prints sacreBLEU (13a) with n-gram precisions, brevity penalty and length ratio per (arch, lenpen);
# outputs are kept as WORK/ARCH.SUBSET.lpLENPEN.{txt,hyp,ref,bleu} (an existing .bleu is not recomputed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PYTHON")
WORK=$1; SUBSET=${2:-valid}; LENPENS=${3:-"0.6 1.0 1.5 2.0 2.5 3.0"}
ARCHS=${4:-"transformer capsule_transformer"}; DATA=${5:-data-bin/multi30k}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
for ARCH in $ARCHS; do
  [ -f "$WORK/$ARCH/checkpoint_last.pt" ] || { echo "lenpen_sweep: no checkpoint $WORK/$ARCH/checkpoint_last.pt" >&2; exit 2; }
  for LP in $LENPENS; do
    out=$WORK/$ARCH.$SUBSET.lp$LP
    if [ ! -s "$out.bleu" ]; then
      "$BIN/fairseq-generate" "$DATA" --user-dir user_dir --path "$WORK/$ARCH/checkpoint_last.pt" --gen-subset "$SUBSET" \
        --beam 5 --lenpen "$LP" --batch-size 128 --remove-bpe subword_nmt --cpu > "$out.txt" 2> "$out.log"
      grep ^H- "$out.txt" | sort -V | cut -f3 > "$out.hyp"
      grep ^T- "$out.txt" | sort -V | cut -f2 > "$out.ref"
      "$BIN/sacrebleu" "$out.ref" -i "$out.hyp" -w 2 > "$out.bleu"
    fi
    "$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], d["score"], d["verbose_score"])' \
      "$out.bleu" "$ARCH $SUBSET lenpen=$LP"
  done
done
