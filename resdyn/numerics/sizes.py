"""Sizes the Jacobian engine works with, torch-free so that the cost model
(:mod:`resdyn.cluster.cost`) prices a job by the same numbers the engine
(:mod:`resdyn.study_a.jacobian`) runs it with."""

from __future__ import annotations

__all__ = ["EXACT_SPECTRAL_MAX_D", "JACOBIAN_GPU_BATCH", "POWER_ITERATIONS", "TANGENT_BUDGET_BYTES"]

#: d at or below which the spectral norm is exact (SVD); above it, power iteration.
EXACT_SPECTRAL_MAX_D = 512
#: Power-iteration steps for the spectral norm above :data:`EXACT_SPECTRAL_MAX_D`.
POWER_ITERATIONS = 64
#: Samples per batched forward of the Jacobian engine on a GPU (on a CPU: 1).
JACOBIAN_GPU_BATCH = 16
#: Memory budget for one chunk of forward-mode tangents (bytes).
TANGENT_BUDGET_BYTES = 1 << 30
