"""Rotation in a mean Jacobian beyond what its sampling noise can produce.

The tolerance rule of :func:`resdyn.study_a.spectral.complex_fraction` counts an eigenvalue as
complex when |Im λ| > tol·max(1, |λ|). Sampling noise in a mean Jacobian J̄ = A + E splits
nearly-degenerate real eigenvalues of A into conjugate pairs, so that count grows with d and
shrinks with N for reasons unrelated to rotation. Bendixson's theorem bounds what the noise can
do: for every eigenvalue λ of a real matrix M, |Im λ| ≤ ‖(M − Mᵀ)/2‖_2; with M = A + E and A
symmetric, |Im λ| ≤ ‖(E − Eᵀ)/2‖_2. The noise-aware share counts a pair only above an estimate
of that bound, τ, taken from draws of E with the mean's sampling covariance
(:func:`resdyn.numerics.resampling.mean_error_draws`). A continuous measure, Σ|Im λ| / Σ|λ|,
reports rotation without any threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse.linalg

from resdyn.numerics.linalg import as_values
from resdyn.numerics.resampling import check_groups, mean_error_draws

__all__ = ["rotation_share", "skew_norm", "imag_noise_bound", "complex_fraction_beyond_noise"]

#: Matrices above this size take the largest singular value by Lanczos (scipy svds), not a full SVD.
DENSE_NORM_MAX_D = 128


def rotation_share(eigvals: Any, shift: float = 0.0) -> float:
    """Share of the spectrum's modulus that is rotation: Σ_i |Im μ_i| / Σ_i |μ_i|, μ_i = λ_i − shift.

    0 for a real spectrum, 1 for a purely imaginary one (a rotation by π/2); a rotation by θ of
    every eigen-pair gives |sin θ|. The eigenvalues of J − I are μ = λ − 1 (shift 1), with the same
    imaginary parts. A zero spectrum gives 0.

    Example:
        >>> rotation_share(np.array([1j, -1j, 2.0, 0.0]))
        0.5
    """
    lam = as_values(eigvals, "eigvals")
    mu = np.abs(lam - float(shift))
    total = float(mu.sum())
    return float(np.abs(np.imag(lam)).sum()) / total if total > 0 else 0.0


def skew_norm(M: Any) -> float:
    """‖(M − Mᵀ)/2‖_2, the largest imaginary part any eigenvalue of M + S can have for symmetric S.

    Dense SVD up to :data:`DENSE_NORM_MAX_D`, Lanczos above (equal to rounding).
    """
    a = np.asarray(M, dtype=np.float64)
    k = (a - a.T) / 2.0
    if k.shape[0] <= DENSE_NORM_MAX_D:
        return float(np.linalg.norm(k, 2))
    s = scipy.sparse.linalg.svds(k, k=1, return_singular_vectors=False, random_state=0)
    return float(s[0])


def imag_noise_bound(
    samples: Any, n_total: int | None = None, n_draws: int = 20, level: float = 0.95, seed: int = 0
) -> float:
    """τ: the ``level`` quantile of ‖(E* − E*ᵀ)/2‖_2 over draws E* of the mean's sampling error.

    By Bendixson's theorem no eigenvalue of A + E with A symmetric has |Im λ| > ‖(E − Eᵀ)/2‖_2, so
    an eigenvalue with |Im λ| > τ is rotation that sampling noise alone would produce only with
    probability about 1 − level.

    Args:
        samples: (m, d, d): B group means over all N samples (``n_total`` None: the error of
            their mean), or the first m per-sample Jacobians of an N-sample mean (``n_total`` = N:
            draws scaled by m/N).
        n_total: N when ``samples`` are per-sample Jacobians, else None.
        n_draws, level, seed: draws of :func:`resdyn.numerics.resampling.mean_error_draws`.
    """
    x = check_groups(samples, "samples")
    m = x.shape[0]
    if n_total is not None and int(n_total) < m:
        raise ValueError(f"n_total = {n_total} is smaller than the {m} samples given")
    ratio = 1.0 if n_total is None else m / int(n_total)
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    norms = [skew_norm(e) for e in mean_error_draws(x, ratio, n_draws, seed)]
    return float(np.quantile(norms, float(level)))


def complex_fraction_beyond_noise(eigvals: Any, bound: float) -> float:
    """Share of eigenvalues whose imaginary part exceeds the noise bound τ: #{i : |Im λ_i| > τ} / d.

    Args:
        eigvals: (d,) eigenvalues of the mean Jacobian.
        bound: τ ≥ 0 (:func:`imag_noise_bound`); τ = 0 counts every non-real eigenvalue.
    Example:
        >>> complex_fraction_beyond_noise(np.array([1 + 0.5j, 1 - 0.5j, 2 + 1e-3j, 2 - 1e-3j]), 0.01)
        0.5
    """
    lam = as_values(eigvals, "eigvals")
    tau = float(bound)
    if not (tau >= 0.0 and np.isfinite(tau)):
        raise ValueError(f"bound must be a finite number ≥ 0, got {bound!r}")
    return float(np.mean(np.abs(np.imag(lam)) > tau))
