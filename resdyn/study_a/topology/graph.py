"""The signed correlation graph of one residual boundary: Pearson correlation of units over
tokens (streamed in chunks), top-k |r| sparsification per unit, the igraph graph."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.linalg import blas

if TYPE_CHECKING:
    import igraph as ig

# igraph is imported inside the functions that use them: the light table jobs
# (checkpoints, coupling) import the package for pandas-only helpers, and these imports cost
# 3-5 s of start-up per job on a loaded 2-core machine.


#: Bytes of one float64 token chunk when the caller does not choose ``chunk_size``.
_CHUNK_BYTES = 32 << 20


#: Bytes of one float64 row block of the d×d matrix (post-processing and top-k selection).
_BLOCK_BYTES = 16 << 20


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
        raise TypeError(f"X must be a tokens × units array or an iterable of such chunks, got {type(X).__name__}")
    return X


def _accumulate(X: Any, chunk_size: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The shifted sums of :func:`correlation_matrix` over all chunks: (S upper triangle (d, d)
    Fortran-ordered, s (d,), per-unit min and max, n tokens); the inputs checked on the way."""
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
    return S, s, lo, hi, n


def _to_correlation(
    S: np.ndarray, s: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """(R, constant units) from :func:`_accumulate`'s sums, R computed in place of S in row
    blocks; constant units get r = 0 with every unit (1 elsewhere on the diagonal)."""
    d = S.shape[0]
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
    return R, constant


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
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    S, s, lo, hi, n = _accumulate(X, chunk_size)
    R, constant = _to_correlation(S, s, lo, hi, n)
    if constant.size:
        warnings.warn(
            f"{constant.size} constant unit(s) (zero variance over {n} tokens), e.g. units "
            f"{constant[:10].tolist()}: their correlations are set to 0, not NaN",
            RuntimeWarning,
            stacklevel=2,
        )
    return R, {"n_tokens": n, "n_units": R.shape[0], "constant_units": constant}


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


def correlation_graph(X: Any, top_k: int, min_abs_r: float = 0.0, *, chunk_size: int | None = None) -> ig.Graph:
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
