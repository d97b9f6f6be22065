"""Bootstrap uncertainty over samples: percentile intervals for Study A's operator metrics.

Generic utilities
-----------------
Nonparametric bootstrap (B. Efron and R. Tibshirani, *An Introduction to the Bootstrap*, 1993):
draw ``n_resamples`` index vectors of length n with replacement from 0 … n−1
(:func:`bootstrap_indices`, ``np.random.default_rng(seed)``), evaluate the statistic on each
(:func:`bootstrap`), and take the percentile interval

    CI = [q_{(1−level)/2}, q_{(1+level)/2}]   of the replicate values      (:func:`percentile_ci`)

with numpy's default (linear, "type 7") quantiles. A constant statistic has a zero-width
interval; for the mean of n ≥ 30 normal draws the 95 % interval covers the truth ≈ 94 % of the
time (the percentile interval is slightly narrow for small n, by the factor sqrt((n−1)/n)).

What is bootstrapped here (:func:`jacobian_bootstrap`)
------------------------------------------------------
The unit is the *sample* (one held-out sequence): a sample's Jacobian is the mean of its
per-position Jacobians, and a bootstrap replicate of a sublayer's mean Jacobian is the mean of
the resampled samples' Jacobians, J* = (1/n) Σ_i c_i J_i with c ~ Multinomial(n, 1/n). The
*same* resampled samples are used for every sublayer of a replicate (the samples are the unit
of the whole forward pass), and — because the index draws depend only on (seed, n) — for every
checkpoint of a model, so replicates of two checkpoints can be paired (:mod:`resdyn.scorecard`).
On every replicate:

- ``henrici`` and ``complex_fraction`` (share of eigenvalues with |Im λ| > tol·max(1, |λ|)) of
  every sublayer's mean Jacobian (:func:`resdyn.spectral.henrici_departure`,
  :func:`resdyn.spectral.complex_fraction`);
- ``cum_erank_full_depth``: effective rank of P = J_{S−1} ⋯ J_0 over all S sublayers
  (Frobenius-rescaled after each product, like :func:`resdyn.spectral.cumulative_spectrum`);
- ``complex_fraction_early_minus_late`` and ``henrici_early_minus_late``: the mean over the
  first third of sublayers minus the mean over the last third (:func:`early_late`).

Only the first n = ``jacobian.store_first_n`` samples keep their whole Jacobians
(``per_sample`` in the HDF5 files, :mod:`resdyn.jacobian`), so the bootstrap runs over those n
(column ``n_bootstrap_samples``); ``n_samples_total`` is the N of the mean Jacobian. ``estimate``
is the statistic of the mean of those n samples (the plug-in value the interval belongs to);
``estimate_all_samples`` is the statistic of the stored all-N mean (what ``spectra.tsv`` and
``bottleneck.tsv`` report). With n < N the interval describes an n-sample estimate and is wider
than the all-N estimate's uncertainty.

What is not bootstrapped
------------------------
The RSS profile and its cut points b1, b2 (Study B). RSS is a deterministic function of the
tuned-lens translators; its sampling uncertainty comes from the lens's training tokens, and a
lens-data bootstrap means refitting every translator ``n_resamples`` times (each fit costs as
much as the ``lens`` rule), which this pipeline does not afford. Those rows are written with
``bootstrapped = False`` and the reason in ``note``, never with a made-up interval.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from resdyn import spectral

__all__ = [
    "percentile_ci",
    "bootstrap_indices",
    "bootstrap",
    "bootstrap_ci",
    "early_late",
    "read_per_sample",
    "jacobian_bootstrap",
    "jacobian_bootstrap_files",
    "not_bootstrapped_rows",
    "BOOTSTRAP_COLUMNS",
    "REPLICATE_COLUMNS",
    "SCALAR_METRICS",
]

BOOTSTRAP_COLUMNS = [
    "metric", "layer", "kind", "s", "estimate", "ci_low", "ci_high", "level", "n_resamples",
    "n_bootstrap_samples", "n_samples_total", "estimate_all_samples", "seed", "bootstrapped", "note",
    "reason",  # why a row's numbers are empty (not bootstrapped)
]
REPLICATE_COLUMNS = ["replicate", "metric", "value"]
#: whole-model statistics whose replicates are kept (for paired comparisons across checkpoints)
SCALAR_METRICS = ("cum_erank_full_depth", "complex_fraction_early_minus_late", "henrici_early_minus_late")
NOT_BOOTSTRAPPED_NOTE = (
    "not bootstrapped: RSS is a deterministic function of the tuned-lens translators; its sampling "
    "uncertainty would need a lens-data bootstrap (refitting every translator per resample), not afforded"
)


# --------------------------------------------------------------------------------------------
# generic utilities


def _check_int(v: Any, name: str, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < low:
        raise ValueError(f"{name} must be an integer ≥ {low}, got {v!r}")
    return int(v)


def _check_level(level: Any) -> float:
    try:
        f = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}") from None
    if not (math.isfinite(f) and 0.0 < f < 1.0):
        raise ValueError(f"level must be in (0, 1) (e.g. 0.95), got {level!r}")
    return f


def percentile_ci(values: Any, level: float = 0.95) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap replicates: the (1−level)/2 and (1+level)/2 quantiles.

    Args:
        values: (R,) replicate values, or (R, ...) for several statistics at once (axis 0).
        level: coverage in (0, 1).
    Returns:
        (low, high) floats for 1-D input, arrays of shape ``values.shape[1:]`` otherwise. Any
        NaN replicate makes that statistic's interval NaN (it is never silently dropped).
    Example:
        >>> percentile_ci(np.arange(101.0), 0.5)  # quartiles of 0..100
        (25.0, 75.0)
        >>> percentile_ci(np.full(50, 3.0))
        (3.0, 3.0)
    """
    lvl = _check_level(level)
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise ValueError(f"values must hold at least one replicate along axis 0, got shape {arr.shape}")
    q = np.quantile(arr, [(1.0 - lvl) / 2.0, (1.0 + lvl) / 2.0], axis=0)
    if arr.ndim == 1:
        return float(q[0]), float(q[1])
    return q[0], q[1]


def bootstrap_indices(n_samples: int, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n_samples) int64 indices drawn with replacement, ``default_rng(seed)``.

    Depends only on (n_samples, n_resamples, seed): the same call on two checkpoints resamples
    the same samples, so their replicates pair up.

    Example:
        >>> idx = bootstrap_indices(4, 3, seed=0)
        >>> idx.shape, bool(((idx >= 0) & (idx < 4)).all())
        ((3, 4), True)
    """
    n = _check_int(n_samples, "n_samples", 1)
    r = _check_int(n_resamples, "n_resamples", 1)
    s = _check_int(seed, "seed", 0)
    return np.random.default_rng(s).integers(0, n, size=(r, n), dtype=np.int64)


def bootstrap(stat_fn: Callable[[np.ndarray], Any], n_samples: int, n_resamples: int, seed: int) -> np.ndarray:
    """Replicates ``stat_fn(idx)`` for each row of :func:`bootstrap_indices`.

    ``stat_fn`` takes an (n_samples,) index vector (the resampled samples, with repeats) and
    returns a number or an array; the result stacks them, shape (n_resamples, ...).

    Example:
        >>> x = np.array([1.0, 2.0, 3.0])
        >>> reps = bootstrap(lambda i: x[i].mean(), 3, 1000, seed=1)
        >>> reps.shape, bool(reps.min() >= 1.0 and reps.max() <= 3.0)
        ((1000,), True)
    """
    if not callable(stat_fn):
        raise ValueError(f"stat_fn must be callable (index vector -> statistic), got {type(stat_fn).__name__}")
    idx = bootstrap_indices(n_samples, n_resamples, seed)
    return np.asarray([stat_fn(row) for row in idx], dtype=np.float64)


def bootstrap_ci(stat_fn: Callable[[np.ndarray], Any], n_samples: int, n_resamples: int = 200, seed: int = 0,
                 level: float = 0.95) -> dict[str, Any]:
    """Point estimate (``stat_fn`` on all samples, in order) and its percentile interval.

    Returns {``estimate``, ``ci_low``, ``ci_high``, ``replicates`` (R, ...)}.

    Example:
        >>> r = bootstrap_ci(lambda i: 7.0, n_samples=5, n_resamples=20)
        >>> r["estimate"], r["ci_low"], r["ci_high"]
        (7.0, 7.0, 7.0)
    """
    lvl = _check_level(level)
    n = _check_int(n_samples, "n_samples", 1)
    reps = bootstrap(stat_fn, n, n_resamples, seed)
    low, high = percentile_ci(reps, lvl)
    est = np.asarray(stat_fn(np.arange(n)), dtype=np.float64)
    return {"estimate": float(est) if est.ndim == 0 else est, "ci_low": low, "ci_high": high, "replicates": reps}


def early_late(n_sublayers: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first and the last third of S sublayers (``max(1, S // 3)`` each).

    Example:
        >>> [a.tolist() for a in early_late(12)], [a.tolist() for a in early_late(2)]
        ([[0, 1, 2, 3], [8, 9, 10, 11]], [[0], [1]])
    """
    S = _check_int(n_sublayers, "n_sublayers", 2)
    third = max(1, S // 3)
    return np.arange(third), np.arange(S - third, S)


# --------------------------------------------------------------------------------------------
# per-sample Jacobians from the HDF5 files


def _per_sample_loader(path: Path, kind: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        with h5py.File(path, "r") as f:
            x = f[kind]["per_sample"][()]
        x = x.astype(np.float64).mean(axis=1)  # (n, P, d, d) -> per-sample mean over positions
        if not np.isfinite(x).all():
            raise FloatingPointError(f"{path}: {kind}/per_sample has non-finite entries")
        return x

    return load


def _mean_loader(path: Path, kind: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        with h5py.File(path, "r") as f:
            return f[kind]["mean"][()].astype(np.float64)

    return load


def read_per_sample(folders: Sequence[os.PathLike | str]) -> tuple[dict, dict, dict[str, Any]]:
    """Loaders of every sublayer's per-sample Jacobians and all-sample mean, from block folders.

    Returns ``(per_sample, means, info)``: ``per_sample[(layer, kind)]()`` → (n, d, d) float64
    (each sample's Jacobians averaged over its positions); ``means[(layer, kind)]()`` → (d, d);
    ``info`` = {``n_bootstrap_samples`` n, ``n_samples_total`` N, ``sample_ids`` (n,)}.
    Raises ValueError naming the file when ``per_sample`` is absent (``jacobian.store_first_n``
    = 0), when files disagree on n or on the stored samples, or when layers have gaps.
    """
    files = sorted(p for folder in folders for p in Path(folder).glob("layer*.h5"))
    if not files:
        raise FileNotFoundError(f"no layer*.h5 Jacobian files in {[str(f) for f in folders]}")
    per: dict[tuple[int, str], Any] = {}
    means: dict[tuple[int, str], Any] = {}
    n_stored: int | None = None
    ids_ref: np.ndarray | None = None
    n_total: int | None = None
    for path in files:
        with h5py.File(path, "r") as f:
            layer = int(f.attrs["layer"])
            for kind in (spectral.LAYER_KIND,) if spectral.LAYER_KIND in f else spectral.KINDS:
                if kind not in f or "per_sample" not in f[kind]:
                    raise ValueError(
                        f"{path}: no {kind}/per_sample dataset — the bootstrap needs whole per-sample Jacobians; "
                        "set jacobian.store_first_n ≥ 2 and rerun the jacobians rule"
                    )
                n = int(f[kind]["per_sample"].shape[0])
                total = int(f[kind]["count"][()])
                ids = np.asarray(f[kind]["sample_ids"][()])[:n]
                if n_stored is None:
                    n_stored, ids_ref, n_total = n, ids, total
                elif n != n_stored or total != n_total or not np.array_equal(ids, ids_ref):
                    raise ValueError(
                        f"{path}: {kind}/per_sample holds {n} of {total} samples, but {files[0]} holds "
                        f"{n_stored} of {n_total} (or other sample ids); all files must come from one run"
                    )
                per[(layer, kind)] = _per_sample_loader(path, kind)
                means[(layer, kind)] = _mean_loader(path, kind)
    layers = sorted({L for L, _ in per})
    if layers != list(range(len(layers))):
        raise ValueError(f"Jacobian files cover layers {layers}; expected 0..{len(layers) - 1} without gaps")
    assert n_stored is not None and ids_ref is not None and n_total is not None
    return per, means, {"n_bootstrap_samples": n_stored, "n_samples_total": n_total, "sample_ids": ids_ref}


# --------------------------------------------------------------------------------------------
# the bootstrap of the operator metrics


def _ordered_keys(per_sample: Mapping[tuple[int, str], Any]) -> list[tuple[int, str]]:
    keys = sorted(per_sample, key=lambda key: spectral.sublayer_index(*key))
    spectral.check_chain(keys, "per-sample Jacobians")
    return keys


def _load(x: Any) -> np.ndarray:
    return np.asarray(x() if callable(x) else x, dtype=np.float64)


def jacobian_bootstrap(
    per_sample: Mapping[tuple[int, str], Any],
    n_resamples: int = 200,
    seed: int = 0,
    level: float = 0.95,
    complex_tol: float = 1e-6,
    means: Mapping[tuple[int, str], Any] | None = None,
    n_samples_total: int | None = None,
    memory_budget: int | None = None,
    device: Any = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Bootstrap over samples of Henrici departure, complex fraction and the full-depth rank.

    Args:
        per_sample: {(layer, kind): (n, d, d) per-sample Jacobians, or a loader}; sublayers
            s = 0..S−1 without gaps, all with the same n ≥ 2 (the same samples, in order).
        n_resamples, seed, level: see :func:`bootstrap_indices`, :func:`percentile_ci`.
        complex_tol: tolerance of the complex fraction.
        means: optional {(layer, kind): all-N mean Jacobian or loader} → ``estimate_all_samples``.
        n_samples_total: N of ``means`` (default n).
        memory_budget: bytes of (d, d) replicate matrices held at once; replicates beyond it are
            processed in further passes over the files (each pass reloads and decompresses
            every sublayer). Default :func:`resdyn.cost.bootstrap_memory_budget`: every row in
            one pass up to 16 GiB (one pass at d = 4096, R = 50), the size the job requests.
        device: None/"cpu" or a CUDA device for the eigenvalues (:func:`resdyn.spectral.eigen_henrici`).
    Returns:
        ``(table, replicates)``: table with :data:`BOOTSTRAP_COLUMNS` — per sublayer
        ``henrici`` and ``complex_fraction`` rows, then ``cum_erank_full_depth`` (layer and kind
        of the last sublayer), ``complex_fraction_early_minus_late`` and
        ``henrici_early_minus_late`` (kind ``all``); replicates: long table
        (``replicate``, ``metric``, ``value``) of the :data:`SCALAR_METRICS`.
    Cost: (R + 2) × S eigen-analyses of d × d matrices — one Schur factor each on the host
    (eigenvalues and Henrici from the same factor; before, a Schur factor *and* eigvals: 2×),
    torch eigvals on a GPU — plus (R + 2) × S fp64 products and one svdvals per row
    (:func:`resdyn.cost.cost_bootstrap`).
    """
    R = _check_int(n_resamples, "n_resamples", 1)
    seed = _check_int(seed, "seed", 0)
    lvl = _check_level(level)
    tol = float(complex_tol)
    if not (math.isfinite(tol) and tol >= 0):
        raise ValueError(f"complex_tol must be a finite number ≥ 0, got {complex_tol!r}")
    if not isinstance(per_sample, Mapping) or not per_sample:
        raise ValueError("per_sample must be a non-empty mapping {(layer, kind): (n, d, d) array or loader}")
    keys = _ordered_keys(per_sample)
    if means is not None:
        missing = [key for key in keys if key not in means]
        if missing:
            raise ValueError(f"means lacks sublayers {missing}")
    S = len(keys)
    first = _load(per_sample[keys[0]])
    if first.ndim != 3 or first.shape[1] != first.shape[2]:
        raise ValueError(f"per_sample[{keys[0]}] must be (n, d, d), got shape {first.shape}")
    n, d = first.shape[0], first.shape[1]
    if n < 2:
        raise ValueError(f"the bootstrap needs at least 2 stored samples, got n = {n} (raise jacobian.store_first_n)")
    total = n if n_samples_total is None else _check_int(n_samples_total, "n_samples_total", n)

    idx = bootstrap_indices(n, R, seed)
    weights = np.stack([np.bincount(row, minlength=n) for row in idx]).astype(np.float64) / n  # (R, n)
    # rows: 0 = all-N mean (when given), 1 = mean of the n stored samples, 2.. = replicates
    weights = np.vstack([np.full((1, n), 1.0 / n), np.full((1, n), 1.0 / n), weights])
    rows_total = R + 2
    henrici = np.full((rows_total, S), np.nan)
    cfrac = np.full((rows_total, S), np.nan)
    erank = np.full(rows_total, np.nan)
    if memory_budget is None:
        from resdyn.cost import bootstrap_memory_budget

        memory_budget = bootstrap_memory_budget(d, rows_total)
    chunk = max(1, int(memory_budget) // (2 * d * d * 8))

    on_gpu = spectral._on_cuda(device)
    if on_gpu:
        import torch
    cache = first
    for start in range(0, rows_total, chunk):
        rows = np.arange(start, min(rows_total, start + chunk))
        products: list[Any] = [None] * rows.size
        for s, key in enumerate(keys):
            X = cache if (s == 0 and cache is not None) else _load(per_sample[key])
            if X.shape != (n, d, d):
                raise ValueError(f"per_sample[{key}] has shape {X.shape}; expected {(n, d, d)} like {keys[0]}")
            mats = np.einsum("rn,nij->rij", weights[rows], X)
            if rows[0] == 0:
                mats[0] = _load(means[key]) if means is not None else np.nan
            for j, r in enumerate(rows):
                J = mats[j]
                if not np.isfinite(J).all():
                    continue
                lam, nn, fro = spectral.eigen_henrici(J, device)
                henrici[r, s] = min(1.0, nn / fro) if fro > 0 else 0.0
                cfrac[r, s] = spectral.complex_fraction(lam, tol)
                if on_gpu:  # the running products stay on the device (2 d³ fp64 GEMMs there)
                    Jt = torch.as_tensor(J, device=device)
                    P = Jt if products[j] is None else Jt @ products[j]
                    nrm = float(torch.linalg.matrix_norm(P))
                else:
                    P = J.copy() if products[j] is None else J @ products[j]
                    nrm = float(np.linalg.norm(P))
                products[j] = P / nrm if nrm > 0 else P
        for j, r in enumerate(rows):
            P = products[j]
            if P is None:
                continue
            if on_gpu:
                if bool(torch.isfinite(P).all()):
                    erank[r] = spectral.effective_rank(torch.linalg.svdvals(P).cpu().numpy())
            elif np.isfinite(P).all():
                erank[r] = spectral.effective_rank(np.linalg.svd(P, compute_uv=False))
        cache = None

    early, late = early_late(S) if S >= 2 else (np.arange(1), np.arange(1))
    scalars = {
        "cum_erank_full_depth": erank,
        "complex_fraction_early_minus_late": cfrac[:, early].mean(1) - cfrac[:, late].mean(1),
        "henrici_early_minus_late": henrici[:, early].mean(1) - henrici[:, late].mean(1),
    }
    common = {"level": lvl, "n_resamples": R, "n_bootstrap_samples": n, "n_samples_total": total, "seed": seed,
              "bootstrapped": True}
    note = "" if n == total else f"bootstrap over the first {n} of {total} samples (jacobian.store_first_n)"

    def row(metric: str, layer: Any, kind: str, s: Any, values: np.ndarray, extra: str = "") -> dict[str, Any]:
        low, high = percentile_ci(values[2:], lvl)
        return {"metric": metric, "layer": layer, "kind": kind, "s": s, "estimate": float(values[1]),
                "ci_low": low, "ci_high": high, "estimate_all_samples": float(values[0]), **common,
                "note": "; ".join(x for x in (note, extra) if x), "reason": ""}

    out = []
    for s, (layer, kind) in enumerate(keys):
        out.append(row("henrici", layer, kind, s, henrici[:, s]))
    for s, (layer, kind) in enumerate(keys):
        out.append(row("complex_fraction", layer, kind, s, cfrac[:, s], f"tol {tol:g}"))
    last_layer, last_kind = keys[-1]
    out.append(row("cum_erank_full_depth", last_layer, last_kind, S - 1, erank))
    span = f"sublayers {early[0]}-{early[-1]} minus {late[0]}-{late[-1]}"
    out.append(row("complex_fraction_early_minus_late", None, "all", None,
                   scalars["complex_fraction_early_minus_late"], f"tol {tol:g}; {span}"))
    out.append(row("henrici_early_minus_late", None, "all", None, scalars["henrici_early_minus_late"], span))
    table = pd.DataFrame(out, columns=BOOTSTRAP_COLUMNS)
    table["layer"] = table["layer"].astype("Int64")
    table["s"] = table["s"].astype("Int64")
    reps = pd.DataFrame(
        [{"replicate": r, "metric": m, "value": float(v[r + 2])} for m, v in scalars.items() for r in range(R)],
        columns=REPLICATE_COLUMNS,
    )
    return table, reps


def not_bootstrapped_rows(level: float = 0.95) -> pd.DataFrame:
    """Rows stating that the RSS profile and its cut points b1, b2 were not bootstrapped."""
    rows = [{"metric": m, "layer": None, "kind": "all", "s": None, "estimate": float("nan"), "ci_low": float("nan"),
             "ci_high": float("nan"), "level": _check_level(level), "n_resamples": 0, "n_bootstrap_samples": 0,
             "n_samples_total": 0, "estimate_all_samples": float("nan"), "seed": None, "bootstrapped": False,
             "note": NOT_BOOTSTRAPPED_NOTE, "reason": NOT_BOOTSTRAPPED_NOTE} for m in ("rss_profile", "b1", "b2")]
    table = pd.DataFrame(rows, columns=BOOTSTRAP_COLUMNS)
    for c in ("layer", "s", "seed"):
        table[c] = table[c].astype("Int64")
    return table


def jacobian_bootstrap_files(folders: Sequence[os.PathLike | str], n_resamples: int = 200, seed: int = 0,
                             level: float = 0.95, complex_tol: float = 1e-6,
                             device: Any = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``bootstrap.tsv`` and ``bootstrap_replicates.tsv`` from Jacobian block folders.

    :func:`read_per_sample` + :func:`jacobian_bootstrap` + :func:`not_bootstrapped_rows`.
    """
    per, means, info = read_per_sample(folders)
    table, reps = jacobian_bootstrap(per, n_resamples, seed, level, complex_tol, means=means,
                                     n_samples_total=info["n_samples_total"], device=device)
    both = pd.concat([table, not_bootstrapped_rows(level)], ignore_index=True)
    for c in ("layer", "s", "seed"):
        both[c] = both[c].astype("Int64")
    return both, reps
