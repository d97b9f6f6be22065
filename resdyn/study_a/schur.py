"""Schur surgery: scale the non-normal part of a Jacobian, keep its eigenvalues.

docs/design.md defines J(α) through the complex Schur form J = Q (Λ + N) Q^H:
J(α) = Q (Λ + αN) Q^H. α = 1 gives J, α = 0 the normal matrix Q Λ Q^H with J's eigenvalues,
and in between the eigenvalues stay put while ‖J(α)‖_F² = Σ|λ_i|² + α²‖N‖_F².

The real Jacobians of a transformer have complex-conjugate eigenvalue pairs, and for those the
complex form leaves the reals. Smallest case: a real 2×2 J with eigenvalues λ, λ̄ has
Q Λ Q^H = λ q_1 q_1^H + λ̄ q_2 q_2^H, real only if q_2 ∝ conj(q_1), i.e. only if the
eigenvector q_1 of λ has q_1^T q_1 = 0, i.e. q_1 ∝ (1, ±i), i.e. J = aI + bK is already normal.
Larger matrices behave alike: for a 40×40 Gaussian J, Q Λ Q^H has imaginary entries up to
0.48 (tests/test_schur.py checks > 1e-3). So for real J and α ≠ 1 the complex surgery returns a
complex matrix, whose product along depth is an operator on C^d rather than on the residual
stream R^d, and taking its real part would move the eigenvalues.

This module therefore offers two forms and picks by the input (``form="auto"``):

``"real"`` (default for real J) — real Schur form J = Z T Z^T, T quasi-upper-triangular:
    T = D + U, D block diagonal with 1×1 blocks (real eigenvalues) and 2×2 blocks B (complex
    pairs a ± iω), U strictly block-upper. Each 2×2 block splits orthogonally (Frobenius) as
    B = a I + S + w K, S symmetric traceless, K = [[0, 1], [−1, 0]], with
    ω² = w² − ‖S‖_F²/2 and ‖B‖_F² − 2|λ|² = 2‖S‖_F². Then

        J(α) = Z (D(α) + α U) Z^T,  D(α): 1×1 blocks unchanged,
        B(α) = a I + α S + sign(w) · sqrt(ω² + α² ‖S‖_F²/2) · K.

    The within-block non-normal part S scales by α and the rotation part stretches so the
    eigenvalues a ± iω stay exactly fixed. Properties (all tested): J(α) is real; J(1) = J;
    J(α) has J's eigenvalues for every α; J(0) is normal (block-diagonal with normal blocks
    a I + ω K); ‖J(α)‖_F² = Σ|λ_i|² + α²‖N‖_F² with ‖N‖_F the same as in the complex form, so
    the Henrici departure h(α) = α‖N‖/sqrt(Σ|λ|² + α²‖N‖²) is identical to the complex form's.
    The formula for B(α) is invariant under rotations of the block, so it does not depend on
    how LAPACK standardises 2×2 blocks. When all eigenvalues are real (no 2×2 blocks) it *is*
    the complex-Schur definition with a real Q. J(0) is also at least as close to J as the
    complex form's Q Λ Q^H: per block ‖B − B(0)‖_F² = ‖S‖² + 2(|w| − ω)² ≤ 2‖S‖², so
    ‖J − J_real(0)‖_F ≤ ‖N‖_F = ‖J − J_complex(0)‖_F.
    Unlike the complex form, J(α) is not affine in α inside the 2×2 blocks.

``"complex"`` (default for complex J, available for real J) — the docs/design.md formula verbatim.
    Always returns complex128 (also for real J, where the result is generally not real).

Both forms depend on which Schur form LAPACK returns (the order of eigenvalues along the
diagonal): J(α) for α ≠ 1 does, ‖N‖_F, the eigenvalues and h(α) do not. Deterministic for a
given machine and LAPACK build.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from resdyn.numerics.linalg import (
    NormalisedProduct,
    as_square,
    as_values,
    effective_rank,
    nonnormal_norm_from_schur,
    participation_ratio,
    real_schur_blocks,
    schur_eigenvalues,
    schur_factor,
    svd,
)
from resdyn.study_a.spectral import check_chain, ordered_sublayers

__all__ = ["SchurSplit", "schur_split", "scale_nonnormal", "schur_bottleneck", "FORMS"]

FORMS: tuple[str, ...] = ("auto", "real", "complex")


def _check_alpha(alpha: Any) -> float:
    if isinstance(alpha, bool):
        raise ValueError(f"alpha must be a finite real number, got {alpha!r}")
    try:
        a = float(alpha)
    except (TypeError, ValueError) as err:
        raise ValueError(f"alpha must be a finite real number (0 = normal part, 1 = J), got {alpha!r}") from err
    if not math.isfinite(a):
        raise ValueError(f"alpha must be a finite real number (0 = normal part, 1 = J), got {alpha!r}")
    return a


def _resolve_form(form: str, a: np.ndarray) -> str:
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form == "auto":
        return "complex" if np.iscomplexobj(a) else "real"
    if form == "real" and np.iscomplexobj(a):
        raise ValueError(f"form='real' needs a real matrix, got dtype {a.dtype} (shape {a.shape}); use 'complex'")
    return form


@dataclass(frozen=True)
class SchurSplit:
    """A Schur decomposition J = Q T Q^H prepared for :meth:`at` (see the module docstring).

    Attributes:
        Q: (d, d) orthogonal (form 'real') or unitary (form 'complex') Schur basis.
        T: (d, d) Schur factor: quasi-upper-triangular real, or upper-triangular complex.
        form: 'real' or 'complex'.
        eigenvalues: (d,) complex128, in Schur (diagonal) order.
        nonnormal_fro: ‖N‖_F, the norm of the non-normal part.
        normal_fro: sqrt(Σ|λ_i|²), the norm of the normal part.
    """

    Q: np.ndarray
    T: np.ndarray
    form: str
    eigenvalues: np.ndarray
    nonnormal_fro: float
    normal_fro: float

    @property
    def d(self) -> int:
        return self.T.shape[0]

    def henrici(self, alpha: float) -> float:
        """Henrici departure of J(α): |α|‖N‖_F / sqrt(Σ|λ|² + α²‖N‖_F²) (0 for the zero matrix)."""
        a = _check_alpha(alpha)
        num = abs(a) * self.nonnormal_fro
        den = math.hypot(self.normal_fro, num)
        return num / den if den > 0 else 0.0

    def factor_at(self, alpha: float) -> np.ndarray:
        """The scaled Schur factor T(α), so that J(α) = Q T(α) Q^H."""
        a = _check_alpha(alpha)
        T = self.T
        if self.form == "complex":
            Ta = a * np.triu(T, 1)
            idx = np.arange(self.d)
            Ta[idx, idx] = np.diagonal(T)
            return Ta
        Ta = a * T
        idx = np.arange(self.d)
        Ta[idx, idx] = np.diagonal(T)  # 1×1 blocks unchanged (2×2 diagonals rewritten below)
        i = real_schur_blocks(T)
        if i.size:
            p, q, r, s = T[i, i], T[i, i + 1], T[i + 1, i], T[i + 1, i + 1]
            mean = 0.5 * (p + s)
            delta, beta, w = 0.5 * (p - s), 0.5 * (q + r), 0.5 * (q - r)
            g2 = delta * delta + beta * beta  # ‖S‖_F² / 2
            omega2 = np.maximum(w * w - g2, 0.0)
            # At α = 1 use |w| exactly, so J(1) = J to rounding of the two basis products only.
            rad = np.abs(w) if a == 1.0 else np.sqrt(omega2 + a * a * g2)
            wa = np.sign(w) * rad
            Ta[i, i] = mean + a * delta
            Ta[i + 1, i + 1] = mean - a * delta
            Ta[i, i + 1] = a * beta + wa
            Ta[i + 1, i] = a * beta - wa
        return Ta

    def at(self, alpha: float) -> np.ndarray:
        """J(α) = Q T(α) Q^H: float64 for form 'real', complex128 for form 'complex'."""
        Ta = self.factor_at(alpha)
        return self.Q @ Ta @ self.Q.conj().T


def schur_split(J: Any, form: str = "auto") -> SchurSplit:
    """Schur decomposition of J for non-normal surgery; compute once, evaluate many α.

    Args:
        J: (d, d) real or complex matrix.
        form: 'auto' (real for real J, complex for complex J), 'real' or 'complex'.
    Returns:
        :class:`SchurSplit`.
    Example:
        >>> sp = schur_split(np.array([[1.0, 3.0], [0.0, 2.0]]))
        >>> round(sp.nonnormal_fro, 12), round(sp.normal_fro ** 2, 12)
        (3.0, 5.0)
    """
    a = as_square(J)
    f = _resolve_form(form, a)
    T, Q = schur_factor(a, f, vectors=True)
    lam = schur_eigenvalues(T)
    return SchurSplit(
        Q=Q,
        T=T,
        form=f,
        eigenvalues=lam,
        nonnormal_fro=nonnormal_norm_from_schur(T),
        normal_fro=float(np.sqrt(np.sum(np.abs(lam) ** 2))),
    )


def scale_nonnormal(J: Any, alpha: float, form: str = "auto") -> np.ndarray:
    """Scale the non-normal part of J by α, keeping its eigenvalues: J(α).

    Complex form: J = Q (Λ + N) Q^H ⇒ J(α) = Q (Λ + αN) Q^H. Real form (default for real J):
    J = Z (D + U) Z^T ⇒ J(α) = Z (D(α) + αU) Z^T, D(α) as in the module docstring. In both,
    J(1) = J, J(0) is normal with J's eigenvalues, eigenvalues are fixed for every α and
    ‖J(α)‖_F² = Σ|λ_i|² + α²‖N‖_F². α ∈ [0, 1] interpolates, α > 1 amplifies, α < 0 is allowed
    (same as |α| for the norms). For several α, use :func:`schur_split` once and ``.at(α)``.

    Args:
        J: (d, d) real or complex matrix.
        alpha: finite real.
        form: 'auto' | 'real' | 'complex'.
    Returns:
        (d, d) float64 (real form) or complex128 (complex form; also for real J).
    Example:
        >>> scale_nonnormal(np.array([[1.0, 3.0], [0.0, 2.0]]), 0.5).round(12).tolist()
        [[1.0, 1.5], [0.0, 2.0]]
        >>> scale_nonnormal(np.array([[0.0, 4.0], [-1.0, 0.0]]), 0.0).round(12).tolist()
        [[0.0, 2.0], [-2.0, 0.0]]
    """
    a = _check_alpha(alpha)
    return schur_split(J, form).at(a)


def _check_alphas(alphas: Any) -> np.ndarray:
    al = as_values(alphas, "alphas", allow_complex=False)
    if len(np.unique(al)) != al.size:
        raise ValueError(f"alphas must be distinct, got {al.tolist()}")
    return al


def schur_bottleneck(
    jacobians: Mapping[tuple[int, str], Any] | Sequence[Any] | Iterable[Any],
    alphas: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    form: str = "auto",
) -> pd.DataFrame:
    """Bottleneck curves of the surgically altered Jacobians: ranks of P_s(α) = J_s(α) ⋯ J_0(α).

    Each sublayer is Schur-decomposed once; for every α a running product is kept (rescaled by
    its Frobenius norm each step, see :func:`resdyn.study_a.spectral.cumulative_spectrum`). Memory:
    one Schur pair plus len(alphas) products of size d×d.

    Args:
        jacobians: {(layer, kind): matrix or zero-argument callable} with contiguous
            s = 0..S−1, or an iterable of (d, d) matrices in sublayer order.
        alphas: distinct finite reals (α = 1 reproduces the plain bottleneck).
        form: 'auto' | 'real' | 'complex' (see the module docstring).
    Returns:
        DataFrame with one row per (α, s), sorted by α then s: ``alpha, s`` (plus ``layer,
        kind`` for a mapping), ``erank``, ``pr`` (of P_s(α)), ``log10_fro`` (log10 ‖P_s(α)‖_F),
        ``henrici_single`` (Henrici departure of J_s(α)).
    Example:
        >>> J = np.array([[1.0, 3.0], [0.0, 1.0]])
        >>> df = schur_bottleneck([J, J], alphas=[0.0, 1.0])
        >>> df[["alpha", "s", "erank"]].round(4).values.tolist()
        [[0.0, 0.0, 2.0], [0.0, 1.0, 2.0], [1.0, 0.0, 1.3343], [1.0, 1.0, 1.1267]]
    """
    al = _check_alphas(alphas)
    if isinstance(jacobians, Mapping):
        ordered = ordered_sublayers(jacobians)
        check_chain([(r[1], r[2]) for r in ordered], "schur_bottleneck: jacobians")
        items = [(s, {"layer": layer, "kind": kind}, J) for s, layer, kind, J in ordered]
    else:
        items = ((s, {}, J) for s, J in enumerate(jacobians))
    cums = [NormalisedProduct() for _ in al]
    rows: list[dict] = []
    d0 = None
    n = 0
    for s, keys, J in items:
        a = as_square(J() if callable(J) else J, name=f"jacobians[{s}]")
        if d0 is None:
            d0 = a.shape[0]
        elif a.shape[0] != d0:
            raise ValueError(f"jacobians[{s}] has shape {a.shape}, but jacobians[0] is {d0}×{d0}")
        split = schur_split(a, form)
        for alpha, cum in zip(al, cums):
            P = cum.push(split.at(alpha))
            sv = np.zeros(d0) if cum.vanished else svd(P, vectors=False)
            rows.append(
                {
                    "alpha": float(alpha),
                    "s": s,
                    **keys,
                    "erank": effective_rank(sv),
                    "pr": participation_ratio(sv),
                    "log10_fro": cum.log10_fro,
                    "henrici_single": split.henrici(alpha),
                }
            )
        n += 1
    if n == 0:
        raise ValueError("jacobians is empty; need at least one d×d matrix")
    return pd.DataFrame(rows).sort_values(["alpha", "s"], kind="stable").reset_index(drop=True)
