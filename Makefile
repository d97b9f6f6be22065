# resdyn — two commands on a fresh machine:  make run  |  make test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
# The CPU build of torch, installed before the project so that pip never resolves torch to the
# multi-GB CUDA wheels. GPU users: see docs/slurm.md "Installing on a GPU cluster".
TORCH_SPEC ?= torch==2.13.0
# Where the CPU build comes from. If pip, as configured, already resolves TORCH_SPEC to a CPU wheel
# (a "+cpu" version: this machine's pip config serves one from disk), nothing is added. Otherwise
# (plain PyPI, whose Linux torch is the CUDA build) the PyTorch CPU index is added as an extra
# index: its 2.13.0+cpu satisfies ==2.13.0 and, as a local version, sorts above PyPI's 2.13.0.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIP_ARGS ?= $(shell $(BIN)/pip install --dry-run --quiet --no-deps --ignore-installed --report - \
	"$(TORCH_SPEC)" 2>/dev/null | $(BIN)/python -c 'import json, sys; \
	v = json.load(sys.stdin)["install"][0]["metadata"]["version"]; sys.exit(0 if v.endswith("+cpu") else 1)' \
	2>/dev/null || echo "--extra-index-url $(TORCH_CPU_INDEX)")

.PHONY: all setup bytecode run smoke report test test-fast lint format install-slurm-profile clean torch-args

all: run

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

# The extra pip arguments the CPU torch install uses here (empty: pip's own configuration has it).
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

test: setup
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=25

test-fast: setup
	$(BIN)/pytest -q -m "not slow and not slurm"

lint: setup
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow/rules

format: setup
	$(BIN)/snakefmt Snakefile workflow/rules

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
