"""Residual-stream geometry per layer, aggregated per phase, and phase-width depth scaling.

Study B (phase metrics). Notation for one decoder layer ``L`` (see docs/design.md, "Sublayers and
boundaries"): ``h_L`` is the stream entering layer L, ``m_L`` the pre-MLP boundary, and

- ``Δ_attn = m_L − h_L``      (attention update),
- ``Δ_mlp  = h_{L+1} − m_L``  (MLP update),
- ``Δ_L    = h_{L+1} − h_L = Δ_attn + Δ_mlp`` (the layer's update).

Per-token quantities are computed on rows of a (tokens × d) matrix; tokens of all samples are
pooled. All arithmetic is float64.

Indexing: per-layer rows use the model layer ``L``; RSS-profile point ``L`` (``S_L`` vs
``S_{L+1}``) describes the same update ``h_L → h_{L+1}``, so a layer's phase is the phase of
profile point ``L`` (see :mod:`resdyn.study_b.phases`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from resdyn.numerics.checks import is_int
from resdyn.numerics.linalg import effective_rank

__all__ = [
    "hidden_singular_values",
    "hidden_effective_rank",
    "token_abs_cosines",
    "update_orthogonality",
    "update_norm_ratio",
    "layer_geometry",
    "phase_metrics",
    "depth_scaling",
    "fallback_widths",
    "phase_widths",
    "group_fits",
    "with_lens_hits",
    "hit_ratio",
    "phase_table",
    "PHASE_NAMES",
    "PHASE_METRICS",
]

PHASE_NAMES = {1: "rise", 2: "plateau", 3: "descent"}
_SVD_MAX_ELEMENTS = 1 << 24  # above this many entries, singular values come from the Gram matrix
_CHUNK_ELEMENTS = 1 << 22  # entries per streamed chunk (32 MiB in float64)


def _as_tokens(a: object, name: str) -> np.ndarray:
    """``a`` as a finite float64 (tokens, d) matrix; leading axes are flattened into tokens."""
    arr = np.asarray(a)
    if arr.ndim < 2:
        raise ValueError(f"{name} must be (tokens, d) (or (..., tokens, d)), got shape {arr.shape}")
    if np.iscomplexobj(arr) or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be real numbers, got dtype {arr.dtype}")
    arr = arr.reshape(-1, arr.shape[-1]).astype(np.float64, copy=False)
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must have at least one token and one dimension, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} (shape {arr.shape}) contains non-finite values (NaN/inf)")
    return arr


def _same_shape(a: np.ndarray, b: np.ndarray, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{na} and {nb} must have the same (tokens, d) shape, got {a.shape} and {b.shape}")


# --------------------------------------------------------------------------------------------
# hidden-state effective rank


class _CenteredGram:
    """Streaming centered Gram matrix ``Σ_t (x_t − μ)(x_t − μ)ᵀ`` over row chunks (float64).

    Chunks are merged with the pairwise update of Chan, Golub & LeVeque (1979):
    ``M = M_a + M_b + δδᵀ·n_a n_b/(n_a + n_b)``, ``δ = μ_b − μ_a`` — no cancellation when the
    mean is large compared with the spread (as for residual streams with massive activations).
    """

    def __init__(self, d: int) -> None:
        self.n = 0
        self.mean = np.zeros(d)
        self.M = np.zeros((d, d))

    def add(self, X: np.ndarray) -> None:
        nb = X.shape[0]
        if nb == 0:
            return
        mu_b = X.mean(axis=0)
        C = X - mu_b
        M_b = C.T @ C
        if self.n == 0:
            self.n, self.mean, self.M = nb, mu_b, M_b
            return
        n = self.n + nb
        delta = mu_b - self.mean
        self.M += M_b + np.outer(delta, delta) * (self.n * nb / n)
        self.mean = self.mean + delta * (nb / n)
        self.n = n

    def singular_values(self) -> np.ndarray:
        """Singular values of the centered matrix: ``sqrt`` of the Gram eigenvalues, descending.

        Eigenvalues ≤ ``d · eps · λ_max`` (rounding, not signal) are set to 0.
        """
        lam = np.linalg.eigvalsh(self.M)[::-1]
        cutoff = lam.size * np.finfo(np.float64).eps * max(float(lam[0]), 0.0)
        return np.sqrt(np.where(lam > cutoff, lam, 0.0))


def hidden_singular_values(H: np.ndarray, method: str = "auto") -> np.ndarray:
    """Singular values (descending, float64) of the column-centered token matrix ``H − 1 μᵀ``.

    ``μ`` is the mean over tokens (rows). ``method``: ``"svd"`` (exact, LAPACK on the
    centered matrix), ``"gram"`` (eigenvalues of the d × d centered Gram matrix ``H_cᵀ H_c``,
    accumulated over row chunks with a stable merge: memory O(d²) beyond the input; values
    below ``d · eps · σ_max²`` in the Gram spectrum — rounding, not signal — are set to 0, so
    singular values below ~``sqrt(d · eps) · σ_max`` read as 0), or ``"auto"`` (``"svd"`` up to
    2²⁴ entries, else ``"gram"``).
    """
    X = _as_tokens(H, "H")
    if method not in ("auto", "svd", "gram"):
        raise ValueError(f"method must be 'auto', 'svd' or 'gram', got {method!r}")
    if X.shape[0] < 2:
        raise ValueError(f"H needs at least 2 tokens to be centered meaningfully, got shape {X.shape}")
    if method == "auto":
        method = "svd" if X.size <= _SVD_MAX_ELEMENTS else "gram"
    if method == "svd":
        return np.linalg.svd(X - X.mean(axis=0), compute_uv=False)
    acc = _CenteredGram(X.shape[1])
    step = max(1, _CHUNK_ELEMENTS // X.shape[1])
    for i in range(0, X.shape[0], step):
        acc.add(X[i : i + step])
    return acc.singular_values()


def hidden_effective_rank(H: np.ndarray, method: str = "auto") -> float:
    """Roy–Vetterli effective rank of a centered hidden-state matrix.

    ``erank(H) = exp(−Σ_i p_i log p_i)``, ``p_i = σ_i / Σ_j σ_j``, σ the singular values of
    ``H_c = H − 1 μᵀ`` (tokens × d, μ = mean token), via :func:`resdyn.study_a.spectral.effective_rank`.
    Reference: O. Roy and M. Vetterli, "The effective rank: a measure of effective
    dimensionality", EUSIPCO 2007.

    Parameters
    ----------
    H : (tokens, d) array_like (leading axes are flattened into tokens), ≥ 2 tokens, finite.
    method : "auto", "svd" or "gram" — see :func:`hidden_singular_values`.

    Returns
    -------
    float in [1, min(tokens − 1, d)]; 0 when ``H_c = 0`` (all tokens identical: rank 0, as in
    :func:`resdyn.study_a.spectral.effective_rank`).

    Examples
    --------
    A centered matrix of rank r with equal singular values has effective rank exactly r:

    >>> H = np.zeros((4, 3)); H[[0, 1], 0] = [1, -1]; H[[2, 3], 1] = [1, -1]
    >>> round(hidden_effective_rank(H), 12)
    2.0
    """
    return float(effective_rank(hidden_singular_values(H, method)))


# --------------------------------------------------------------------------------------------
# per-token update geometry


def token_abs_cosines(a: np.ndarray, b: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Per-token ``|cos(a_t, b_t)| = |⟨a_t, b_t⟩| / (‖a_t‖ ‖b_t‖)``, NaN where either norm ≤ eps.

    ``a``, ``b``: (tokens, d) of equal shape. Returns (tokens,) float64 in [0, 1] or NaN.
    """
    A = _as_tokens(a, "a")
    B = _as_tokens(b, "b")
    _same_shape(A, B, "a", "b")
    if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    na = np.linalg.norm(A, axis=1)
    nb = np.linalg.norm(B, axis=1)
    ok = (na > eps) & (nb > eps)
    out = np.full(A.shape[0], np.nan)
    dots = np.einsum("ij,ij->i", A[ok], B[ok])
    out[ok] = np.clip(np.abs(dots) / (na[ok] * nb[ok]), 0.0, 1.0)
    return out


def update_orthogonality(delta: np.ndarray, h_prev: np.ndarray, eps: float = 0.0) -> float:
    """Mean over tokens of ``|cos(Δ_t, h_t)|``: how aligned an update is with the stream it is added to.

    ``(1/|T'|) Σ_{t∈T'} |⟨Δ_t, h_t⟩| / (‖Δ_t‖ ‖h_t‖)``, ``T'`` the tokens where both norms are
    ``> eps`` (the others are excluded; :func:`token_abs_cosines` gives the per-token values,
    NaN where excluded, to count them). 0 when every update is orthogonal to its stream, 1 when
    every update is parallel or antiparallel. NaN if no token is left.

    Parameters
    ----------
    delta, h_prev : (tokens, d) array_like, same shape (leading axes flattened).
    eps : float ≥ 0, norm threshold for exclusion.

    Examples
    --------
    >>> h = np.array([[1.0, 0.0], [0.0, 2.0]])
    >>> update_orthogonality([[0.0, 3.0], [5.0, 0.0]], h), update_orthogonality(-2 * h, h)
    (0.0, 1.0)
    """
    c = token_abs_cosines(delta, h_prev, eps)
    if not np.any(np.isfinite(c)):
        return float("nan")
    return float(np.nanmean(c))


def update_norm_ratio(delta_mlp: np.ndarray, delta_attn: np.ndarray, how: str = "mean_of_ratios") -> float:
    """MLP-to-attention update size, ``‖Δ_MLP‖ / ‖Δ_attn‖``, aggregated over tokens.

    - ``how="mean_of_ratios"`` (default): ``(1/|T'|) Σ_{t∈T'} ‖Δ_MLP,t‖ / ‖Δ_attn,t‖`` over the
      tokens ``T'`` with ``‖Δ_attn,t‖ > 0`` (NaN if none). Per-token, so every token counts
      equally; sensitive to tokens with a tiny attention update.
    - ``how="ratio_of_means"``: ``mean_t ‖Δ_MLP,t‖ / mean_t ‖Δ_attn,t‖`` over all tokens (NaN
      if the denominator is 0). Robust to small denominators; weights large-update tokens.

    Both are ≥ 0; they agree when the per-token ratio is constant.

    Examples
    --------
    >>> a = np.array([[1.0, 0.0], [0.0, 2.0]]); m = np.array([[0.0, 3.0], [4.0, 0.0]])
    >>> update_norm_ratio(m, a), update_norm_ratio(m, a, "ratio_of_means")
    (2.5, 2.3333333333333335)
    """
    M = _as_tokens(delta_mlp, "delta_mlp")
    A = _as_tokens(delta_attn, "delta_attn")
    _same_shape(M, A, "delta_mlp", "delta_attn")
    nm = np.linalg.norm(M, axis=1)
    na = np.linalg.norm(A, axis=1)
    if how == "mean_of_ratios":
        ok = na > 0
        return float(np.mean(nm[ok] / na[ok])) if np.any(ok) else float("nan")
    if how == "ratio_of_means":
        den = float(na.mean())
        return float(nm.mean() / den) if den > 0 else float("nan")
    raise ValueError(f"how must be 'mean_of_ratios' or 'ratio_of_means', got {how!r}")


# --------------------------------------------------------------------------------------------
# per-layer table

LAYER_COLUMNS = [
    "layer",
    "state",
    "n_tokens",
    "hidden_erank",
    "update_orthogonality",
    "attn_orthogonality",
    "mlp_orthogonality",
    "n_excluded",
    "norm_ratio",
    "norm_ratio_of_means",
    "relative_update_norm",
    "update_norm",
    "attn_update_norm",
    "mlp_update_norm",
    "update_erank",
    "attn_update_erank",
    "mlp_update_erank",
]
#: per-layer columns about the update after a state: empty on the ``output`` row (nothing follows)
UPDATE_COLUMNS = tuple(LAYER_COLUMNS[4:])
#: lens columns that :func:`with_lens_hits` adds
LENS_HIT_COLUMNS = tuple(f"{lens}_{c}" for lens in ("tuned", "logit") for c in ("hit1", "hit5", "hit5_over_hit1"))
#: per-layer metrics aggregated by phase_table (those present in the table)
PHASE_METRICS = ["hidden_erank", *(c for c in UPDATE_COLUMNS if c != "n_excluded"), *LENS_HIT_COLUMNS]


class _UpdateSums:
    """Running sums over tokens for the per-layer update metrics (one layer)."""

    def __init__(self) -> None:
        self.n_tokens = 0
        self.orth = [0.0, 0]  # [sum of |cos|, count] for Δ_L vs h_L
        self.attn = [0.0, 0]
        self.mlp = [0.0, 0]
        self.ratio = [0.0, 0]  # Σ ‖Δ_mlp‖/‖Δ_attn‖ over tokens with ‖Δ_attn‖ > 0
        self.rel = [0.0, 0]  # Σ ‖Δ_L‖/‖h_L‖ over tokens with ‖h_L‖ > 0
        self.norm_mlp = 0.0
        self.norm_attn = 0.0
        self.norm_layer = 0.0

    @staticmethod
    def _add(acc: list, values: np.ndarray) -> None:
        ok = np.isfinite(values)
        acc[0] += float(values[ok].sum())
        acc[1] += int(ok.sum())

    def add(self, h: np.ndarray, m: np.ndarray, h_next: np.ndarray, eps: float) -> None:
        d_attn, d_mlp, d_layer = m - h, h_next - m, h_next - h
        self.n_tokens += h.shape[0]
        self._add(self.orth, token_abs_cosines(d_layer, h, eps))
        self._add(self.attn, token_abs_cosines(d_attn, h, eps))
        self._add(self.mlp, token_abs_cosines(d_mlp, m, eps))
        na = np.linalg.norm(d_attn, axis=1)
        nm = np.linalg.norm(d_mlp, axis=1)
        nh = np.linalg.norm(h, axis=1)
        ok = na > 0
        self._add(self.ratio, nm[ok] / na[ok])
        ok = nh > 0
        nd = np.linalg.norm(d_layer, axis=1)
        self._add(self.rel, nd[ok] / nh[ok])
        self.norm_mlp += float(nm.sum())
        self.norm_attn += float(na.sum())
        self.norm_layer += float(nd.sum())

    @staticmethod
    def _mean(acc: list) -> float:
        return acc[0] / acc[1] if acc[1] else float("nan")

    def row(self) -> dict[str, Any]:
        return {
            "update_orthogonality": self._mean(self.orth),
            "attn_orthogonality": self._mean(self.attn),
            "mlp_orthogonality": self._mean(self.mlp),
            "n_excluded": self.n_tokens - self.orth[1],
            "norm_ratio": self._mean(self.ratio),
            "norm_ratio_of_means": self.norm_mlp / self.norm_attn if self.norm_attn > 0 else float("nan"),
            "relative_update_norm": self._mean(self.rel),
            "update_norm": self.norm_layer / self.n_tokens if self.n_tokens else float("nan"),
            "attn_update_norm": self.norm_attn / self.n_tokens if self.n_tokens else float("nan"),
            "mlp_update_norm": self.norm_mlp / self.n_tokens if self.n_tokens else float("nan"),
        }


def layer_geometry(
    boundary_states: Any,
    skip_positions: int = 0,
    eps: float = 0.0,
    erank_method: str = "auto",
    chunk_samples: int | None = None,
) -> pd.DataFrame:
    """Per-layer residual-stream geometry from the boundary states of every layer.

    Parameters
    ----------
    boundary_states : array of shape (N_samples, 2n+1, T, d)
        Index ``2L`` = ``h_L`` (entering layer L, ``h_0`` = embedding output), ``2L+1`` =
        ``m_L`` (pre-MLP of layer L), ``2n`` = ``h_n``, the raw output of the last layer (before
        the final norm). Any object with ``.shape`` and numpy slicing works (ndarray, memmap,
        ``h5py.Dataset``): it is read one state and one chunk of samples at a time and upcast
        to float64, so memory stays at a few chunks plus a d × d Gram matrix.
    skip_positions : int, 0 ≤ skip_positions < T
        Drop the first positions of every sample (e.g. the BOS / attention-sink token).
    eps : float ≥ 0
        Tokens with a norm ≤ eps are excluded from cosines.
    erank_method : "auto", "svd" or "gram"
        How singular values for ``hidden_erank`` are obtained (:func:`hidden_singular_values`);
        "auto" = exact SVD when the pooled matrix has ≤ 2²⁴ entries, else the streamed Gram.
    chunk_samples : int ≥ 1 or None
        Samples per chunk (None: about 2²² entries per chunk). Results do not depend on it
        (up to rounding).

    Returns
    -------
    DataFrame with n + 1 rows: ``layer = 0 … n−1`` (``state = "h_L"``) and ``layer = n``
    (``state = "output"``: only ``hidden_erank`` and ``n_tokens`` filled, the rest NaN).
    Columns, with tokens pooled over samples (``n_tokens = N·(T − skip)``):

    - ``hidden_erank``: :func:`hidden_effective_rank` of ``h_L`` (centered over pooled tokens);
    - ``update_orthogonality``: mean ``|cos(Δ_L, h_L)|``, ``Δ_L = h_{L+1} − h_L``;
    - ``attn_orthogonality``: mean ``|cos(Δ_attn, h_L)|``; ``mlp_orthogonality``: mean
      ``|cos(Δ_mlp, m_L)|``;
    - ``n_excluded``: tokens excluded from ``update_orthogonality`` (a norm ≤ eps);
    - ``norm_ratio``: mean over tokens of ``‖Δ_mlp‖/‖Δ_attn‖`` (tokens with ``Δ_attn = 0`` left
      out); ``norm_ratio_of_means``: ``mean‖Δ_mlp‖ / mean‖Δ_attn‖`` (see
      :func:`update_norm_ratio`);
    - ``relative_update_norm``: mean over tokens of ``‖Δ_L‖ / ‖h_L‖`` (tokens with ``h_L = 0``
      left out);
    - ``update_norm``, ``attn_update_norm``, ``mlp_update_norm``: the absolute sizes, mean over
      tokens of ``‖Δ_L‖``, ``‖Δ_attn‖``, ``‖Δ_mlp‖`` (all tokens);
    - ``update_erank``, ``attn_update_erank``, ``mlp_update_erank``: the effective rank of the
      updates as a (tokens × d) matrix, with ``hidden_erank``'s definition (Roy–Vetterli on the
      singular values of the token-centered matrix, :func:`hidden_effective_rank`).
    """
    boundary_states, (N, S, T, d), skip, chunk = _check_boundary_states(
        boundary_states, skip_positions, eps, erank_method, chunk_samples
    )
    n = (S - 1) // 2
    n_tok = N * (T - skip)
    use_svd = erank_method == "svd" or (erank_method == "auto" and n_tok * d <= _SVD_MAX_ELEMENTS)
    pool = _TokenPool(boundary_states, skip, d, n_tok, use_svd)
    rows = [_layer_row(pool, L, n, N, chunk, eps) for L in range(n + 1)]
    return pd.DataFrame(rows, columns=LAYER_COLUMNS)


def _layer_row(pool: _TokenPool, L: int, n: int, N: int, chunk: int, eps: float) -> dict[str, Any]:
    """The :func:`layer_geometry` row of layer L (of n; L = n is the output state), streamed over
    chunks of ``chunk`` of the N samples."""
    # h_L and the three updates after it: Δ_attn = m_L − h_L, Δ_mlp = h_{L+1} − m_L, Δ_L
    mats = {"hidden_erank": pool.new()}
    if L < n:
        mats.update(attn_update_erank=pool.new(), mlp_update_erank=pool.new(), update_erank=pool.new())
    sums = _UpdateSums()
    for a in range(0, N, chunk):
        b = min(N, a + chunk)
        h = pool.read(2 * L, a, b)
        pool.push(mats["hidden_erank"], h)
        if L < n:
            m, h_next = pool.read(2 * L + 1, a, b), pool.read(2 * L + 2, a, b)
            sums.add(h, m, h_next, eps)
            pool.push(mats["attn_update_erank"], m - h)
            pool.push(mats["mlp_update_erank"], h_next - m)
            pool.push(mats["update_erank"], h_next - h)
    row: dict[str, Any] = {
        "layer": L,
        "state": "h_L" if L < n else "output",
        "n_tokens": pool.n_tok,
    }
    if L < n:
        row.update(sums.row())
    row.update({name: pool.erank(parts) for name, parts in mats.items()})
    return row


def _check_boundary_states(
    boundary_states: Any, skip_positions: int, eps: float, erank_method: str, chunk_samples: int | None
) -> tuple[Any, tuple[int, int, int, int], int, int]:
    """(states, (N, S, T, d), skip, samples per chunk) of :func:`layer_geometry`'s arguments, checked;
    states without ``.shape`` become an ndarray."""
    shape = getattr(boundary_states, "shape", None)
    if shape is None:
        boundary_states = np.asarray(boundary_states)
        shape = boundary_states.shape
    shape = tuple(int(v) for v in shape)
    if len(shape) != 4:
        raise ValueError(
            f"boundary_states must have shape (N_samples, 2n+1, T, d), got shape {shape} (ndim {len(shape)})"
        )
    N, S, T, d = shape
    if S < 3 or S % 2 == 0:
        raise ValueError(
            f"boundary_states axis 1 must hold 2n+1 states (h_0, m_0, h_1, …, h_n), an odd number >= 3, got {S}"
        )
    if N < 1 or T < 1 or d < 1:
        raise ValueError(f"boundary_states has an empty axis: shape {shape}")
    if not is_int(skip_positions):
        raise ValueError(f"skip_positions must be an integer, got {skip_positions!r}")
    skip = int(skip_positions)
    if not 0 <= skip < T:
        raise ValueError(f"skip_positions must be in [0, T-1] = [0, {T - 1}], got {skip}")
    if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if erank_method not in ("auto", "svd", "gram"):
        raise ValueError(f"erank_method must be 'auto', 'svd' or 'gram', got {erank_method!r}")
    if chunk_samples is None:
        chunk = max(1, _CHUNK_ELEMENTS // ((T - skip) * d))
    elif not is_int(chunk_samples) or chunk_samples < 1:
        raise ValueError(f"chunk_samples must be a positive integer or None, got {chunk_samples!r}")
    else:
        chunk = int(chunk_samples)
    return boundary_states, (N, S, T, d), skip, chunk


@dataclass(frozen=True)
class _TokenPool:
    """Reads chunks of one boundary state as pooled float64 tokens and accumulates (tokens × d)
    matrices for an effective rank: the token rows themselves (exact SVD, ``use_svd``) or their
    streamed centered Gram matrix."""

    states: Any
    skip: int
    d: int
    n_tok: int
    use_svd: bool

    def read(self, i: int, a: int, b: int) -> np.ndarray:
        """Samples a..b−1 of state i, positions from ``skip`` on, as (tokens, d)."""
        X = np.asarray(self.states[a:b, i, self.skip :, :])
        return _as_tokens(X, f"boundary_states[:, {i}]")

    def new(self) -> list[np.ndarray] | _CenteredGram:
        """An empty accumulator."""
        return [] if self.use_svd else _CenteredGram(self.d)

    @staticmethod
    def push(parts: list[np.ndarray] | _CenteredGram, X: np.ndarray) -> None:
        """Add the tokens X to an accumulator."""
        if isinstance(parts, list):
            parts.append(X)
        else:
            parts.add(X)

    def erank(self, parts: list[np.ndarray] | _CenteredGram) -> float:
        """:func:`hidden_effective_rank` of the accumulated tokens (NaN with fewer than 2 tokens)."""
        if self.n_tok < 2:
            return float("nan")
        if isinstance(parts, _CenteredGram):
            return float(effective_rank(parts.singular_values()))
        return hidden_effective_rank(np.concatenate(parts, axis=0), "svd")


# --------------------------------------------------------------------------------------------
# phases


def phase_metrics(
    per_layer: pd.DataFrame,
    b1: int,
    b2: int,
    metrics: Sequence[str],
    layer_col: str = "layer",
) -> pd.DataFrame:
    """Aggregate per-layer metrics over the three phases.

    A row with layer ``L`` belongs to phase 1 if ``L ≤ b1``, phase 2 if ``b1 < L ≤ b2``, phase 3
    if ``L > b2`` — the phases of RSS-profile point ``L`` (:func:`resdyn.study_b.phases.phase_of_layer`).
    Rows beyond the profile (the last layer ``n−1`` and the ``output`` row of
    :func:`layer_geometry`) fall into phase 3; filter ``per_layer`` first to leave them out.

    Returns
    -------
    Long table, one row per (phase, metric) for phases 1, 2, 3 and each metric in order:
    ``phase`` (int), ``phase_name`` (rise / plateau / descent), ``metric``, ``mean``, ``sd``
    (sample sd, ddof = 1; NaN for fewer than 2 values), ``n_layers`` (finite values used; NaN
    values are skipped). An empty phase gives ``n_layers = 0`` and NaN statistics.

    Examples
    --------
    >>> df = pd.DataFrame({"layer": range(6), "x": [1.0, 3.0, 5.0, 5.0, 5.0, 9.0]})
    >>> phase_metrics(df, 1, 4, ["x"])[["phase", "mean", "sd", "n_layers"]].to_dict("list")
    {'phase': [1, 2, 3], 'mean': [2.0, 5.0, 9.0], 'sd': [1.4142135623730951, 0.0, nan], 'n_layers': [2, 3, 1]}
    """
    if not isinstance(per_layer, pd.DataFrame):
        raise ValueError(f"per_layer must be a pandas DataFrame, got {type(per_layer).__name__}")
    if isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    missing = [c for c in [layer_col, *metrics] if c not in per_layer.columns]
    if missing:
        raise ValueError(f"per_layer lacks columns {missing}; it has {list(per_layer.columns)}")
    for name, v in (("b1", b1), ("b2", b2)):
        if not is_int(v):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if not 0 <= int(b1) <= int(b2):
        raise ValueError(f"cut points must satisfy 0 <= b1 <= b2, got b1={b1}, b2={b2}")
    layers = pd.to_numeric(per_layer[layer_col], errors="coerce").to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(layers)) or np.any(layers != np.round(layers)) or np.any(layers < 0):
        raise ValueError(f"per_layer[{layer_col!r}] must hold non-negative integers")
    phase = np.where(layers <= b1, 1, np.where(layers <= b2, 2, 3))
    rows = []
    for ph in (1, 2, 3):
        sel = phase == ph
        for metric in metrics:
            vals = pd.to_numeric(per_layer.loc[sel, metric], errors="coerce").to_numpy(dtype=np.float64)
            vals = vals[np.isfinite(vals)]
            rows.append(
                {
                    "phase": ph,
                    "phase_name": PHASE_NAMES[ph],
                    "metric": metric,
                    "mean": float(vals.mean()) if vals.size else float("nan"),
                    "sd": float(vals.std(ddof=1)) if vals.size >= 2 else float("nan"),
                    "n_layers": int(vals.size),
                }
            )
    return pd.DataFrame(rows, columns=["phase", "phase_name", "metric", "mean", "sd", "n_layers"])


def with_lens_hits(
    per_layer: pd.DataFrame, lens_metrics: pd.DataFrame, columns: Sequence[str] = ("hit1", "hit5")
) -> pd.DataFrame:
    """Add lens readout columns to a per-layer table: ``{lens}_{column}`` joined on ``layer``.

    ``lens_metrics`` is the ``lens_metrics.tsv`` table (:func:`resdyn.study_b.lens.lens_metrics`: one row
    per (lens ∈ {tuned, logit}, layer), layer L = the lens reading ``h_L``, L = n the model's
    output) — the same layer index as :func:`layer_geometry` (row L describes ``h_L``; the
    ``output`` row is L = n). Gives e.g. ``tuned_hit1``, ``tuned_hit5``, ``logit_hit1``,
    ``logit_hit5``, and with both hit columns ``{lens}_hit5_over_hit1`` (:func:`hit_ratio`);
    layers without a lens row get NaN. Left join: ``per_layer``'s rows and
    order are kept.
    """
    if not isinstance(per_layer, pd.DataFrame) or not isinstance(lens_metrics, pd.DataFrame):
        raise ValueError("per_layer and lens_metrics must be pandas DataFrames")
    columns = [columns] if isinstance(columns, str) else list(columns)
    need = ["lens", "layer", *columns]
    missing = [c for c in need if c not in lens_metrics.columns]
    if missing:
        raise ValueError(f"lens_metrics lacks columns {missing}; needs {need}, has {list(lens_metrics.columns)}")
    if "layer" not in per_layer.columns:
        raise ValueError(f"per_layer lacks column 'layer'; has {list(per_layer.columns)}")
    dup = lens_metrics.duplicated(["lens", "layer"])
    if dup.any():
        raise ValueError(
            "lens_metrics has duplicate (lens, layer) rows: "
            f"{lens_metrics.loc[dup, ['lens', 'layer']].values.tolist()[:5]}"
        )
    wide = lens_metrics.pivot(index="layer", columns="lens", values=columns)
    wide.columns = [f"{lens}_{col}" for col, lens in wide.columns]
    wide = wide[sorted(wide.columns)].reset_index()
    wide["layer"] = wide["layer"].astype(per_layer["layer"].dtype)
    if {"hit1", "hit5"} <= set(columns):
        for lens in sorted(lens_metrics["lens"].unique()):
            wide[f"{lens}_hit5_over_hit1"] = hit_ratio(wide[f"{lens}_hit5"], wide[f"{lens}_hit1"])
    clash = [c for c in wide.columns if c != "layer" and c in per_layer.columns]
    if clash:
        raise ValueError(f"per_layer already has columns {clash}")
    return per_layer.merge(wide, on="layer", how="left")


def hit_ratio(hit5: Any, hit1: Any) -> np.ndarray:
    """``Hit@5 / Hit@1`` per layer: how much more often the final top-1 token is among the lens's
    top 5 than its top 1 (≥ 1, since Hit@5 ≥ Hit@1); NaN where ``Hit@1 = 0`` (undefined).

    Examples
    --------
    >>> hit_ratio([0.5, 0.9, 0.1], [0.25, 0.9, 0.0]).tolist()
    [2.0, 1.0, nan]
    """
    h5 = np.asarray(hit5, dtype=np.float64)
    h1 = np.asarray(hit1, dtype=np.float64)
    out = np.full(np.broadcast(h5, h1).shape, np.nan)
    ok = h1 > 0
    np.divide(h5, h1, out=out, where=ok)
    return out


def phase_table(per_layer: pd.DataFrame, cuts: Any, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """:func:`phase_metrics` with the cut points of a :func:`resdyn.study_b.phases.cutpoints` result
    (a :class:`resdyn.study_b.phases.Cutpoints`, or a mapping with keys ``b1`` and ``b2``).

    ``metrics`` defaults to the columns of :data:`PHASE_METRICS` present in ``per_layer``. The
    ``output`` row of :func:`layer_geometry` (``state == "output"``, not a layer) is left out;
    the last layer ``n−1``, which has no RSS point, falls into phase 3.
    """
    if isinstance(cuts, dict):
        b1, b2 = cuts.get("b1"), cuts.get("b2")
    else:
        b1, b2 = getattr(cuts, "b1", None), getattr(cuts, "b2", None)
    if b1 is None or b2 is None:
        raise ValueError(f"cuts must be a cutpoints() result with keys 'b1' and 'b2', got {cuts!r:.200}")
    if not isinstance(per_layer, pd.DataFrame):
        raise ValueError(f"per_layer must be a pandas DataFrame, got {type(per_layer).__name__}")
    if metrics is None:
        metrics = [m for m in PHASE_METRICS if m in per_layer.columns]
    table = per_layer
    if "state" in table.columns:
        table = table[table["state"] != "output"]
    out = phase_metrics(table, int(b1), int(b2), metrics)
    # why a statistic is empty: a phase with no (finite) layer, or one layer (no sd)
    out["reason"] = np.select(
        [out["n_layers"] == 0, out["n_layers"] == 1],
        ["no layer with a finite value in this phase", "one layer: sd undefined"],
        "",
    )
    return out


def depth_scaling(widths: pd.DataFrame, alpha: float = 0.05, min_depths: int = 3) -> pd.DataFrame:
    """How phase widths scale with depth: per phase, OLS ``width = intercept + slope · n_layers``.

    ``width`` is a phase's number of RSS-profile points (one per layer among the first
    ``n_layers − 1``; :func:`resdyn.study_b.phases.phase_spans`), so the three widths of a model sum to
    ``n_layers − 1``. Fitted with ``statsmodels.OLS`` (constant added); the slope's
    ``1 − alpha`` confidence interval is the usual t interval.

    Parameters
    ----------
    widths : DataFrame with columns ``model``, ``n_layers``, ``phase``, ``width``
        One row per (model, phase); several rows per model (e.g. checkpoints) are separate
        observations. An optional bool column ``fallback`` flags widths whose cut came from a
        Kneedle fallback (:func:`fallback_widths`): they are left out of the fit and counted in
        ``n_fallback``.
    alpha : float in (0, 1)
    min_depths : int ≥ 3
        Phases with fewer distinct ``n_layers`` values are not fitted.

    Returns
    -------
    One row per phase (sorted): ``phase``, ``status`` (``"ok"`` or ``"too_few_depths"``),
    ``slope``, ``intercept``, ``slope_ci_low``, ``slope_ci_high``, ``slope_se``, ``p_value``
    (slope ≠ 0), ``r_squared``, ``n_models`` (distinct models), ``n_depths`` (distinct depths),
    ``n_obs`` (rows fitted), ``n_fallback`` (fallback rows left out); statistics NaN unless
    ``status == "ok"``. With 3 points the interval has 1
    degree of freedom (wide); an exact fit gives a zero-width interval.

    Examples
    --------
    >>> w = pd.DataFrame({"model": list("abc"), "n_layers": [8, 12, 16], "phase": 2, "width": [3, 5, 7]})
    >>> r = depth_scaling(w).iloc[0]
    >>> r["status"], round(float(r["slope"]), 12), round(float(r["intercept"]), 12)
    ('ok', 0.5, -1.0)
    """
    import statsmodels.api as sm

    _check_widths(widths, alpha, min_depths)
    flag = widths["fallback"].astype(bool).to_numpy() if "fallback" in widths.columns else np.zeros(len(widths), bool)
    rows = []
    for ph, at in sorted(widths.groupby("phase").indices.items()):
        g, left_out = widths.iloc[at], flag[at]
        row = _depth_fit_row(ph, g[~left_out], alpha, min_depths, sm)
        row["n_fallback"] = int(left_out.sum())
        if row["n_fallback"] and row["reason"]:
            row["reason"] += f" ({row['n_fallback']} fallback width(s) left out)"
        rows.append(row)
    return pd.DataFrame(rows, columns=list(_DEPTH_SCALING_COLUMNS))


def phase_widths(
    cuts: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]], n_layers: Mapping[str, int]
) -> pd.DataFrame:
    """``results/scaling/widths.tsv``: the three phase widths of every model of every scaling group.

    ``cuts``: model → its ``phases.json`` object (``widths``, ``b1_found``, ``b2_found``);
    ``groups``: group → models; ``n_layers``: model → depth. Columns ``group, model, n_layers,
    phase, width, fallback`` (:func:`fallback_widths`).
    """
    rows = []
    for group, members in groups.items():
        for m in members:
            flags = fallback_widths(bool(cuts[m]["b1_found"]), bool(cuts[m]["b2_found"]))
            for phase, (width, fb) in enumerate(zip(cuts[m]["widths"], flags, strict=True), start=1):
                rows.append([group, m, int(n_layers[m]), phase, int(width), fb])
    return pd.DataFrame(rows, columns=["group", "model", "n_layers", "phase", "width", "fallback"])


def group_fits(widths: pd.DataFrame) -> pd.DataFrame:
    """``results/scaling/phase_widths.tsv``: :func:`depth_scaling` of each group of
    :func:`phase_widths`, with its ``group`` (no group: the empty fit table with the column)."""
    fits = [depth_scaling(sub).assign(group=g) for g, sub in widths.groupby("group")]
    return pd.concat(fits, ignore_index=True) if fits else depth_scaling(widths).assign(group=pd.Series(dtype=str))


def fallback_widths(b1_found: bool, b2_found: bool) -> tuple[bool, bool, bool]:
    """Which of the three phase widths rest on a Kneedle fallback cut.

    Phase 1 spans ``[0, b1]``, phase 2 ``(b1, b2]``, phase 3 ``(b2, end]``: width 1 depends on
    b1, width 3 on b2, width 2 on both, so a fallback b1 (= peak) flags phases 1 and 2, a
    fallback b2 (= peak) phases 2 and 3.

    Example:
        >>> fallback_widths(True, False)
        (False, True, True)
    """
    return (not b1_found, not (b1_found and b2_found), not b2_found)


#: The columns of :func:`depth_scaling`, in order.
_DEPTH_SCALING_COLUMNS = (
    "phase",
    "status",
    "slope",
    "intercept",
    "slope_ci_low",
    "slope_ci_high",
    "slope_se",
    "p_value",
    "r_squared",
    "n_models",
    "n_depths",
    "n_obs",
    "n_fallback",
    "reason",
)


def _check_widths(widths: pd.DataFrame, alpha: float, min_depths: int) -> None:
    """:func:`depth_scaling`'s arguments: a DataFrame with the needed columns and finite numbers,
    alpha in (0, 1), min_depths ≥ 3."""
    if not isinstance(widths, pd.DataFrame):
        raise ValueError(f"widths must be a pandas DataFrame, got {type(widths).__name__}")
    need = ["model", "n_layers", "phase", "width"]
    missing = [c for c in need if c not in widths.columns]
    if missing:
        raise ValueError(f"widths lacks columns {missing}; needs {need}, has {list(widths.columns)}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not is_int(min_depths) or min_depths < 3:
        raise ValueError(
            f"min_depths must be an integer >= 3 (a line through 2 depths has no error), got {min_depths!r}"
        )
    for col in ("n_layers", "width"):
        vals = pd.to_numeric(widths[col], errors="coerce")
        if vals.isna().any() or not np.all(np.isfinite(vals.to_numpy(dtype=np.float64))):
            bad = widths.loc[vals.isna() | ~np.isfinite(vals.astype(float)), col].tolist()
            raise ValueError(f"widths[{col!r}] must be finite numbers, got bad values {bad[:5]}")


def _depth_fit_row(ph: Any, g: pd.DataFrame, alpha: float, min_depths: int, sm: Any) -> dict[str, Any]:
    """The :func:`depth_scaling` row of phase ``ph`` from its rows ``g``: OLS width ~ 1 + n_layers
    (``sm`` = statsmodels.api), or ``too_few_depths`` with fewer than ``min_depths`` distinct depths."""
    x = g["n_layers"].to_numpy(dtype=np.float64)
    y = g["width"].to_numpy(dtype=np.float64)
    n_depths = int(np.unique(x).size)
    row: dict[str, Any] = {
        "phase": ph,
        "status": "ok",
        "slope": math.nan,
        "intercept": math.nan,
        "slope_ci_low": math.nan,
        "slope_ci_high": math.nan,
        "slope_se": math.nan,
        "p_value": math.nan,
        "r_squared": math.nan,
        "n_models": int(g["model"].nunique()),
        "n_depths": n_depths,
        "n_obs": int(len(g)),
        "reason": "",
    }
    if n_depths < min_depths:
        row["status"] = "too_few_depths"
        row["reason"] = f"too_few_depths: {n_depths} depth(s) in the group, the fit needs {min_depths}"
        return row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exact fits: zero residual variance → divide warnings
        fit = sm.OLS(y, sm.add_constant(x, has_constant="add")).fit()
        ci = np.asarray(fit.conf_int(alpha=alpha))
        row.update(
            slope=float(fit.params[1]),
            intercept=float(fit.params[0]),
            slope_ci_low=float(ci[1, 0]),
            slope_ci_high=float(ci[1, 1]),
            slope_se=float(fit.bse[1]),
            p_value=float(fit.pvalues[1]),
            r_squared=float(fit.rsquared),
        )
    return row
