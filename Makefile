# Set-up is part of every target: the first call builds .venv (torch's CPU wheel first, so
# that no multi-GB CUDA build is pulled), later calls reuse it.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test lint bench
run: $(VENV)/.installed  ## the main job: the report (accuracy, random features, scaling)
	$(PY) -m linattn_verify report

test: $(VENV)/.installed  ## the test suite (what CI runs)
	$(PY) -m pytest -q -n auto

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed  ## speed of the exact reference engines
	$(PY) benchmarks/bench_reference.py

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@
