"""Community partitions compared across training checkpoints (study A: "community structure is
partly present at step 0", i.e. partly architectural).

For two partitions U, V of the same N units, with contingency table n_ij = |U_i ∩ V_j|, row sums
a_i, column sums b_j (all from :func:`contingency`):

* normalised mutual information (Danon et al., J. Stat. Mech. P09008, 2005; igraph's ``nmi``)::

      I(U; V) = Σ_ij (n_ij/N) log(N n_ij / (a_i b_j)),   H(U) = −Σ_i (a_i/N) log(a_i/N)
      NMI     = 2 I(U; V) / (H(U) + H(V))        ∈ [0, 1];  1 iff U = V up to relabelling

* adjusted Rand index (Hubert & Arabie, J. Classif. 2, 193, 1985)::

      index = Σ_ij C(n_ij, 2),   A = Σ_i C(a_i, 2),   B = Σ_j C(b_j, 2),   E = A B / C(N, 2)
      ARI   = (index − E) / ((A + B)/2 − E)        1 iff U = V; expectation 0 over random
                                                    labellings with the same cluster sizes

Degenerate case: when both partitions are the same trivial one (all units in one community,
or all singletons) the normaliser is 0; both indices are then 1 (the partitions are identical).

* permutation null of the NMI (:func:`nmi_permutation_null`): the NMI of V against U with U's
  labels shuffled over the units (community sizes kept), n times; its 95 % quantile and the
  one-sided p-value ``(1 + #{NMI_perm ≥ NMI}) / (1 + n)``. NMI is biased upward for small
  partitions with many communities; the null carries that bias, so "above the null" is
  similarity beyond what the two partitions' sizes alone give.

Pure numpy/pandas; nothing here reads files.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "contingency",
    "normalized_mutual_information",
    "adjusted_rand_index",
    "nmi_permutation_null",
    "partition_similarity",
    "SIMILARITY_COLUMNS",
    "NULL_QUANTILE",
    "REFERENCES",
]

#: Columns of ``partition_similarity.tsv``.
SIMILARITY_COLUMNS = (
    "ckpt",
    "layer",
    "boundary",
    "reference_ckpt",
    "reference",
    "nmi",
    "ari",
    "nmi_null_q95",
    "nmi_p",
    "modularity",
    "reason",
)
#: The quantile of the permutation null reported beside the NMI.
NULL_QUANTILE = 0.95
#: Reference checkpoints every checkpoint is compared with: the last (trained) and the first (step 0).
REFERENCES = ("final", "first")


def contingency(u: Any, v: Any) -> np.ndarray:
    """Contingency table n_ij = #{units with label u_i in U and v_j in V} (float64, labels in
    sorted order; any hashable integer labels). ``u`` and ``v`` are 1-D of equal length ≥ 1."""
    a, b = np.asarray(u), np.asarray(v)
    if a.ndim != 1 or b.ndim != 1 or a.size != b.size:
        raise ValueError(f"partitions must be 1-D label arrays of equal length, got shapes {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("partitions are empty: need at least one unit")
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    table = np.zeros((int(ia.max()) + 1, int(ib.max()) + 1))
    np.add.at(table, (ia, ib), 1.0)
    return table


def _entropy(counts: np.ndarray, n: float) -> float:
    p = counts[counts > 0] / n
    return float(-(p * np.log(p)).sum())


def normalized_mutual_information(u: Any, v: Any) -> float:
    """NMI = 2 I(U; V) / (H(U) + H(V)) of two partitions of the same units (module docstring);
    1 when both are the same single community."""
    n_ij = contingency(u, v)
    n = n_ij.sum()
    a, b = n_ij.sum(axis=1), n_ij.sum(axis=0)
    h = _entropy(a, n) + _entropy(b, n)
    if h == 0.0:
        return 1.0  # both partitions are one community each: identical
    i, j = np.nonzero(n_ij)
    nz = n_ij[i, j]
    mi = float((nz / n * np.log(n * nz / (a[i] * b[j]))).sum())
    return float(np.clip(2.0 * mi / h, 0.0, 1.0))


def _pairs(x: np.ndarray) -> float:
    return float((x * (x - 1.0) / 2.0).sum())


def adjusted_rand_index(u: Any, v: Any) -> float:
    """ARI = (index − E) / ((A + B)/2 − E) of two partitions of the same units (module
    docstring); 1 when both are the same trivial partition (the normaliser is then 0)."""
    n_ij = contingency(u, v)
    n = n_ij.sum()
    index, A, B = _pairs(n_ij), _pairs(n_ij.sum(axis=1)), _pairs(n_ij.sum(axis=0))
    total = n * (n - 1.0) / 2.0
    expected = A * B / total if total > 0 else 0.0
    top = (A + B) / 2.0 - expected
    if top == 0.0:
        return 1.0
    return float((index - expected) / top)


def nmi_permutation_null(u: Any, v: Any, n_permutations: int, rng: np.random.Generator) -> tuple[float, float]:
    """The NMI of ``v`` against label-shuffled ``u``: (its :data:`NULL_QUANTILE` quantile, the p-value).

    Draws ``n_permutations`` permutations π of the units and computes NMI(u∘π, v); the p-value is
    ``(1 + #{NMI(u∘π, v) ≥ NMI(u, v)}) / (1 + n_permutations)`` (one-sided: more similar than
    chance), never below ``1 / (1 + n_permutations)``.

    Example:
        >>> u = np.repeat(np.arange(4), 25)
        >>> q, p = nmi_permutation_null(u, u, 99, np.random.default_rng(0))
        >>> q < 0.2, p
        (True, 0.01)
    """
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, (int, np.integer)) or n_permutations < 1:
        raise ValueError(f"n_permutations must be a positive integer, got {n_permutations!r}")
    a, b = np.asarray(u), np.asarray(v)
    observed = normalized_mutual_information(a, b)
    null = np.array([normalized_mutual_information(rng.permutation(a), b) for _ in range(int(n_permutations))])
    p = (1.0 + float(np.sum(null >= observed - 1e-12))) / (1.0 + null.size)
    return float(np.quantile(null, NULL_QUANTILE)), p


def _row_rng(seed: int, *key: object) -> np.random.Generator:
    """A generator of its own for one comparison, so adding a checkpoint moves no other row's null."""
    return np.random.default_rng([int(seed), zlib.crc32("|".join(map(str, key)).encode())])


def _labels(table: pd.DataFrame, ckpt: str) -> dict[tuple[int, str], pd.Series]:
    need = {"layer", "boundary", "unit", "community"}
    if not need <= set(table.columns):
        raise ValueError(f"communities of checkpoint {ckpt!r} lack columns {sorted(need - set(table.columns))}")
    return {
        (int(layer), str(boundary)): sub.set_index("unit")["community"].sort_index()
        for (layer, boundary), sub in table.groupby(["layer", "boundary"], sort=True)
    }


def _modularity(summary: pd.DataFrame, ckpt: str) -> dict[tuple[int, str], float]:
    need = {"layer", "boundary", "modularity"}
    if not need <= set(summary.columns):
        raise ValueError(
            f"communities summary of checkpoint {ckpt!r} lacks columns {sorted(need - set(summary.columns))}"
        )
    return {
        (int(r.layer), str(r.boundary)): float(r.modularity)
        for r in summary[["layer", "boundary", "modularity"]].itertuples(index=False)
    }


def partition_similarity(
    partitions: Mapping[str, pd.DataFrame],
    summaries: Mapping[str, pd.DataFrame],
    n_permutations: int = 199,
    seed: int = 0,
) -> pd.DataFrame:
    """``partition_similarity.tsv``: every checkpoint's partition of every boundary compared with
    the final checkpoint's and the first's (step 0) of the same boundary.

    ``partitions``: checkpoint → its communities (columns ``layer, boundary, unit, community``;
    :meth:`resdyn.artifacts.CommunityPartitions.read_folder`), in training order (first = step 0,
    last = final). ``summaries``: checkpoint → ``communities_summary.tsv`` (``layer, boundary,
    modularity``), same keys. One row per (ckpt, layer, boundary, reference) with
    :data:`SIMILARITY_COLUMNS`: :func:`normalized_mutual_information` and
    :func:`adjusted_rand_index` of the two label vectors (units matched by id), the NMI's
    permutation null (:func:`nmi_permutation_null`, ``n_permutations`` draws, a generator per row
    from ``seed`` and the row's key) and the signed modularity of the checkpoint's own partition.
    A boundary the reference lacks, or whose unit ids differ, gets NaN indices and a ``reason``.
    The reference compared with itself gives 1, 1.
    """
    if not isinstance(partitions, Mapping) or not partitions:
        raise ValueError("partitions must be a non-empty mapping {checkpoint: community table}")
    if set(summaries) != set(partitions):
        raise ValueError(
            f"summaries for checkpoints {sorted(summaries)}, partitions for {sorted(partitions)}: they must match"
        )
    names = list(partitions)
    labels = {c: _labels(t, c) for c, t in partitions.items()}
    modularity = {c: _modularity(summaries[c], c) for c in names}
    refs = {"final": names[-1], "first": names[0]}
    rows = []
    for ckpt in names:
        for key, lab in labels[ckpt].items():
            for reference in REFERENCES:
                row = {"ckpt": ckpt, "layer": key[0], "boundary": key[1], "reference_ckpt": refs[reference]}
                row |= {"reference": reference, "modularity": modularity[ckpt].get(key, float("nan"))}
                other = labels[refs[reference]].get(key)
                rng = _row_rng(seed, ckpt, key[0], key[1], reference)
                row |= _compare(lab, other, n_permutations, rng, f"{ckpt!r}", f"{refs[reference]!r}", key)
                if np.isnan(row["modularity"]) and row["reason"] is None:
                    row["reason"] = f"no modularity for layer {key[0]} {key[1]} in the summary of {ckpt!r}"
                rows.append(row)
    return pd.DataFrame(rows, columns=list(SIMILARITY_COLUMNS))


def _compare(
    lab: pd.Series,
    other: pd.Series | None,
    n_permutations: int,
    rng: np.random.Generator,
    ckpt: str,
    ref: str,
    key: tuple[int, str],
) -> dict[str, Any]:
    """NMI, ARI and the NMI's permutation null of two partitions of boundary ``key``, or NaN and the
    reason (the reference ``ref`` has no partition of it, or other units than ``ckpt``)."""
    nan = float("nan")
    out: dict[str, Any] = {"nmi": nan, "ari": nan, "nmi_null_q95": nan, "nmi_p": nan, "reason": None}
    if other is None:
        out["reason"] = f"checkpoint {ref} has no partition of layer {key[0]} {key[1]}"
    elif not lab.index.equals(other.index):
        out["reason"] = f"units differ: {lab.size} in {ckpt}, {other.size} in {ref} (layer {key[0]} {key[1]})"
    else:
        u, v = lab.to_numpy(), other.to_numpy()
        out.update(nmi=normalized_mutual_information(u, v), ari=adjusted_rand_index(u, v))
        out["nmi_null_q95"], out["nmi_p"] = nmi_permutation_null(u, v, n_permutations, rng)
    return out
