"""Resampling over groups of samples: the delete-one-group jackknife and wild (Rademacher) draws of a
mean's sampling error.

A mean Jacobian J̄ = (1/N) Σ_i J_i over N samples is estimated once; its uncertainty comes from B
equal groups of the samples, each summarised by its mean G_g (so J̄ = (1/B) Σ_g G_g), or from the
first n per-sample Jacobians. Both give estimates from every sample (the groups) or from a
subset (the first n), with the formulas below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from resdyn.numerics.checks import check_int

__all__ = [
    "JackknifeResult",
    "group_jackknife",
    "jackknife_interval",
    "jackknife_weights",
    "mean_error_draws",
    "check_groups",
]


def check_groups(groups: Any, name: str = "groups") -> np.ndarray:
    """``groups`` as a float64 array (B, ...) of B ≥ 2 finite group means; else ValueError naming ``name``."""
    g = np.asarray(groups, dtype=np.float64)
    if g.ndim < 1 or g.shape[0] < 2:
        raise ValueError(f"{name}: need at least 2 groups (or samples), got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError(f"{name}: contains NaN or Inf")
    return g


class JackknifeResult(tuple):
    """(estimate, standard error, low, high, replicates) of :func:`group_jackknife`."""

    __slots__ = ()

    def __new__(cls, estimate: float, se: float, low: float, high: float, replicates: np.ndarray):
        return super().__new__(cls, (estimate, se, low, high, replicates))

    estimate = property(lambda self: self[0])
    se = property(lambda self: self[1])
    low = property(lambda self: self[2])
    high = property(lambda self: self[3])
    replicates = property(lambda self: self[4])


def group_jackknife(stat: Callable[[np.ndarray], float], groups: Any, level: float = 0.95) -> JackknifeResult:
    """Delete-one-group jackknife interval of θ = stat(Ḡ), Ḡ = (1/B) Σ_g G_g.

    θ_(g) = stat(Ḡ_(g)) with Ḡ_(g) = (B Ḡ − G_g)/(B − 1) the mean without group g;
    se = sqrt((B − 1)/B · Σ_g (θ_(g) − θ̄_(·))²), θ̄_(·) = mean of the θ_(g);
    interval θ ± t_{B−1, (1+level)/2} · se (Student t with B − 1 degrees of freedom: B is small).
    The estimate is θ on all groups, not the bias-corrected one (bias correction adds variance
    and the studies report θ).

    Args:
        stat: matrix (or array) → float, applied to means of the groups.
        groups: (B, ...) the B ≥ 2 group means, of equal group sizes.
        level: in (0, 1).
    Example:
        >>> r = group_jackknife(lambda m: float(m[0]), np.array([[1.0], [2.0], [3.0]]))
        >>> round(r.estimate, 6), round(r.se, 6)
        (2.0, 0.57735)
    """
    g = check_groups(groups)
    B = g.shape[0]
    total = g.sum(axis=0)
    estimate = float(stat(total / B))
    reps = np.array([float(stat((total - g[i]) / (B - 1))) for i in range(B)])
    se, low, high = jackknife_interval(reps, estimate, level)
    return JackknifeResult(estimate, se, low, high, reps)


def jackknife_interval(replicates: Any, estimate: float, level: float = 0.95) -> tuple[float, float, float]:
    """(se, low, high) from B delete-one-group replicates θ_(g) of ``estimate`` θ (see :func:`group_jackknife`).

    se = sqrt((B − 1)/B · Σ_g (θ_(g) − θ̄_(·))²); interval θ ± t_{B−1, (1+level)/2} · se. A NaN
    replicate or estimate gives NaN.

    Example:
        >>> [round(v, 4) for v in jackknife_interval([2.5, 1.75, 2.0], 2.0, 0.95)]
        [0.3819, 0.3567, 3.6433]
    """
    reps = np.asarray(replicates, dtype=np.float64)
    if reps.ndim != 1 or reps.size < 2:
        raise ValueError(f"a jackknife interval needs ≥ 2 replicates (1-D), got shape {reps.shape}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    B = reps.size
    se = float(np.sqrt((B - 1) / B * np.sum((reps - reps.mean()) ** 2)))
    from scipy.stats import t as student_t  # here, not at the top: scipy.stats costs light jobs ~0.5 s of start-up

    half = float(student_t.ppf((1.0 + float(level)) / 2.0, B - 1)) * se
    return se, float(estimate) - half, float(estimate) + half


def jackknife_weights(n_groups: int) -> np.ndarray:
    """(B, B) weights of the delete-one-group means: row g is 1/(B − 1) on every group but g, 0 on g."""
    B = check_int(n_groups, "n_groups", 2)
    return (np.ones((B, B)) - np.eye(B)) / (B - 1)


def mean_error_draws(samples: Any, variance_ratio: float, n_draws: int, seed: int) -> Iterator[np.ndarray]:
    """Wild-bootstrap draws with the covariance of a mean's sampling error.

    For m i.i.d. matrices X_i (samples, or equal-size group means) with covariance Σ_X and
    deviations D_i = X_i − X̄:  E* = sqrt(r / (m (m − 1))) Σ_i ε_i D_i, ε_i = ±1 uniformly, has
    E[E* ⊗ E*] = r · Σ_X / m (unbiased given the deviations' expectation (m − 1)/m · Σ_X).
    r = 1 gives the error of X̄ itself (groups covering all N samples); r = m / N gives the error
    of an N-sample mean from m per-sample matrices (the stored first n of N).

    Args:
        samples: (m, d, d) with m ≥ 2.
        variance_ratio: r > 0.
        n_draws: ≥ 1.
        seed: for the signs.
    Yields:
        (d, d) float64 draws E*.
    """
    x = check_groups(samples, "samples")
    r = float(variance_ratio)
    if not r > 0.0:
        raise ValueError(f"variance_ratio must be > 0, got {variance_ratio!r}")
    n = check_int(n_draws, "n_draws", 1)
    m = x.shape[0]
    dev = x - x.mean(axis=0)
    scale = np.sqrt(r / (m * (m - 1)))
    rng = np.random.default_rng(seed)
    for _ in range(n):
        signs = rng.choice(np.array([-1.0, 1.0]), size=m)
        yield scale * np.tensordot(signs, dev, axes=1)
