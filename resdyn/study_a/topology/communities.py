"""Signed Leiden communities: CPM on the positive layer with the negative layer weighted −1,
the resolution grid and its selection, signed modularity, and a partition's summary."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import igraph as ig

# igraph and leidenalg are imported inside the functions that use them: the light table jobs
# (checkpoints, coupling) import the package for pandas-only helpers, and these imports cost
# 3-5 s of start-up per job on a loaded 2-core machine.


def edge_arrays(graph: ig.Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, weight) arrays of a weighted undirected graph, validated."""
    import igraph as ig

    if not isinstance(graph, ig.Graph):
        raise TypeError(f"graph must be an igraph.Graph, got {type(graph).__name__}")
    if graph.is_directed():
        raise ValueError("graph must be undirected (a correlation graph), got a directed graph")
    m = graph.ecount()
    if m == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0)
    if "weight" not in graph.es.attributes():
        raise ValueError("graph edges need a 'weight' attribute (signed correlation r)")
    e = np.asarray(graph.get_edgelist(), dtype=np.int64)
    w = np.asarray(graph.es["weight"], dtype=np.float64)
    if not np.isfinite(w).all():
        bad = np.nonzero(~np.isfinite(w))[0]
        raise ValueError(f"graph edge weights must be finite; edges {bad[:5].tolist()} are not")
    return e[:, 0], e[:, 1], w


def check_labels(graph: ig.Graph, labels: Any) -> np.ndarray:
    """``labels`` as one int64 community label per vertex of ``graph``; TypeError/ValueError otherwise."""
    import igraph as ig

    if not isinstance(graph, ig.Graph):
        raise TypeError(f"graph must be an igraph.Graph, got {type(graph).__name__}")
    lab = np.asarray(labels)
    n = graph.vcount()
    if lab.shape != (n,):
        raise ValueError(f"labels must have shape ({n},) (one per vertex), got {lab.shape}")
    if lab.size and not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"labels must be integers (community ids), got dtype {lab.dtype}")
    return lab.astype(np.int64)


def _canonical_labels(membership: Sequence[int]) -> np.ndarray:
    """Relabel communities 0, 1, … by decreasing size, ties by smallest member index."""
    mem = np.asarray(membership, dtype=np.int64)
    if mem.size == 0:
        return mem
    uniq, inv, counts = np.unique(mem, return_inverse=True, return_counts=True)
    first = np.full(uniq.size, mem.size, dtype=np.int64)
    np.minimum.at(first, inv, np.arange(mem.size))
    order = np.lexsort((first, -counts))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inv]


def _check_resolution(value: Any, name: str = "resolution") -> float:
    try:
        g = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}") from None
    if not math.isfinite(g) or g < 0:
        raise ValueError(f"{name} must be a finite number ≥ 0 (CPM γ), got {value!r}")
    return g


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


@dataclass(frozen=True)
class GridPoint:
    """One resolution of a grid: γ, its CPM quality, signed modularity and community count."""

    resolution: float
    quality: float
    modularity: float
    n_communities: int


@dataclass(frozen=True)
class SignedPartition:
    """Result of :func:`signed_leiden_partition`.

    ``labels``: community per unit (0 = largest community). ``quality``: the optimised signed
    CPM objective at the chosen γ. ``resolution``: the chosen γ. ``modularity``: signed
    modularity (:func:`signed_modularity`) of ``labels``. ``grid``: every γ tried.
    """

    labels: np.ndarray
    quality: float
    resolution: float
    modularity: float
    grid: tuple[GridPoint, ...]

    @property
    def n_communities(self) -> int:
        return int(self.labels.max()) + 1 if self.labels.size else 0


def _leiden_once(
    n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray, gamma: float, seed: int
) -> tuple[np.ndarray, float]:
    import igraph as ig
    import leidenalg

    pos, neg = w > 0, w < 0
    g_pos = ig.Graph(n=n, edges=np.stack([src[pos], dst[pos]], 1).tolist(), directed=False)
    g_pos.es["weight"] = w[pos].tolist()
    g_neg = ig.Graph(n=n, edges=np.stack([src[neg], dst[neg]], 1).tolist(), directed=False)
    g_neg.es["weight"] = (-w[neg]).tolist()
    p_pos = leidenalg.CPMVertexPartition(g_pos, weights="weight", resolution_parameter=gamma)
    # Own γ = 0 on the negative layer: see signed_leiden_partition.
    p_neg = leidenalg.CPMVertexPartition(g_neg, weights="weight", resolution_parameter=0.0)
    opt = leidenalg.Optimiser()
    opt.set_rng_seed(seed)
    # n_iterations = -1: iterate until an iteration brings no improvement.
    opt.optimise_partition_multiplex([p_pos, p_neg], layer_weights=[1, -1], n_iterations=-1)
    quality = float(p_pos.quality() - p_neg.quality())
    return _canonical_labels(p_pos.membership), quality


def signed_modularity(graph: ig.Graph, labels: Any) -> float:
    """Signed modularity of a partition (Gómez, Jensen & Arenas, Phys. Rev. E 80, 016114, 2009).

    With w⁺_ij = max(w_ij, 0), w⁻_ij = max(−w_ij, 0), strengths w^±_i = Σ_j w^±_ij and totals
    2w^± = Σ_i w^±_i::

        Q = 1/(2w⁺ + 2w⁻) · Σ_ij [ (w⁺_ij − w⁺_i w⁺_j / 2w⁺) − (w⁻_ij − w⁻_i w⁻_j / 2w⁻) ] δ(c_i, c_j)

    (a layer with no edges contributes 0). Q ∈ [−1, 1]; equals Newman modularity when there
    are no negative edges. Returns NaN for a graph without edges.
    """
    src, dst, w = edge_arrays(graph)
    lab = check_labels(graph, labels)
    if w.size == 0:
        return float("nan")
    _, lab = np.unique(lab, return_inverse=True)
    n_c = int(lab.max()) + 1
    same = lab[src] == lab[dst]
    total = 0.0
    for sign in (1.0, -1.0):
        ws = np.maximum(sign * w, 0.0)
        two_m = 2.0 * ws.sum()
        if two_m == 0:
            continue
        inside = 2.0 * ws[same].sum()  # Σ_ij over ordered pairs counts each edge twice
        strength = np.bincount(src, ws, minlength=graph.vcount()) + np.bincount(dst, ws, minlength=graph.vcount())
        K = np.bincount(lab, strength, minlength=n_c)
        total += sign * (inside - (K**2).sum() / two_m)
    return float(total / (2.0 * np.abs(w).sum()))


def signed_leiden_partition(graph: ig.Graph, resolution: float | Sequence[float], seed: int) -> SignedPartition:
    """Signed Leiden CPM communities of a signed graph; a grid of γ picks by signed modularity.

    The graph is split into a positive layer G⁺ (edges w > 0, weight w) and a negative layer
    G⁻ (edges w < 0, weight |w|) on the same vertices, and leidenalg optimises, with layer
    weights [1, −1] (Traag & Bruggeman, Phys. Rev. E 80, 036115, 2009)::

        Q = Q_CPM(G⁺; γ) − Q_CPM(G⁻; 0),   Q_CPM(G; γ) = 2 Σ_c [ w_c − γ · n_c (n_c − 1)/2 ]

    (w_c: edge weight inside community c, n_c its size; leidenalg's factor 2 for undirected
    graphs). So Q = 2 Σ_c [ w⁺_c − w⁻_c − γ·C(n_c, 2) ]: positive weight inside rewarded,
    negative weight inside penalised, γ the density a community must exceed.

    **Why γ = 0 on the negative layer:** with the same γ on both layers the size terms
    −γ C(n_c, 2) and +γ C(n_c, 2) cancel, leaving 2 Σ_c (w⁺_c − w⁻_c), which no longer depends
    on γ at all (the resolution would do nothing). With γ⁻ = 0 the penalty is applied once.

    The optimiser's RNG is seeded with ``seed`` and Leiden iterates until an iteration brings
    no improvement (``n_iterations=-1``); labels are canonical (0 = largest community, ties by
    smallest unit index), so the same graph, γ and seed give the same labels.

    ``resolution``: one γ ≥ 0, or a grid of them. **Grid selection rule:** every γ is run with
    the same seed and the γ whose partition has the largest :func:`signed_modularity` is chosen
    (ties → the smallest γ, i.e. the coarsest). Signed modularity is scale-free and compares
    partitions of different γ on one footing, unlike the CPM quality which depends on γ.
    """
    src, dst, w = edge_arrays(graph)
    seed = _check_seed(seed)
    if isinstance(resolution, (str, bytes)):
        raise ValueError(f"resolution must be a number or a list of numbers, got {resolution!r}")
    if np.ndim(resolution) > 0 or (isinstance(resolution, Iterable) and not isinstance(resolution, np.ndarray)):
        gammas = [_check_resolution(g, "resolution grid value") for g in resolution]
        if not gammas:
            raise ValueError("resolution grid is empty: give one γ or a non-empty list")
        gammas = sorted(set(gammas))
    else:
        gammas = [_check_resolution(resolution)]
    n = graph.vcount()
    best: tuple[float, float, np.ndarray, float] | None = None
    grid: list[GridPoint] = []
    for gamma in gammas:
        labels, quality = _leiden_once(n, src, dst, w, gamma, seed)
        mod = signed_modularity(graph, labels) if w.size else float("nan")
        grid.append(GridPoint(gamma, quality, mod, int(labels.max()) + 1 if labels.size else 0))
        key = -math.inf if math.isnan(mod) else mod
        if best is None or key > best[0]:
            best = (key, gamma, labels, quality)
    assert best is not None
    _, gamma, labels, quality = best
    mod = next(p.modularity for p in grid if p.resolution == gamma)
    return SignedPartition(labels, quality, gamma, mod, tuple(grid))


def signed_leiden(graph: ig.Graph, resolution: float | Sequence[float], seed: int) -> np.ndarray:
    """Community label per unit (int64, shape (d,)); see :func:`signed_leiden_partition`."""
    return signed_leiden_partition(graph, resolution, seed).labels


def community_summary(labels: Any, quality: float) -> dict[str, Any]:
    """JSON-ready summary: n_units, n_communities, sizes (descending), largest, n_singletons,
    quality."""
    lab = np.asarray(labels)
    if lab.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {lab.shape}")
    sizes = np.sort(np.unique(lab, return_counts=True)[1])[::-1] if lab.size else np.zeros(0, int)
    return {
        "n_units": int(lab.size),
        "n_communities": int(sizes.size),
        "sizes": [int(s) for s in sizes],
        "largest": int(sizes[0]) if sizes.size else 0,
        "n_singletons": int((sizes == 1).sum()),
        "quality": float(quality),
    }
