#!/usr/bin/env bash
# GPU check for the cost model and the GPU code paths (≤ 8 min on one H100/H200):
#   structured Jacobians of a Llama-3.1-8B-shaped layer on CUDA vs CPU (max |Δ|), their GEMM
#   throughput as a fraction of the measured fp32 matmul rate, one bf16 lens training step,
#   the float64 decompositions on the GPU (eigvals, eig with vectors + inverse, svd, svdvals) —
#   one table, then MEASURED_RATES to paste into resdyn/cluster/cost.py (DEVICES).
#   benchmarks/gpu_check.sh            # on the GPU node (falls back to --dry without CUDA)
#   benchmarks/gpu_check.sh --dry      # CPU fallback at d = 256: checks the script (~1 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" != "--dry" ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device: running the CPU fallback (--dry)" >&2
    set -- --dry "$@"
fi
exec timeout 480 "$PY" benchmarks/gpu_check.py "$@"
