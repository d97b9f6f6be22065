"""Linear-algebra kernels shared by :mod:`resdyn.study_a.spectral`, :mod:`resdyn.study_a.schur`,
:mod:`resdyn.beyond.bootstrap` and :mod:`resdyn.study_b.readout`.

Pure numpy/scipy on float64 (complex128 for complex input); torch only on request, for a CUDA
device. Every function states its formula; the metric definitions that build on them live in
:mod:`resdyn.study_a.spectral` (docs/design.md "Definitions").

* validation: :func:`as_square`, :func:`as_values`; rounding: :func:`round_half_up`,
  :func:`k_from_fraction` (the one place a share of the width becomes a subspace dimension k);
* decompositions: :func:`svd`, :func:`schur_factor` and what is read off a Schur factor
  (:func:`real_schur_blocks`, :func:`schur_eigenvalues`, :func:`nonnormal_norm_from_schur`),
  :func:`sort_eigenvalues`;
* the device switch: :func:`on_cuda`, :func:`eigen_henrici`, :func:`svd_on`;
* ranks of a spectrum: :func:`effective_rank`, :func:`participation_ratio`;
* the Frobenius-normalised running product P_s = J_s ⋯ J_0: :class:`NormalisedProduct`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import scipy.linalg
from scipy.linalg import lapack

__all__ = [
    "GPU_HENRICI_MIN",
    "as_square",
    "as_values",
    "round_half_up",
    "k_from_fraction",
    "svd",
    "schur_factor",
    "real_schur_blocks",
    "schur_eigenvalues",
    "nonnormal_norm_from_schur",
    "sort_eigenvalues",
    "on_cuda",
    "eigen_henrici",
    "svd_on",
    "effective_rank",
    "participation_ratio",
    "NormalisedProduct",
]


# --------------------------------------------------------------------------------------------
# validation and rounding


def as_square(J: Any, name: str = "J") -> np.ndarray:
    """``J`` as a finite, non-empty, square float64 (or complex128) 2-D array, else ValueError."""
    try:
        a = np.asarray(J)
    except Exception as err:  # pragma: no cover - exotic inputs
        raise ValueError(f"{name} must be a square 2-D numeric array, got {type(J).__name__}") from err
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} must be a square 2-D matrix (d×d), got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty square matrix, got shape {a.shape}")
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.number)):
        raise ValueError(f"{name} must be numeric (float or complex), got dtype {a.dtype} with shape {a.shape}")
    a = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64, copy=False)
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(
            f"{name} (shape {a.shape}) has {int(bad.sum())} non-finite entries (NaN/Inf); only finite values "
            "are allowed"
        )
    return a


def as_values(x: Any, name: str, *, nonnegative: bool = False, allow_complex: bool = True) -> np.ndarray:
    """``x`` as a finite, non-empty 1-D float64/complex128 array, else ValueError."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of values, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} must be non-empty, got shape {a.shape}")
    if a.dtype == bool or not np.issubdtype(a.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
    if np.iscomplexobj(a):
        if not allow_complex:
            raise ValueError(f"{name} must be real, got complex dtype {a.dtype} (shape {a.shape})")
        a = a.astype(np.complex128, copy=False)
    else:
        a = a.astype(np.float64, copy=False)
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(
            f"{name} (shape {a.shape}) has {int(bad.sum())} non-finite values (NaN/Inf); only finite values are allowed"
        )
    if nonnegative and (a < 0).any():
        raise ValueError(f"{name} must be ≥ 0 (singular values), got minimum {a.min():.6g} (shape {a.shape})")
    return a


def round_half_up(x: float) -> int:
    """⌊x + 1/2⌋: halves round up (2.5 → 3), unlike Python's ``round`` (2.5 → 2)."""
    return int(math.floor(x + 0.5))


def k_from_fraction(d: int, fraction: float) -> int:
    """Subspace dimension for a share of the width: ``k = clip(⌊fraction·d + 1/2⌋, 1, d)``.

    The one fraction → k rule of resdyn (self-alignment ``spectra.k_fraction``, the readout
    sweep ``readout.k_fractions``, ``readout.phase_k_fraction``, ``bridge``/``causal``
    ``k_fraction`` and the cost model): the float product fraction·d rounded half up
    (:func:`round_half_up`), at least 1, at most d.

    Args:
        d: hidden size, an integer ≥ 1.
        fraction: a number in (0, 1], e.g. 0.01 … 0.5 in the resolution sweep.
    Returns:
        int in [1, d].
    Example:
        >>> k_from_fraction(64, 0.01), k_from_fraction(64, 0.1), k_from_fraction(64, 0.5)
        (1, 6, 32)
        >>> k_from_fraction(10, 0.25)  # 2.5 rounds half up
        3
    """
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    if isinstance(fraction, (str, bytes, bool)):
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    try:
        f = float(fraction)
    except (TypeError, ValueError):
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}") from None
    if not (math.isfinite(f) and 0.0 < f <= 1.0):
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    k = math.floor(f * int(d) + 0.5)
    return int(min(max(k, 1), int(d)))


# --------------------------------------------------------------------------------------------
# decompositions


def svd(a: np.ndarray, vectors: bool):
    """Thin SVD a = U diag(σ) V^H, σ descending: (U, σ, V^H) with ``vectors``, else σ only.

    LAPACK divide and conquer (gesdd), falling back to gesvd if it does not converge.
    """
    try:
        if vectors:
            return scipy.linalg.svd(a, full_matrices=False, check_finite=False, lapack_driver="gesdd")
        return scipy.linalg.svd(a, compute_uv=False, check_finite=False, lapack_driver="gesdd")
    except np.linalg.LinAlgError:
        if vectors:
            return scipy.linalg.svd(a, full_matrices=False, check_finite=False, lapack_driver="gesvd")
        return scipy.linalg.svd(a, compute_uv=False, check_finite=False, lapack_driver="gesvd")


def schur_factor(a: np.ndarray, output: str, vectors: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Schur factor T (and basis Q if ``vectors``) of a validated square matrix.

    ``output='real'`` (real ``a`` only): real Schur, T quasi-upper-triangular with 1×1 blocks
    for real eigenvalues and standardised 2×2 blocks for complex pairs, a = Q T Q^T.
    ``output='complex'``: complex Schur, T upper triangular, a = Q T Q^H.
    LAPACK ?gees with an optimal workspace; ``vectors=False`` skips accumulating Q (faster).
    """
    if output == "complex":
        a = a.astype(np.complex128, copy=False)
        gees = lapack.zgees
    elif output == "real":
        if np.iscomplexobj(a):
            raise ValueError(f"the real Schur form needs a real matrix, got dtype {a.dtype} (shape {a.shape})")
        gees = lapack.dgees
    else:
        raise ValueError(f"output must be 'real' or 'complex', got {output!r}")
    compute_v = 1 if vectors else 0
    query = gees(lambda *x: None, a, compute_v=compute_v, lwork=-1)
    lwork = max(int(query[-2][0].real), 1)
    res = gees(lambda *x: None, a, compute_v=compute_v, lwork=lwork, sort_t=0, overwrite_a=0)
    info = res[-1]
    if info != 0:
        raise np.linalg.LinAlgError(f"Schur decomposition failed (LAPACK ?gees info = {info}) for shape {a.shape}")
    return res[0], (res[-3] if vectors else None)


def real_schur_blocks(T: np.ndarray) -> np.ndarray:
    """Start indices i of the 2×2 diagonal blocks T[i:i+2, i:i+2] of a real Schur factor."""
    sub = np.diagonal(T, -1)
    return np.flatnonzero(sub != 0)


def schur_eigenvalues(T: np.ndarray) -> np.ndarray:
    """Eigenvalues (complex128, in Schur order) read off a real or complex Schur factor."""
    lam = np.diagonal(T).astype(np.complex128)
    if not np.iscomplexobj(T):
        for i in real_schur_blocks(T):
            p, q, r, s = T[i, i], T[i, i + 1], T[i + 1, i], T[i + 1, i + 1]
            a = 0.5 * (p + s)
            disc = (0.5 * (p - s)) ** 2 + q * r  # < 0 for a complex pair
            w = math.sqrt(max(-disc, 0.0))
            lam[i], lam[i + 1] = complex(a, w), complex(a, -w)
    return lam


def nonnormal_norm_from_schur(T: np.ndarray) -> float:
    """‖N‖_F, the non-normal part of a Schur factor, summed without cancellation.

    Complex Schur: N = strictly upper triangle of T. Real Schur: the strictly block-upper part
    plus, for each 2×2 block [[p, q], [r, s]] (complex pair), the within-block part with
    ‖·‖_F² = ‖B‖_F² − 2|λ|² = (p − s)² + (q + r)². Equal to ‖J‖_F² − Σ|λ_i|² in exact arithmetic.
    """
    U = np.triu(T, 1)
    if np.iscomplexobj(T):
        return float(np.linalg.norm(U))
    starts = real_schur_blocks(T)
    if starts.size:
        U = U.copy()
        U[starts, starts + 1] = 0.0
        p, q = T[starts, starts], T[starts, starts + 1]
        r, s = T[starts + 1, starts], T[starts + 1, starts + 1]
        within = float(np.sum((p - s) ** 2 + (q + r) ** 2))
    else:
        within = 0.0
    return math.sqrt(float(np.sum(U * U)) + within)


def sort_eigenvalues(lam: np.ndarray) -> np.ndarray:
    """Eigenvalues sorted by descending modulus, ties by ascending angle (stable, reproducible)."""
    return lam[np.lexsort((np.angle(lam), -np.abs(lam)))]


# --------------------------------------------------------------------------------------------
# host or CUDA device


#: Below this Henrici departure the GPU path's subtraction ‖J‖_F² − Σ|λ|² is not trusted (its
#: absolute error is O(d·ε·‖J‖_F²), i.e. a relative error ≈ d·ε/h² ≤ 5e-7 at d = 4096 above it);
#: the value is then recomputed from the host's Schur factor.
GPU_HENRICI_MIN = 1e-3


def on_cuda(device: Any) -> bool:
    """True for a CUDA device (``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 0)``), else False."""
    return device is not None and str(device).startswith("cuda")


def eigen_henrici(a: np.ndarray, device: Any = None) -> tuple[np.ndarray, float, float]:
    """(eigenvalues, ‖N‖_F, ‖J‖_F) of a validated real/complex square matrix, one decomposition.

    Host (``device`` None or cpu): one Schur factor T without vectors (LAPACK ?gees): the
    eigenvalues are T's diagonal (blocks) and ‖N‖_F its non-normal part — the Schur form serves
    both, where eigvals + Schur would cost two decompositions (10 d³ + 10 d³ nominal → 10 d³).
    CUDA: ``torch.linalg.eigvals`` on the device (float64; cuSOLVER) and
    ``‖N‖_F = sqrt(max(0, ‖J‖_F² − Σ|λ|²))``; when that gives ‖N‖_F/‖J‖_F < :data:`GPU_HENRICI_MIN`
    (where the subtraction cancels) ‖N‖_F is recomputed from the host Schur factor.
    """
    fro = float(np.linalg.norm(a))
    if on_cuda(device):
        import torch

        lam = torch.linalg.eigvals(torch.as_tensor(a, device=device)).cpu().numpy().astype(np.complex128)
        nn2 = fro * fro - float(np.sum(np.abs(lam) ** 2))
        nn = math.sqrt(max(0.0, nn2))
        if fro == 0.0 or nn / fro >= GPU_HENRICI_MIN:
            return lam, nn, fro
        T, _ = schur_factor(a, "complex" if np.iscomplexobj(a) else "real", vectors=False)
        return lam, nonnormal_norm_from_schur(T), fro
    T, _ = schur_factor(a, "complex" if np.iscomplexobj(a) else "real", vectors=False)
    return schur_eigenvalues(T), nonnormal_norm_from_schur(T), fro


def svd_on(a: np.ndarray, vectors: bool, device: Any):
    """:func:`svd` on the host, ``torch.linalg.svd``/``svdvals`` (float64) on a CUDA device."""
    if not on_cuda(device):
        return svd(a, vectors)
    import torch

    t = torch.as_tensor(a, device=device)
    if vectors:
        U, sv, Vh = torch.linalg.svd(t, full_matrices=False)
        return U.cpu().numpy(), sv.cpu().numpy(), Vh.cpu().numpy()
    return torch.linalg.svdvals(t).cpu().numpy()


# --------------------------------------------------------------------------------------------
# ranks of a spectrum


def effective_rank(singular_values: Any) -> float:
    """Roy–Vetterli effective rank: exp(−Σ_i p_i log p_i), p_i = σ_i / Σ_j σ_j (0·log 0 = 0).

    Scale-invariant. The zero matrix (all σ = 0) has rank 0 and gives 0.

    Args:
        singular_values: (d,) array of σ ≥ 0.
    Returns:
        float in [1, d] (0 for all zeros); d iff all σ are equal; r for r equal non-zero σ.
    Example:
        >>> round(effective_rank(np.ones(5)), 12)
        5.0
        >>> round(effective_rank(np.array([1.0, 1.0, 0.0])), 12)
        2.0
    """
    s = as_values(singular_values, "singular_values", nonnegative=True, allow_complex=False)
    total = float(np.sum(s))
    if total == 0.0:
        return 0.0
    p = s[s > 0] / total
    return float(np.exp(-np.sum(p * np.log(p))))


def participation_ratio(singular_values: Any) -> float:
    """Participation ratio of the squared singular values: (Σ_i σ_i²)² / Σ_i σ_i⁴.

    Scale-invariant (evaluated on σ / σ_max, so it neither overflows nor underflows). The zero
    matrix gives 0.

    Args:
        singular_values: (d,) array of σ ≥ 0.
    Returns:
        float in [1, d] (0 for all zeros); r for r equal non-zero σ.
    Example:
        >>> participation_ratio(np.array([1.0, 1.0, 1.0, 0.0]))
        3.0
    """
    s = as_values(singular_values, "singular_values", nonnegative=True, allow_complex=False)
    smax = float(np.max(s))
    if smax == 0.0:
        return 0.0
    q = (s / smax) ** 2
    return float(np.sum(q) ** 2 / np.sum(q * q))


# --------------------------------------------------------------------------------------------
# the running product along depth


class NormalisedProduct:
    """Running product P_s = J_s P_{s−1} (P_0 = J_0), renormalised to ‖P_s‖_F = 1 every step.

    Dividing by the Frobenius norm after each multiplication keeps 200 factors of norm 10 from
    overflowing (or of norm 0.1 from underflowing); every rank of the spectrum is
    scale-invariant, so nothing is lost. :attr:`log10_fro` accumulates log10 of the removed
    factors, i.e. log10 ‖J_s ⋯ J_0‖_F of the unrescaled product. A product that becomes exactly
    0 stays 0 (:attr:`vanished`, ``log10_fro = −inf``).

    Works on numpy arrays and, for a device-resident product, on torch tensors (``@``,
    ``torch.linalg.matrix_norm``); do not mix the two in one product.

    Example:
        >>> p = NormalisedProduct()
        >>> for J in (2 * np.eye(2), 2 * np.eye(2)):
        ...     P = p.push(J)
        >>> P.round(6).tolist(), round(p.log10_fro, 6)  # ‖4 I‖_F = 4 sqrt(2)
        ([[0.707107, 0.0], [0.0, 0.707107]], 0.752575)
    """

    def __init__(self) -> None:
        #: the current normalised product (None before the first push; the zero matrix once vanished)
        self.P: Any = None
        #: log10 ‖J_s ⋯ J_0‖_F of the unrescaled product (−inf once it is exactly 0)
        self.log10_fro = 0.0

    @property
    def vanished(self) -> bool:
        """True once the product is exactly the zero matrix."""
        return self.log10_fro == -math.inf

    def push(self, J: Any) -> Any:
        """Multiply J on the left: P ← J P / ‖J P‖_F; returns the new P (the zero matrix once vanished).

        Raises FloatingPointError if ‖J P‖_F overflows (‖J‖_F near 1e308).
        """
        if self.vanished:
            return self.P
        if self.P is None:
            P = J.copy() if isinstance(J, np.ndarray) else J.clone()
        else:
            P = J @ self.P
        nrm = _fro(P)
        if nrm == 0.0 or not math.isfinite(nrm):
            if not math.isfinite(nrm):  # pragma: no cover - needs ‖J‖ near the float64 limit
                raise FloatingPointError("cumulative product overflowed despite rescaling; ‖J‖_F is near 1e308")
            self.P, self.log10_fro = P, -math.inf
            return self.P
        self.P = P / nrm
        self.log10_fro += math.log10(nrm)
        return self.P


def _fro(P: Any) -> float:
    """‖P‖_F as a Python float, for a numpy array or a torch tensor."""
    if isinstance(P, np.ndarray):
        return float(np.linalg.norm(P))
    import torch

    return float(torch.linalg.matrix_norm(P))
