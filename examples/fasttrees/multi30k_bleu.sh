#!/usr/bin/env bash
# Multi30k En->De: fasttrees_transformer vs fairseq's transformer of identical size.
#   examples/capsule_transformer/prepare_multi30k.sh ../shared/data/multi30k/tok data-bin/multi30k
#   examples/fasttrees/multi30k_bleu.sh [DATA_BIN] [WORK]        # full budget: 428 updates of 4096 tokens
# Variables as examples/translation/multi30k_compare.sh (EXTRA: FastTrees flags, e.g. "--chunk-size 16").
ARCHS=${ARCHS:-"transformer fasttrees_transformer"} exec "$(dirname "$0")/../translation/multi30k_compare.sh" "$@"
