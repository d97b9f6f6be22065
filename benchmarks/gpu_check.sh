#!/usr/bin/env bash
# The one script a lent GPU runs (≤ 8 min on one H200): numerics and TF32 state, matmul/HBM rates,
# the priced jacobians / lens / spectra jobs at Llama-3.1-8B widths (measured vs planned rate and
# peak device memory), Jacobians vs autograd through HF's layer (exit 1 when off), determinism,
# float64 decompositions; writes a run folder `resdyn calibrate` reads (docs/cost.md, "GPU check").
#   benchmarks/gpu_check.sh [--kind h200] [--out DIR]   # one GPU
#   benchmarks/gpu_check.sh --two-gpu                   # two GPUs: a model placed by layer across them
#   benchmarks/gpu_check.sh --dry [--out DIR]           # on a CPU at small shapes: checks the script
# Without CUDA the real modes print torch.version.cuda and what to install, and exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PY" benchmarks/gpu_check.py "$@"
