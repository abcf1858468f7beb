# Sourced by the convergence scripts.  train_min_epoch MIN_EPOCH MAX_EPOCH PATIENCE LOG FAIRSEQ_TRAIN_COMMAND...
# runs the command (appending to LOG; it continues from checkpoint_last.pt when there is one) until --patience
# stops it or MAX_EPOCH, but never lets patience stop it before MIN_EPOCH: epochs 1 .. MIN_EPOCH - 1 run with
# patience off while its count runs on (user_dir/fairseq_fixes.py keeps the count in the checkpoints).
train_min_epoch() {
  local min_epoch=$1 max_epoch=$2 patience=$3 log=$4
  shift 4
  local no_stop=$(( min_epoch - 1 < max_epoch ? min_epoch - 1 : max_epoch ))
  [ "$no_stop" -le 0 ] || "$@" --max-epoch "$no_stop" --patience 1000000000 >> "$log" 2>&1
  "$@" --max-epoch "$max_epoch" --patience "$patience" >> "$log" 2>&1
}
