# resdyn — two commands on a fresh machine:  make run  |  make test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
# torch is installed before the project, as the build this machine can use: the CUDA build where
# `nvidia-smi -L` lists a GPU (a GPU node), else the CPU build, so that pip never pulls the multi-GB
# CUDA wheels onto a laptop or CI runner. Force either: `make setup TORCH_BUILD=cuda` (e.g. on a
# login node without a driver, for the GPU nodes) or TORCH_BUILD=cpu. See docs/slurm.md,
# "Installing on a GPU cluster".
TORCH_SPEC ?= torch==2.13.0
TORCH_BUILD ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
ifeq ($(filter cpu cuda,$(TORCH_BUILD)),)
$(error TORCH_BUILD=$(TORCH_BUILD): allowed cpu or cuda)
endif
# Where the CUDA build comes from (CUDA 12.8 wheels run on drivers >= 570; cu126 for older ones).
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu128
# Where the CPU build comes from. If pip, as configured, already resolves TORCH_SPEC to a CPU wheel
# (a "+cpu" version: this machine's pip config serves one from disk), nothing is added. Otherwise
# (plain PyPI, whose Linux torch is the CUDA build) the PyTorch CPU index is added as an extra
# index: its 2.13.0+cpu satisfies ==2.13.0 and, as a local version, sorts above PyPI's 2.13.0.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CPU_ARGS = $(shell $(BIN)/pip install --dry-run --quiet --no-deps --ignore-installed --report - \
	"$(TORCH_SPEC)" 2>/dev/null | $(BIN)/python -c 'import json, sys; \
	v = json.load(sys.stdin)["install"][0]["metadata"]["version"]; sys.exit(0 if v.endswith("+cpu") else 1)' \
	2>/dev/null || echo "--extra-index-url $(TORCH_CPU_INDEX)")
TORCH_PIP_ARGS ?= $(if $(filter cuda,$(TORCH_BUILD)),--extra-index-url $(TORCH_CUDA_INDEX),$(TORCH_CPU_ARGS))
# exit status 0 when the installed torch is the build asked for
TORCH_IS_BUILD = $(BIN)/python -c 'import sys, torch; sys.exit((torch.version.cuda is None) != ("$(TORCH_BUILD)" == "cpu"))'

.PHONY: all setup bytecode run smoke report test test-fast lint format install-slurm-profile clean torch-args

all: run

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# A stamp per torch build: switching TORCH_BUILD reinstalls torch (same version, other build).
$(VENV)/.torch-%: $(BIN)/activate
	rm -f $(VENV)/.torch-*
	touch $@

.SECONDARY: $(VENV)/.torch-cpu $(VENV)/.torch-cuda

$(VENV)/.installed: $(BIN)/activate pyproject.toml $(VENV)/.torch-$(TORCH_BUILD)
	$(TORCH_IS_BUILD) 2>/dev/null || $(BIN)/pip install -q --force-reinstall --no-deps $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	@$(TORCH_IS_BUILD) || { echo "TORCH_BUILD=$(TORCH_BUILD) but pip installed another torch build: see docs/slurm.md, Installing on a GPU cluster" >&2; exit 1; }
	touch $@

setup: $(VENV)/.installed

# The extra pip arguments the torch install uses here (CPU build: empty when pip's own configuration
# has it; CUDA build: the CUDA index).
torch-args: $(BIN)/activate
	@echo "$(TORCH_PIP_ARGS)"

# The package's bytecode before a run: in an environment with PYTHONDONTWRITEBYTECODE set (common in
# containers) each of the run's ~170 job processes would otherwise compile resdyn from source.
bytecode: setup
	$(BIN)/python -m compileall -q resdyn

run: bytecode
	$(BIN)/snakemake --profile profiles/local --cores $(CORES)
	$(BIN)/snakemake --profile profiles/local --cores $(CORES) --report report.html
	@echo "report: $(CURDIR)/report.html"

smoke: bytecode
	$(BIN)/snakemake --profile profiles/local --cores $(CORES) --configfile configs/smoke.yaml

# The suite starts hundreds of Python processes (workflow jobs, dry runs, pytest workers). With
# bytecode writing off (PYTHONDONTWRITEBYTECODE, common in containers) each would compile resdyn and
# the test helpers again, and pytest would rewrite every test module's asserts again: the tests
# write bytecode caches (__pycache__, ignored by git) whatever the caller's environment says.
test test-fast: export PYTHONDONTWRITEBYTECODE =

test: setup
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=25

# The unit and oracle tests: everything but the Snakemake workflow runs (`slow`) and SLURM (`slurm`).
test-fast: setup
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not slow and not slurm"

lint: setup
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/snakefmt Snakefile workflow/rules
	$(BIN)/ruff format .

# `snakemake --profile slurm` looks for a profile named slurm in ./ and the user config folder
# ($XDG_CONFIG_HOME or ~/.config/snakemake), not in profiles/: link it there.
SNAKEMAKE_PROFILE_DIR ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake
install-slurm-profile:
	@mkdir -p "$(SNAKEMAKE_PROFILE_DIR)"
	@if [ -e "$(SNAKEMAKE_PROFILE_DIR)/slurm" ] && [ ! -L "$(SNAKEMAKE_PROFILE_DIR)/slurm" ]; then \
	  echo "$(SNAKEMAKE_PROFILE_DIR)/slurm exists and is not a link: move it away first" >&2; exit 1; fi
	ln -sfn "$(CURDIR)/profiles/slurm" "$(SNAKEMAKE_PROFILE_DIR)/slurm"
	@echo "installed: snakemake --profile slurm  (site settings: see docs/slurm.md, "Site settings")"

clean:
	rm -rf results logs .snakemake report.html benchmarks/out
