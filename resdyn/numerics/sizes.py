"""Sizes the Jacobian engine works with, torch-free so that the cost model
(:mod:`resdyn.cluster.cost`) prices a job by the same numbers the engine
(:mod:`resdyn.study_a.jacobian`) runs it with."""

from __future__ import annotations

__all__ = [
    "EXACT_SPECTRAL_MAX_D",
    "JACOBIAN_GPU_BATCH",
    "POWER_ITERATIONS",
    "TANGENT_BUDGET_BYTES",
    "TANGENT_BUDGET_GPU_BYTES",
    "attention_tangent_bytes",
    "tangent_chunk",
]

#: d at or below which the spectral norm is exact (SVD); above it, power iteration.
EXACT_SPECTRAL_MAX_D = 512
#: Power-iteration steps for the spectral norm above :data:`EXACT_SPECTRAL_MAX_D`.
POWER_ITERATIONS = 64
#: Samples per batched forward of the Jacobian engine on a GPU (on a CPU: 1).
JACOBIAN_GPU_BATCH = 16
#: Memory budget for one chunk of forward-mode tangents on a CPU (bytes).
TANGENT_BUDGET_BYTES = 1 << 30
#: The same on a GPU: 10 % of the smallest GPU kind priced (A100 40 GB, 40,960 MiB), so that d = 4,096
#: (32 heads of 128) at T ≤ 895 takes one vmap pass over the d directions.
TANGENT_BUDGET_GPU_BYTES = 4 << 30


def attention_tangent_bytes(n_heads: int, head_dim: int, length: int) -> int:
    """Bound on the bytes one tangent direction of the attention core holds: 4·(8·H·(T+1) + 8·H·hd)
    (fp32 score-sized and head-sized arrays; the resident size is about a third of it)."""
    return 4 * (8 * n_heads * (length + 1) + 8 * n_heads * head_dim)


def tangent_chunk(d: int, per_tangent: int, gpu: bool) -> int:
    """Tangent directions per vmap pass: min(d, ⌊budget / per_tangent⌋), at least 1.

    The budget is :data:`TANGENT_BUDGET_GPU_BYTES` on a GPU, :data:`TANGENT_BUDGET_BYTES` on a CPU;
    d directions go in one pass whenever d · per_tangent fits it. The Jacobian engine and the cost
    model (:func:`resdyn.cluster.cost.cost_jacobians`) both call this, so the plan prices the chunk the
    job runs.
    """
    budget = TANGENT_BUDGET_GPU_BYTES if gpu else TANGENT_BUDGET_BYTES
    return int(max(1, min(d, budget // per_tangent)))
