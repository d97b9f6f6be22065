"""Activation-correlation topology: signed correlation graphs, signed Leiden communities,
boundary units and how they couple to Jacobian gain.

Pipeline (one boundary of one checkpoint)::

    activations (tokens × d) ─► correlation_graph ─► signed_leiden_partition ─► labels
        labels ─► boundary_units / participation_coefficient ─► community_table
    mean Jacobian J ─► unit_gains ─► coupling_stats(gains, is_boundary)
    per-boundary rows ─► coupling_table (Benjamini–Hochberg q-values, significance)
    per-boundary p-values ─► layer_significance (Simes per layer, BH over layers: the layer count)

Everything here is pure (numpy / scipy / igraph / leidenalg); nothing reads config or files.
Memory: :func:`correlation_matrix` streams the tokens in chunks and never holds more than one
d×d float64 matrix (128 MiB at d = 4096) plus one token chunk and one row block.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.linalg import blas

# igraph, leidenalg and scipy.stats/sparse are imported inside the functions that use them: the
# light table jobs (checkpoints, coupling) import this module for pandas-only helpers, and these
# imports cost 3-5 s of start-up per job on a loaded 2-core machine.

__all__ = [
    "BOUNDARY_KIND",
    "GridPoint",
    "analyse_boundary",
    "SignedPartition",
    "bh_fdr",
    "layer_significance",
    "simes_p",
    "significant_counts",
    "boundary_units",
    "boundary_units_by_participation",
    "community_summary",
    "community_table",
    "correlation_graph",
    "correlation_matrix",
    "coupling_stats",
    "coupling_table",
    "coupling_from_tables",
    "coupling_test",
    "participation_coefficient",
    "sign_dependence",
    "signed_leiden",
    "signed_leiden_partition",
    "signed_modularity",
    "top_k_edges",
    "unit_gains",
]

#: Bytes of one float64 token chunk when the caller does not choose ``chunk_size``.
_CHUNK_BYTES = 32 << 20
#: Bytes of one float64 row block of the d×d matrix (post-processing and top-k selection).
_BLOCK_BYTES = 16 << 20


# ----------------------------------------------------------------------------------------------
# Correlation
# ----------------------------------------------------------------------------------------------


def _iter_chunks(X: Any, chunk_size: int | None) -> Iterable[Any]:
    """Token chunks of ``X``: row slices of an array-like (ndarray, memmap, h5py dataset,
    CPU tensor), or the items of any other iterable (each a tokens × units block)."""
    shape = getattr(X, "shape", None)
    if shape is not None:
        if len(shape) != 2:
            raise ValueError(f"X must be 2-D (tokens × units), got shape {tuple(shape)}")
        n, d = int(shape[0]), int(shape[1])
        step = chunk_size if chunk_size is not None else max(1, _CHUNK_BYTES // (8 * max(d, 1)))
        return (X[i : i + step] for i in range(0, n, step))
    if isinstance(X, (str, bytes, Mapping)) or not isinstance(X, Iterable):
        raise TypeError(
            f"X must be a tokens × units array or an iterable of such chunks, got {type(X).__name__}"
        )
    return X


def correlation_matrix(X: Any, *, chunk_size: int | None = None) -> tuple[np.ndarray, dict]:
    """Pearson correlation of units over tokens, streamed over token chunks.

    ``X`` is tokens × units (n × d): an array-like with ``shape`` (numpy array / memmap, h5py
    dataset, CPU tensor; read ``chunk_size`` rows at a time) or an iterable of n_b × d chunks
    (e.g. a generator, so the input is never held whole). Any float dtype; each chunk is upcast
    to float64.

    With a shift ``c`` (the mean of the first chunk, which removes most of the cancellation of
    the one-pass formula) and ``y_t = x_t − c``, float64 sums are accumulated over all chunks::

        s = Σ_t y_t   (d),       S = Σ_t y_t y_tᵀ   (d × d, one BLAS ``dsyrk`` per chunk, in place)
        m = s / n,   C = S − n m mᵀ  (= n · covariance),   r_ij = C_ij / sqrt(C_ii C_jj)

    Constant units (max = min over all tokens) get r = 0 with every unit, themselves included
    (a ``RuntimeWarning`` names them) instead of NaN; every other diagonal entry is 1.
    Results are clipped to [−1, 1].

    Memory: one d×d float64 matrix (the result, updated in place), one float64 token chunk and
    one row block; default chunk ≈ 32 MiB (1024 tokens at d = 4096).

    Returns ``(R, info)``: R is d × d float64 symmetric; info has ``n_tokens``, ``n_units``,
    ``constant_units`` (index array).
    """
    if chunk_size is not None and (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, (int, np.integer))
        or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    S: np.ndarray | None = None  # Fortran-ordered accumulator; upper triangle filled by dsyrk
    shift = s = lo = hi = None
    n = 0
    d = -1
    for b, chunk in enumerate(_iter_chunks(X, chunk_size)):
        # Always a private float64 copy: it is shifted in place below and must not alias X.
        Y = np.array(chunk, dtype=np.float64, copy=True)
        if Y.ndim != 2:
            raise ValueError(f"X chunk {b} must be 2-D (tokens × units), got shape {Y.shape}")
        if S is None:
            d = Y.shape[1]
            if d < 2:
                raise ValueError(f"X must have at least 2 units (columns), got {d}")
        elif Y.shape[1] != d:
            raise ValueError(f"X chunk {b} has {Y.shape[1]} units, the first chunk has {d}")
        if Y.shape[0] == 0:
            continue
        if not np.isfinite(Y).all():
            rows = np.unique(np.nonzero(~np.isfinite(Y))[0])
            raise ValueError(
                f"X has non-finite values (NaN/inf) in chunk {b}, rows {rows[:5].tolist()} of that "
                "chunk; activations must be finite"
            )
        if S is None:
            shift = Y.mean(axis=0)
            S = np.zeros((d, d), dtype=np.float64, order="F")
            s = np.zeros(d)
            lo = Y.min(axis=0)
            hi = Y.max(axis=0)
        else:
            np.minimum(lo, Y.min(axis=0), out=lo)
            np.maximum(hi, Y.max(axis=0), out=hi)
        Y -= shift
        s += Y.sum(axis=0)
        n += Y.shape[0]
        # S (Fortran) += Yᵀ Y, upper triangle only; Y.T of a C-ordered Y is Fortran: no copy.
        blas.dsyrk(1.0, np.asfortranarray(Y.T), beta=1.0, c=S, trans=0, lower=0, overwrite_c=1)
    if S is None:
        raise ValueError("X has no chunks/units: at least 2 tokens × 2 units are required")
    if n < 2:
        raise ValueError(f"X must have at least 2 tokens (rows), got {n}")

    # R = Sᵀ is a C-ordered view whose *lower* triangle (i ≥ j) holds the sums.
    R = S.T
    m = s / n
    diag = np.diagonal(R) - n * m * m
    constant = np.nonzero((hi <= lo) | (diag <= 0.0))[0]
    inv_sd = np.zeros(d)
    ok = np.ones(d, dtype=bool)
    ok[constant] = False
    inv_sd[ok] = 1.0 / np.sqrt(diag[ok])
    block = max(1, _BLOCK_BYTES // (8 * d))
    for a in range(0, d, block):  # pass 1: lower triangle (and the diagonal block) → r
        b = min(d, a + block)
        Rb = R[a:b, :b]
        Rb -= n * np.outer(m[a:b], m[:b])
        Rb *= inv_sd[a:b, None]
        Rb *= inv_sd[None, :b]
    for a in range(0, d, block):  # pass 2: mirror into the upper triangle
        b = min(d, a + block)
        D = R[a:b, a:b]
        D[...] = np.tril(D) + np.tril(D, -1).T
        R[a:b, b:] = R[b:, a:b].T
    np.clip(R, -1.0, 1.0, out=R)
    idx = np.arange(d)
    R[idx, idx] = ok.astype(np.float64)
    if constant.size:
        warnings.warn(
            f"{constant.size} constant unit(s) (zero variance over {n} tokens), e.g. units "
            f"{constant[:10].tolist()}: their correlations are set to 0, not NaN",
            RuntimeWarning,
            stacklevel=2,
        )
    return R, {"n_tokens": n, "n_units": d, "constant_units": constant}


def _check_top_k(top_k: Any) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer (edges kept per unit), got {top_k!r}")
    return int(top_k)


def _check_min_abs_r(min_abs_r: Any) -> float:
    try:
        tau = float(min_abs_r)
    except (TypeError, ValueError):
        raise ValueError(f"min_abs_r must be a number in [0, 1], got {min_abs_r!r}") from None
    if not (0.0 <= tau <= 1.0):
        raise ValueError(f"min_abs_r must be in [0, 1], got {min_abs_r!r}")
    return tau


def top_k_edges(R: np.ndarray, top_k: int, min_abs_r: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Sparsify a symmetric correlation matrix: each unit's ``top_k`` strongest |r| edges.

    Edge {i, j} (i ≠ j) is kept iff j is among the ``top_k`` largest |R_ij| of row i *or* i is
    among those of row j (union over both endpoints), and |R_ij| ≥ ``min_abs_r``, and
    R_ij ≠ 0 (a zero correlation is no edge). ``top_k ≥ d − 1`` keeps every pair. Selection
    runs on row blocks with ``np.argpartition`` (ties at the k-th value are broken by
    argpartition's deterministic order), so memory is one float64 row block beyond R.

    Returns ``(edges, weights)``: edges is m × 2 int64 with i < j, sorted; weights = R_ij.
    """
    R = np.asarray(R)
    if R.ndim != 2 or R.shape[0] != R.shape[1]:
        raise ValueError(f"R must be a square d × d matrix, got shape {R.shape}")
    d = R.shape[0]
    k = _check_top_k(top_k)
    tau = _check_min_abs_r(min_abs_r)
    block = max(1, _BLOCK_BYTES // (8 * max(d, 1)))
    codes: list[np.ndarray] = []
    for a in range(0, d, block):
        b = min(d, a + block)
        rows = np.arange(a, b)
        A = np.abs(R[a:b], dtype=np.float64)
        A[rows - a, rows] = -1.0  # no self-loops
        if k >= d - 1:
            ii, jj = np.nonzero(A > 0)
            ii = ii + a
        else:
            sel = np.argpartition(A, d - k, axis=1)[:, d - k :]
            vals = np.take_along_axis(A, sel, axis=1)
            keep = vals > 0
            ii = np.broadcast_to(rows[:, None], sel.shape)[keep]
            jj = sel[keep]
        lo = np.minimum(ii, jj).astype(np.int64)
        hi = np.maximum(ii, jj).astype(np.int64)
        codes.append(lo * d + hi)
    code = np.unique(np.concatenate(codes)) if codes else np.zeros(0, np.int64)
    i, j = code // d, code % d
    w = np.asarray(R[i, j], dtype=np.float64)
    if tau > 0:
        keep = np.abs(w) >= tau
        i, j, w = i[keep], j[keep], w[keep]
    return np.stack([i, j], axis=1).astype(np.int64), w


def correlation_graph(
    X: Any, top_k: int, min_abs_r: float = 0.0, *, chunk_size: int | None = None
) -> ig.Graph:
    """Signed, sparsified correlation graph of units over tokens.

    ``X``: tokens × units (n × d) float array-like or iterable of token chunks (see
    :func:`correlation_matrix`). Pearson r_ij over tokens (streamed float64 sums; constant units
    → r = 0 with a warning), then :func:`top_k_edges`: each unit keeps its ``top_k`` largest
    |r_ij| (union over both endpoints, no self-loops), optionally only |r_ij| ≥ ``min_abs_r``.

    Returns an undirected ``igraph.Graph`` with d vertices (vertex i = unit i), edge attribute
    ``weight`` = r_ij (signed), and graph attributes ``n_tokens``, ``top_k``, ``min_abs_r``,
    ``n_constant_units``. Peak memory ≈ one d×d float64 (128 MiB at d = 4096) + one token chunk.
    """
    import igraph as ig
    k = _check_top_k(top_k)
    tau = _check_min_abs_r(min_abs_r)
    R, info = correlation_matrix(X, chunk_size=chunk_size)
    d = R.shape[0]
    edges, w = top_k_edges(R, k, tau)
    del R
    g = ig.Graph(n=d, edges=edges.tolist(), directed=False)
    g.es["weight"] = w.tolist()
    g["n_tokens"] = int(info["n_tokens"])
    g["top_k"] = k
    g["min_abs_r"] = tau
    g["n_constant_units"] = int(info["constant_units"].size)
    return g


# ----------------------------------------------------------------------------------------------
# Signed Leiden communities
# ----------------------------------------------------------------------------------------------


def _edge_arrays(graph: ig.Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _check_labels(graph: ig.Graph, labels: Any) -> np.ndarray:
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
    src, dst, w = _edge_arrays(graph)
    lab = _check_labels(graph, labels)
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
        strength = np.bincount(src, ws, minlength=graph.vcount()) + np.bincount(
            dst, ws, minlength=graph.vcount()
        )
        K = np.bincount(lab, strength, minlength=n_c)
        total += sign * (inside - (K**2).sum() / two_m)
    return float(total / (2.0 * np.abs(w).sum()))


def signed_leiden_partition(
    graph: ig.Graph, resolution: float | Sequence[float], seed: int
) -> SignedPartition:
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
    src, dst, w = _edge_arrays(graph)
    seed = _check_seed(seed)
    if isinstance(resolution, (str, bytes)):
        raise ValueError(f"resolution must be a number or a list of numbers, got {resolution!r}")
    if np.ndim(resolution) > 0 or (
        isinstance(resolution, Iterable) and not isinstance(resolution, np.ndarray)
    ):
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


# ----------------------------------------------------------------------------------------------
# Boundary units
# ----------------------------------------------------------------------------------------------


def _positive_arcs(graph: ig.Graph, lab: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positive edges as arcs in both directions: (unit, neighbour, weight)."""
    src, dst, w = _edge_arrays(graph)
    pos = w > 0
    i = np.concatenate([src[pos], dst[pos]])
    j = np.concatenate([dst[pos], src[pos]])
    return i, j, np.concatenate([w[pos], w[pos]])


def boundary_units(graph: ig.Graph, labels: Any, min_other: int = 2) -> np.ndarray:
    """Boundary units: a unit whose positive neighbours lie in ≥ ``min_other`` (default 2)
    communities other than its own.

    B_i = [ |{ c_j : w_ij > 0, c_j ≠ c_i }| ≥ 2 ]. Negative edges are ignored. Returns a bool
    array of shape (d,).
    """
    lab = _check_labels(graph, labels)
    if isinstance(min_other, bool) or not isinstance(min_other, (int, np.integer)) or min_other < 1:
        raise ValueError(f"min_other must be a positive integer, got {min_other!r}")
    i, j, _ = _positive_arcs(graph, lab)
    other = lab[j] != lab[i]
    i, cj = i[other], lab[j][other]
    n = graph.vcount()
    if i.size == 0:
        return np.zeros(n, dtype=bool)
    _, cj = np.unique(cj, return_inverse=True)
    pairs = np.unique(i * (int(cj.max()) + 1) + cj)
    count = np.bincount(pairs // (int(cj.max()) + 1), minlength=n)
    return count >= min_other


def participation_coefficient(graph: ig.Graph, labels: Any) -> np.ndarray:
    """Participation coefficient (Guimerà & Amaral, Nature 433, 895, 2005) on positive weights.

    P_i = 1 − Σ_c (k_ic / k_i)², with k_ic = Σ_{j ∈ c, w_ij > 0} w_ij and k_i = Σ_c k_ic.
    0 when all positive weight stays in one community, and 0 for units without positive edges
    (isolated). Returns float64, shape (d,).
    """
    from scipy import sparse
    lab = _check_labels(graph, labels)
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


# ----------------------------------------------------------------------------------------------
# Gain coupling
# ----------------------------------------------------------------------------------------------


def unit_gains(J: Any) -> np.ndarray:
    """Gain of each input unit: the column norm g_i = ‖J e_i‖₂ = sqrt(Σ_o J_oi²).

    ``J``: (..., d_out, d_in), e.g. the mean sublayer Jacobian d × d (batched stacks allowed).
    Returns float64 (..., d_in). For the gain of the update ‖(J − I) e_i‖ the caller passes
    ``J − I``.
    """
    A = np.asarray(J)
    if A.ndim < 2:
        raise ValueError(f"J must be at least 2-D (d_out × d_in), got shape {A.shape}")
    if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
        raise ValueError(f"J must be a real numeric matrix, got dtype {A.dtype}")
    A = A.astype(np.float64, copy=False)
    if not np.isfinite(A).all():
        raise ValueError("J has non-finite entries (NaN/inf)")
    return np.linalg.norm(A, axis=-2)


def coupling_stats(gains: Any, is_boundary: Any) -> dict[str, Any]:
    """Gain of boundary vs interior units: effect size, rank-biserial and Mann–Whitney p.

    With g_B the gains of boundary units and g_I those of interior units::

        effect_log_median_ratio = log( median(g_B) / median(g_I) )
        rank_biserial           = 2 U_B / (n_B n_I) − 1     ∈ [−1, 1]  (> 0: boundary larger)
        p_value                 = two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, 'auto')

    U_B = #{(b, i): g_b > g_i} + ½ #{ties}. Fewer than 1 boundary or 1 interior unit → NaNs and a
    ``reason`` (never an exception); a non-positive median leaves the log ratio NaN (reason
    given) but still reports the rank statistics. Keys: effect_log_median_ratio,
    rank_biserial, p_value, n_boundary, n_interior, median_boundary, median_interior, reason.
    """
    from scipy import stats
    g = np.asarray(gains, dtype=np.float64)
    b = np.asarray(is_boundary)
    if g.ndim != 1:
        raise ValueError(f"gains must be 1-D (one per unit), got shape {g.shape}")
    if b.shape != g.shape:
        raise ValueError(f"is_boundary must have the shape of gains {g.shape}, got {b.shape}")
    if b.dtype != bool:
        if not np.isin(b, [0, 1]).all():
            raise ValueError("is_boundary must be boolean (or 0/1)")
        b = b.astype(bool)
    if not np.isfinite(g).all():
        raise ValueError("gains must be finite (NaN/inf found)")
    gb, gi = g[b], g[~b]
    out: dict[str, Any] = {
        "effect_log_median_ratio": float("nan"),
        "rank_biserial": float("nan"),
        "p_value": float("nan"),
        "n_boundary": int(gb.size),
        "n_interior": int(gi.size),
        "median_boundary": float(np.median(gb)) if gb.size else float("nan"),
        "median_interior": float(np.median(gi)) if gi.size else float("nan"),
        "reason": None,
    }
    if gb.size < 1 or gi.size < 1:
        out["reason"] = (
            f"need ≥ 1 boundary and ≥ 1 interior unit, got {gb.size} boundary and "
            f"{gi.size} interior"
        )
        return out
    res = stats.mannwhitneyu(gb, gi, alternative="two-sided")
    out["rank_biserial"] = float(2.0 * res.statistic / (gb.size * gi.size) - 1.0)
    out["p_value"] = float(res.pvalue)
    if math.isnan(out["p_value"]):
        out["reason"] = "Mann–Whitney p-value undefined (all gains tied)"
    mb, mi = out["median_boundary"], out["median_interior"]
    if mb > 0 and mi > 0:
        out["effect_log_median_ratio"] = float(math.log(mb / mi))
    else:
        out["reason"] = (
            f"non-positive median gain (boundary {mb}, interior {mi}): log ratio undefined"
        )
    return out


def coupling_test(gains: Any, is_boundary: Any) -> tuple[float, float]:
    """(effect, p): log median-gain ratio boundary / interior and the two-sided Mann–Whitney
    p-value; (nan, nan) if either group is empty. See :func:`coupling_stats`."""
    s = coupling_stats(gains, is_boundary)
    return s["effect_log_median_ratio"], s["p_value"]


def bh_fdr(p_values: Any) -> np.ndarray:
    """Benjamini–Hochberg q-values (J. R. Stat. Soc. B 57, 289, 1995).

    For the m non-NaN p-values sorted p_(1) ≤ … ≤ p_(m): q_(i) = min_{j ≥ i} min(1, m p_(j) / j)
    (monotone in p, capped at 1). NaN inputs stay NaN and do not count in m. Same shape as input.
    Computed by ``scipy.stats.false_discovery_control(method="bh")``; this wrapper adds the NaN
    handling and the range check.
    """
    from scipy import stats
    p = np.asarray(p_values, dtype=np.float64)
    flat = p.ravel()
    ok = ~np.isnan(flat)
    if np.any((flat[ok] < 0) | (flat[ok] > 1)):
        bad = flat[ok][(flat[ok] < 0) | (flat[ok] > 1)]
        raise ValueError(f"p-values must lie in [0, 1] (or be NaN), got e.g. {bad[:3].tolist()}")
    q = np.full(flat.shape, np.nan)
    if ok.any():
        q[ok] = stats.false_discovery_control(flat[ok], method="bh")
    return q.reshape(p.shape)


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def community_table(graph: ig.Graph, labels: Any, is_boundary: Any, pc: Any) -> pd.DataFrame:
    """One row per unit: ``unit``, ``community``, ``participation``, ``is_boundary``."""
    lab = _check_labels(graph, labels)
    n = graph.vcount()
    b = np.asarray(is_boundary)
    p = np.asarray(pc, dtype=np.float64)
    if b.shape != (n,):
        raise ValueError(f"is_boundary must have shape ({n},), got {b.shape}")
    if p.shape != (n,):
        raise ValueError(f"pc must have shape ({n},), got {p.shape}")
    return pd.DataFrame(
        {
            "unit": np.arange(n, dtype=np.int64),
            "community": lab,
            "participation": p,
            "is_boundary": b.astype(bool),
        }
    )


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


def coupling_table(
    rows: Iterable[Mapping[str, Any]], q_level: float = 0.05, by: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per-boundary coupling rows → table with BH ``q_value`` and ``significant`` (q ≤ q_level).

    ``rows``: dicts, one per boundary, each with at least ``p_value`` (e.g. the output of
    :func:`coupling_stats` plus identifiers such as model, checkpoint, layer, boundary). The
    correction runs over all rows, or within each group of ``by`` (the design corrects across
    boundaries *per checkpoint*: pass ``by=["model", "checkpoint"]`` for multi-checkpoint rows).
    NaN p-values get NaN q and are never significant.
    """
    try:
        lvl = float(q_level)
    except (TypeError, ValueError):
        raise ValueError(f"q_level must be in (0, 1), got {q_level!r}") from None
    if not (0.0 < lvl < 1.0):
        raise ValueError(f"q_level must be in (0, 1), got {q_level!r}")
    df = pd.DataFrame(list(rows))
    if df.empty:
        return pd.DataFrame(columns=["p_value", "q_value", "significant"])
    if "p_value" not in df.columns:
        raise ValueError(f"coupling rows need a 'p_value' key; got keys {sorted(df.columns)}")
    p = pd.to_numeric(df["p_value"], errors="raise").astype(float)
    if by:
        missing = [c for c in by if c not in df.columns]
        if missing:
            raise ValueError(f"by columns {missing} not in the rows (keys {sorted(df.columns)})")
        q = pd.Series(np.nan, index=df.index)
        for _, sub in df.groupby(list(by), sort=False, dropna=False):
            q.loc[sub.index] = bh_fdr(p.loc[sub.index].to_numpy())
        df["q_value"] = q.to_numpy()
    else:
        df["q_value"] = bh_fdr(p.to_numpy())
    df["significant"] = (df["q_value"] <= lvl).fillna(False).astype(bool)
    return df


def sign_dependence(effects: Any, henrici: Any) -> tuple[float, float]:
    """Spearman ρ (and two-sided p) between coupling effects and Henrici departures.

    Pairs with a NaN on either side are dropped. Fewer than 3 pairs, or a constant side,
    → (nan, nan).
    """
    from scipy import stats
    e = np.asarray(effects, dtype=np.float64).ravel()
    h = np.asarray(henrici, dtype=np.float64).ravel()
    if e.shape != h.shape:
        raise ValueError(f"effects and henrici must have equal length, got {e.size} and {h.size}")
    ok = np.isfinite(e) & np.isfinite(h)
    e, h = e[ok], h[ok]
    if e.size < 3 or np.ptp(e) == 0 or np.ptp(h) == 0:
        return float("nan"), float("nan")
    res = stats.spearmanr(e, h)
    return float(res.statistic), float(res.pvalue)


# ----------------------------------------------------------------------------------------------
# Pipeline helpers (compose the functions above; called by workflow/scripts)
# ----------------------------------------------------------------------------------------------

#: The sublayer whose *input* a residual boundary is: pre-attention h_L feeds the attention
#: half of layer L, pre-MLP m_L the MLP half. A boundary's units are that Jacobian's columns.
BOUNDARY_KIND: dict[str, str] = {"pre_attn": "attn", "pre_mlp": "mlp"}

BOUNDARY_RULES = ("neighbours", "participation")
GAINS = ("J", "J_minus_I")


def analyse_boundary(
    X: Any,
    top_k: int,
    min_abs_r: float = 0.0,
    resolution: float | Sequence[float] = 0.05,
    seed: int = 0,
    boundary_rule: str = "neighbours",
    participation_quantile: float = 0.9,
    *,
    chunk_size: int | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Communities and boundary units of one residual boundary.

    ``X`` (tokens × units) → :func:`correlation_graph` → :func:`signed_leiden_partition` →
    :func:`participation_coefficient` and boundary units by ``boundary_rule``: ``neighbours``
    (:func:`boundary_units`, positive neighbours in ≥ 2 other communities) or ``participation``
    (:func:`boundary_units_by_participation` at ``participation_quantile``).

    Returns ``(units, summary)``: units is :func:`community_table`; summary is
    :func:`community_summary` with ``sizes`` as a comma-joined string (one TSV cell), plus
    ``resolution`` (chosen γ), ``modularity``, ``n_edges``, ``n_negative_edges``, ``n_boundary``,
    ``n_tokens``, ``n_constant_units``.
    """
    if boundary_rule not in BOUNDARY_RULES:
        raise ValueError(f"boundary_rule must be one of {BOUNDARY_RULES}, got {boundary_rule!r}")
    g = correlation_graph(X, top_k, min_abs_r, chunk_size=chunk_size)
    part = signed_leiden_partition(g, resolution, seed)
    pc = participation_coefficient(g, part.labels)
    if boundary_rule == "neighbours":
        is_b = boundary_units(g, part.labels)
    else:
        is_b = boundary_units_by_participation(pc, participation_quantile)
    units = community_table(g, part.labels, is_b, pc)
    summary = community_summary(part.labels, part.quality)
    w = np.asarray(g.es["weight"]) if g.ecount() else np.zeros(0)
    summary.update(
        sizes=",".join(map(str, summary["sizes"])),
        resolution=part.resolution,
        modularity=part.modularity,
        n_edges=int(g.ecount()),
        n_negative_edges=int((w < 0).sum()),
        n_boundary=int(is_b.sum()),
        n_tokens=g["n_tokens"],
        n_constant_units=g["n_constant_units"],
    )
    return units, summary


def coupling_from_tables(
    communities: pd.DataFrame,
    jacobians: Mapping[tuple[int, str], Any],
    spectra: pd.DataFrame,
    gain: str = "J",
    q_level: float = 0.05,
) -> pd.DataFrame:
    """``coupling.tsv`` of one checkpoint: boundary-vs-interior gain per residual boundary.

    ``communities``: the partitions of all layers (columns ``layer, boundary, unit,
    is_boundary`` …; :meth:`resdyn.artifacts.CommunityPartitions.read_folder`). ``jacobians``: {(layer, kind): mean Jacobian (d, d) or a
    zero-argument callable}; boundary ``pre_attn`` of layer L uses (L, 'attn'), ``pre_mlp``
    uses (L, 'mlp') (:data:`BOUNDARY_KIND`); for a parallel-residual layer ``pre_attn`` (h_L, its
    only boundary) uses the layer operator (L, 'layer'). ``gain``: ``J`` → ‖J e_i‖, ``J_minus_I`` →
    ‖(J − I) e_i‖ (:func:`unit_gains`). ``spectra``: spectra.tsv (``layer, kind, henrici``),
    whose Henrici departure is carried along (NaN if absent) for :func:`sign_dependence`.

    One row per (layer, boundary), ordered by depth s = 2L (attn) / 2L + 1 (mlp), with the
    :func:`coupling_stats` keys, ``henrici``, and BH ``q_value`` / ``significant`` across the
    boundaries of this checkpoint (:func:`coupling_table`).
    """
    if gain not in GAINS:
        raise ValueError(f"gain must be one of {GAINS}, got {gain!r}")
    table = communities
    need = {"layer", "boundary", "unit", "is_boundary"}
    if not need <= set(table.columns):
        raise ValueError(f"community table lacks columns {sorted(need - set(table.columns))}")
    henrici: dict[tuple[int, str], float] = {}
    if {"layer", "kind", "henrici"} <= set(spectra.columns):
        henrici = {
            (int(r.layer), str(r.kind)): float(r.henrici)
            for r in spectra[["layer", "kind", "henrici"]].itertuples(index=False)
        }
    rows = []
    for (layer, boundary), sub in table.groupby(["layer", "boundary"], sort=True):
        if boundary not in BOUNDARY_KIND:
            continue
        kind = BOUNDARY_KIND[str(boundary)]
        if kind == "attn" and (int(layer), "attn") not in jacobians and (int(layer), "layer") in jacobians:
            kind = "layer"  # parallel residual: h_L is read by the layer operator I + J_A + J_F
        key = (int(layer), kind)
        if key not in jacobians:
            raise ValueError(
                f"no mean Jacobian for sublayer {key} (boundary {boundary!r} of layer {layer}); "
                f"have {sorted(jacobians)[:6]}"
            )
        J = jacobians[key]
        J = np.asarray(J() if callable(J) else J, dtype=np.float64)
        if gain == "J_minus_I":
            J = J - np.eye(J.shape[0], J.shape[1])
        g = unit_gains(J)
        units = sub["unit"].to_numpy(dtype=np.int64)
        if units.size and (units.min() < 0 or units.max() >= g.size):
            raise ValueError(f"layer {layer} {boundary}: unit ids outside 0..{g.size - 1}")
        is_b = sub["is_boundary"].astype(str).str.lower().isin(["true", "1"]).to_numpy()
        st = coupling_stats(g[units], is_b)
        rows.append(
            {
                "layer": int(layer),
                "boundary": str(boundary),
                "kind": kind,
                "s": 2 * int(layer) + (0 if boundary == "pre_attn" else 1),
                "gain": gain,
                **st,
                "henrici": henrici.get(key, float("nan")),
            }
        )
    rows.sort(key=lambda r: r["s"])
    return coupling_table(rows, q_level=q_level)


def simes_p(p_values: Any) -> float:
    """Simes' combined p-value of a family of tests (Biometrika 73, 751, 1986).

    For the k non-NaN p-values sorted p_(1) ≤ … ≤ p_(k)::

        p_S = min_i  k · p_(i) / i      (capped at 1)

    It tests the global null "no test of the family is non-null", is valid under independence
    and positive dependence (PRDS), equals the smallest BH q-value of the family, and is the
    p-value itself for k = 1. No non-NaN p-value → NaN.
    """
    p = np.asarray(p_values, dtype=np.float64).ravel()
    p = np.sort(p[~np.isnan(p)])
    if p.size == 0:
        return float("nan")
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1] (or be NaN), got e.g. {p[(p < 0) | (p > 1)][:3].tolist()}")
    return float(min(1.0, np.min(p.size * p / np.arange(1, p.size + 1))))


#: Columns of ``coupling_layers.tsv`` (:func:`layer_significance`).
LAYER_COLUMNS = ("layer", "p_value", "q_value", "significant", "n_boundaries_tested", "reason")


def layer_significance(coupling: pd.DataFrame, q_level: float = 0.05) -> pd.DataFrame:
    """FDR-significant *layers* of one checkpoint, the unit study A counts ("0 / 14 / 24 of 32").

    ``coupling``: the checkpoint's ``coupling.tsv`` (one row per boundary: ``layer``,
    ``p_value``, ``reason``). A layer holds up to two boundary tests (pre-attention h_L and
    pre-MLP m_L; a parallel-residual layer only h_L). Two stages (Benjamini & Bogomolov,
    J. R. Stat. Soc. B 76, 297, 2014: families selected by BH on their Simes p-values)::

        p_L = simes_p({p_b : b a tested boundary of layer L})      (p_L = p_b for one boundary)
        q_L = BH({p_L : L a layer with ≥ 1 tested boundary})       significant_L = q_L ≤ q_level

    so the family is the layers of the checkpoint (m = number of tested layers) and a layer
    counts when its boundaries, taken together, reject "neither boundary's units differ in
    gain". A layer whose boundaries all lack a test (NaN p) gets NaN p/q, is not significant,
    is left out of m and says why in ``reason``.

    Returns one row per layer (sorted) with :data:`LAYER_COLUMNS`; ``n_boundaries_tested`` is the
    number of non-NaN boundary p-values of the layer.
    """
    need = {"layer", "p_value"}
    if not need <= set(coupling.columns):
        raise ValueError(f"coupling table lacks columns {sorted(need - set(coupling.columns))}; "
                         f"it has {sorted(coupling.columns)}")
    rows = []
    for layer, sub in coupling.groupby("layer", sort=True):
        p = pd.to_numeric(sub["p_value"], errors="raise").to_numpy(dtype=np.float64)
        tested = int((~np.isnan(p)).sum())
        reason = None
        if tested == 0:
            why = sorted({str(r) for r in sub.get("reason", pd.Series(dtype=object)).dropna() if str(r).strip()})
            reason = "no boundary of the layer was tested" + (f" ({'; '.join(why)})" if why else "")
        rows.append({"layer": int(layer), "p_value": simes_p(p), "n_boundaries_tested": tested, "reason": reason})
    table = coupling_table(rows, q_level=q_level)
    if table.empty:
        return pd.DataFrame(columns=list(LAYER_COLUMNS))
    return table[list(LAYER_COLUMNS)]


def significant_counts(
    coupling: Mapping[str, pd.DataFrame], layers: Mapping[str, pd.DataFrame]
) -> pd.DataFrame:
    """Per checkpoint: FDR-significant layers (the headline count, :func:`layer_significance`),
    FDR-significant boundaries (detail), and the sign dependence (Spearman ρ between coupling
    effect and Henrici departure across boundaries).

    ``coupling``: checkpoint name → its ``coupling.tsv`` table (in training order); ``layers``:
    checkpoint name → its ``coupling_layers.tsv`` (same keys). Columns: ``ckpt``,
    ``n_significant_layers``, ``n_layers`` (layers of the checkpoint), ``n_layers_tested``,
    ``n_significant_boundaries``, ``n_boundaries`` (boundaries tested), ``sign_dependence_rho``,
    ``sign_dependence_p``.
    """
    if set(layers) != set(coupling):
        raise ValueError(f"layer tables for checkpoints {sorted(layers)}, coupling tables for {sorted(coupling)}: "
                         "they must match")
    rows = []
    for ckpt, table in coupling.items():
        tested = table["p_value"].notna() if "p_value" in table else pd.Series(dtype=bool)
        per_layer = layers[ckpt]
        rho, p = (
            sign_dependence(table["effect_log_median_ratio"], table["henrici"])
            if {"effect_log_median_ratio", "henrici"} <= set(table.columns)
            else (float("nan"), float("nan"))
        )
        rows.append({
            "ckpt": ckpt,
            "n_significant_layers": int(per_layer["significant"].astype(bool).sum()),
            "n_layers": int(per_layer["layer"].nunique()),
            "n_layers_tested": int(per_layer["p_value"].notna().sum()),
            "n_significant_boundaries": int(table["significant"].astype(bool).sum()) if "significant" in table else 0,
            "n_boundaries": int(tested.sum()),
            "sign_dependence_rho": rho,
            "sign_dependence_p": p,
        })
    return pd.DataFrame(rows)
