# Two entry points for a newcomer (see README): `make demo` runs the main job, `make test` the tests.
# Each builds ./.venv from this repo's files first (idempotent: a stamp file tracks pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck bench lock

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rlpure demo $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check rlpure shell tests benchmarks
	$(BIN)/ruff format --check rlpure shell tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_assembly.py

# Re-resolve the pinned versions from pyproject.toml's ranges in a scratch venv.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet -e '.[test]'
	(head -3 constraints.txt; .lock-venv/bin/pip freeze --exclude-editable) > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv
