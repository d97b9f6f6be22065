"""Boundary units of a partition (positive neighbours in other communities, or a participation
quantile), the participation coefficient, and the per-unit community table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import igraph as ig

from resdyn.study_a.topology.communities import check_labels, edge_arrays

# scipy.sparse is imported inside the function that uses it: the light table jobs
# (checkpoints, coupling) import the package for pandas-only helpers, and these imports cost
# 3-5 s of start-up per job on a loaded 2-core machine.


def _positive_arcs(graph: ig.Graph, lab: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positive edges as arcs in both directions: (unit, neighbour, weight)."""
    src, dst, w = edge_arrays(graph)
    pos = w > 0
    i = np.concatenate([src[pos], dst[pos]])
    j = np.concatenate([dst[pos], src[pos]])
    return i, j, np.concatenate([w[pos], w[pos]])


def other_communities(graph: ig.Graph, labels: Any) -> np.ndarray:
    """How many communities other than its own each unit's positive neighbours lie in.

    n_i = |{ c_j : w_ij > 0, c_j ≠ c_i }|. Negative edges are ignored. Returns int64, shape (d,).
    """
    lab = check_labels(graph, labels)
    i, j, _ = _positive_arcs(graph, lab)
    other = lab[j] != lab[i]
    i, cj = i[other], lab[j][other]
    n = graph.vcount()
    if i.size == 0:
        return np.zeros(n, dtype=np.int64)
    _, cj = np.unique(cj, return_inverse=True)
    pairs = np.unique(i * (int(cj.max()) + 1) + cj)
    return np.bincount(pairs // (int(cj.max()) + 1), minlength=n).astype(np.int64)


def boundary_units(graph: ig.Graph, labels: Any, min_other: int = 2) -> np.ndarray:
    """Boundary units: a unit whose positive neighbours lie in ≥ ``min_other`` (default 2)
    communities other than its own.

    B_i = [ n_i ≥ min_other ], n_i from :func:`other_communities`. Returns a bool array of shape (d,).
    """
    check_min_other(min_other)
    return other_communities(graph, labels) >= min_other


def check_min_other(min_other: Any) -> None:
    """``min_other`` (other communities a boundary unit reaches) is a positive integer, or stop."""
    if isinstance(min_other, bool) or not isinstance(min_other, (int, np.integer)) or min_other < 1:
        raise ValueError(f"min_other must be a positive integer, got {min_other!r}")


def participation_coefficient(graph: ig.Graph, labels: Any) -> np.ndarray:
    """Participation coefficient (Guimerà & Amaral, Nature 433, 895, 2005) on positive weights.

    P_i = 1 − Σ_c (k_ic / k_i)², with k_ic = Σ_{j ∈ c, w_ij > 0} w_ij and k_i = Σ_c k_ic.
    0 when all positive weight stays in one community, and 0 for units without positive edges
    (isolated). Returns float64, shape (d,).
    """
    from scipy import sparse

    lab = check_labels(graph, labels)
    n = graph.vcount()
    i, j, w = _positive_arcs(graph, lab)
    if i.size == 0:
        return np.zeros(n)
    _, cj = np.unique(lab[j], return_inverse=True)
    K = sparse.coo_matrix((w, (i, cj)), shape=(n, int(cj.max()) + 1)).tocsr()
    K.sum_duplicates()
    k = np.asarray(K.sum(axis=1)).ravel()
    sq = np.asarray(K.multiply(K).sum(axis=1)).ravel()
    pc = np.zeros(n)
    has = k > 0
    pc[has] = 1.0 - sq[has] / k[has] ** 2
    return np.clip(pc, 0.0, 1.0)


def boundary_units_by_participation(pc: Any, quantile: float) -> np.ndarray:
    """Alternative boundary rule: the units whose participation coefficient is at or above its
    ``quantile`` (e.g. 0.9 → the top 10 %), and strictly positive.

    B_i = [ P_i ≥ Q_q(P) and P_i > 0 ]  (``np.quantile``, linear interpolation). Ties at the
    threshold are all included. Returns bool, same shape as ``pc``.
    """
    p = np.asarray(pc, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"pc must be 1-D (one value per unit), got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError("pc must be finite (participation coefficients in [0, 1])")
    try:
        q = float(quantile)
    except (TypeError, ValueError):
        raise ValueError(f"quantile must be a number in [0, 1), got {quantile!r}") from None
    if not (0.0 <= q < 1.0):
        raise ValueError(f"quantile must be in [0, 1), got {quantile!r}")
    if p.size == 0:
        return np.zeros(0, dtype=bool)
    return (p >= np.quantile(p, q)) & (p > 0)


def community_table(
    graph: ig.Graph, labels: Any, is_boundary: Any, pc: Any, n_other: Any | None = None
) -> pd.DataFrame:
    """One row per unit: ``unit``, ``community``, ``participation``, ``is_boundary`` and, with
    ``n_other`` (:func:`other_communities`), ``n_other_communities``, from which either
    neighbour-count boundary rule (≥ 1 or ≥ 2 other communities) can be read back."""
    lab = check_labels(graph, labels)
    n = graph.vcount()
    b = np.asarray(is_boundary)
    p = np.asarray(pc, dtype=np.float64)
    if b.shape != (n,):
        raise ValueError(f"is_boundary must have shape ({n},), got {b.shape}")
    if p.shape != (n,):
        raise ValueError(f"pc must have shape ({n},), got {p.shape}")
    out = pd.DataFrame(
        {
            "unit": np.arange(n, dtype=np.int64),
            "community": lab,
            "participation": p,
            "is_boundary": b.astype(bool),
        }
    )
    if n_other is not None:
        k = np.asarray(n_other, dtype=np.int64)
        if k.shape != (n,):
            raise ValueError(f"n_other must have shape ({n},), got {k.shape}")
        out["n_other_communities"] = k
    return out
