"""Bootstrap uncertainty over samples: percentile intervals for Study A's operator metrics.

Generic utilities
-----------------
Nonparametric bootstrap (B. Efron and R. Tibshirani, *An Introduction to the Bootstrap*, 1993):
draw ``n_resamples`` index vectors of length n with replacement from 0 … n−1
(:func:`bootstrap_indices`, ``np.random.default_rng(seed)``), evaluate the statistic on each
(:func:`bootstrap`), and take the percentile interval

    CI = [q_{(1−level)/2}, q_{(1+level)/2}]   of the replicate values      (:func:`percentile_ci`)

with numpy's default (linear, "type 7") quantiles. A constant statistic has a zero-width
interval; for the mean of n ≥ 30 normal draws the 95 % interval covers the truth ≈ 94 % of the
time (the percentile interval is slightly narrow for small n, by the factor sqrt((n−1)/n)).

What is bootstrapped here (:func:`jacobian_bootstrap`)
------------------------------------------------------
The unit is the *sample* (one held-out sequence): a sample's Jacobian is the mean of its
per-position Jacobians, and a bootstrap replicate of a sublayer's mean Jacobian is the mean of
the resampled samples' Jacobians, J* = (1/n) Σ_i c_i J_i with c ~ Multinomial(n, 1/n). The
*same* resampled samples are used for every sublayer of a replicate (the samples are the unit
of the whole forward pass), and — because the index draws depend only on (seed, n) — for every
checkpoint of a model, so replicates of two checkpoints can be paired (:mod:`resdyn.beyond.scorecard`).
On every replicate:

- ``henrici`` and ``complex_fraction`` (share of eigenvalues with |Im λ| > tol·max(1, |λ|)) of
  every sublayer's mean Jacobian (:func:`resdyn.study_a.spectral.henrici_departure`,
  :func:`resdyn.study_a.spectral.complex_fraction`);
- ``cum_erank_full_depth``: effective rank of P = J_{S−1} ⋯ J_0 over all S sublayers
  (Frobenius-rescaled after each product, like :func:`resdyn.study_a.spectral.cumulative_spectrum`, with
  :class:`resdyn.numerics.linalg.NormalisedProduct`);
- ``complex_fraction_early_minus_late`` and ``henrici_early_minus_late``: the mean over the
  first third of sublayers minus the mean over the last third (:func:`early_late`).

Only the first n = ``jacobian.store_first_n`` samples keep their whole Jacobians
(``per_sample`` in the HDF5 files, :mod:`resdyn.study_a.jacobian`), so the bootstrap runs over those n
(column ``n_bootstrap_samples``); ``n_samples_total`` is the N of the mean Jacobian. ``estimate``
is the statistic of the mean of those n samples (the plug-in value the interval belongs to);
``estimate_all_samples`` is the statistic of the stored all-N mean (what ``spectra.tsv`` and
``bottleneck.tsv`` report). With n < N the interval describes an n-sample estimate and is wider
than the all-N estimate's uncertainty.

Intervals from every sample: the group jackknife
------------------------------------------------
With ``jacobian.n_groups`` = B > 0 the Jacobian pass also stores the mean Jacobian G_g of each of B
equal groups of consecutive samples (J̄ = (1/B) Σ_g G_g). Then every statistic θ is evaluated on the
B delete-one-group means J̄_(g) = (B J̄ − G_g)/(B − 1) of every sublayer (the same group deleted in
each sublayer, and in each checkpoint: replicates pair across checkpoints), and its interval is
θ ± t_{B−1} · se_jack (:func:`resdyn.numerics.resampling.jackknife_interval`), centred on the
all-N estimate. This replaces the first-n bootstrap in ``bootstrap.tsv`` (``interval`` column
``jackknife``, ``n_bootstrap_samples`` = N): the interval then describes the quantity the table
reports, not an n-sample estimate of it.

What is not bootstrapped
------------------------
The RSS profile and its cut points b1, b2 (Study B). RSS is a deterministic function of the
tuned-lens translators; its sampling uncertainty comes from the lens's training tokens, and a
lens-data bootstrap means refitting every translator ``n_resamples`` times (each fit costs as
much as the ``lens`` rule), which this pipeline does not afford. Those rows are written with
``bootstrapped = False`` and the reason in ``note``, never with a made-up interval.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from resdyn import artifacts
from resdyn.numerics import linalg
from resdyn.numerics.checks import check_int
from resdyn.numerics.resampling import jackknife_interval, jackknife_weights
from resdyn.study_a import spectral
from resdyn.study_a.rotation import complex_fraction_beyond_noise

__all__ = [
    "percentile_ci",
    "bootstrap_indices",
    "bootstrap",
    "bootstrap_ci",
    "early_late",
    "jacobian_bootstrap",
    "jacobian_bootstrap_files",
    "not_bootstrapped_rows",
    "BOOTSTRAP_COLUMNS",
    "METHODS",
    "INTERVALS",
    "studentized_ci",
    "replicate_ci",
    "perturbative_spectra",
    "perturbative_rows",
    "REPLICATE_COLUMNS",
    "SCALAR_METRICS",
]

BOOTSTRAP_COLUMNS = artifacts.BOOTSTRAP_COLUMNS  # defined by resdyn.artifacts.BootstrapTable
REPLICATE_COLUMNS = artifacts.REPLICATE_COLUMNS
#: whole-model statistics whose replicates are kept (for paired comparisons across checkpoints)
SCALAR_METRICS = (
    "cum_erank_full_depth",
    "complex_fraction_early_minus_late",
    "henrici_early_minus_late",
    "symmetry_minus_identity_early_minus_late",
    "complex_fraction_beyond_noise_early_minus_late",
)
#: Range each metric can take, given d: where a studentized interval is clipped.
METRIC_RANGE: dict[str, Callable[[int], tuple[float, float]]] = {
    "henrici": lambda d: (0.0, 1.0),
    "complex_fraction": lambda d: (0.0, 1.0),
    "cum_erank_full_depth": lambda d: (1.0, float(d)),
    "complex_fraction_early_minus_late": lambda d: (-1.0, 1.0),
    "henrici_early_minus_late": lambda d: (-1.0, 1.0),
    "symmetry_minus_identity": lambda d: (0.0, 2.0),
    "complex_fraction_beyond_noise": lambda d: (0.0, 1.0),
    "cum_erank": lambda d: (1.0, float(d)),
    "symmetry_minus_identity_early_minus_late": lambda d: (-2.0, 2.0),
    "complex_fraction_beyond_noise_early_minus_late": lambda d: (-1.0, 1.0),
}
NOT_BOOTSTRAPPED_NOTE = (
    "not bootstrapped: RSS is a deterministic function of the tuned-lens translators; its sampling "
    "uncertainty would need a lens-data bootstrap (refitting every translator per resample), not afforded"
)


# --------------------------------------------------------------------------------------------
# generic utilities


def _check_level(level: Any) -> float:
    try:
        f = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}") from None
    if not (math.isfinite(f) and 0.0 < f < 1.0):
        raise ValueError(f"level must be in (0, 1) (e.g. 0.95), got {level!r}")
    return f


def percentile_ci(values: Any, level: float = 0.95) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap replicates: the (1−level)/2 and (1+level)/2 quantiles.

    Args:
        values: (R,) replicate values, or (R, ...) for several statistics at once (axis 0).
        level: coverage in (0, 1).
    Returns:
        (low, high) floats for 1-D input, arrays of shape ``values.shape[1:]`` otherwise. Any
        NaN replicate makes that statistic's interval NaN (it is never silently dropped).
    Example:
        >>> percentile_ci(np.arange(101.0), 0.5)  # quartiles of 0..100
        (25.0, 75.0)
        >>> percentile_ci(np.full(50, 3.0))
        (3.0, 3.0)
    """
    lvl = _check_level(level)
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise ValueError(f"values must hold at least one replicate along axis 0, got shape {arr.shape}")
    q = np.quantile(arr, [(1.0 - lvl) / 2.0, (1.0 + lvl) / 2.0], axis=0)
    if arr.ndim == 1:
        return float(q[0]), float(q[1])
    return q[0], q[1]


#: Interval kinds of :func:`replicate_ci` over bootstrap resamples (``bootstrap.interval``).
INTERVALS = ("percentile", "studentized")
#: The interval kind of delete-one-group jackknife replicates (the Jacobian files' group means).
JACKKNIFE = "jackknife"


def studentized_ci(values: Any, estimate: Any, level: float = 0.95) -> tuple[float, float]:
    """Bootstrap-t standard-error interval: estimate ± t_{R−1, (1+level)/2} · sd(replicates).

    sd is the sample standard deviation (ddof 1) of the R replicates; the t quantile with R − 1
    degrees of freedom accounts for estimating the standard error from few replicates, so the
    interval keeps its level with R as small as 6 when the statistic is near-normal (a normal
    statistic with the bootstrap's standard error: coverage exactly ``level``). A constant
    statistic gives a zero-width interval; a NaN replicate or estimate gives NaN.

    Example:
        >>> lo, hi = studentized_ci([1.0, 2.0, 3.0], 2.0, 0.95)  # 2 ± t_{2, 0.975} · 1
        >>> round(lo, 4), round(hi, 4)
        (-2.3027, 6.3027)
    """
    from scipy.stats import t as student_t

    lvl = _check_level(level)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size < 2:
        raise ValueError(f"a studentized interval needs ≥ 2 replicates (1-D), got shape {v.shape}")
    half = float(student_t.ppf((1.0 + lvl) / 2.0, v.size - 1)) * float(np.std(v, ddof=1))
    est = float(estimate)
    return est - half, est + half


def replicate_ci(
    values: Any,
    estimate: Any,
    level: float = 0.95,
    interval: str = "percentile",
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> tuple[float, float]:
    """The interval of ``bootstrap.interval``: :func:`percentile_ci` of the replicates or
    :func:`studentized_ci` around ``estimate`` (or, for delete-one-group replicates, ``jackknife``:
    :func:`resdyn.numerics.resampling.jackknife_interval`), intersected with ``bounds``, the range the
    statistic can take (a fraction lies in [0, 1]). Clipping never lowers coverage: the true
    value lies inside ``bounds``. Percentile endpoints are replicate values, so already inside.

    Example:
        >>> replicate_ci([0.0, 0.0, 0.1, 0.0, 0.0, 0.05], 0.02, 0.95, "studentized", (0.0, 1.0))[0]
        0.0
    """
    if interval == "percentile":
        low, high = percentile_ci(np.asarray(values, dtype=np.float64).ravel(), level)
    elif interval == "studentized":
        low, high = studentized_ci(values, estimate, level)
    elif interval == JACKKNIFE:
        _, low, high = jackknife_interval(values, estimate, _check_level(level))
    else:
        raise ValueError(f"bootstrap.interval must be one of {list(INTERVALS)}, got {interval!r}")
    lo_b, hi_b = bounds
    # NaN endpoints stay NaN (min/max would silently replace them)
    return (
        low if math.isnan(low) else min(max(low, lo_b), hi_b),
        high if math.isnan(high) else max(min(high, hi_b), lo_b),
    )


def bootstrap_indices(n_samples: int, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n_samples) int64 indices drawn with replacement, ``default_rng(seed)``.

    Depends only on (n_samples, n_resamples, seed): the same call on two checkpoints resamples
    the same samples, so their replicates pair up.

    Example:
        >>> idx = bootstrap_indices(4, 3, seed=0)
        >>> idx.shape, bool(((idx >= 0) & (idx < 4)).all())
        ((3, 4), True)
    """
    n = check_int(n_samples, "n_samples", 1)
    r = check_int(n_resamples, "n_resamples", 1)
    s = check_int(seed, "seed", 0)
    return np.random.default_rng(s).integers(0, n, size=(r, n), dtype=np.int64)


def bootstrap(stat_fn: Callable[[np.ndarray], Any], n_samples: int, n_resamples: int, seed: int) -> np.ndarray:
    """Replicates ``stat_fn(idx)`` for each row of :func:`bootstrap_indices`.

    ``stat_fn`` takes an (n_samples,) index vector (the resampled samples, with repeats) and
    returns a number or an array; the result stacks them, shape (n_resamples, ...).

    Example:
        >>> x = np.array([1.0, 2.0, 3.0])
        >>> reps = bootstrap(lambda i: x[i].mean(), 3, 1000, seed=1)
        >>> reps.shape, bool(reps.min() >= 1.0 and reps.max() <= 3.0)
        ((1000,), True)
    """
    if not callable(stat_fn):
        raise ValueError(f"stat_fn must be callable (index vector -> statistic), got {type(stat_fn).__name__}")
    idx = bootstrap_indices(n_samples, n_resamples, seed)
    return np.asarray([stat_fn(row) for row in idx], dtype=np.float64)


def bootstrap_ci(
    stat_fn: Callable[[np.ndarray], Any], n_samples: int, n_resamples: int = 200, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """Point estimate (``stat_fn`` on all samples, in order) and its percentile interval.

    Returns {``estimate``, ``ci_low``, ``ci_high``, ``replicates`` (R, ...)}.

    Example:
        >>> r = bootstrap_ci(lambda i: 7.0, n_samples=5, n_resamples=20)
        >>> r["estimate"], r["ci_low"], r["ci_high"]
        (7.0, 7.0, 7.0)
    """
    lvl = _check_level(level)
    n = check_int(n_samples, "n_samples", 1)
    reps = bootstrap(stat_fn, n, n_resamples, seed)
    low, high = percentile_ci(reps, lvl)
    est = np.asarray(stat_fn(np.arange(n)), dtype=np.float64)
    return {"estimate": float(est) if est.ndim == 0 else est, "ci_low": low, "ci_high": high, "replicates": reps}


def early_late(n_sublayers: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first and the last third of S sublayers (``max(1, S // 3)`` each).

    Example:
        >>> [a.tolist() for a in early_late(12)], [a.tolist() for a in early_late(2)]
        ([[0, 1, 2, 3], [8, 9, 10, 11]], [[0], [1]])
    """
    S = check_int(n_sublayers, "n_sublayers", 2)
    third = max(1, S // 3)
    return np.arange(third), np.arange(S - third, S)


# --------------------------------------------------------------------------------------------
# perturbative replicate spectra (method "perturbative")

#: Bootstrap methods: ``exact`` decomposes every replicate; ``perturbative`` decomposes the
#: n-sample mean once and gets replicate spectra from perturbation theory, verified a posteriori.
METHODS = ("perturbative", "exact")
#: p and q are one cluster when their gap is below CLUSTER_TAU × their coupling (see below).
CLUSTER_TAU = 4.0
#: Replicates per sublayer decomposed exactly to check the perturbative ones (largest ‖F_r‖_F).
VERIFY_REPLICATES = 2
#: The check fails when a checked replicate's Henrici or complex count differs from the exact
#: one by more than this fraction of the perturbative interval's width (plus :data:`VERIFY_ATOL`).
VERIFY_FRACTION = 0.1
VERIFY_ATOL = 1e-9
#: Eigenvalue condition numbers κ_p = ‖x_p‖‖y_p‖ above this: eigenvectors too ill-conditioned.
COND_MAX = 1e8
#: The small eigenproblems of the clusters may cost at most this fraction of the exact method's
#: (Σ_C |C|³ ≤ CLUSTER_FRACTION · d³ per replicate); beyond it the method saves too little.
CLUSTER_FRACTION = 1.0 / 32.0


def _torch_device(device: Any) -> Any:
    import torch

    return torch.device(device) if linalg.on_cuda(device) else torch.device("cpu")


def _clusters(lam: np.ndarray, gap_min: np.ndarray, coupling: np.ndarray, tau: float) -> np.ndarray:
    """Cluster label per eigenvalue: p ~ q (transitively, union-find via connected components)
    when min(|λ_p − λ_q|, min_r |λ_p + F_pp − λ_q − F_qq|) < τ · max_r sqrt|F_pq F_qp|."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    gap = np.minimum(np.abs(lam[:, None] - lam[None, :]), gap_min)
    link = gap < tau * coupling
    np.fill_diagonal(link, False)
    _, labels = connected_components(csr_matrix(link | link.T), directed=False)
    return labels


def perturbative_spectra(
    X: np.ndarray,
    weights: np.ndarray,
    device: Any = None,
    tau: float = CLUSTER_TAU,
    chunk_bytes: int = 2 * 2**30,
) -> dict[str, Any]:
    """Eigenvalues and Henrici departures of every replicate J*_r = Σ_i w_ri J_i from ONE
    eigendecomposition of the n-sample mean J̄ = (1/n) Σ_i J_i.

    With J̄ = V Λ V⁻¹ (eigenvalues λ, unit eigenvectors), a replicate is V(Λ + F_r)V⁻¹ with

        F_r = V⁻¹ (J*_r − J̄) V = Σ_i (w_ri − 1/n) E_i,   E_i = V⁻¹ (J_i − J_0) V

    (deviations from sample 0, so identical samples give F_r = 0 exactly). The replicate's
    eigenvalues are those of Λ + F_r:

    * clusters: p ~ q when min(|λ_p − λ_q|, min_r |λ_p + F_r,pp − λ_q − F_r,qq|) < τ·max_r
      sqrt|F_r,pq F_r,qp| (the perturbation can mix or collide them), closed transitively;
      a conjugate pair with small |Im λ| is one cluster by the same rule, which is what lets a
      pair turn into two real eigenvalues and back.
    * an isolated eigenvalue (cluster of one): second order,
      λ*_p = λ_p + F_pp + Σ_{q≠p} F_pq F_qp / (λ_p − λ_q), its real part when λ_p is real
      (a simple real eigenvalue of a real matrix stays real under a small real perturbation).
    * a cluster C: the eigenvalues of the |C|×|C| effective matrix (quasi-degenerate
      perturbation theory, Löwdin partitioning)
      H_ab = λ_a δ_ab + F_ab + ½ Σ_{q∉C} F_aq F_qb (1/(λ_a − λ_q) + 1/(λ_b − λ_q)).

    Henrici without cancellation in the real parts (:func:`_henrici_from_quadratics`), from exact
    quadratic terms (:func:`_exact_quadratics`); only Σ(Im λ*)² is perturbative.

    Args:
        X: (n, d, d) real per-sample Jacobians.
        weights: (R, n) replicate weights (rows sum to 1).
        device: None/"cpu" or a CUDA device (torch.linalg.eig and the GEMMs run there).
        tau: cluster threshold :data:`CLUSTER_TAU`.
    Returns:
        {``eigvals`` (R, d) complex or None, ``henrici`` (R,), ``norm_F`` (R,) ‖F_r‖_F,
        ``cluster_sizes`` list, ``cond`` max κ_p, ``reason`` "" or why the perturbative path
        cannot be used (then ``eigvals`` is None)}.
    """
    import torch

    dev = _torch_device(device)
    n, d = X.shape[0], X.shape[1]
    R = weights.shape[0]
    Xt = torch.as_tensor(X, dtype=torch.float64, device=dev)
    Z = Xt.clone()
    Z[1:] -= Xt[0]  # Z = (J_0, J_1 − J_0, …)
    D = Z.clone()
    D[0] = 0.0  # D_i = J_i − J_0, D_0 = 0 exactly
    fro2, asym2 = _exact_quadratics(Z, weights, dev)
    out: dict[str, Any] = dict(eigvals=None, henrici=None, norm_F=None, cluster_sizes=[], cond=math.nan, reason="")
    lam_t, V, Vinv, cond = _mean_eigenbasis(Xt[0] + D.mean(0))
    out["cond"] = cond
    if not math.isfinite(cond) or cond > COND_MAX:
        out["reason"] = f"eigenvectors of the n-sample mean ill-conditioned (max κ = {cond:.3g} > {COND_MAX:g})"
        return out
    E = torch.stack([Vinv @ D[i].to(torch.complex128) @ V for i in range(n)])  # (n, d, d)
    del D, Z, Xt
    C = torch.as_tensor(weights - 1.0 / n, dtype=torch.complex128, device=dev)  # (R, n)
    lam = lam_t.cpu().numpy()
    B = max(1, int(chunk_bytes // (3 * 16 * d * d)))

    gap_min, coupling, out["norm_F"] = _cluster_extremes(_replicate_blocks(C, E, B), lam_t, R)
    labels = _clusters(lam, gap_min.cpu().numpy(), coupling.cpu().numpy(), tau)
    del gap_min, coupling
    groups = [np.flatnonzero(labels == c) for c in range(labels.max() + 1)]
    multi = [g for g in groups if g.size > 1]
    out["cluster_sizes"] = sorted((int(g.size) for g in multi), reverse=True)
    if sum(float(g.size) ** 3 for g in multi) > CLUSTER_FRACTION * float(d) ** 3:
        out["reason"] = (
            f"perturbation not small against the eigenvalue gaps: clusters of sizes "
            f"{out['cluster_sizes'][:5]} (of d = {d}) would cost more than {CLUSTER_FRACTION:.3g} "
            "of exact decompositions"
        )
        return out
    lam_star = _perturbed_eigvals(_replicate_blocks(C, E, B), lam_t, lam, labels, multi, R)
    out.update(eigvals=lam_star, henrici=_henrici_from_quadratics(fro2, asym2, lam_star))
    return out


def _exact_quadratics(Z: Any, weights: np.ndarray, dev: Any) -> tuple[np.ndarray, np.ndarray]:
    """‖J*_r‖_F² = v_r G v_r and ½‖J*_r − J*_rᵀ‖_F² = v_r A v_r of every replicate, exactly.

    Z = (J_0, J_1 − J_0, …, J_{n−1} − J_0),
    G_ij = ⟨Z_i, Z_j⟩, A_ij = ½⟨Z_i − Z_iᵀ, Z_j − Z_jᵀ⟩, v_r = (1, w_r1, …, w_r,n−1): J*_r =
    J_0 + Σ_{i≥1} w_ri (J_i − J_0) since Σ_i w_ri = 1.
    """
    import torch

    n = Z.shape[0]
    R = weights.shape[0]
    flat = Z.reshape(n, -1)
    G = flat @ flat.T
    asym = (Z - Z.transpose(1, 2)).reshape(n, -1)
    A = 0.5 * (asym @ asym.T)
    del asym
    v = torch.cat(
        [
            torch.ones(R, 1, dtype=torch.float64, device=dev),
            torch.as_tensor(weights[:, 1:], dtype=torch.float64, device=dev),
        ],
        1,
    )
    fro2 = torch.einsum("ri,ij,rj->r", v, G, v).cpu().numpy()
    asym2 = torch.einsum("ri,ij,rj->r", v, A, v).cpu().numpy()
    return fro2, asym2


def _mean_eigenbasis(Jbar: Any) -> tuple[Any, Any, Any, float]:
    """(λ, V, V⁻¹, max_p κ_p) of J̄ = V Λ V⁻¹, κ_p = ‖V_{:,p}‖ ‖V⁻¹_{p,:}‖ (eigenvalue condition numbers)."""
    import torch

    lam_t, V = torch.linalg.eig(Jbar)
    Vinv = torch.linalg.inv(V)
    cond = float((torch.linalg.vector_norm(V, dim=0) * torch.linalg.vector_norm(Vinv, dim=1)).max())
    return lam_t, V, Vinv, cond


def _replicate_blocks(C: Any, E: Any, B: int) -> Iterator[tuple[int, Any]]:
    """(r0, F) for blocks of B replicates: F_r = Σ_i C_ri E_i, C_ri = w_ri − 1/n."""
    import torch

    for r0 in range(0, C.shape[0], B):
        yield r0, torch.einsum("rn,npq->rpq", C[r0 : r0 + B], E)


def _cluster_extremes(blocks: Iterable[tuple[int, Any]], lam_t: Any, R: int) -> tuple[Any, Any, np.ndarray]:
    """The cluster criterion's extremes over replicates: (min_r |λ_p + F_r,pp − λ_q − F_r,qq|,
    max_r sqrt|F_r,pq F_r,qp|, ‖F_r‖_F per replicate)."""
    import torch

    d = lam_t.shape[0]
    dev = lam_t.device
    gap_min = torch.full((d, d), math.inf, dtype=torch.float64, device=dev)
    coupling = torch.zeros((d, d), dtype=torch.float64, device=dev)
    normF = np.empty(R)
    for r0, F in blocks:
        diag = lam_t[None, :] + F.diagonal(dim1=1, dim2=2)
        gap_min = torch.minimum(gap_min, (diag[:, :, None] - diag[:, None, :]).abs().amin(0))
        coupling = torch.maximum(coupling, (F * F.transpose(1, 2)).abs().sqrt().amax(0))
        normF[r0 : r0 + F.shape[0]] = torch.linalg.matrix_norm(F).cpu().numpy()
    return gap_min, coupling, normF


def _perturbed_eigvals(
    blocks: Iterable[tuple[int, Any]],
    lam_t: Any,
    lam: np.ndarray,
    labels: np.ndarray,
    multi: list[np.ndarray],
    R: int,
) -> np.ndarray:
    """(R, d) replicate eigenvalues: second order λ_p + F_pp + Σ_{q∉C(p)} F_pq F_qp / (λ_p − λ_q) for an
    isolated eigenvalue (real part when λ_p is real), eigenvalues of the Löwdin effective matrix
    H_ab = λ_a δ_ab + F_ab + ½ Σ_{q∉C} F_aq F_qb (1/(λ_a − λ_q) + 1/(λ_b − λ_q)) for each cluster C in ``multi``."""
    import torch

    d = lam_t.shape[0]
    dev = lam_t.device
    same = torch.as_tensor(labels[:, None] == labels[None, :], device=dev)
    diff = lam_t[:, None] - lam_t[None, :]
    K = torch.where(same, torch.zeros((), dtype=torch.complex128, device=dev), 1.0 / torch.where(same, 1.0, diff))
    real_single = torch.as_tensor((lam.imag == 0) & (np.bincount(labels)[labels] == 1), device=dev)
    lam_star = np.empty((R, d), dtype=np.complex128)
    for r0, F in blocks:
        Ft = F.transpose(1, 2)
        val = lam_t[None, :] + F.diagonal(dim1=1, dim2=2) + (F * Ft * K[None]).sum(-1)
        val = torch.where(real_single[None], val.real.to(torch.complex128), val)
        for g in multi:
            gi = torch.as_tensor(g, device=dev)
            Fr = F[:, gi, :]  # (b, m, d)
            Fc = F[:, :, gi]  # (b, d, m)
            Kg = K[gi, :]  # (m, d): zero on the cluster's own columns
            H = torch.diag_embed(lam_t[gi]).expand(F.shape[0], -1, -1) + Fr[:, :, gi]
            H = H + 0.5 * ((Fr * Kg[None]) @ Fc + Fr @ (Kg.T[None] * Fc))
            val[:, gi] = torch.linalg.eigvals(H)
        lam_star[r0 : r0 + F.shape[0]] = val.cpu().numpy()
    return lam_star


def _henrici_from_quadratics(fro2: np.ndarray, asym2: np.ndarray, lam_star: np.ndarray) -> np.ndarray:
    """min(1, ‖N‖_F / ‖J‖_F) per replicate, 0 where ‖J‖_F = 0.

    For real J, Σ|λ|² = tr(J²) + 2 Σ (Im λ)², so ‖N‖_F² = ‖J‖_F² − Σ|λ|² = ½‖J − Jᵀ‖_F² − 2 Σ_p (Im λ_p)²:
    no cancellation in the real parts. ``fro2`` = ‖J‖_F², ``asym2`` = ½‖J − Jᵀ‖_F² (exact), ``lam_star``
    the (perturbative) eigenvalues.
    """
    nn2 = asym2 - 2.0 * np.sum(lam_star.imag**2, axis=1)
    fro = np.sqrt(np.maximum(fro2, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(fro > 0, np.minimum(1.0, np.sqrt(np.maximum(nn2, 0.0)) / fro), 0.0)


def perturbative_rows(
    X: np.ndarray,
    weights: np.ndarray,
    complex_tol: float,
    level: float,
    device: Any = None,
    n_verify: int = VERIFY_REPLICATES,
) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """Henrici and complex fraction of every replicate by :func:`perturbative_spectra`, checked
    a posteriori against exact decompositions of ``n_verify`` replicates (those with the largest
    ‖F_r‖_F, where perturbation theory is least accurate).

    The check fails when a checked replicate's Henrici differs by more than
    VERIFY_FRACTION × (width of the perturbative Henrici interval) + VERIFY_ATOL, or its complex
    count (complex fraction × d) by more than VERIFY_FRACTION × (the count interval's width).
    Checked replicates keep their exact values.

    Returns:
        (henrici (R,), complex_fraction (R,), note) — or (None, None, reason) when the
        perturbative path does not apply (ill-conditioned eigenvectors, clusters as costly as
        exact decompositions, or the check failed): the caller then decomposes every replicate.
    """
    if not np.isfinite(X).all():
        return None, None, "non-finite per-sample Jacobians"
    res = perturbative_spectra(X, weights, device)
    if res["eigvals"] is None:
        return None, None, res["reason"]
    d = X.shape[1]
    h = np.asarray(res["henrici"], dtype=np.float64).copy()
    cf = np.array([spectral.complex_fraction(lam, complex_tol) for lam in res["eigvals"]])
    width_h = float(np.subtract(*percentile_ci(h, level)[::-1]))
    width_c = float(np.subtract(*percentile_ci(cf, level)[::-1])) * d
    checked = np.argsort(-res["norm_F"], kind="stable")[: max(0, min(int(n_verify), len(h)))]
    worst_h, worst_c = 0.0, 0.0
    for r in checked:
        lam, nn, fro = linalg.eigen_henrici(np.einsum("n,nij->ij", weights[r], X), device)
        he = min(1.0, nn / fro) if fro > 0 else 0.0
        ce = spectral.complex_fraction(lam, complex_tol)
        worst_h = max(worst_h, abs(he - h[r]))
        worst_c = max(worst_c, abs(ce - cf[r]) * d)
        h[r], cf[r] = he, ce
    if worst_h > VERIFY_FRACTION * width_h + VERIFY_ATOL or worst_c > VERIFY_FRACTION * width_c:
        return (
            None,
            None,
            (
                f"a-posteriori check failed on {len(checked)} exact replicates: |Δhenrici| "
                f"{worst_h:.2g} vs interval width {width_h:.2g}, |Δcomplex count| {worst_c:g} vs "
                f"{width_c:g} (allowed fraction {VERIFY_FRACTION:g})"
            ),
        )
    sizes = res["cluster_sizes"]
    note = (
        f"perturbative (clusters {sizes[:3] if sizes else 'none'}; checked on {len(checked)} exact "
        f"replicates: |Δhenrici| ≤ {worst_h:.2g}, |Δcomplex count| ≤ {worst_c:g})"
    )
    return h, cf, note


# --------------------------------------------------------------------------------------------
# the bootstrap of the operator metrics


def _ordered_keys(per_sample: Mapping[tuple[int, str], Any]) -> list[tuple[int, str]]:
    keys = sorted(per_sample, key=lambda key: spectral.sublayer_index(*key))
    spectral.check_chain(keys, "per-sample Jacobians")
    return keys


def _load(x: Any) -> np.ndarray:
    return np.asarray(x() if callable(x) else x, dtype=np.float64)


def jacobian_bootstrap(
    per_sample: Mapping[tuple[int, str], Any],
    n_resamples: int = 200,
    seed: int = 0,
    level: float = 0.95,
    complex_tol: float = 1e-6,
    means: Mapping[tuple[int, str], Any] | None = None,
    n_samples_total: int | None = None,
    memory_budget: int | None = None,
    device: Any = None,
    method: str = "exact",
    interval: str = "percentile",
    noise_bounds: Sequence[float] | None = None,
    per_depth_erank: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Bootstrap over samples of Henrici departure, complex fraction and the full-depth rank.

    Args:
        per_sample: {(layer, kind): (n, d, d) per-sample Jacobians, or a loader}; sublayers
            s = 0..S−1 without gaps, all with the same n ≥ 2 (the same samples, in order).
        n_resamples, seed, level: see :func:`bootstrap_indices`, :func:`percentile_ci`.
        complex_tol: tolerance of the complex fraction.
        means: optional {(layer, kind): all-N mean Jacobian or loader} → ``estimate_all_samples``.
        n_samples_total: N of ``means`` (default n).
        memory_budget: bytes of (d, d) replicate matrices held at once; replicates beyond it are
            processed in further passes over the files (each pass reloads and decompresses
            every sublayer). Default :func:`resdyn.cluster.cost.bootstrap_memory_budget`: every row in
            one pass up to 16 GiB (one pass at d = 4096, R = 50), the size the job requests.
        device: None/"cpu" or a CUDA device for the eigenvalues (:func:`resdyn.numerics.linalg.eigen_henrici`).
        method: ``exact`` (every replicate decomposed) or ``perturbative`` (replicate spectra of
            each sublayer from one decomposition of its n-sample mean, :func:`perturbative_rows`;
            a sublayer where that does not apply or fails its a-posteriori check is decomposed
            exactly, and its rows' ``method`` and ``note`` say why). The estimates (rows of the
            two means) and ``cum_erank_full_depth`` are exact in both.
        interval: ``percentile`` or ``studentized`` (:func:`replicate_ci`; the latter keeps its
            level with few resamples, e.g. 6, at the price of a wider interval); or ``jackknife``:
            ``per_sample`` are then the B equal groups' mean Jacobians over all N samples
            (``n_samples_total``), the replicates the B delete-one-group means, the interval
            :func:`resdyn.numerics.resampling.jackknife_interval` (``n_resamples``, ``seed`` unused).
        noise_bounds: τ per sublayer (chain order; :func:`resdyn.study_a.rotation.imag_noise_bound`):
            adds ``complex_fraction_beyond_noise`` rows (exact decompositions only).
        per_depth_erank: ``cum_erank`` rows for every s (one svdvals per row and sublayer), else
            only ``cum_erank_full_depth``.
    Returns:
        ``(table, replicates)``: table with :data:`BOOTSTRAP_COLUMNS` — per sublayer
        ``henrici``, ``complex_fraction``, ``symmetry_minus_identity`` (of J − I), with
        ``noise_bounds`` ``complex_fraction_beyond_noise``, and ``cum_erank`` (of P_s) rows, then
        ``cum_erank_full_depth`` (layer and kind of the last sublayer), and the early-minus-late
        differences of complex fraction, Henrici, symmetry index (and beyond-noise share) (kind
        ``all``); replicates: long table
        (``replicate``, ``metric``, ``value``) of the :data:`SCALAR_METRICS`.
    Cost: (R + 2) × S eigen-analyses of d × d matrices — one Schur factor each on the host
    (eigenvalues and Henrici from the same factor, half the cost of a Schur factor plus eigvals),
    torch eigvals on a GPU — plus (R + 2) × S fp64 products and one svdvals per row
    (:func:`resdyn.cluster.cost.cost_bootstrap`).
    """
    R, seed, lvl, tol = _check_bootstrap_options(n_resamples, seed, level, complex_tol, method, interval)
    keys, first = _check_per_sample(per_sample, means)
    n, d = first.shape[0], first.shape[1]
    total = n if n_samples_total is None else check_int(n_samples_total, "n_samples_total", n)
    weights, R, seed = _row_weights(interval, n, R, seed)
    rows_total = R + 2
    if memory_budget is None:
        from resdyn.cluster.cost import bootstrap_memory_budget

        memory_budget = bootstrap_memory_budget(d, rows_total)
    chunk = max(1, int(memory_budget) // (2 * d * d * 8))
    acc = _BootstrapRows.empty(rows_total, len(keys), method)
    bounds = None if noise_bounds is None else np.asarray(noise_bounds, dtype=np.float64)
    if bounds is not None and bounds.shape != (len(keys),):
        raise ValueError(f"noise_bounds has shape {bounds.shape}; expected one per sublayer ({len(keys)},)")
    stream = _BootstrapStream(
        per_sample, keys, means, weights, n, d, tol, lvl, device, method, bounds, bool(per_depth_erank)
    )
    cache: np.ndarray | None = first
    for start in range(0, rows_total, chunk):
        stream.run_pass(acc, np.arange(start, min(rows_total, start + chunk)), cache)
        cache = None
    return _bootstrap_tables(acc, keys, d, n, total, R, seed, lvl, tol, method, interval)


def _check_bootstrap_options(
    n_resamples: int, seed: int, level: float, complex_tol: float, method: str, interval: str
) -> tuple[int, int, float, float]:
    """(R, seed, level, complex_tol) of :func:`jacobian_bootstrap`, checked."""
    R = check_int(n_resamples, "n_resamples", 1)
    seed = check_int(seed, "seed", 0)
    if method not in METHODS:
        raise ValueError(f"bootstrap.method must be one of {list(METHODS)}, got {method!r}")
    if interval not in (*INTERVALS, JACKKNIFE):
        raise ValueError(f"bootstrap.interval must be one of {list(INTERVALS)}, got {interval!r}")
    if interval == "studentized" and R < 2:
        raise ValueError(f"bootstrap.interval studentized needs n_resamples ≥ 2, got {R}")
    lvl = _check_level(level)
    tol = float(complex_tol)
    if not (math.isfinite(tol) and tol >= 0):
        raise ValueError(f"complex_tol must be a finite number ≥ 0, got {complex_tol!r}")
    return R, seed, lvl, tol


def _check_per_sample(
    per_sample: Mapping[tuple[int, str], Any], means: Mapping[tuple[int, str], Any] | None
) -> tuple[list[tuple[int, str]], np.ndarray]:
    """(sublayer keys in chain order, the first sublayer's (n, d, d) Jacobians), checked."""
    if not isinstance(per_sample, Mapping) or not per_sample:
        raise ValueError("per_sample must be a non-empty mapping {(layer, kind): (n, d, d) array or loader}")
    keys = _ordered_keys(per_sample)
    if means is not None:
        missing = [key for key in keys if key not in means]
        if missing:
            raise ValueError(f"means lacks sublayers {missing}")
    first = _load(per_sample[keys[0]])
    if first.ndim != 3 or first.shape[1] != first.shape[2]:
        raise ValueError(f"per_sample[{keys[0]}] must be (n, d, d), got shape {first.shape}")
    n = first.shape[0]
    if n < 2:
        raise ValueError(f"the bootstrap needs at least 2 stored samples, got n = {n} (raise jacobian.store_first_n)")
    return keys, first


def _row_weights(interval: str, n: int, R: int, seed: int) -> tuple[np.ndarray, int, int]:
    """(weights, R, seed) of the rows: the jackknife's B = n delete-one-group rows (seed 0) or the
    bootstrap's R resamples (:func:`_bootstrap_weights`)."""
    if interval == JACKKNIFE:  # per_sample are the B group means; rows 2.. delete one group each
        return np.vstack([np.full((2, n), 1.0 / n), jackknife_weights(n)]), n, 0
    return _bootstrap_weights(n, R, seed), R, seed


def _bootstrap_weights(n: int, R: int, seed: int) -> np.ndarray:
    """(R + 2, n) row weights: rows 0 (all-N mean, when given) and 1 (mean of the n stored samples)
    weigh 1/n each; rows 2.. are the replicates, w_ri = (times sample i is drawn) / n."""
    idx = bootstrap_indices(n, R, seed)
    weights = np.stack([np.bincount(row, minlength=n) for row in idx]).astype(np.float64) / n  # (R, n)
    return np.vstack([np.full((1, n), 1.0 / n), np.full((1, n), 1.0 / n), weights])


@dataclass
class _BootstrapRows:
    """Per-row results of :func:`jacobian_bootstrap`, filled pass by pass: ``henrici``, ``cfrac``,
    ``sym`` (symmetry index of J − I), ``cf_noise`` (complex fraction beyond the noise bound, NaN
    without bounds or for perturbative rows) and ``cum_erank`` (erank of P_s) (rows, S), ``erank``
    (rows,), and per sublayer whether its replicates are decomposed one by
    one (``exact_rows``), the method used (``how``) and its note (``why``)."""

    henrici: np.ndarray
    cfrac: np.ndarray
    erank: np.ndarray
    exact_rows: np.ndarray
    sym: np.ndarray
    cf_noise: np.ndarray
    cum_erank: np.ndarray
    how: list[str]
    why: list[str]

    @classmethod
    def empty(cls, rows_total: int, S: int, method: str) -> _BootstrapRows:
        """NaN metrics; every sublayer exact when ``method`` is ``exact``, else perturbative until it falls back."""
        return cls(
            henrici=np.full((rows_total, S), np.nan),
            cfrac=np.full((rows_total, S), np.nan),
            erank=np.full(rows_total, np.nan),
            exact_rows=np.full(S, method == "exact"),
            sym=np.full((rows_total, S), np.nan),
            cf_noise=np.full((rows_total, S), np.nan),
            cum_erank=np.full((rows_total, S), np.nan),
            how=[method] * S,
            why=[""] * S,
        )


@dataclass
class _BootstrapStream:
    """One pass of :func:`jacobian_bootstrap` over the sublayers for a block of rows: the resampled
    means J*_r = Σ_i w_ri J_i of each sublayer, their spectra, and the running normalised products
    whose effective rank is ``cum_erank_full_depth``."""

    per_sample: Mapping[tuple[int, str], Any]
    keys: list[tuple[int, str]]
    means: Mapping[tuple[int, str], Any] | None
    weights: np.ndarray
    n: int
    d: int
    tol: float
    lvl: float
    device: Any
    method: str
    noise_bounds: np.ndarray | None = None
    per_depth: bool = True

    @property
    def on_gpu(self) -> bool:
        """Whether the running products (and the eigenvalues) are on a CUDA device."""
        return linalg.on_cuda(self.device)

    @property
    def on_device_means(self) -> bool:
        """Whether the resampled means are formed on the device (one GEMM, not streamed on the host)."""
        return self.on_gpu and self.method == "perturbative"

    def run_pass(self, acc: _BootstrapRows, rows: np.ndarray, cache: np.ndarray | None) -> None:
        """Fill ``acc`` for ``rows``; ``cache`` is the first sublayer's Jacobians when already loaded."""
        n, d = self.n, self.d
        products = [linalg.NormalisedProduct() for _ in rows]
        for s, key in enumerate(self.keys):
            X = cache if (s == 0 and cache is not None) else _load(self.per_sample[key])
            if X.shape != (n, d, d):
                raise ValueError(f"per_sample[{key}] has shape {X.shape}; expected {(n, d, d)} like {self.keys[0]}")
            mats = self._resampled_means(acc, s, key, X, rows)
            self._decompose(acc, s, rows, mats, products)
        acc.erank[rows] = acc.cum_erank[rows, -1]

    def _resampled_means(
        self, acc: _BootstrapRows, s: int, key: tuple[int, str], X: np.ndarray, rows: np.ndarray
    ) -> Any:
        """(len(rows), d, d) J*_r = Σ_i w_ri J_i; in the pass holding row 0 that row is the all-N mean
        (NaN without ``means``) and a perturbative sublayer gets its replicate rows from
        :func:`perturbative_rows`, or falls back to exact decompositions."""
        device = self.device
        if self.on_device_means:
            import torch

            mats = torch.einsum(
                "rn,nij->rij", torch.as_tensor(self.weights[rows], device=device), torch.as_tensor(X, device=device)
            )
        else:
            mats = np.einsum("rn,nij->rij", self.weights[rows], X)
        if rows[0] == 0:
            if self.means is not None:
                mean = _load(self.means[key])
                mats[0] = torch.as_tensor(mean, device=device) if self.on_device_means else mean
            else:
                mats[0] = np.nan
            if not acc.exact_rows[s]:
                h_p, cf_p, acc.why[s] = perturbative_rows(X, self.weights[2:], self.tol, self.lvl, device)
                if h_p is None:
                    acc.exact_rows[s], acc.how[s] = True, "exact-fallback"
                else:
                    acc.henrici[2:, s], acc.cfrac[2:, s] = h_p, cf_p
        return mats

    def _decompose(
        self, acc: _BootstrapRows, s: int, rows: np.ndarray, mats: Any, products: list[linalg.NormalisedProduct]
    ) -> None:
        """Henrici and complex fraction of the finite rows that are estimates or exact replicates, and
        every finite row pushed onto its running product (on the device when there is one: 2 d³ fp64
        GEMMs there)."""
        if self.on_gpu:
            import torch
        for j, r in enumerate(rows):
            J = mats[j]
            if not (bool(torch.isfinite(J).all()) if self.on_device_means else np.isfinite(J).all()):
                continue
            host = J.cpu().numpy() if self.on_device_means else J
            acc.sym[r, s] = spectral.symmetry_index(host, shift=1.0)
            if r < 2 or acc.exact_rows[s]:
                lam, nn, fro = linalg.eigen_henrici(host, self.device)
                acc.henrici[r, s] = min(1.0, nn / fro) if fro > 0 else 0.0
                acc.cfrac[r, s] = spectral.complex_fraction(lam, self.tol)
                if self.noise_bounds is not None:
                    acc.cf_noise[r, s] = complex_fraction_beyond_noise(lam, self.noise_bounds[s])
            products[j].push(torch.as_tensor(J, device=self.device) if self.on_gpu else J)
            if self.per_depth or s == len(self.keys) - 1:
                acc.cum_erank[r, s] = self._product_erank(products[j].P)

    def _product_erank(self, P: Any) -> float:
        """Effective rank of a running product (NaN when not finite)."""
        if self.on_gpu:
            import torch

            return (
                linalg.effective_rank(torch.linalg.svdvals(P).cpu().numpy())
                if bool(torch.isfinite(P).all())
                else np.nan
            )
        return linalg.effective_rank(np.linalg.svd(P, compute_uv=False)) if np.isfinite(P).all() else np.nan


@dataclass(frozen=True)
class _RowContext:
    """What every row of the bootstrap table shares: the interval (``lvl``, ``interval``, d for the
    metric's range), the ``common`` columns and the table-wide ``note``."""

    lvl: float
    interval: str
    d: int
    common: dict[str, Any]
    note: str

    def row(
        self, metric: str, layer: Any, kind: str, s: Any, values: np.ndarray, extra: str = "", used: str = "exact"
    ) -> dict[str, Any]:
        """One table row: estimate values[1], all-N estimate values[0], interval of the replicates values[2:]."""
        low, high = replicate_ci(values[2:], values[1], self.lvl, self.interval, METRIC_RANGE[metric](self.d))
        return {
            "metric": metric,
            "layer": layer,
            "kind": kind,
            "s": s,
            "estimate": float(values[1]),
            "ci_low": low,
            "ci_high": high,
            "estimate_all_samples": float(values[0]),
            **self.common,
            "note": "; ".join(x for x in (self.note, extra) if x),
            "reason": "",
            "method": used,
            "interval": self.interval,
        }


def _bootstrap_tables(
    acc: _BootstrapRows,
    keys: list[tuple[int, str]],
    d: int,
    n: int,
    total: int,
    R: int,
    seed: int,
    lvl: float,
    tol: float,
    method: str,
    interval: str,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``(table, replicates)`` of :func:`jacobian_bootstrap` from its per-row results; the
    early-minus-late scalars are means over :func:`early_late` sublayers."""
    S = len(keys)
    henrici, cfrac, how, why = acc.henrici, acc.cfrac, acc.how, acc.why
    early, late = early_late(S) if S >= 2 else (np.arange(1), np.arange(1))
    scalars = {
        "cum_erank_full_depth": acc.erank,
        "complex_fraction_early_minus_late": cfrac[:, early].mean(1) - cfrac[:, late].mean(1),
        "henrici_early_minus_late": henrici[:, early].mean(1) - henrici[:, late].mean(1),
        "symmetry_minus_identity_early_minus_late": acc.sym[:, early].mean(1) - acc.sym[:, late].mean(1),
    }
    with_noise = bool(np.isfinite(acc.cf_noise[1]).all())  # bounds given and every sublayer decomposed
    if with_noise:
        cfn = acc.cf_noise
        scalars["complex_fraction_beyond_noise_early_minus_late"] = cfn[:, early].mean(1) - cfn[:, late].mean(1)
    common = {
        "level": lvl,
        "n_resamples": R,
        "n_bootstrap_samples": total if interval == JACKKNIFE else n,
        "n_samples_total": total,
        "seed": seed,
        "bootstrapped": True,
    }
    if interval == JACKKNIFE:
        note = f"delete-one-group jackknife over {n} groups of {total // n} samples (all {total} samples)"
    else:
        note = "" if n == total else f"bootstrap over the first {n} of {total} samples (jacobian.store_first_n)"
    row = _RowContext(lvl, interval, d, common, note).row
    out = []
    for s, (layer, kind) in enumerate(keys):
        out.append(row("henrici", layer, kind, s, henrici[:, s], why[s], how[s]))
    for s, (layer, kind) in enumerate(keys):
        extra = "; ".join(x for x in (f"tol {tol:g}", why[s]) if x)
        out.append(row("complex_fraction", layer, kind, s, cfrac[:, s], extra, how[s]))
    for s, (layer, kind) in enumerate(keys):
        out.append(row("symmetry_minus_identity", layer, kind, s, acc.sym[:, s]))
    if with_noise:
        for s, (layer, kind) in enumerate(keys):
            out.append(row("complex_fraction_beyond_noise", layer, kind, s, acc.cf_noise[:, s], "τ: spectra.tsv"))
    if np.isfinite(acc.cum_erank[1, 0]):  # per_depth_erank
        for s, (layer, kind) in enumerate(keys):
            out.append(row("cum_erank", layer, kind, s, acc.cum_erank[:, s]))
    last_layer, last_kind = keys[-1]
    out.append(row("cum_erank_full_depth", last_layer, last_kind, S - 1, acc.erank))
    span = f"sublayers {early[0]}-{early[-1]} minus {late[0]}-{late[-1]}"
    n_fb = sum(h == "exact-fallback" for h in how)
    mixed = (
        method
        if method == "exact"
        else ("perturbative" if n_fb == 0 else f"perturbative ({n_fb} of {S} sublayers exact-fallback)")
    )
    sym_span = scalars["symmetry_minus_identity_early_minus_late"]
    out.append(row("symmetry_minus_identity_early_minus_late", None, "all", None, sym_span, span))
    if with_noise:
        cfn_span = scalars["complex_fraction_beyond_noise_early_minus_late"]
        out.append(row("complex_fraction_beyond_noise_early_minus_late", None, "all", None, cfn_span, span))
    cf_span = scalars["complex_fraction_early_minus_late"]
    out.append(row("complex_fraction_early_minus_late", None, "all", None, cf_span, f"tol {tol:g}; {span}", mixed))
    out.append(row("henrici_early_minus_late", None, "all", None, scalars["henrici_early_minus_late"], span, mixed))
    table = pd.DataFrame(out, columns=BOOTSTRAP_COLUMNS)
    table["layer"] = table["layer"].astype("Int64")
    table["s"] = table["s"].astype("Int64")
    reps = pd.DataFrame(
        [{"replicate": r, "metric": m, "value": float(v[r + 2])} for m, v in scalars.items() for r in range(R)],
        columns=REPLICATE_COLUMNS,
    )
    return table, reps


def not_bootstrapped_rows(level: float = 0.95) -> pd.DataFrame:
    """Rows stating that the RSS profile and its cut points b1, b2 were not bootstrapped."""
    rows = [
        {
            "metric": m,
            "layer": None,
            "kind": "all",
            "s": None,
            "estimate": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "level": _check_level(level),
            "n_resamples": 0,
            "n_bootstrap_samples": 0,
            "n_samples_total": 0,
            "estimate_all_samples": float("nan"),
            "seed": None,
            "bootstrapped": False,
            "note": NOT_BOOTSTRAPPED_NOTE,
            "reason": NOT_BOOTSTRAPPED_NOTE,
            "method": "",
            "interval": "",
        }
        for m in ("rss_profile", "b1", "b2")
    ]
    table = pd.DataFrame(rows, columns=BOOTSTRAP_COLUMNS)
    for c in ("layer", "s", "seed"):
        table[c] = table[c].astype("Int64")
    return table


def jacobian_bootstrap_files(
    folders: Sequence[os.PathLike | str],
    n_resamples: int = 200,
    seed: int = 0,
    level: float = 0.95,
    complex_tol: float = 1e-6,
    device: Any = None,
    method: str = "exact",
    interval: str = "percentile",
    spectra: pd.DataFrame | None = None,
    per_depth_erank: bool = True,
    groups: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``bootstrap.tsv`` and ``bootstrap_replicates.tsv`` from Jacobian block folders.

    With group means in the files (``jacobian.n_groups``) and ``groups``, the delete-one-group
    jackknife over all N samples (``interval`` ``jackknife``); else the bootstrap of the stored first n samples
    (:meth:`resdyn.artifacts.JacobianBlocks.read_per_sample`). The noise bounds τ of the complex
    share are the ``imag_noise_bound`` column of the checkpoint's ``spectra`` table, when it has
    one. Then :func:`jacobian_bootstrap` + :func:`not_bootstrapped_rows`.
    """
    files = artifacts.JacobianBlocks.read(folders)
    if groups and files.n_groups >= 2:
        per, interval = files.group_means, JACKKNIFE
    else:
        per = artifacts.JacobianBlocks.read_per_sample(folders)[0]
    bounds = None
    if spectra is not None and "imag_noise_bound" in spectra.columns:
        bounds = spectra.sort_values("s")["imag_noise_bound"].to_numpy(dtype=np.float64)
    table, reps = jacobian_bootstrap(
        per,
        n_resamples,
        seed,
        level,
        complex_tol,
        means=files.means,
        n_samples_total=files.n_samples_total,
        device=device,
        method=method,
        interval=interval,
        noise_bounds=bounds,
        per_depth_erank=per_depth_erank,
    )
    both = pd.concat([table, not_bootstrapped_rows(level)], ignore_index=True)
    for c in ("layer", "s", "seed"):
        both[c] = both[c].astype("Int64")
    return both, reps


#: The note every row of the second method's table carries (``bootstrap_first_n.tsv``).
FIRST_N_NOTE = "second method: bootstrap of the stored first n samples; bootstrap.tsv holds the all-sample jackknife"


def first_n_missing_rows(reason: str, level: float = 0.95) -> pd.DataFrame:
    """The second method's table when it is not computed: one row (metric ``first_n_bootstrap``) with ``reason``."""
    table = not_bootstrapped_rows(level).iloc[:1].copy()
    table["metric"], table["note"], table["reason"] = "first_n_bootstrap", reason, reason
    return table.reset_index(drop=True)


def first_n_bootstrap_files(
    folders: Sequence[os.PathLike | str], enabled: bool = True, level: float = 0.95, **options: Any
) -> pd.DataFrame:
    """``bootstrap_first_n.tsv``: the per-sample bootstrap of the stored first n samples, as a second
    method beside the group jackknife of ``bootstrap.tsv`` (same columns and statistics, every row's
    note :data:`FIRST_N_NOTE`; intervals centred on the n-sample estimate). ``options``: those of
    :func:`jacobian_bootstrap_files`.

    Computed only where it is a second method: with group means in the files (``jacobian.n_groups``),
    ``enabled`` (``bootstrap.first_n``) and n ≥ 2 stored samples. Otherwise one row
    (:func:`first_n_missing_rows`) says why: without group means ``bootstrap.tsv`` is this method.
    """
    files = artifacts.JacobianBlocks.read(folders)
    if files.n_groups < 2:
        return first_n_missing_rows("no group means (jacobian.n_groups): bootstrap.tsv is this method", level)
    if not enabled:
        return first_n_missing_rows("bootstrap.first_n is false", level)
    if files.n_stored < 2:
        return first_n_missing_rows(
            f"jacobian.store_first_n keeps {files.n_stored} per-sample Jacobians; the bootstrap needs at least 2", level
        )
    table, _ = jacobian_bootstrap_files(folders, level=level, groups=False, **options)
    table = table[table["bootstrapped"].astype(bool)].reset_index(drop=True)
    table["note"] = [FIRST_N_NOTE if not n else f"{FIRST_N_NOTE}; {n}" for n in table["note"].fillna("")]
    return table
