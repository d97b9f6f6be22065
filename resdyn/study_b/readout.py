"""Readout subspaces of tuned-lens translators and their geometry on the Grassmannian.

Study B. A tuned-lens translator for the stream entering layer ``L`` is the affine map
``h ↦ A_L h + b_L`` with ``A_L = I + W_L`` (d × d). Its *readout subspace* of dimension ``k``,
``S_L^(k)``, is the span of the top-``k`` right singular vectors of ``A_L``: the input
directions the translator amplifies most, i.e. what the lens "reads" from the stream.

Consecutive readout subspaces are compared through their principal angles
``0 ≤ θ_1 ≤ … ≤ θ_k ≤ π/2``:

- Readout Subspace Similarity ``RSS_L(k) = (1/k) Σ_i cos θ_i`` between ``S_L`` and ``S_{L+1}``
  (1 for identical subspaces, 0 for orthogonal ones);
- geodesic (Grassmann) distance ``sqrt(Σ_i θ_i²)`` (0 … ``sqrt(k)·π/2``).

Indexing convention: with ``n`` translators ``A_0 … A_{n-1}`` (translator ``L`` reads the stream
``h_L`` entering layer ``L``; ``L = 0`` is the embedding output) the RSS profile has ``n − 1``
points, ``L = 0 … n−2``, and point ``L`` compares ``S_L`` with ``S_{L+1}`` — the readouts before
and after layer ``L``'s update ``h_{L+1} = h_L + Δ_L``.

All linear algebra is float64. Reference for principal angles: A. V. Knyazev and
M. E. Argentati, "Principal angles between subspaces in an A-based scalar product: algorithms
and perturbation estimates", SIAM J. Sci. Comput. 23(6):2008–2040, 2002.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from resdyn import artifacts
from resdyn.numerics.checks import is_int

# The one fraction -> k rule, shared with spectral (self-alignment k) and the cost model.
from resdyn.numerics.linalg import k_from_fraction

__all__ = [
    "RSS_COLUMNS",
    "READOUT_MATRICES",
    "readout_matrices",
    "readout_subspace",
    "principal_angles",
    "rss",
    "grassmann_distance",
    "energy_share",
    "k_from_fraction",
    "rss_profile",
    "resolution_table",
    "pareto_front",
]

#: Columns of ``rss.tsv`` (:func:`rss_profile`), in order.
RSS_COLUMNS = artifacts.RSS_COLUMNS  # defined by resdyn.artifacts.RssProfile
#: Which matrix of a translator the readout subspace is taken from (config ``readout.matrix``).
READOUT_MATRICES = ("I_plus_W", "W")


def readout_matrices(translators: Sequence[np.ndarray], matrix: str) -> list[np.ndarray]:
    """The matrices whose top-k right singular vectors are the readout subspaces.

    ``translators`` are ``A_L = I + W_L``; ``matrix`` ``"I_plus_W"`` keeps them, ``"W"`` gives
    ``W_L = A_L − I`` (the learned correction alone: for a near-identity translator the top-k
    subspaces of I + W and of W can differ, and the top-k energy share of I + W is ≈ k/d).

    Example:
        >>> readout_matrices([np.diag([3.0, 1.0])], "W")[0].tolist()
        [[2.0, 0.0], [0.0, 0.0]]
    """
    if matrix not in READOUT_MATRICES:
        raise ValueError(f"readout matrix must be one of {READOUT_MATRICES}, got {matrix!r}")
    if matrix == "I_plus_W":
        return [np.asarray(A, dtype=np.float64) for A in translators]
    return [np.asarray(A, dtype=np.float64) - np.eye(np.shape(A)[0]) for A in translators]


# --------------------------------------------------------------------------------------------
# validation helpers


def _as_matrix(a: object, name: str) -> np.ndarray:
    """``a`` as a finite 2-D float64 array, or ValueError naming ``name`` and the shape."""
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {arr.shape} (ndim {arr.ndim})")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} (shape {arr.shape}) has {bad} non-finite entries (NaN/inf)")
    return arr


def _check_k(k: object, limit: int, what: str) -> int:
    if not is_int(k):
        raise ValueError(f"k must be an integer, got {k!r} ({type(k).__name__})")
    k = int(k)
    if not 1 <= k <= limit:
        raise ValueError(f"k must satisfy 1 <= k <= {limit} ({what}), got k={k}")
    return k


def _orthonormal_basis(V: np.ndarray, name: str) -> np.ndarray:
    """Orthonormal basis (d × k) of span(V) via the thin SVD; ValueError if rank < k."""
    d, k = V.shape
    if k > d:
        raise ValueError(f"{name} has shape {V.shape}: a basis of a subspace of R^d needs k <= d columns")
    U, s, _ = np.linalg.svd(V, full_matrices=False)
    tol = max(V.shape) * np.finfo(np.float64).eps * (s[0] if s.size else 0.0)
    if s.size == 0 or s[0] == 0.0 or s[-1] <= tol:
        rank = int(np.count_nonzero(s > tol))
        raise ValueError(
            f"{name} (shape {V.shape}) has linearly dependent columns (numerical rank {rank} < k={k});"
            " a k-dimensional subspace needs k independent columns"
        )
    return U


def _pair(V1: object, V2: object) -> tuple[np.ndarray, np.ndarray]:
    A = _as_matrix(V1, "V1")
    B = _as_matrix(V2, "V2")
    if A.shape != B.shape:
        raise ValueError(
            f"V1 and V2 must have the same shape (d × k, same ambient d and same k), got V1 {A.shape} and V2 {B.shape}"
        )
    return _orthonormal_basis(A, "V1"), _orthonormal_basis(B, "V2")


# --------------------------------------------------------------------------------------------
# core geometry (inputs already orthonormal)


def _angles_orthonormal(Q1: np.ndarray, Q2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosines descending, angles ascending) for orthonormal Q1, Q2 of equal shape d × k.

    Cosines are the singular values of ``Q1ᵀQ2``; sines are the singular values of the part of
    ``Q2`` orthogonal to span(Q1), ``Q2 − Q1 (Q1ᵀQ2)``. As in Knyazev & Argentati (2002), an
    angle is taken from its sine when it is small (cos² ≥ 1/2, i.e. θ ≤ π/4, where arccos is
    ill-conditioned) and from its cosine otherwise.
    """
    M = Q1.T @ Q2
    cos = np.clip(np.linalg.svd(M, compute_uv=False), 0.0, 1.0)  # descending → θ ascending
    small = cos * cos >= 0.5
    theta = np.arccos(cos)
    if small.any():
        R = Q2 - Q1 @ M
        sin = np.clip(np.linalg.svd(R, compute_uv=False), 0.0, 1.0)[::-1]  # ascending → θ ascending
        theta = np.where(small, np.arcsin(sin), theta)
    return cos, theta


def _svd_translator(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Singular values (descending) and right singular vectors as columns (d × r)."""
    _, s, Vt = np.linalg.svd(A, full_matrices=False)
    return s, Vt.T


def _energy_from_sigma(s: np.ndarray, k: int) -> float:
    sq = s * s
    total = float(sq.sum())
    if total == 0.0:
        return float("nan")
    return float(sq[:k].sum() / total)


# --------------------------------------------------------------------------------------------
# public API


def readout_subspace(A: np.ndarray, k: int) -> np.ndarray:
    """Readout subspace ``S^(k)`` of a translator: its top-``k`` right singular vectors.

    With the SVD ``A = U Σ Vᵀ`` (σ_1 ≥ σ_2 ≥ …), returns ``V[:, :k]``, the orthonormal basis of
    the ``k`` input directions that ``A`` amplifies most.

    Parameters
    ----------
    A : (m, d) array_like
        Translator matrix, normally ``A_L = I + W_L`` (square, d × d). Real and finite.
    k : int
        Subspace dimension, ``1 ≤ k ≤ min(m, d)``.

    Returns
    -------
    V : (d, k) ndarray, float64
        Orthonormal columns (``VᵀV = I_k``). Only the span is meaningful: signs, and the basis
        inside a block of equal singular values, are arbitrary. If ``σ_k = σ_{k+1}`` the
        subspace itself is not unique.

    Raises
    ------
    ValueError
        If ``A`` is not 2-D, is empty, non-finite, or ``k`` is out of range.

    Examples
    --------
    A diagonal translator reads the coordinate axes with the largest entries:

    >>> V = readout_subspace(np.diag([1.0, 5.0, 3.0, 0.5]), 2)
    >>> np.round(np.abs(V), 12)
    array([[0., 0.],
           [1., 0.],
           [0., 1.],
           [0., 0.]])
    """
    M = _as_matrix(A, "A")
    k = _check_k(k, min(M.shape), f"A has shape {M.shape}")
    _, V = _svd_translator(M)
    return np.ascontiguousarray(V[:, :k])


def principal_angles(V1: np.ndarray, V2: np.ndarray) -> np.ndarray:
    """Principal angles ``0 ≤ θ_1 ≤ … ≤ θ_k ≤ π/2`` between span(V1) and span(V2), ascending.

    Both bases are orthonormalised (thin SVD). ``cos θ_i`` are the singular values of
    ``Q1ᵀQ2``; small angles (``θ ≤ π/4``) are taken from the sines, the singular values of
    ``Q2 − Q1 Q1ᵀQ2``, which keeps them accurate down to ~1e-16 where ``arccos`` would lose
    half the digits (Knyazev & Argentati, 2002). Same values as
    ``scipy.linalg.subspace_angles`` (which returns them in descending order).

    Parameters
    ----------
    V1, V2 : (d, k) array_like
        Bases (any, not necessarily orthonormal) of two k-dimensional subspaces of R^d;
        same shape, ``k ≤ d``, full column rank.

    Returns
    -------
    theta : (k,) ndarray, float64, ascending, in [0, π/2].

    Examples
    --------
    >>> e = np.eye(3)
    >>> principal_angles(e[:, :2], e[:, [0, 2]])  # share e_0, e_1 ⟂ e_2
    array([0.        , 1.57079633])
    """
    Q1, Q2 = _pair(V1, V2)
    return _angles_orthonormal(Q1, Q2)[1]


def rss(V1: np.ndarray, V2: np.ndarray) -> float:
    """Readout Subspace Similarity ``RSS = (1/k) Σ_i cos θ_i`` of two k-dim subspaces.

    ``θ_i`` are the principal angles between span(V1) and span(V2); the cosines are the
    singular values of ``Q1ᵀQ2`` (Q the orthonormalised bases), clipped to [0, 1].

    Parameters
    ----------
    V1, V2 : (d, k) array_like
        Bases of the two subspaces (same shape, full column rank, ``k ≤ d``).

    Returns
    -------
    float in [0, 1]
        1 iff the subspaces coincide, 0 iff they are orthogonal. Invariant to the choice of
        basis (``V → V Q`` for any invertible ``Q``) and to a common rotation of both.
        Symmetric in its arguments. Equals ``‖Q1ᵀQ2‖_* / k`` (nuclear norm).

    Examples
    --------
    >>> e = np.eye(4)
    >>> rss(e[:, :2], e[:, :2]), rss(e[:, :2], e[:, 2:])
    (1.0, 0.0)
    >>> round(rss(e[:, :2], e[:, [0, 2]]), 12)  # one shared direction, one orthogonal
    0.5
    """
    Q1, Q2 = _pair(V1, V2)
    cos = np.clip(np.linalg.svd(Q1.T @ Q2, compute_uv=False), 0.0, 1.0)
    return float(cos.mean())


def grassmann_distance(V1: np.ndarray, V2: np.ndarray) -> float:
    """Geodesic (arc-length) distance on the Grassmannian: ``sqrt(Σ_i θ_i²)``.

    ``θ_i`` are the principal angles, small ones computed from their sines (see
    :func:`principal_angles`), so nearly identical subspaces get an accurate small distance
    rather than the ~1e-8 floor of ``arccos``.

    Parameters
    ----------
    V1, V2 : (d, k) array_like
        Bases of the two subspaces (same shape, full column rank, ``k ≤ d``).

    Returns
    -------
    float in [0, sqrt(k)·π/2]
        0 for identical subspaces, ``sqrt(k)·π/2`` for orthogonal ones.

    Examples
    --------
    >>> e = np.eye(4)
    >>> grassmann_distance(e[:, :2], e[:, :2])
    0.0
    >>> bool(np.isclose(grassmann_distance(e[:, :2], e[:, 2:]), np.sqrt(2) * np.pi / 2))
    True
    """
    theta = principal_angles(V1, V2)
    return float(np.sqrt(np.sum(theta * theta)))


def energy_share(A: np.ndarray, k: int) -> float:
    """Share of ``‖A‖_F² = Σσ_i²`` carried by the top-``k`` singular values: ``Σ_{i≤k} σ_i² / Σ σ_i²``.

    In [0, 1]; NaN for ``A = 0``. For ``A = diag(a)``: ``Σ`` of the ``k`` largest ``a_i²`` over
    ``Σ a_i²``; e.g. ``energy_share(np.diag([3., 4., 0.]), 1) == 16/25``.
    """
    M = _as_matrix(A, "A")
    k = _check_k(k, min(M.shape), f"A has shape {M.shape}")
    return _energy_from_sigma(np.linalg.svd(M, compute_uv=False), k)


def _check_translators(translators: Sequence[np.ndarray], min_n: int) -> list[np.ndarray]:
    if isinstance(translators, np.ndarray) and translators.ndim == 3:
        translators = list(translators)
    if not isinstance(translators, (list, tuple)):
        raise ValueError(f"translators must be a list of (d, d) arrays A_0..A_(n-1), got {type(translators).__name__}")
    if len(translators) < min_n:
        raise ValueError(f"need at least {min_n} translators (consecutive pairs), got {len(translators)}")
    mats = [_as_matrix(A, f"translators[{i}]") for i, A in enumerate(translators)]
    shape = mats[0].shape
    if shape[0] != shape[1]:
        raise ValueError(f"translators must be square (d, d), translators[0] has shape {shape}")
    for i, M in enumerate(mats):
        if M.shape != shape:
            raise ValueError(
                f"all translators must have the same shape; translators[0] is {shape}, translators[{i}] is {M.shape}"
            )
    return mats


def rss_profile(translators: Sequence[np.ndarray], ks: Sequence[int]) -> pd.DataFrame:
    """RSS profile: principal-angle similarity of consecutive readout subspaces, per k.

    For translators ``A_0 … A_{n−1}`` (each d × d) and every ``k`` in ``ks``, one row per
    consecutive pair ``(L, L+1)``, ``L = 0 … n−2``:

    - ``rss = (1/k) Σ cos θ_i`` between ``S_L^(k)`` and ``S_{L+1}^(k)`` (see :func:`rss`),
    - ``grassmann_distance = sqrt(Σ θ_i²)``,
    - ``energy = Σ_{i≤k} σ_i(A_L)² / Σ σ_i(A_L)²`` (top-k energy share of ``A_L``).

    Each translator is decomposed once (float64 SVD). Row ``layer = L`` describes the change of
    readout across layer ``L`` (stream ``h_L`` → ``h_{L+1}``), so the profile has ``n − 1``
    points per ``k``.

    Parameters
    ----------
    translators : list of (d, d) arrays, length n ≥ 2
    ks : list of int, each in [1, d]

    Returns
    -------
    DataFrame with columns :data:`RSS_COLUMNS`: ``layer`` (int), ``k`` (int), ``k_fraction``
    (= k/d), ``d`` (int, the hidden size: readers need not reconstruct it), ``rss`` (in
    [0, 1]), ``grassmann_distance`` (in [0, sqrt(k)π/2]), ``energy`` (in [0, 1]); sorted by k,
    then layer; ``(n − 1)·len(ks)`` rows.

    Examples
    --------
    >>> A = [np.diag([3.0, 2.0, 1.0]), np.diag([1.0, 2.0, 3.0])]
    >>> rss_profile(A, [1])[["layer", "k", "rss", "energy"]].round(6).to_dict("records")
    [{'layer': 0, 'k': 1, 'rss': 0.0, 'energy': 0.642857}]
    """
    mats = _check_translators(translators, 2)
    d = mats[0].shape[0]
    ks = _check_ks(ks, d)
    decomp = [_svd_translator(M) for M in mats]
    rows = []
    for k in ks:
        for L in range(len(mats) - 1):
            s_L, V_L = decomp[L]
            _, V_next = decomp[L + 1]
            cos, theta = _angles_orthonormal(V_L[:, :k], V_next[:, :k])
            rows.append(
                {
                    "layer": L,
                    "k": k,
                    "k_fraction": k / d,
                    "d": d,
                    "rss": float(cos.mean()),
                    "grassmann_distance": float(np.sqrt(np.sum(theta * theta))),
                    "energy": _energy_from_sigma(s_L, k),
                }
            )
    return pd.DataFrame(rows, columns=RSS_COLUMNS)


def _check_ks(ks: Sequence[int], d: int) -> list[int]:
    ks_list = list(np.atleast_1d(np.asarray(ks, dtype=object)))
    if not ks_list:
        raise ValueError("ks must list at least one subspace dimension k")
    return [_check_k(k, d, f"translators are {d} × {d}") for k in ks_list]


def pareto_front(energy: Sequence[float], visibility: Sequence[float]) -> np.ndarray:
    """Boolean mask of points not dominated when both coordinates are maximised.

    Point i is dominated if some j has ``energy_j ≥ energy_i`` and ``visibility_j ≥
    visibility_i`` with at least one strict inequality. Ties (identical points) are all kept.
    NaN points are never on the front and never dominate.

    Examples
    --------
    >>> pareto_front([0.2, 0.5, 0.9, 0.4], [0.9, 0.6, 0.1, 0.5]).tolist()
    [True, True, True, False]
    """
    e = np.asarray(energy, dtype=np.float64).ravel()
    v = np.asarray(visibility, dtype=np.float64).ravel()
    if e.shape != v.shape:
        raise ValueError(f"energy and visibility must have the same length, got {e.shape} and {v.shape}")
    ok = np.isfinite(e) & np.isfinite(v)
    front = ok.copy()
    for i in np.flatnonzero(ok):
        ge = ok & (e >= e[i]) & (v >= v[i])
        gt = (e > e[i]) | (v > v[i])
        if np.any(ge & gt):
            front[i] = False
    return front


def resolution_table(translators: Sequence[np.ndarray], k_fractions: Sequence[float]) -> pd.DataFrame:
    """Resolution sweep over the readout dimension k: energy vs visibility, with the Pareto front.

    For each fraction f, ``k = k_from_fraction(d, f)`` and

    - ``energy(k) = (1/n) Σ_{L=0}^{n−1} Σ_{i≤k} σ_i(A_L)² / Σ_i σ_i(A_L)²`` — how much of each
      translator the top-k subspace captures (mean over **all** n translators), increasing in k;
    - ``mean_rss(k) = (1/(n−1)) Σ_{L=0}^{n−2} RSS_L(k)`` and ``visibility(k) = 1 − mean_rss(k)``
      — how distinguishable consecutive readout subspaces are; tends to fall as k grows
      (``RSS → 1`` at ``k = d``);
    - ``pareto``: True if no other row has both higher-or-equal energy and visibility with one
      strictly higher (:func:`pareto_front`).

    Fractions that round to the same k give identical rows (both kept, both flagged alike).

    Parameters
    ----------
    translators : list of (d, d) arrays, length n ≥ 2
    k_fractions : list of float in (0, 1]

    Returns
    -------
    DataFrame with columns ``k_fraction``, ``k``, ``energy``, ``mean_rss``, ``visibility``,
    ``pareto``; one row per fraction, in the given order.

    Examples
    --------
    Identical diagonal translators: RSS = 1, visibility = 0 for every k, and energy has the
    closed form ``Σ_{i≤k} a_i² / Σ a_i²``:

    >>> A = np.diag([2.0, 1.0, 1.0, 0.0])
    >>> t = resolution_table([A, A, A], [0.25, 0.5])
    >>> t[["k", "energy", "visibility"]].round(6).to_dict("records")
    [{'k': 1, 'energy': 0.666667, 'visibility': 0.0}, {'k': 2, 'energy': 0.833333, 'visibility': 0.0}]
    """
    mats = _check_translators(translators, 2)
    d = mats[0].shape[0]
    fracs = list(np.atleast_1d(np.asarray(k_fractions, dtype=object)))
    if not fracs:
        raise ValueError("k_fractions must list at least one fraction in (0, 1]")
    ks = [k_from_fraction(d, f) for f in fracs]
    decomp = [_svd_translator(M) for M in mats]
    rows = []
    cache: dict[int, tuple[float, float]] = {}
    for f, k in zip(fracs, ks):
        if k not in cache:
            energy = float(np.mean([_energy_from_sigma(s, k) for s, _ in decomp]))
            sims = [
                float(_angles_orthonormal(decomp[L][1][:, :k], decomp[L + 1][1][:, :k])[0].mean())
                for L in range(len(mats) - 1)
            ]
            cache[k] = (energy, float(np.mean(sims)))
        energy, mean_rss = cache[k]
        rows.append(
            {
                "k_fraction": float(f),
                "k": k,
                "energy": energy,
                "mean_rss": mean_rss,
                "visibility": 1.0 - mean_rss,
            }
        )
    table = pd.DataFrame(rows, columns=["k_fraction", "k", "energy", "mean_rss", "visibility"])
    table["pareto"] = pareto_front(table["energy"].to_numpy(), table["visibility"].to_numpy())
    return table
