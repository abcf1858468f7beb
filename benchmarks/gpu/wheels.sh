#!/usr/bin/env bash
# fairseq for a GPU machine that has torch but no fairseq and no network: wheels made here, installed there.
#   benchmarks/gpu/wheels.sh download DIR [PYTHON_VERSION]   (here: the wheels for that Python, default 3.12)
#   benchmarks/gpu/wheels.sh install DIR [PREFIX]            (there: installs into PREFIX, default /tmp/fairseq)
# `install` puts the packages in PREFIX/site and, in PREFIX/bin, a `python` that runs the machine's python3 with
# fairseq's console scripts (and the machine's sacrebleu), and prints the two exports the GPU scripts need, e.g.
#   eval "$(benchmarks/gpu/wheels.sh install .whl)" && benchmarks/gpu/multi30k_converged.sh
# Wheels: ve-fairseq 0.12.3 (fairseq 0.12 built for recent Pythons), bitarray, hydra-core, omegaconf, and
# antlr4-python3-runtime 4.9.3 (hydra's parser; only an sdist exists, so it is built here with `pip wheel`).
# Everything else fairseq imports (torch, numpy, regex, sacrebleu, ...) is expected on the machine.
set -euo pipefail
MODE=${1:?usage: wheels.sh download|install DIR ...}
DIR=${2:?usage: wheels.sh download|install DIR ...}
case "$MODE" in
  download)
    PYV=${3:-3.12}
    mkdir -p "$DIR"
    python -m pip download --only-binary=:all: --no-deps --python-version "$PYV" --platform manylinux_2_28_x86_64 \
      --platform manylinux2014_x86_64 -d "$DIR" ve-fairseq==0.12.3 bitarray hydra-core==1.3.8 omegaconf==2.3.1 >&2
    python -m pip wheel --no-deps -w "$DIR" antlr4-python3-runtime==4.9.3 >&2
    ls "$DIR" >&2 ;;
  install)
    PREFIX=${3:-/tmp/fairseq}
    python3 -m pip install -q --no-index --no-deps --upgrade --target "$PREFIX/site" "$DIR"/*.whl >&2
    mkdir -p "$PREFIX/bin"
    # A script, not a link: a link to a virtual environment's python starts Python without that environment
    # (it looks for pyvenv.cfg beside the path it was started as), so torch would not be found.
    rm -f "$PREFIX/bin/python"  # an older install's link: writing through it would overwrite the interpreter
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$(python3 -c 'import sys; print(sys.executable)')" > "$PREFIX/bin/python"
    chmod +x "$PREFIX/bin/python"
    for f in "$PREFIX"/site/bin/*; do ln -sf "$f" "$PREFIX/bin/"; done
    if command -v sacrebleu > /dev/null; then ln -sf "$(command -v sacrebleu)" "$PREFIX/bin/sacrebleu"
    else echo "wheels.sh: no sacrebleu on this machine (the scoring step needs it)" >&2; fi
    echo "export PYTHONPATH=$PREFIX/site:$PWD PYTHON=$PREFIX/bin/python" ;;
  *) echo "wheels.sh: MODE must be download or install, got '$MODE'" >&2; exit 2 ;;
esac
