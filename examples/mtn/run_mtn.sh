#!/usr/bin/env bash
# MTN query suggestion end to end: sessions -> binarized data -> fairseq-train -> fairseq-generate --nbest -> scores.
#   examples/mtn/run_mtn.sh synthetic         # generated sessions (no private logs needed)
#   examples/mtn/run_mtn.sh trec              # TREC Session Track 2013 (../shared/data/trec-session-2013)
#   examples/mtn/run_mtn.sh log LOG.tsv       # a query log: id<TAB>timestamp<TAB>query (AOL: COLUMNS=0,2,1)
# Environment: PYTHON (default python), WORK (default mtn-work), ARCH (default mtn_tiny), UPDATES (default 3000),
#              MAXQ (max query length, default 16), NBEST (default 5), COLUMNS (for `log`, default 0,1,2),
#              TREC (the TREC XML, default ../shared/data/trec-session-2013/sessiontrack2013.xml.xz).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
BIN=$(dirname "$(command -v "$PYTHON")")
WORK=${WORK:-mtn-work}; ARCH=${ARCH:-mtn_tiny}; UPDATES=${UPDATES:-3000}; MAXQ=${MAXQ:-16}; NBEST=${NBEST:-5}
SOURCE=${1:?usage: run_mtn.sh synthetic|trec|log LOG.tsv}
mkdir -p "$WORK"
case "$SOURCE" in
  synthetic) "$PYTHON" preprocess/synthetic_sessions.py --out "$WORK/ses" ;;
  trec) "$PYTHON" preprocess/trec_session_sessions.py "${TREC:-../shared/data/trec-session-2013/sessiontrack2013.xml.xz}" \
          --out "$WORK/ses" --max-query-length "$MAXQ" ;;
  log) "$PYTHON" preprocess/query_log_sessions.py "${2:?log TSV missing}" --columns "${COLUMNS:-0,1,2}" \
          --max-query-length "$MAXQ" --split 0.8,0.1,0.1 --out "$WORK/ses" ;;
  *) echo "unknown source '$SOURCE' (synthetic, trec or log)" >&2; exit 2 ;;
esac
"$PYTHON" preprocess/query_suggestion_prepare.py --ses-dir "$WORK/ses" --dest "$WORK/bin" --max-query-length "$MAXQ"
"$BIN/fairseq-train" "$WORK/bin" --user-dir user_dir --task query_suggestion --max-query-length "$MAXQ" \
    --arch "$ARCH" --share-all-embeddings --optimizer adam --adam-betas '(0.9,0.98)' --lr 2e-3 \
    --lr-scheduler inverse_sqrt --warmup-updates 200 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 2000 --max-update "$UPDATES" --eval-suggestions --eval-nbest "$NBEST" \
    --best-checkpoint-metric mrr --maximize-best-checkpoint-metric --no-epoch-checkpoints \
    --save-dir "$WORK/checkpoints" --log-format simple --no-progress-bar
"$BIN/fairseq-generate" "$WORK/bin" --user-dir user_dir --task query_suggestion \
    --path "$WORK/checkpoints/checkpoint_best.pt" --beam "$NBEST" --nbest "$NBEST" --max-len-b $((MAXQ + 1)) \
    > "$WORK/generate.txt"
"$PYTHON" preprocess/query_suggestion_score.py "$WORK/generate.txt" --k "$NBEST" --ref "$WORK/bin/raw/test.tgt"
