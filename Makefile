# distlab — set-up and the main jobs. `make demo` and `make test` install what they need first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.distlab-installed
# torch 2.13.0's CPU wheel ships on our machines in /opt/wheels; elsewhere pip takes it from PyPI.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP_FLAGS  := --disable-pip-version-check --no-input $(FIND_LINKS) -c requirements/constraints.txt

.PHONY: setup demo test test-gpu test-versions lint bench bench-gpu mutation clean

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

test-gpu: setup  ## what only GPUs run (nccl oracles, FSDP2 bf16, HSDP, torch.compile, MFU vs datasheet); skips without CUDA
	$(BIN)/python -m pytest -m gpu tests/gpu -v

test-versions: setup  ## the oldest and the newest dependency versions pyproject.toml allows, each from distlab's wheel in a fresh venv, outside the repository (~6 min)
	$(BIN)/python scripts/check_versions.py

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: setup  ## every benchmark (~15 min on 2 idle cores): runs/bench/bench.json, bench.md and PNG plots (not tests)
	$(BIN)/python scripts/bench.py --out runs/bench

bench-gpu: setup  ## the depth-12 GPT on one GPU, bf16 + torch.compile: tokens/s and MFU vs the datasheet peak (needs CUDA)
	$(BIN)/python scripts/bench_gpu.py --out runs/bench_gpu

MUTATION_STAMP := $(VENV)/.distlab-mutation-installed
$(MUTATION_STAMP): $(STAMP)
	$(BIN)/python -m pip install $(PIP_FLAGS) -e ".[mutation]"
	@touch $(MUTATION_STAMP)

# A seeded sample of cosmic-ray mutants (a new seed each run, printed; ~25 min on 2 cores), then the named
# historic bugs (~15 min). Not part of make test. MUTATION_ARGS picks: --part tool|named, --seed, --sample.
mutation: setup $(MUTATION_STAMP)  ## plant bugs in a copy, one at a time: the tests that cover each must fail
	$(BIN)/python scripts/mutation_check.py $(MUTATION_ARGS)

clean:
	rm -rf runs .pytest_cache
