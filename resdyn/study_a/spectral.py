"""Spectral geometry of sublayer Jacobians: eigen/singular spectra, non-normality, ranks.

Pure numpy/scipy, float64 (complex128 for complex input) linear algebra; no torch, no plotting.
Every public function validates its input first and raises ``ValueError`` naming the shape or
value it got and what is allowed.

Notation (docs/design.md, "Definitions"): J is a d×d (mean) Jacobian with eigenvalues λ_i and SVD
J = U Σ V^T (V^H for complex J), σ_1 ≥ … ≥ σ_d ≥ 0. Sublayers are ordered by depth index
s = 2L (attention half of layer L) and s = 2L + 1 (MLP half).

Numerical notes
---------------
* The Henrici departure is computed from the Schur form, not by subtracting Σ|λ|² from ‖J‖_F²:
  the subtraction cancels catastrophically for (near-)normal matrices (a normal 50×50 matrix
  would report ~1e-8 instead of ~1e-15). Both are the same number in exact arithmetic.
* Eigenvalues of highly non-normal matrices are ill-conditioned; LAPACK returns the exact
  eigenvalues of a nearby matrix J + E with ‖E‖ ≈ ε‖J‖. For a rotated d×d Jordan block this
  moves the eigenvalues by ≈ ε^(1/d), so its computed Henrici departure is below 1. This is
  the honest answer for J + E, not a bug to be fixed here.

Tables
------
:func:`spectra_table` builds ``spectra.tsv`` (one row per sublayer, columns from
:func:`sublayer_metrics`) and the arrays of ``spectra.h5`` (:class:`resdyn.artifacts.SpectraArrays`);
:func:`bottleneck_table` builds ``bottleneck.tsv`` (cumulative-product ranks along depth);
:func:`checkpoint_table` stacks both across training checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg

from resdyn.numerics.checks import check_fraction, check_int, check_nonnegative_float, is_int
from resdyn.numerics.linalg import (
    NormalisedProduct,
    as_square,
    as_values,
    effective_rank,
    eigen_henrici,
    k_from_fraction,
    nonnormal_norm_from_schur,
    participation_ratio,
    round_half_up,
    schur_factor,
    sort_eigenvalues,
    svd,
    svd_on,
)
from resdyn.study_a.rotation import complex_fraction_beyond_noise, imag_noise_bound, rotation_share

__all__ = [
    "KINDS",
    "DEFAULT_TOLERANCES",
    "CHECKPOINT_METRICS",
    "mean_of_products_bottleneck",
    "NoiseSamples",
    "henrici_departure",
    "symmetry_index",
    "nonnormal_norm",
    "complex_fraction",
    "shifted_complex_fraction",
    "expansive_fraction",
    "spectral_radius",
    "condition_number",
    "self_alignment",
    "effective_rank",
    "participation_ratio",
    "cumulative_spectrum",
    "cumulative_effective_rank",
    "cumulative_participation_ratio",
    "spectrum",
    "sublayer_metrics",
    "spectra_table",
    "bottleneck_table",
    "checkpoint_table",
    "sublayer_index",
    "group_name",
    "check_chain",
    "ordered_sublayers",
    "LAYER_KIND",
    "OPERATOR_KINDS",
]

#: Sublayer kinds in depth order within a layer: s = 2L + KINDS.index(kind).
KINDS: tuple[str, ...] = ("attn", "mlp")
#: The single operator of a parallel-residual layer, I + J_A + J_F (docs/design.md "Parallel-residual
#: layers"). It maps h_L -> h_{L+1}, so it takes the depth slot s = 2L + 1 of a sequential layer's
#: MLP half (the slot that ends at h_{L+1}); s = 2L is absent (there is no m_L boundary).
LAYER_KIND = "layer"
OPERATOR_KINDS: tuple[str, ...] = (*KINDS, LAYER_KIND)
#: Default tolerances of the complex fraction reported by :func:`sublayer_metrics`.
DEFAULT_TOLERANCES: tuple[float, ...] = (1e-9, 1e-6, 1e-3)


# A sublayer's Jacobian may be given as an array or as a zero-argument callable returning one,
# so table builders can load large Jacobians one at a time.
MatrixLike = Any
JacobianSource = Mapping[tuple[int, str], MatrixLike]


# --------------------------------------------------------------------------------------------
# validation


def _check_tol(tol: Any) -> float:
    return check_nonnegative_float(tol, "tol")


def _check_k(k: Any, d: int) -> int:
    if not is_int(k):
        raise ValueError(f"k must be an integer in [1, {d}] (d = {d}), got {k!r}")
    if not 1 <= int(k) <= d:
        raise ValueError(f"k must be in [1, {d}] for a {d}×{d} matrix, got k = {k}")
    return int(k)


# --------------------------------------------------------------------------------------------
# scalar metrics


def nonnormal_norm(J: Any) -> float:
    """Absolute departure from normality ‖N‖_F = sqrt(max(0, ‖J‖_F² − Σ|λ_i|²)).

    N is the strictly upper part of the Schur form J = Q (Λ + N) Q^H (the Frobenius norm of N
    does not depend on which Schur form is taken). Computed from the Schur factor directly.

    Args:
        J: (d, d) real or complex matrix.
    Returns:
        float in [0, ‖J‖_F]; 0 iff J is normal.
    Example:
        >>> nonnormal_norm(np.array([[1.0, 3.0], [0.0, 2.0]]))
        3.0
    """
    a = as_square(J)
    T, _ = schur_factor(a, "complex" if np.iscomplexobj(a) else "real", vectors=False)
    return nonnormal_norm_from_schur(T)


def henrici_departure(J: Any) -> float:
    """Normalised Henrici departure from normality.

    h(J) = sqrt(max(0, ‖J‖_F² − Σ_i |λ_i|²)) / ‖J‖_F = ‖N‖_F / ‖J‖_F,
    with N the strictly upper part of a Schur form J = Q (Λ + N) Q^H. Evaluated as ‖N‖_F from
    the Schur factor (no cancellation, see the module notes); the zero matrix gives 0.

    Args:
        J: (d, d) real or complex matrix.
    Returns:
        float in [0, 1]: 0 iff J is normal (symmetric, orthogonal, diagonal, …), 1 iff all
        eigenvalues are 0 (nilpotent, e.g. a Jordan block).
    Example:
        >>> henrici_departure(np.array([[0.0, 1.0], [0.0, 0.0]]))
        1.0
        >>> round(henrici_departure(np.array([[1.0, 3.0], [0.0, 1.0]])), 6)  # 3/sqrt(11)
        0.904534
    """
    a = as_square(J)
    fro = float(np.linalg.norm(a))
    if fro == 0.0:
        return 0.0
    T, _ = schur_factor(a, "complex" if np.iscomplexobj(a) else "real", vectors=False)
    return min(1.0, nonnormal_norm_from_schur(T) / fro)


def symmetry_index(J: Any, shift: float = 0.0) -> float:
    """Departure from symmetry of J − shift·I (0 = symmetric; the column ``symmetry`` of J and
    ``symmetry_minus_identity`` of J − I in spectra.tsv).

    s(J) = ‖J − Jᵀ‖_F / ‖J − shift·I‖_F  (the numerator does not depend on the shift).

    With the symmetric and antisymmetric parts S = (J + Jᵀ)/2, A = (J − Jᵀ)/2, which are
    Frobenius-orthogonal, s = 2‖A‖_F / sqrt(‖S‖_F² + ‖A‖_F²) ∈ [0, 2]: 0 iff J is symmetric, 2 iff
    J is antisymmetric, → √2 for a large matrix of i.i.d. entries (‖S‖_F ≈ ‖A‖_F). A symmetric
    matrix is normal, so s = 0 implies Henrici departure 0, not conversely (a rotation is normal,
    s = 2). The zero matrix gives 0.

    Args:
        J: (d, d) matrix.
        shift: the multiple of I taken off before normalising (1.0 for J − I).
    Example:
        >>> symmetry_index(np.array([[0.0, 1.0], [-1.0, 0.0]])), symmetry_index(np.eye(2))
        (2.0, 0.0)
    """
    a = as_square(J)
    return _symmetry(a, float(np.linalg.norm(a - shift * np.eye(a.shape[0]))))


def _symmetry(a: np.ndarray, fro: float) -> float:
    """‖a − aᵀ‖_F / fro, 0 when fro = 0 (see :func:`symmetry_index`)."""
    return float(np.linalg.norm(a - a.T)) / fro if fro > 0 else 0.0


def complex_fraction(eigvals: Any, tol: float = 1e-6) -> float:
    """Share of eigenvalues that are genuinely complex: #{i : |Im λ_i| > tol·max(1, |λ_i|)} / d.

    The tolerance is absolute for |λ| ≤ 1 and relative above, so roundoff in real eigenvalues
    of large modulus is not counted as complex.

    Args:
        eigvals: (d,) eigenvalues (complex or real; a real array gives 0).
        tol: ≥ 0.
    Returns:
        float in [0, 1].
    Example:
        >>> complex_fraction(np.array([1j, -1j, 2.0, 3.0]))
        0.5
    """
    lam = as_values(eigvals, "eigvals")
    t = _check_tol(tol)
    if not np.iscomplexobj(lam):
        return 0.0
    return float(np.mean(np.abs(lam.imag) > t * np.maximum(1.0, np.abs(lam))))


#: Imaginary parts below this multiple of machine epsilon × max(1, max|λ|) are roundoff.
IMAG_ROUNDOFF = 64 * float(np.finfo(np.float64).eps)


def shifted_complex_fraction(eigvals: Any, shift: float = 1.0, tol: float = 1e-6) -> float:
    """Share of eigenvalues of J − shift·I that are complex relative to their own modulus.

    With μ_i = λ_i − shift (the eigenvalues of J − shift·I; Im μ = Im λ):
    #{i : |Im μ_i| > tol·|μ_i|  and  |Im μ_i| > ``IMAG_ROUNDOFF``·max(1, max_j |λ_j|)} / d.

    Unlike :func:`complex_fraction` (threshold tol·max(1, |·|), absolute below 1), the threshold
    scales with |μ| itself, so for a near-identity J (all |μ| ≪ 1) it still tells rotating
    updates (μ off the real axis by more than arcsin(tol)) from real ones; with the absolute
    threshold it equalled J's complex fraction. The floor keeps eigenvalues at ``shift`` up to
    roundoff (random phase) from counting.

    Args:
        eigvals: (d,) eigenvalues of J (complex or real; a real array gives 0).
        shift: the c in J − c·I.
        tol: ≥ 0.
    Returns:
        float in [0, 1].
    Example:
        >>> shifted_complex_fraction(np.array([1 + 1e-8 + 1e-8j, 1 + 1e-8 - 1e-8j, 1.5, 0.5]), 1.0, 1e-6)
        0.5
    """
    lam = as_values(eigvals, "eigvals")
    t = _check_tol(tol)
    if not np.iscomplexobj(lam):
        return 0.0
    im = np.abs(lam.imag)
    floor = IMAG_ROUNDOFF * max(1.0, float(np.max(np.abs(lam))))
    return float(np.mean((im > t * np.abs(lam - shift)) & (im > floor)))


def expansive_fraction(values: Any, threshold: float = 1.0) -> float:
    """Share of values with modulus above ``threshold``: #{i : |x_i| > threshold} / n.

    With eigenvalues: share of expanding eigen-directions (|λ| > 1); with singular values:
    share of stretched directions (σ > 1).

    Args:
        values: (n,) real or complex.
        threshold: finite, default 1.
    Returns:
        float in [0, 1].
    Example:
        >>> expansive_fraction(np.array([0.5, 1.0, 2.0, -3.0]))
        0.5
    """
    x = as_values(values, "values")
    thr = float(threshold)
    if not math.isfinite(thr):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    return float(np.mean(np.abs(x) > thr))


def spectral_radius(x: Any) -> float:
    """Spectral radius ρ = max_i |λ_i|.

    Args:
        x: a (d, d) matrix (eigenvalues are computed) or a (d,) array of eigenvalues.
    Returns:
        float ≥ 0.
    Example:
        >>> round(spectral_radius(np.array([[0.0, -2.0], [2.0, 0.0]])), 12)  # eigenvalues ±2i
        2.0
    """
    if np.ndim(x) == 2:
        a = as_square(x)
        lam = scipy.linalg.eigvals(a, check_finite=False)
    else:
        lam = as_values(x, "eigenvalues")
    return float(np.max(np.abs(lam)))


def condition_number(x: Any) -> float:
    """Condition number κ = σ_max / σ_min (2-norm); ``inf`` for a singular matrix, nan for 0.

    Args:
        x: a (d, d) matrix (singular values are computed) or a (d,) array of singular values.
    Returns:
        float in [1, inf].
    Example:
        >>> condition_number(np.diag([4.0, 2.0, 0.5]))
        8.0
    """
    if np.ndim(x) == 2:
        sv = svd(as_square(x), vectors=False)
    else:
        sv = as_values(x, "singular_values", nonnegative=True, allow_complex=False)
    smax, smin = float(np.max(sv)), float(np.min(sv))
    if smax == 0.0:
        return float("nan")
    if smin == 0.0:
        return float("inf")
    return smax / smin


def _self_alignment_from_svd(U: np.ndarray, Vh: np.ndarray, k: int) -> float:
    overlap = U[:, :k].conj().T @ Vh[:k, :].conj().T  # U_k^H V_k, (k, k)
    return float(np.sum(np.abs(overlap) ** 2) / k)


def self_alignment(J: Any, k: int) -> float:
    """Overlap of the top-k output and input singular directions: ‖U_k^T V_k‖_F² / k.

    J = U Σ V^T (V^H for complex J), U_k, V_k the first k columns (largest σ). Equals the mean
    squared cosine of the principal angles between span(U_k) and span(V_k). When σ_k = σ_{k+1}
    the top-k subspaces are not unique and neither is the value.

    Args:
        J: (d, d) matrix.
        k: integer in [1, d].
    Returns:
        float in [0, 1]: 1 when J maps its top-k input subspace onto itself (e.g. symmetric
        J — U and V then differ only in column signs), 0 when it maps it to an orthogonal one.
        k = d always gives 1.
    Example:
        >>> self_alignment(np.diag([3.0, 2.0, 1.0]), 2)
        1.0
        >>> self_alignment(np.array([[0.0, 0.0], [2.0, 0.0]]), 1)  # e_0 -> 2 e_1
        0.0
    """
    a = as_square(J)
    k = _check_k(k, a.shape[0])
    U, _, Vh = svd(a, vectors=True)
    return _self_alignment_from_svd(U, Vh, k)


# --------------------------------------------------------------------------------------------
# cumulative products along depth


def _push_singular_values(cum: NormalisedProduct, a: np.ndarray) -> np.ndarray:
    """Push J onto the running product; singular values of the normalised P_s (zeros once it vanished)."""
    P = cum.push(a)
    return np.zeros(a.shape[0]) if cum.vanished else svd(P, vectors=False)


def _iter_matrices(jacobians: Iterable[Any], what: str = "jacobians") -> Iterable[np.ndarray]:
    d = None
    n = 0
    for s, J in enumerate(jacobians):
        a = as_square(J() if callable(J) else J, name=f"{what}[{s}]")
        if d is None:
            d = a.shape[0]
        elif a.shape[0] != d:
            raise ValueError(f"{what}[{s}] has shape {a.shape}, but {what}[0] is {d}×{d}; all must be the same size")
        n += 1
        yield a
    if n == 0:
        raise ValueError(f"{what} is empty; need at least one d×d matrix")


def cumulative_spectrum(jacobians: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Singular values and scale of the cumulative products P_s = J_s J_{s−1} ⋯ J_0.

    Products are formed in float64 (complex128 if any J is complex) and divided by their
    Frobenius norm after each multiplication, so 200 sublayers of norm 10 neither overflow nor
    (for norm 0.1) underflow; the removed scale is returned as log10 ‖P_s‖_F.

    Args:
        jacobians: iterable of S matrices (d, d) in sublayer order s = 0..S−1 (arrays or
            zero-argument callables returning arrays, loaded one at a time).
    Returns:
        (sv, log10_fro): sv (S, d) singular values of P_s / ‖P_s‖_F (descending, rows sum of
        squares 1, or all 0 if the product vanished); log10_fro (S,) log10 ‖P_s‖_F
        (−inf once the product is exactly 0).
    Example:
        >>> sv, lg = cumulative_spectrum([2 * np.eye(2)] * 3)
        >>> sv[-1].round(6).tolist(), lg.round(6).tolist()
        ([0.707107, 0.707107], [0.451545, 0.752575, 1.053605])
    """
    cum = NormalisedProduct()
    rows, logs = [], []
    for a in _iter_matrices(jacobians):
        rows.append(_push_singular_values(cum, a))
        logs.append(cum.log10_fro)
    return np.vstack(rows), np.asarray(logs, dtype=np.float64)


def cumulative_effective_rank(jacobians: Iterable[Any]) -> np.ndarray:
    """Bottleneck curve: erank(P_s) for P_s = J_s J_{s−1} ⋯ J_0, s = 0..S−1.

    erank is the Roy–Vetterli effective rank (:func:`effective_rank`), scale-invariant, so the
    Frobenius rescaling of :func:`cumulative_spectrum` does not change it.

    Args:
        jacobians: iterable of S (d, d) matrices in sublayer order (arrays or callables).
    Returns:
        (S,) float64 array with values in [1, d] (0 once the product is exactly 0).
    Example:
        >>> cumulative_effective_rank([np.diag([1.0, 1.0, 0.5]), np.diag([1.0, 1.0, 0.0])]).round(6).tolist()
        [2.871746, 2.0]
    """
    sv, _ = cumulative_spectrum(jacobians)
    return np.array([effective_rank(row) for row in sv])


def cumulative_participation_ratio(jacobians: Iterable[Any]) -> np.ndarray:
    """Bottleneck curve by participation ratio: PR(P_s) = (Σσ²)²/Σσ⁴ of P_s = J_s ⋯ J_0.

    Args:
        jacobians: iterable of S (d, d) matrices in sublayer order (arrays or callables).
    Returns:
        (S,) float64 array with values in [1, d] (0 once the product is exactly 0).
    Example:
        >>> cumulative_participation_ratio([np.eye(3), np.diag([1.0, 1.0, 0.0])]).tolist()
        [3.0, 2.0]
    """
    sv, _ = cumulative_spectrum(jacobians)
    return np.array([participation_ratio(row) for row in sv])


# --------------------------------------------------------------------------------------------
# per-sublayer analysis


def _tol_label(tol: float) -> str:
    return f"{tol:.0e}"


def _check_tolerances(tolerances: Any) -> tuple[float, ...]:
    try:
        tols = tuple(tolerances)
    except TypeError as err:
        raise ValueError(f"tolerances must be a sequence of numbers ≥ 0, got {tolerances!r}") from err
    if not tols:
        raise ValueError("tolerances must contain at least one tolerance")
    tols = tuple(_check_tol(t) for t in tols)
    labels = [_tol_label(t) for t in tols]
    if len(set(labels)) != len(labels):
        raise ValueError(f"tolerances {tols} give duplicate column labels {labels}; use distinct values")
    return tols


def _check_k_fraction(k_fraction: Any) -> float:
    return check_fraction(k_fraction, "k_fraction")


def spectrum(J: Any) -> dict[str, np.ndarray]:
    """Eigenvalues of J and singular values of J and of J − I.

    Args:
        J: (d, d) matrix.
    Returns:
        dict with ``eigenvalues`` (d,) complex128 sorted by descending |λ| (ties by angle),
        ``singular_values`` (d,) and ``singular_values_JmI`` (d,) float64, descending.
    Example:
        >>> sp = spectrum(np.diag([2.0, -1.0]))
        >>> sp["eigenvalues"].tolist(), sp["singular_values"].tolist(), sp["singular_values_JmI"].tolist()
        ([(2+0j), (-1+0j)], [2.0, 1.0], [2.0, 1.0])
    """
    a = as_square(J)
    lam = scipy.linalg.eigvals(a, check_finite=False)
    return {
        "eigenvalues": sort_eigenvalues(lam.astype(np.complex128)),
        "singular_values": svd(a, vectors=False),
        "singular_values_JmI": svd(a - np.eye(a.shape[0]), vectors=False),
    }


def _analyse(a: np.ndarray, k_fraction: float, tols: tuple[float, ...], device: Any = None) -> tuple[dict, dict]:
    """Metrics and spectra of one validated matrix: one eigen-analysis (:func:`eigen_henrici`:
    Schur T on the host, eigvals on a GPU), one SVD, one svdvals — each reused by every metric
    that needs it."""
    d = a.shape[0]
    eye = np.eye(d)
    lam, nn, fro = eigen_henrici(a, device)
    U, sv, Vh = svd_on(a, True, device)
    JmI = a - eye
    sv_m = svd_on(JmI, False, device)
    fro_m = float(np.linalg.norm(JmI))

    erank = effective_rank(sv)
    k_frac = k_from_fraction(d, k_fraction)
    k_erank = min(d, max(1, round_half_up(erank)))
    m: dict[str, Any] = {
        "d": d,
        "spectral_radius": float(np.max(np.abs(lam))),
        "condition_number": condition_number(sv),
        "sigma_max": float(sv[0]),
        "sigma_min": float(sv[-1]),
        "fro_J": fro,
        "fro_minus_identity": fro_m,
        "nonnormal_fro": nn,
        # J − I has the same Schur basis and the same N, only Λ shifts by −1.
        "henrici": min(1.0, nn / fro) if fro > 0 else 0.0,
        "henrici_JmI": min(1.0, nn / fro_m) if fro_m > 0 else 0.0,
        "symmetry": _symmetry(a, fro),
        "symmetry_minus_identity": _symmetry(a, fro_m),
    }
    for t in tols:
        m[f"complex_frac_J_tol{_tol_label(t)}"] = complex_fraction(lam, t)
    for t in tols:
        m[f"complex_frac_JmI_tol{_tol_label(t)}"] = shifted_complex_fraction(lam, 1.0, t)
    m.update(
        {
            "expansive_frac_eig": expansive_fraction(lam),
            "expansive_frac_sv": expansive_fraction(sv),
            "k_frac": k_frac,
            "self_alignment_kfrac": _self_alignment_from_svd(U, Vh, k_frac),
            "self_alignment_k1": _self_alignment_from_svd(U, Vh, 1),
            "k_erank": k_erank,
            "self_alignment_kerank": _self_alignment_from_svd(U, Vh, k_erank),
            "erank_J": erank,
            "pr_J": participation_ratio(sv),
            "erank_JmI": effective_rank(sv_m),
            "pr_JmI": participation_ratio(sv_m),
            "rotation_share_J": rotation_share(lam),
            "rotation_share_JmI": rotation_share(lam, 1.0),
        }
    )
    arrays = {
        "eigenvalues": sort_eigenvalues(lam),
        "singular_values": np.asarray(sv, dtype=np.float64),
        "singular_values_JmI": np.asarray(sv_m, dtype=np.float64),
    }
    return m, arrays


def sublayer_metrics(
    J: Any, k_fraction: float = 0.1, tolerances: Sequence[float] = DEFAULT_TOLERANCES
) -> dict[str, Any]:
    """All per-sublayer scalars of ``spectra.tsv`` for one Jacobian J (d×d).

    Keys (λ eigenvalues of J, σ singular values, N the Schur non-normal part):
    ``d``; ``spectral_radius`` max|λ|; ``condition_number`` σ_max/σ_min; ``sigma_max``,
    ``sigma_min``; ``fro_J`` ‖J‖_F; ``fro_minus_identity`` ‖J − I‖_F; ``nonnormal_fro`` ‖N‖_F;
    ``henrici`` ‖N‖_F/‖J‖_F and ``henrici_JmI`` ‖N‖_F/‖J − I‖_F (J − I has the same N);
    ``symmetry`` ‖J − Jᵀ‖_F/‖J‖_F and ``symmetry_minus_identity`` ‖J − Jᵀ‖_F/‖J − I‖_F
    (:func:`symmetry_index`, 0 = symmetric, ≤ 2); ``complex_frac_J_tol{t}`` (:func:`complex_fraction`) /
    ``complex_frac_JmI_tol{t}``
    (:func:`shifted_complex_fraction`, relative to |λ − 1|) for each tolerance t (label
    ``f"{t:.0e}"``, e.g. ``complex_frac_J_tol1e-06``; eigenvalues of J − I are λ − 1);
    ``expansive_frac_eig`` share |λ| > 1; ``expansive_frac_sv`` share σ > 1;
    ``k_frac`` = :func:`resdyn.numerics.linalg.k_from_fraction` (d, k_fraction) and ``self_alignment_kfrac``;
    ``self_alignment_k1``; ``k_erank`` = max(1, round(erank_J)) and ``self_alignment_kerank``;
    ``erank_J``, ``pr_J``, ``erank_JmI``, ``pr_JmI`` (effective rank, participation ratio);
    ``rotation_share_J`` Σ|Im λ|/Σ|λ| and ``rotation_share_JmI`` Σ|Im λ|/Σ|λ − 1|
    (:func:`resdyn.study_a.rotation.rotation_share`). Rounding is half-up.

    Cost: one real Schur factor (no vectors: eigenvalues and ‖N‖_F both come from it), one SVD
    with vectors, singular values of J − I (nominal 10 d³ + 22 d³ + 8/3 d³, resdyn.cluster.cost).

    Args:
        J: (d, d) matrix (cast to float64).
        k_fraction: in (0, 1].
        tolerances: non-empty sequence of complex-fraction tolerances ≥ 0.
    Returns:
        dict of floats/ints (order as listed).
    Example:
        >>> m = sublayer_metrics(np.eye(4))
        >>> m["henrici"], m["erank_J"], m["pr_J"], m["erank_JmI"], m["self_alignment_k1"]
        (0.0, 4.0, 4.0, 0.0, 1.0)
    """
    a = as_square(J)
    return _analyse(a, _check_k_fraction(k_fraction), _check_tolerances(tolerances))[0]


# --------------------------------------------------------------------------------------------
# tables


def sublayer_index(layer: int, kind: str) -> int:
    """Depth index s = 2·layer + (0 for 'attn', 1 for 'mlp' and for a parallel layer's 'layer').

    Example:
        >>> sublayer_index(3, "mlp"), sublayer_index(3, "layer")
        (7, 7)
    """
    check_int(layer, "layer", 0)
    if kind not in OPERATOR_KINDS:
        raise ValueError(f"kind must be one of {OPERATOR_KINDS}, got {kind!r}")
    return 2 * int(layer) + (0 if kind == "attn" else 1)


def check_chain(keys: Sequence[tuple[int, str]], what: str = "jacobians") -> None:
    """Raise ValueError unless ``keys`` (layer, kind) form a gap-free chain h_0 -> h_n: layers
    0..n−1, each with both halves 'attn' and 'mlp' (sequential) or only 'layer' (parallel).

    Example:
        >>> check_chain([(0, "attn"), (0, "mlp"), (1, "layer")])
    """
    by_layer: dict[int, set[str]] = {}
    for layer, kind in keys:
        by_layer.setdefault(int(layer), set()).add(kind)
    last = max(by_layer, default=-1)
    missing, mixed = [], []
    for L in range(last + 1):
        kinds = by_layer.get(L, set())
        if LAYER_KIND in kinds:
            if kinds != {LAYER_KIND}:
                mixed.append(L)
        else:
            missing += [(L, k) for k in KINDS if k not in kinds]
    if missing or mixed:
        detail = [f"missing (layer, kind): {', '.join(f'({L}, {k!r})' for L, k in missing)}"] if missing else []
        detail += [f"layers {mixed} mix 'layer' with 'attn'/'mlp'"] if mixed else []
        raise ValueError(
            f"{what} must chain s = 0..{2 * last + 1} without gaps (each layer: 'attn' and 'mlp', or one "
            "parallel-residual "
            f"'layer'); {'; '.join(detail)}"
        )


def group_name(layer: int, kind: str) -> str:
    """HDF5 group of a sublayer in ``spectra.h5``: ``L{layer:03d}_{kind}``.

    Example:
        >>> group_name(7, "attn")
        'L007_attn'
    """
    sublayer_index(layer, kind)
    return f"L{int(layer):03d}_{kind}"


def ordered_sublayers(jacobians: JacobianSource, what: str = "jacobians") -> list[tuple[int, int, str, Any]]:
    """(s, layer, kind, matrix-or-loader) sorted by depth; validates keys."""
    if not isinstance(jacobians, Mapping):
        raise ValueError(f"{what} must be a mapping {{(layer, kind): d×d matrix}}, got {type(jacobians).__name__}")
    if len(jacobians) == 0:
        raise ValueError(f"{what} is empty; need at least one (layer, kind) sublayer")
    rows = []
    for key, J in jacobians.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(f"{what} keys must be (layer, kind) tuples, got {key!r}")
        layer, kind = key
        try:
            s = sublayer_index(layer, kind)
        except ValueError as err:
            raise ValueError(f"{what} key {key!r}: {err}") from None
        rows.append((s, int(layer), kind, J))
    rows.sort(key=lambda r: r[0])
    return rows


@dataclass(frozen=True)
class NoiseSamples:
    """Where the sampling error of each mean Jacobian is drawn from, for the noise-aware complex share.

    Attributes:
        samples: {(layer, kind): loader → (m, d, d)}: the first m per-sample Jacobians (``n_total`` = N)
            or m group means over all samples (``n_total`` None).
        n_total: N for per-sample Jacobians, None for group means.
        n_draws, level: of :func:`resdyn.study_a.rotation.imag_noise_bound` (seed: the sublayer index s).
    """

    samples: Mapping[tuple[int, str], Any]
    n_total: int | None = None
    n_draws: int = 20
    level: float = 0.95

    def bound(self, layer: int, kind: str, s: int) -> float:
        """τ of sublayer (layer, kind) at depth s (its seed)."""
        x = self.samples[(layer, kind)]
        return imag_noise_bound(x() if callable(x) else x, self.n_total, self.n_draws, self.level, seed=s)

    def columns(self, layer: int, kind: str, s: int, eigvals: np.ndarray) -> dict[str, float]:
        """``imag_noise_bound`` and ``complex_frac_beyond_noise`` of one sublayer."""
        tau = self.bound(layer, kind, s)
        return {"imag_noise_bound": tau, "complex_frac_beyond_noise": complex_fraction_beyond_noise(eigvals, tau)}


def noise_samples(files: Any, n_draws: int = 20, level: float = 0.95) -> NoiseSamples | None:
    """The :class:`NoiseSamples` of a run's Jacobian files (:class:`resdyn.artifacts.jacobians.JacobianFiles`):
    the B group means over all samples when stored (B ≥ 2), else the stored first n of N per-sample
    Jacobians when n ≥ 2, else None (no noise bound: fewer than two samples carry no estimate of the
    sampling error)."""
    if files.n_groups >= 2:
        return NoiseSamples(files.group_means, None, n_draws, level)
    if files.n_stored < 2:
        return None
    return NoiseSamples(files.per_sample, files.n_samples_total, n_draws, level)


def spectra_table(
    jacobians: JacobianSource,
    k_fraction: float = 0.1,
    tolerances: Sequence[float] = DEFAULT_TOLERANCES,
    device: Any = None,
    noise: NoiseSamples | None = None,
) -> tuple[pd.DataFrame, dict[str, dict[str, np.ndarray]]]:
    """``spectra.tsv`` rows and ``spectra.h5`` arrays for a set of sublayer Jacobians.

    With ``noise``, two more columns per sublayer: ``imag_noise_bound`` τ
    (:func:`resdyn.study_a.rotation.imag_noise_bound` of its samples) and
    ``complex_frac_beyond_noise`` #{|Im λ| > τ}/d
    (:func:`resdyn.study_a.rotation.complex_fraction_beyond_noise`).

    Args:
        jacobians: {(layer, kind): (d, d) matrix or zero-argument callable returning it};
            kind in ('attn', 'mlp'). Matrices are loaded and analysed one at a time.
        k_fraction, tolerances: passed to :func:`sublayer_metrics`.
        device: None/"cpu" (LAPACK via scipy, the reference) or a CUDA device: eigenvalues and
            SVDs by torch.linalg there (:func:`eigen_henrici`); equal up to rounding.
        noise: the samples the noise bound is drawn from (:class:`NoiseSamples`), or None.
    Returns:
        (table, arrays): table has one row per sublayer ordered by s = 2L (attn), 2L+1 (mlp),
        columns ``layer, kind, s`` then the :func:`sublayer_metrics` keys; arrays maps
        ``L{layer:03d}_{kind}`` to {``eigenvalues`` (d,) complex128, ``singular_values`` (d,),
        ``singular_values_JmI`` (d,)} for :class:`resdyn.artifacts.SpectraArrays`.
    Example:
        >>> df, arr = spectra_table({(0, "mlp"): np.eye(2), (0, "attn"): 2 * np.eye(2)})
        >>> df[["layer", "kind", "s", "erank_J"]].values.tolist(), sorted(arr)
        ([[0, 'attn', 0, 2.0], [0, 'mlp', 1, 2.0]], ['L000_attn', 'L000_mlp'])
    """
    kf = _check_k_fraction(k_fraction)
    tols = _check_tolerances(tolerances)
    rows, arrays = [], {}
    for s, layer, kind, J in ordered_sublayers(jacobians):
        a = as_square(J() if callable(J) else J, name=f"jacobians[({layer}, {kind!r})]")
        m, arr = _analyse(a, kf, tols, device)
        if noise is not None:
            m.update(noise.columns(layer, kind, s, arr["eigenvalues"]))
        rows.append({"layer": layer, "kind": kind, "s": s, **m})
        arrays[group_name(layer, kind)] = arr
    return pd.DataFrame(rows), arrays


def bottleneck_table(
    jacobians: JacobianSource,
    spectra: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> pd.DataFrame:
    """``bottleneck.tsv``: ranks of the cumulative Jacobian P_s = J_s J_{s−1} ⋯ J_0 along depth.

    Sublayers must form a chain (:func:`check_chain`; a gap would make the product meaningless);
    a parallel-residual layer contributes its one operator J_L at s = 2L + 1.

    Args:
        jacobians: {(layer, kind): (d, d) matrix or zero-argument callable}, all the same d.
        spectra: the arrays of :func:`spectra_table` (``L{layer:03d}_{kind}`` →
            ``singular_values``): the single-sublayer reference erank(J_s), PR(J_s) reuses those
            singular values instead of recomputing them (cost per sublayer: one product and one
            svdvals, not two svdvals). The reference is always computed: BottleneckTable
            requires it (an option to drop it made tables its writer refused).
    Returns:
        DataFrame with columns ``s, layer, kind, d, erank, erank_energy, participation_ratio,
        log10_fro`` (log10 ‖P_s‖_F of the unrescaled product), ``erank_single``, ``pr_single``;
        ``erank_energy`` is the Roy–Vetterli rank on p_i = σ_i²/Σσ² (the energy reading of
        "effective rank", beside the σ reading ``erank``).
    Example:
        >>> J = {(0, "attn"): np.diag([1.0, 1.0, 0.5]), (0, "mlp"): np.diag([1.0, 1.0, 0.0])}
        >>> bottleneck_table(J)[["s", "erank", "pr_single"]].round(4).values.tolist()
        [[0.0, 2.8717, 2.4545], [1.0, 2.0, 2.0]]
    """
    ordered = ordered_sublayers(jacobians)
    check_chain([(r[1], r[2]) for r in ordered], "bottleneck: jacobians")
    cum = NormalisedProduct()
    rows = []
    d0 = None
    for s, layer, kind, J in ordered:
        a = as_square(J() if callable(J) else J, name=f"jacobians[({layer}, {kind!r})]")
        if d0 is None:
            d0 = a.shape[0]
        elif a.shape[0] != d0:
            raise ValueError(f"jacobians[({layer}, {kind!r})] has shape {a.shape}, but the first sublayer is {d0}×{d0}")
        sv = _push_singular_values(cum, a)
        row = {
            "s": s,
            "layer": layer,
            "kind": kind,
            "d": a.shape[0],
            "erank": effective_rank(sv),
            "erank_energy": effective_rank(sv * sv),
            "participation_ratio": participation_ratio(sv),
            "log10_fro": cum.log10_fro,
        }
        known = (spectra or {}).get(group_name(layer, kind))
        sv1 = np.asarray(known["singular_values"]) if known is not None else svd(a, vectors=False)
        row["erank_single"] = effective_rank(sv1)
        row["pr_single"] = participation_ratio(sv1)
        rows.append(row)
    return pd.DataFrame(rows)


def mean_of_products_bottleneck(per_sample: JacobianSource) -> pd.DataFrame:
    """Bottleneck of the mean of per-sample products, beside the product of the same samples' means.

    For the n stored samples i with Jacobians J_s^(i) (each a (n, d, d) stack per sublayer):
    P_s^(i) = J_s^(i) ⋯ J_0^(i), M_s = (1/n) Σ_i P_s^(i) and Q_s = J̄_s ⋯ J̄_0 with
    J̄_s = (1/n) Σ_i J_s^(i). Every P_s^(i) is renormalised to ‖·‖_F = 1 at each step and its
    log-norm kept, so M_s is the exact mean up to one common factor (ranks are scale-invariant).
    Columns ``s, layer, kind, n, erank_mean_of_products`` (Roy–Vetterli erank of M_s),
    ``erank_product_of_means`` (of Q_s, as :func:`bottleneck_table` on the n samples' means).

    Example:
        >>> a, b = np.diag([1.0, 0.0]), np.diag([0.0, 1.0])  # each sample's product is 0
        >>> t = mean_of_products_bottleneck({(0, "attn"): np.stack([a, b]), (0, "mlp"): np.stack([b, a])})
        >>> t[["erank_mean_of_products", "erank_product_of_means"]].round(6).values.tolist()
        [[2.0, 2.0], [0.0, 2.0]]
    """
    ordered = ordered_sublayers(per_sample, "per_sample")
    check_chain([(r[1], r[2]) for r in ordered], "mean_of_products_bottleneck: per_sample")
    means, P, log_norm, rows = NormalisedProduct(), None, None, []
    for s, layer, kind, loader in ordered:
        Js = np.asarray(loader() if callable(loader) else loader, dtype=np.float64)
        if Js.ndim != 3 or Js.shape[1] != Js.shape[2] or (P is not None and Js.shape != P.shape):
            raise ValueError(f"per_sample[({layer}, {kind!r})] must be (n, d, d) like the others, got {Js.shape}")
        P = Js.copy() if P is None else Js @ P
        norms = np.linalg.norm(P, axis=(1, 2))
        alive = norms > 0
        P[alive] /= norms[alive, None, None]
        log_norm = np.where(
            alive, (0.0 if log_norm is None else log_norm) + np.log(np.where(alive, norms, 1.0)), -np.inf
        )
        M = np.zeros(P.shape[1:]) if not alive.any() else np.tensordot(np.exp(log_norm - log_norm.max()), P, 1)
        sv_means = _push_singular_values(means, Js.mean(axis=0))
        rows.append(
            {
                "s": s,
                "layer": layer,
                "kind": kind,
                "n": Js.shape[0],
                "erank_mean_of_products": effective_rank(svd(M, vectors=False)),
                "erank_product_of_means": effective_rank(sv_means),
            }
        )
    return pd.DataFrame(rows)


#: Per-sublayer columns of spectra.tsv compared across checkpoints by :func:`checkpoint_table`
#: (plus every ``complex_frac_J_tol*`` column present).
CHECKPOINT_METRICS: tuple[str, ...] = (
    "d",
    "henrici",
    "henrici_JmI",
    "symmetry",
    "symmetry_minus_identity",
    "self_alignment_kfrac",
    "self_alignment_k1",
    "self_alignment_kerank",
    "erank_J",
    "expansive_frac_eig",
    "rotation_share_J",
    "rotation_share_JmI",
)

#: Spectra columns a checkpoint table keeps whenever the spectra have them (the noise-aware complex
#: share exists only where samples were stored to draw the noise from).
CHECKPOINT_OPTIONAL: tuple[str, ...] = ("imag_noise_bound", "complex_frac_beyond_noise")


def checkpoint_table(
    tables: Mapping[str, pd.DataFrame],
    bottlenecks: Mapping[str, pd.DataFrame] | None = None,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Stack per-checkpoint spectra (and bottleneck) tables for comparison across training.

    One row per (checkpoint, sublayer): ``ckpt, layer, kind, s``, every ``complex_frac_J_tol*``
    column and those of :data:`CHECKPOINT_OPTIONAL` the spectra have, the ``metrics`` columns
    (default :data:`CHECKPOINT_METRICS`) and, with ``bottlenecks``, ``cum_erank`` and ``cum_pr``
    (bottleneck ``erank`` and ``participation_ratio``, joined on s), and ``cum_erank_energy`` where
    the bottleneck has ``erank_energy``. Checkpoints keep the mapping's order; rows within a
    checkpoint are sorted by s. (Long in checkpoints; melt for one metric per row.)

    Args:
        tables: {ckpt name: spectra DataFrame from :func:`spectra_table`}.
        bottlenecks: optional {ckpt name: DataFrame from :func:`bottleneck_table`}, same keys.
        metrics: spectra columns to keep (default :data:`CHECKPOINT_METRICS`).
    Returns:
        DataFrame.
    Example:
        >>> t = {"step0": pd.DataFrame({"layer": [0], "kind": ["attn"], "s": [0], "henrici": [0.5]})}
        >>> checkpoint_table(t, metrics=["henrici"]).values.tolist()
        [['step0', 0, 'attn', 0, 0.5]]
    """
    if not isinstance(tables, Mapping) or len(tables) == 0:
        raise ValueError(f"tables must be a non-empty mapping {{ckpt: spectra table}}, got {tables!r:.80}")
    if bottlenecks is not None:
        if not isinstance(bottlenecks, Mapping):
            raise ValueError(
                f"bottlenecks must be a mapping {{ckpt: bottleneck table}}, got {type(bottlenecks).__name__}"
            )
        if set(bottlenecks) != set(tables):
            raise ValueError(
                f"bottlenecks has checkpoints {sorted(bottlenecks)} but tables has {sorted(tables)}; they must match"
            )
    wanted = list(CHECKPOINT_METRICS if metrics is None else metrics)
    parts = []
    for ckpt, df in tables.items():
        if not isinstance(df, pd.DataFrame):
            raise ValueError(f"tables[{ckpt!r}] must be a DataFrame, got {type(df).__name__}")
        found = [c for c in df.columns if c.startswith("complex_frac_J_tol") or c in CHECKPOINT_OPTIONAL]
        cols = ["layer", "kind", "s"] + found + wanted
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise ValueError(f"tables[{ckpt!r}] lacks columns {missing}; it has {list(df.columns)}")
        part = df[cols].copy()
        if bottlenecks is not None:
            b = bottlenecks[ckpt]
            need = ["s", "erank", "participation_ratio"]
            lack = [c for c in need if c not in b.columns]
            if lack:
                raise ValueError(f"bottlenecks[{ckpt!r}] lacks columns {lack}; it has {list(b.columns)}")
            need += ["erank_energy"] if "erank_energy" in b.columns else []
            b = b[need].rename(
                columns={"erank": "cum_erank", "participation_ratio": "cum_pr", "erank_energy": "cum_erank_energy"}
            )
            part = part.merge(b, on="s", how="left", validate="one_to_one")
        part.insert(0, "ckpt", str(ckpt))
        parts.append(part.sort_values("s", kind="stable"))
    return pd.concat(parts, ignore_index=True)
