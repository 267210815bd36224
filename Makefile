# Two entry points for a newcomer (see README): `make demo` runs the main job, `make test` the tests.
# Each builds ./.venv from this repo's files first (idempotent: a stamp file tracks pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
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
