"""Coupling of boundary units to Jacobian gain: unit gains, boundary-vs-interior tests,
Benjamini–Hochberg across boundaries, Simes per layer, and the per-checkpoint counts."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

# scipy.stats is imported inside the functions that use them: the light table jobs
# (checkpoints, coupling) import the package for pandas-only helpers, and these imports cost
# 3-5 s of start-up per job on a loaded 2-core machine.


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
        out["reason"] = f"need ≥ 1 boundary and ≥ 1 interior unit, got {gb.size} boundary and {gi.size} interior"
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
        out["reason"] = f"non-positive median gain (boundary {mb}, interior {mi}): log ratio undefined"
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


#: The sublayer whose *input* a residual boundary is: pre-attention h_L feeds the attention
#: half of layer L, pre-MLP m_L the MLP half. A boundary's units are that Jacobian's columns.
BOUNDARY_KIND: dict[str, str] = {"pre_attn": "attn", "pre_mlp": "mlp"}


GAINS = ("J", "J_minus_I")


def coupling_from_tables(
    communities: pd.DataFrame,
    jacobians: Mapping[tuple[int, str], Any],
    spectra: pd.DataFrame,
    gain: str = "J",
    q_level: float = 0.05,
) -> pd.DataFrame:
    """``coupling.tsv`` of one checkpoint: boundary-vs-interior gain per residual boundary.

    ``communities``: the partitions of all layers (columns ``layer, boundary, unit, is_boundary`` …;
    :meth:`resdyn.artifacts.CommunityPartitions.read_folder`). ``jacobians``: {(layer, kind): mean
    Jacobian (d, d) or a zero-argument callable}; boundary ``pre_attn`` of layer L uses (L, 'attn'),
    ``pre_mlp`` uses (L, 'mlp') (:data:`BOUNDARY_KIND`); for a parallel-residual layer ``pre_attn``
    (h_L, its only boundary) uses the layer operator (L, 'layer'). ``gain``: ``J`` → ‖J e_i‖,
    ``J_minus_I`` → ‖(J − I) e_i‖ (:func:`unit_gains`). ``spectra``: spectra.tsv (``layer, kind,
    henrici``), whose Henrici departure is carried along (NaN if absent) for
    :func:`sign_dependence`.

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
        raise ValueError(
            f"coupling table lacks columns {sorted(need - set(coupling.columns))}; it has {sorted(coupling.columns)}"
        )
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


def significant_counts(coupling: Mapping[str, pd.DataFrame], layers: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
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
        raise ValueError(
            f"layer tables for checkpoints {sorted(layers)}, coupling tables for {sorted(coupling)}: they must match"
        )
    rows = []
    for ckpt, table in coupling.items():
        tested = table["p_value"].notna() if "p_value" in table else pd.Series(dtype=bool)
        per_layer = layers[ckpt]
        rho, p = (
            sign_dependence(table["effect_log_median_ratio"], table["henrici"])
            if {"effect_log_median_ratio", "henrici"} <= set(table.columns)
            else (float("nan"), float("nan"))
        )
        rows.append(
            {
                "ckpt": ckpt,
                "n_significant_layers": int(per_layer["significant"].astype(bool).sum()),
                "n_layers": int(per_layer["layer"].nunique()),
                "n_layers_tested": int(per_layer["p_value"].notna().sum()),
                "n_significant_boundaries": int(table["significant"].astype(bool).sum())
                if "significant" in table
                else 0,
                "n_boundaries": int(tested.sum()),
                "sign_dependence_rho": rho,
                "sign_dependence_p": p,
            }
        )
    return pd.DataFrame(rows)
