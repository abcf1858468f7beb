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

# stopped_by_patience LOG: the last validation in the fairseq-train LOG was followed by fairseq's early stop.
stopped_by_patience() {
  awk '/valid on .valid. subset/ { v = NR } /early stop since valid performance/ { e = NR }
       END { exit !(e > v) }' "$1"
}

# epochs_trained LOG: the last epoch the fairseq-train LOG validated (0 if none).
epochs_trained() {
  local last
  last=$(grep -o "epoch [0-9]* | valid on" "$1" | tail -n 1 | grep -o "[0-9][0-9]*" || true)
  echo $(( 10#${last:-0} ))
}

# stopped_before_min_epoch MIN_EPOCH LOG: the patience rule stopped the run LOG records before MIN_EPOCH epochs,
# i.e. it ran under a smaller minimum.  train_min_epoch with MIN_EPOCH then continues it from checkpoint_last.pt;
# the patience count kept there stops it as if it had run under MIN_EPOCH from the start.
stopped_before_min_epoch() {
  [ -f "$2" ] && stopped_by_patience "$2" && [ "$(epochs_trained "$2")" -lt "$1" ]
}
