# resdyn — two commands on a fresh machine:  make run  |  make test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
# The CPU build of torch that lies on disk; installed before the project so that pip never
# resolves torch to the multi-GB CUDA wheels. GPU users: see README "Installing on a GPU cluster".
TORCH_SPEC ?= torch==2.13.0

.PHONY: all setup run smoke report test test-fast lint format install-slurm-profile clean

all: run

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/snakemake --profile profiles/local --cores $(CORES)
	$(BIN)/snakemake --profile profiles/local --cores $(CORES) --report report.html
	@echo "report: $(CURDIR)/report.html"

smoke: setup
	$(BIN)/snakemake --profile profiles/local --cores $(CORES) --configfile configs/smoke.yaml

test: setup
	$(BIN)/pytest -q

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
	@echo "installed: snakemake --profile slurm  (site settings: see README.md, Running on SLURM)"

clean:
	rm -rf results logs .snakemake report.html benchmarks/out
