#!/usr/bin/env bash
# Multi30k En->De: capsule_transformer vs fairseq's transformer of identical size.
#   examples/capsule_transformer/multi30k_compare.sh [DATA_BIN] [WORK]
# Variables as examples/translation/multi30k_compare.sh (EXTRA: capsule flags, e.g. "--routing-iters 1").
# ROUTED (default enc_self, as multi30k.yaml): --routed-attention of the capsule_transformer runs;
# ROUTED=enc_self,dec_self is the model's default (the issue's).
ROUTED=${ROUTED:-enc_self} ARCHS=${ARCHS:-"transformer capsule_transformer"} exec "$(dirname "$0")/../translation/multi30k_compare.sh" "$@"
