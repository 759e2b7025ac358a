# Set-up is part of every target: the first call builds .venv (torch's CPU wheel first, so
# that no multi-GB CUDA build is pulled), later calls reuse it.
VENV ?= .venv
PY := $(VENV)/bin/python
# an extra of pyproject.toml, as pip arguments
EXTRA = $(shell $(PY) -c "import shlex, tomllib; print(shlex.join(tomllib.load( \
	open('pyproject.toml', 'rb'))['project']['optional-dependencies']['$(1)']))")

.PHONY: run test lint docs doc-blocks bench adapters readme-verdicts device-check
run: $(VENV)/.installed  ## the main job: the report (accuracy, random features, scaling)
	$(PY) -m linattn_verify report

test: $(VENV)/.installed $(VENV)/.adapters  ## the test suite (what CI runs)
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	$(PY) -m pytest -q -n auto --dist worksteal  # one BLAS thread a worker, as one torch thread

lint: $(VENV)/.installed  ## ruff and the layer contract (import-linter)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

bench: $(VENV)/.installed  ## speed of the exact reference engines
	$(PY) benchmarks/bench_reference.py

adapters: $(VENV)/.adapters  ## the third-party libraries that install in seconds

docs: $(VENV)/.docs  ## the documentation site (MkDocs), strictly: a dead link fails it
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

doc-blocks: $(VENV)/.installed  ## rerun the commands behind the README's and docs' examples
	$(PY) scripts/doc_blocks.py --update

readme-verdicts: $(VENV)/.installed  ## the adapters' verdict table (docs/adapters.md)
	$(PY) -m linattn_verify adapters --readme docs/adapters.md

device-check: $(VENV)/.installed $(VENV)/.adapters  ## the GPU checks (one line without CUDA)
	@$(PY) benchmarks/device_check.py $(ARGS)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# the `adapters` and `triton` extras with --no-deps (pip must not touch torch)
$(VENV)/.adapters: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps $(call EXTRA,adapters) $(call EXTRA,triton)
	touch $@

# the `docs` extra: pure-Python tools whose dependencies never include torch
$(VENV)/.docs: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q $(call EXTRA,docs)
	touch $@
