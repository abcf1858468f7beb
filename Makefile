# `make demo` and `make test` set everything up in .venv on first use.
#   PYTHON        interpreter for the venv (Python 3.11 recommended)
#   TORCH         torch requirement; e.g. TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu121"
#   FAIRSEQ       fairseq distribution, installed with --no-deps
#   DATA          for `make demo`: a directory of raw train/valid/test parallel files (default: built-in corpus)
#   TEST_WORKERS  for `make test`: pytest-xdist worker processes, one thread each (default 2; 0 runs in one process)
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
FAIRSEQ ?= ve-fairseq==0.12.3
TEST_WORKERS ?= 2
PIP = $(VENV)/bin/pip
PY = $(VENV)/bin/python

.PHONY: demo test install install-test clean

$(VENV)/.installed: requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip "setuptools<82" wheel
	$(PIP) install $(TORCH)
	$(PIP) install --no-deps $(FAIRSEQ)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps --no-build-isolation -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PIP) install -r requirements-test.txt
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: install
	PYTHON=$(PY) DATA=$(DATA) examples/demo/run_demo.sh

test: install-test
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest tests -q -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf demo-work .pytest_cache
