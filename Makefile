# distlab — set-up and the main jobs. `make demo` and `make test` install what they need first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.distlab-installed
# torch 2.13.0's CPU wheel ships on our machines in /opt/wheels; elsewhere pip takes it from PyPI.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP_FLAGS  := --disable-pip-version-check --no-input $(FIND_LINKS) -c requirements/constraints.txt

.PHONY: setup demo test lint bench mutation clean

setup: $(STAMP)  ## create .venv if missing and install distlab[dev] with the pinned versions

$(STAMP): pyproject.toml requirements/constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_FLAGS) "torch==2.13.0"
	$(BIN)/python -m pip install $(PIP_FLAGS) -e ".[dev]"
	@touch $(STAMP)

demo: setup  ## train the tiny GPT on the embedded stdlib corpus, then sample from its checkpoint
	@# The demo's own output folder is replaced on every run (distlab fit refuses to mix runs).
	rm -rf runs/demo
	$(BIN)/distlab fit --config configs/demo_cpu.yaml
	$(BIN)/distlab generate --ckpt_path runs/demo/checkpoints/last.ckpt --prompt "def " --max_new_tokens 200

test: setup  ## the full test suite (unit, CLI, gloo multi-process, torchrun)
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: setup  ## every benchmark (~12 min on 2 cores): runs/bench/bench.json, bench.md and PNG plots (not tests)
	$(BIN)/python scripts/bench.py --out runs/bench

mutation: setup  ## plant each listed bug in a copy and check its tests fail (~20 min; not part of make test)
	$(BIN)/python scripts/mutation_check.py

clean:
	rm -rf runs .pytest_cache
