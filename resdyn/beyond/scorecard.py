"""Replication scorecard: one row per headline claim of the two studies, with a verdict.

Each claim is turned into one statistic computed from the pipeline's tables, an interval where
one exists, the study's own figure where it states one (quoted from the claims table,
resdyn/data/claims.tsv, :data:`STUDY_REFERENCES`; docs/claims.md), and a verdict:

- ``holds``: the statistic points the claimed way (past the threshold below) and, when an
  interval exists, the whole interval does (a bootstrap interval over fewer than
  :data:`MIN_BOOTSTRAP_SAMPLES` samples is reported but does not decide: the reason says so);
- ``does not hold``: it does not (the reason says which part failed);
- ``not testable``: the data cannot decide (one checkpoint, fewer than 3 depths, a profile too
  short for three phases, no collapse to dissolve, missing table …; the reason says which);
- ``not run``: the claim's study (:data:`CLAIM_STUDY`) is switched off by config key ``studies``.

Claims (``claim_id``: statistic; thresholds are the module constants):

1. ``rotational_gradient`` — early sublayers rotational, late near-symmetric: mean complex
   fraction (at ``complex_tol``) over the first third of sublayers minus the last third
   (:func:`resdyn.beyond.bootstrap.early_late`), final checkpoint; holds if > 0. CI: bootstrap.
2. ``gradient_learned`` — that gradient is learned: statistic 1 at the final checkpoint minus
   at the first (step 0); holds if > 0. CI: paired bootstrap (same resampled samples).
3. ``collapse_learned`` — the cumulative effective-rank collapse is learned: erank of P at full
   depth, final minus first checkpoint; holds if < 0. CI: paired bootstrap.
4. ``schur_dissolves_collapse`` — α = 0 Schur surgery dissolves most of the collapse: full-depth
   erank at α = 0 over α = 1 (final checkpoint); holds if > :data:`SCHUR_RATIO_MIN`; not testable
   if there is no collapse (full-depth erank at α = 1 ≥ :data:`COLLAPSE_FRACTION` × the
   erank after the first sublayer).
5. ``coupling_grows`` — FDR-significant coupling layers grow with training: count at the final
   minus the first checkpoint (``n_significant_layers``: Simes per layer, BH over the layers,
   :func:`resdyn.study_a.topology.layer_significance`); holds if > 0 and the counts never decrease.
6. ``coupling_sign`` — coupling sign follows operator type: Spearman ρ between coupling effect
   and Henrici departure (final checkpoint); holds if ρ < 0 with p < :data:`ALPHA`.
7. ``rss_three_phases`` — RSS unimodal with three phases: number of prominent peaks (prominence
   ≥ :data:`PEAK_PROMINENCE` × range) of the smoothed RSS profile; holds if ≤ 1, both Kneedle knees
   were found and b1 < peak < b2; not testable for profiles of < :data:`MIN_PROFILE_POINTS`
   points.
8. ``tuned_beats_logit_early`` — tuned lens ≫ logit lens early: mean KL of the logit lens over
   mean KL of the tuned lens on the first third of layers (``ceil(n/3)``); holds if >
   :data:`KL_RATIO_MIN`. Hit@1 of both in ``detail``.
9. ``phase2_width_grows`` — phase-2 width grows with depth: OLS slope of phase-2 width on
   n_layers (``phase_widths.tsv`` of the model's scaling group); holds if slope > 0 and its CI
   excludes 0; not testable with fewer than 3 depths or when the model is in no group.

"First checkpoint" is the first in training order (step 0, the architecture-only null, in the
zoo and in the study's OLMo runs); the row's ``ckpts`` column names what was compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from resdyn import artifacts
from resdyn.beyond import bootstrap as bs

__all__ = [
    "CLAIMS",
    "CLAIM_STUDY",
    "SCORECARD_COLUMNS",
    "STUDY_REFERENCES",
    "study_values",
    "VERDICTS",
    "scorecard",
    "paired_difference_ci",
    "scaling_group",
]

HOLDS, FAILS, UNTESTABLE, NOT_RUN = "holds", "does not hold", "not testable", "not run"
VERDICTS = (HOLDS, FAILS, UNTESTABLE, NOT_RUN)
SCHUR_RATIO_MIN = 2.0
COLLAPSE_FRACTION = 0.5
KL_RATIO_MIN = 2.0
ALPHA = 0.05
MIN_PROFILE_POINTS = 7
PEAK_PROMINENCE = 0.1
#: bootstrap intervals over fewer samples are reported but do not decide a verdict
MIN_BOOTSTRAP_SAMPLES = 10

CLAIMS: dict[str, str] = {
    "rotational_gradient": "early sublayers rotational (complex fraction early > late), late near-symmetric",
    "gradient_learned": "the rotational-to-symmetric gradient is learned (weaker at step 0)",
    "collapse_learned": "the cumulative effective-rank collapse is learned (final full-depth erank < step 0)",
    "schur_dissolves_collapse": "alpha = 0 Schur surgery dissolves most of the collapse",
    "coupling_grows": "FDR-significant coupling layers grow with training",
    "coupling_sign": "coupling sign follows operator type (Spearman rho(effect, Henrici) < 0)",
    "rss_three_phases": "RSS profile is unimodal with three phases (b1 < peak < b2, both knees found)",
    "tuned_beats_logit_early": "tuned lens >> logit lens in the first third of layers",
    "phase2_width_grows": "phase-2 width grows with depth (slope > 0, CI excludes 0)",
}
#: The study whose tables decide each claim (claims 1-6: A, 7-9: B).
CLAIM_STUDY: dict[str, str] = {
    **dict.fromkeys(
        (
            "rotational_gradient",
            "gradient_learned",
            "collapse_learned",
            "schur_dissolves_collapse",
            "coupling_grows",
            "coupling_sign",
        ),
        "A",
    ),
    **dict.fromkeys(("rss_three_phases", "tuned_beats_logit_early", "phase2_width_grows"), "B"),
}
#: The stated figures (ids of the claims table, resdyn/data/claims.tsv) each claim's
#: ``study_value`` quotes; a claim without one quotes nothing (the studies give no number).
STUDY_REFERENCES: dict[str, tuple[str, ...]] = {
    "rotational_gradient": ("complex_share_early",),
    "collapse_learned": ("erank_single_layer", "erank_full_depth"),
    "coupling_grows": ("significant_layers_step0", "significant_layers_mid", "significant_layers_final"),
    "phase2_width_grows": ("phase2_width_slope", "phase1_width_slope"),
}


def study_values(claims: pd.DataFrame | None = None) -> dict[str, str]:
    """Each claim's ``study_value``: its :data:`STUDY_REFERENCES` figures as the claims table
    states them, ``"<stated_value> <unit> (<study_model>, <study_ckpt>)"`` joined by ``"; "``.

    ``claims``: the claims table (default: the packaged one, :meth:`resdyn.artifacts.ClaimsTable.load`).
    A referenced id missing from the table raises ValueError naming it.
    """
    claims = artifacts.ClaimsTable.load() if claims is None else claims
    by_id = claims.set_index("claim_id")
    missing = sorted({c for ids in STUDY_REFERENCES.values() for c in ids} - set(by_id.index))
    if missing:
        raise ValueError(
            f"claims table lacks the figures {missing} that the scorecard quotes "
            f"(resdyn/data/claims.tsv has {sorted(by_id.index)})"
        )
    return {
        cid: "; ".join(
            f"{by_id.at[c, 'stated_value']} {by_id.at[c, 'unit']} "
            f"({by_id.at[c, 'study_model']}, {by_id.at[c, 'study_ckpt']})"
            for c in ids
        )
        for cid, ids in STUDY_REFERENCES.items()
    }


SCORECARD_COLUMNS = artifacts.SCORECARD_COLUMNS  # defined by resdyn.artifacts.ScorecardTable


# --------------------------------------------------------------------------------------------
# helpers


def _row(
    claim_id: str,
    statistic: str,
    value: float = math.nan,
    ci: tuple[float, float] | None = None,
    ci_source: str = "",
    verdict: str = UNTESTABLE,
    reason: str = "",
    detail: str = "",
    ckpts: str = "",
) -> dict:
    """One scorecard row; ``study_value`` is filled by :func:`scorecard` from the claims table."""
    lo, hi = ci if ci is not None else (math.nan, math.nan)
    return {
        "claim_id": claim_id,
        "claim": CLAIMS[claim_id],
        "statistic": statistic,
        "value": float(value),
        "ci_low": float(lo),
        "ci_high": float(hi),
        "ci_source": ci_source if ci is not None else "",
        "study_value": "",
        "verdict": verdict,
        "reason": reason,
        "detail": detail,
        "ckpts": ckpts,
    }


def _fmt(x: float) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _directional(
    value: float, ci: tuple[float, float] | None, sign: int, threshold: float = 0.0, what: str = "statistic"
) -> tuple[str, str]:
    """Verdict for 'value is above (sign = +1) / below (sign = −1) threshold, CI included'."""
    if not math.isfinite(value):
        return UNTESTABLE, f"{what} is not finite"
    op = ">" if sign > 0 else "<"
    if sign * (value - threshold) <= 0:
        return FAILS, f"{what} {_fmt(value)} is not {op} {_fmt(threshold)}"
    if ci is not None and all(math.isfinite(c) for c in ci):
        lo, hi = ci
        bound = lo if sign > 0 else hi
        if sign * (bound - threshold) <= 0:
            return FAILS, (
                f"{what} {_fmt(value)} {op} {_fmt(threshold)}, but the interval "
                f"[{_fmt(lo)}, {_fmt(hi)}] includes {_fmt(threshold)}"
            )
        return (
            HOLDS,
            f"{what} {_fmt(value)} {op} {_fmt(threshold)} and the interval [{_fmt(lo)}, {_fmt(hi)}] excludes it",
        )
    return HOLDS, f"{what} {_fmt(value)} {op} {_fmt(threshold)} (no interval)"


def complex_column(table: pd.DataFrame, tol: float) -> str | None:
    col = f"complex_frac_J_tol{tol:.0e}"
    return col if col in table.columns else None


def _ckpt_rows(table: pd.DataFrame, ckpt: str) -> pd.DataFrame:
    return table[table["ckpt"].astype(str) == str(ckpt)].sort_values("s")


def complex_gradient(rows: pd.DataFrame, col: str) -> tuple[float, str]:
    """Mean complex fraction of the first third minus the last third of sublayers."""
    vals = rows[col].to_numpy(dtype=np.float64)
    if vals.size < 2:
        return math.nan, f"only {vals.size} sublayer(s)"
    early, late = bs.early_late(vals.size)
    e, l_ = float(vals[early].mean()), float(vals[late].mean())
    detail = f"complex fraction early (s {early[0]}-{early[-1]}) {_fmt(e)}, late (s {late[0]}-{late[-1]}) {_fmt(l_)}"
    if "henrici" in rows.columns:
        h = rows["henrici"].to_numpy(dtype=np.float64)
        detail += f"; Henrici early {_fmt(float(h[early].mean()))}, late {_fmt(float(h[late].mean()))}"
    return e - l_, detail


def _boot_row(boot: pd.DataFrame | None, metric: str) -> pd.Series | None:
    if boot is None or "metric" not in boot.columns:
        return None
    rows = boot[(boot["metric"] == metric) & boot["bootstrapped"].astype(bool)]
    return None if rows.empty else rows.iloc[0]


def _usable(ci: tuple[float, float] | None, n: int) -> tuple[tuple[float, float] | None, str]:
    """The interval for the verdict (None below MIN_BOOTSTRAP_SAMPLES samples) and a note."""
    if ci is None or n >= MIN_BOOTSTRAP_SAMPLES:
        return ci, ""
    return None, (
        f"; the interval (from only {n} samples, < {MIN_BOOTSTRAP_SAMPLES}) is reported but not used for the verdict"
    )


def _boot_ci(boot: pd.DataFrame | None, metric: str) -> tuple[tuple[float, float] | None, str, int]:
    row = _boot_row(boot, metric)
    if row is None:
        return None, "", 0
    source = (
        f"bootstrap {int(row['n_resamples'])} resamples of {int(row['n_bootstrap_samples'])}/"
        f"{int(row['n_samples_total'])} samples (their estimate {_fmt(float(row['estimate']))}), "
        f"level {row['level']:g}"
    )
    return (float(row["ci_low"]), float(row["ci_high"])), source, int(row["n_bootstrap_samples"])


def paired_difference_ci(
    boot_a: pd.DataFrame | None,
    reps_a: pd.DataFrame | None,
    boot_b: pd.DataFrame | None,
    reps_b: pd.DataFrame | None,
    metric: str,
    level: float,
) -> tuple[tuple[float, float] | None, str, int]:
    """Interval of (b − a) from replicate-wise differences of two checkpoints: percentile, or
    studentized around the difference of the estimates when the bootstraps say so (``interval``).

    Valid because :func:`resdyn.beyond.bootstrap.bootstrap_indices` depends only on (n, R, seed):
    replicate r of both checkpoints resamples the same samples. Returns (None, reason) when the
    two bootstraps used different n, R or seed, or when replicates are missing. The third item
    is the number of resampled samples (0 without an interval).

    Example:
        >>> b = pd.DataFrame({"metric": ["m"], "bootstrapped": [True], "n_resamples": [3],
        ...                   "n_bootstrap_samples": [2], "seed": [0]})
        >>> ra = pd.DataFrame({"replicate": [0, 1, 2], "metric": "m", "value": [1.0, 2.0, 3.0]})
        >>> rb = ra.assign(value=[2.0, 4.0, 6.0])
        >>> paired_difference_ci(b, ra, b, rb, "m", 0.5)[0]
        (1.5, 2.5)
    """
    ra, rb = _boot_row(boot_a, metric), _boot_row(boot_b, metric)
    if ra is None or rb is None or reps_a is None or reps_b is None:
        return None, "no bootstrap replicates", 0
    for key in ("n_resamples", "n_bootstrap_samples", "seed"):
        if ra[key] != rb[key]:
            return None, f"bootstraps differ in {key} ({ra[key]} vs {rb[key]}): replicates do not pair", 0
    a = reps_a[reps_a["metric"] == metric].set_index("replicate")["value"]
    b = reps_b[reps_b["metric"] == metric].set_index("replicate")["value"]
    if a.empty or not a.index.equals(b.index):
        return None, "replicate ids do not match", 0
    n = int(ra["n_bootstrap_samples"])
    diff = float(rb["estimate"]) - float(ra["estimate"]) if "estimate" in ra and "estimate" in rb else math.nan
    # the interval kind of the bootstraps (bootstrap.interval; percentile when not recorded)
    kind = ra.get("interval")
    kind = kind if isinstance(kind, str) and kind else "percentile"
    lo, hi = bs.replicate_ci((b - a).to_numpy(dtype=np.float64), diff, level, kind)
    return (
        (lo, hi),
        (
            f"paired bootstrap ({int(ra['n_resamples'])} resamples of {n} samples; "
            f"their estimate {_fmt(diff)}), level {level:g}"
        ),
        n,
    )


def _full_depth(rows: pd.DataFrame) -> float:
    if "cum_erank" not in rows.columns or rows.empty:
        return math.nan
    return float(rows.sort_values("s")["cum_erank"].iloc[-1])


# --------------------------------------------------------------------------------------------
# the claims


def _claim_gradient(ck: pd.DataFrame | None, final: str, col: str | None, boot: Mapping, tol: float) -> dict:
    cid, stat = "rotational_gradient", f"complex fraction (tol {tol:g}) first third − last third of sublayers"
    if ck is None or col is None:
        return _row(
            cid,
            stat,
            reason="no checkpoints table"
            if ck is None
            else f"no complex_frac_J_tol{tol:.0e} column in checkpoints.tsv",
            ckpts=final,
        )
    value, detail = complex_gradient(_ckpt_rows(ck, final), col)
    ci, source, n = _boot_ci(boot.get(final), "complex_fraction_early_minus_late")
    decide, note = _usable(ci, n)
    verdict, reason = _directional(value, decide, +1, what="early − late")
    reason = reason.replace(" (no interval)", "") + note if note else reason
    return _row(cid, stat, value, ci, source, verdict, reason, detail, final)


def _claim_gradient_learned(ck, order, col, boot, reps, tol, level) -> dict:
    cid = "gradient_learned"
    stat = f"(early − late complex fraction) at {order[-1]} minus at {order[0]}" if order else "gradient difference"
    if ck is None or col is None:
        return _row(cid, stat, reason="no checkpoints table or complex-fraction column")
    if len(order) < 2:
        return _row(cid, stat, reason="only one checkpoint", ckpts=",".join(order))
    first, final = order[0], order[-1]
    g0, d0 = complex_gradient(_ckpt_rows(ck, first), col)
    g1, d1 = complex_gradient(_ckpt_rows(ck, final), col)
    ci, source, n = paired_difference_ci(
        boot.get(first), reps.get(first), boot.get(final), reps.get(final), "complex_fraction_early_minus_late", level
    )
    value = g1 - g0
    decide, note = _usable(ci, n)
    verdict, reason = _directional(value, decide, +1, what="gradient change")
    reason = reason.replace(" (no interval)", "") + note if note else reason
    if ci is None and source and source != "no bootstrap replicates":
        reason += f"; {source}"
    detail = f"{first}: {_fmt(g0)} ({d0}); {final}: {_fmt(g1)} ({d1})"
    return _row(cid, stat, value, ci, source, verdict, reason, detail, f"{first},{final}")


def _claim_collapse(ck, order, boot, reps, level) -> dict:
    cid = "collapse_learned"
    stat = "full-depth cumulative erank, final − first checkpoint"
    if ck is None or "cum_erank" not in ck.columns:
        return _row(cid, stat, reason="no cum_erank in checkpoints.tsv")
    if len(order) < 2:
        return _row(cid, stat, reason="only one checkpoint", ckpts=",".join(order))
    first, final = order[0], order[-1]
    e0, e1 = _full_depth(_ckpt_rows(ck, first)), _full_depth(_ckpt_rows(ck, final))
    ci, source, n = paired_difference_ci(
        boot.get(first), reps.get(first), boot.get(final), reps.get(final), "cum_erank_full_depth", level
    )
    value = e1 - e0
    decide, note = _usable(ci, n)
    verdict, reason = _directional(value, decide, -1, what="erank change")
    reason = reason.replace(" (no interval)", "") + note if note else reason
    if ci is None and source and source != "no bootstrap replicates":
        reason += f"; {source}"
    return _row(
        cid, stat, value, ci, source, verdict, reason, f"{first}: {_fmt(e0)} → {final}: {_fmt(e1)}", f"{first},{final}"
    )


def _claim_schur(schur: pd.DataFrame | None, final: str) -> dict:
    cid = "schur_dissolves_collapse"
    stat = "full-depth erank at alpha = 0 / at alpha = 1"
    if schur is None or not {"alpha", "s", "erank"} <= set(schur.columns):
        return _row(cid, stat, reason="no schur.tsv", ckpts=final)
    alphas = schur["alpha"].astype(float)
    if not (np.isclose(alphas, 0.0).any() and np.isclose(alphas, 1.0).any()):
        return _row(cid, stat, reason=f"schur.alphas {sorted(alphas.unique())} lack 0 or 1", ckpts=final)
    a0 = schur[np.isclose(alphas, 0.0)].sort_values("s")
    a1 = schur[np.isclose(alphas, 1.0)].sort_values("s")
    e0, e1, start = float(a0["erank"].iloc[-1]), float(a1["erank"].iloc[-1]), float(a1["erank"].iloc[0])
    value = e0 / e1 if e1 > 0 else math.nan
    detail = f"erank after s 0: {_fmt(start)}; full depth alpha=1: {_fmt(e1)}, alpha=0: {_fmt(e0)}"
    if e1 >= COLLAPSE_FRACTION * start:
        return _row(
            cid,
            stat,
            value,
            reason=(
                f"no collapse to dissolve: full-depth erank {_fmt(e1)} ≥ "
                f"{COLLAPSE_FRACTION:g} × {_fmt(start)} (after the first sublayer)"
            ),
            detail=detail,
            ckpts=final,
        )
    verdict, reason = _directional(value, None, +1, SCHUR_RATIO_MIN, what="ratio")
    return _row(cid, stat, value, None, "", verdict, reason, detail, final)


def _claim_coupling_grows(ck, order) -> dict:
    cid = "coupling_grows"
    stat = "FDR-significant layers, final − first checkpoint"
    if ck is None or "n_significant_layers" not in ck.columns:
        return _row(cid, stat, reason="no n_significant_layers in checkpoints.tsv")
    if len(order) < 2:
        return _row(cid, stat, reason="only one checkpoint", ckpts=",".join(order))
    series = [_ckpt_rows(ck, c)["n_significant_layers"].astype(float) for c in order]
    counts = [float(c.iloc[0]) if len(c) else math.nan for c in series]
    detail = " / ".join(f"{c}: {_fmt(v)}" for c, v in zip(order, counts)) + " layers"
    if not all(math.isfinite(v) for v in counts):
        return _row(cid, stat, reason="a checkpoint has no coupling count", detail=detail, ckpts=",".join(order))
    value = counts[-1] - counts[0]
    verdict, reason = _directional(value, None, +1, what="increase")
    if verdict == HOLDS and any(b < a for a, b in zip(counts, counts[1:])):
        verdict, reason = FAILS, f"final > first, but the counts decrease along training ({detail})"
    return _row(cid, stat, value, None, "", verdict, reason, detail, ",".join(order))


def _claim_coupling_sign(ck, final) -> dict:
    cid = "coupling_sign"
    stat = "Spearman rho(coupling effect, Henrici departure)"
    if ck is None or "sign_dependence_rho" not in ck.columns:
        return _row(cid, stat, reason="no sign_dependence_rho in checkpoints.tsv", ckpts=final)
    rows = _ckpt_rows(ck, final)
    rho = float(rows["sign_dependence_rho"].iloc[0]) if len(rows) else math.nan
    p = float(rows["sign_dependence_p"].iloc[0]) if len(rows) and "sign_dependence_p" in rows else math.nan
    detail = f"rho {_fmt(rho)}, p {_fmt(p)}"
    if not math.isfinite(rho):
        return _row(
            cid,
            stat,
            reason="rho undefined (fewer than 3 tested boundaries or a constant side)",
            detail=detail,
            ckpts=final,
        )
    if rho >= 0:
        return _row(cid, stat, rho, verdict=FAILS, reason=f"rho {_fmt(rho)} is not < 0", detail=detail, ckpts=final)
    if not (math.isfinite(p) and p < ALPHA):
        return _row(
            cid,
            stat,
            rho,
            verdict=FAILS,
            reason=f"rho {_fmt(rho)} < 0 but p {_fmt(p)} ≥ {ALPHA:g}",
            detail=detail,
            ckpts=final,
        )
    return _row(
        cid,
        stat,
        rho,
        verdict=HOLDS,
        reason=f"rho {_fmt(rho)} < 0 with p {_fmt(p)} < {ALPHA:g}",
        detail=detail,
        ckpts=final,
    )


def _claim_phases(phases: Mapping[str, Any] | None, lens_ckpt: str) -> dict:
    cid = "rss_three_phases"
    stat = f"prominent peaks (≥ {PEAK_PROMINENCE:g} × range) of the smoothed RSS; b1 < peak < b2 with both knees"
    if not phases:
        return _row(cid, stat, reason="no phases.json", ckpts=lens_ckpt)
    smoothed = np.asarray(phases.get("smoothed", phases.get("profile", [])), dtype=np.float64)
    n = int(phases.get("n", smoothed.size))
    b1, peak, b2 = int(phases["b1"]), int(phases["peak"]), int(phases["b2"])
    span = float(np.ptp(smoothed)) if smoothed.size else 0.0
    padded = np.concatenate([[-np.inf], smoothed, [-np.inf]])  # count a maximum at either end too
    from scipy.signal import find_peaks  # 1-2 s of import: only this function needs it

    n_peaks = len(find_peaks(padded, prominence=max(PEAK_PROMINENCE * span, 1e-300))[0]) if smoothed.size else 0
    detail = (
        f"n = {n} points, b1 = {b1}, peak = {peak}, b2 = {b2}, knees found: b1 {phases.get('b1_found')}, "
        f"b2 {phases.get('b2_found')}, k = {phases.get('k')}"
    )
    if n < MIN_PROFILE_POINTS:
        return _row(
            cid,
            stat,
            n_peaks,
            reason=(
                f"RSS profile has {n} points (< {MIN_PROFILE_POINTS}; "
                f"needs ≥ {MIN_PROFILE_POINTS + 1} layers) — too short for three phases"
            ),
            detail=detail,
            ckpts=lens_ckpt,
        )
    problems = []
    if not phases.get("b1_found", False):
        problems.append("no knee found for b1")
    if not phases.get("b2_found", False):
        problems.append("no knee found for b2")
    if not b1 < peak < b2:
        problems.append(f"not b1 < peak < b2 ({b1}, {peak}, {b2})")
    if n_peaks > 1:
        problems.append(f"{n_peaks} prominent peaks (not unimodal)")
    if problems:
        reason = "; ".join(problems) + (f" ({phases['reason']})" if phases.get("reason") else "")
        return _row(cid, stat, n_peaks, verdict=FAILS, reason=reason, detail=detail, ckpts=lens_ckpt)
    return _row(
        cid,
        stat,
        n_peaks,
        verdict=HOLDS,
        reason="unimodal, both knees found, b1 < peak < b2",
        detail=detail,
        ckpts=lens_ckpt,
    )


def _claim_lens(metrics: pd.DataFrame | None, lens_ckpt: str) -> dict:
    cid = "tuned_beats_logit_early"
    stat = "mean KL logit lens / mean KL tuned lens, first third of layers"
    if metrics is None or not {"lens", "layer", "kl"} <= set(metrics.columns):
        return _row(cid, stat, reason="no lens_metrics.tsv", ckpts=lens_ckpt)
    n = int(metrics["layer"].max())  # layers 0..n, n = the model's own output
    early = list(range(max(1, math.ceil(n / 3))))
    sel = metrics[metrics["layer"].isin(early)]
    tuned, logit = sel[sel["lens"] == "tuned"], sel[sel["lens"] == "logit"]
    if tuned.empty or logit.empty:
        return _row(cid, stat, reason="lens_metrics lacks tuned or logit rows", ckpts=lens_ckpt)
    kt, kl = float(tuned["kl"].mean()), float(logit["kl"].mean())
    value = kl / kt if kt > 0 else (math.inf if kl > 0 else math.nan)
    detail = f"layers {early[0]}-{early[-1]}: KL tuned {_fmt(kt)}, logit {_fmt(kl)}"
    if "hit1" in metrics.columns:
        detail += f"; Hit@1 tuned {_fmt(float(tuned['hit1'].mean()))}, logit {_fmt(float(logit['hit1'].mean()))}"
    verdict, reason = _directional(value, None, +1, KL_RATIO_MIN, what="KL ratio")
    return _row(cid, stat, value, None, "", verdict, reason, detail, lens_ckpt)


def _claim_scaling(widths: pd.DataFrame | None, group: str | None) -> dict:
    cid = "phase2_width_grows"
    stat = "OLS slope of phase-2 width on n_layers"
    if group is None:
        return _row(cid, stat, reason="the model is in no scaling group")
    if widths is None or "phase" not in widths.columns:
        return _row(cid, stat, reason="no phase_widths.tsv")
    rows = widths[widths["group"].astype(str) == str(group)] if "group" in widths.columns else widths
    p2, p1 = rows[rows["phase"] == 2], rows[rows["phase"] == 1]
    if p2.empty:
        return _row(cid, stat, reason=f"no phase-2 fit for group {group!r}")
    r = p2.iloc[0]
    depths = int(r["n_depths"]) if "n_depths" in r and pd.notna(r["n_depths"]) else 0
    detail = f"group {group}: {depths} depth(s)"
    if not p1.empty and pd.notna(p1.iloc[0].get("slope")):
        detail += f"; phase-1 slope {_fmt(float(p1.iloc[0]['slope']))}"
    if r.get("status") != "ok":
        reason = "fewer than 3 depths" if r.get("status") == "too_few_depths" else f"fit status {r.get('status')!r}"
        return _row(cid, stat, reason=reason, detail=detail)
    ci = (float(r["slope_ci_low"]), float(r["slope_ci_high"]))
    verdict, reason = _directional(float(r["slope"]), ci, +1, what="slope")
    return _row(cid, stat, float(r["slope"]), ci, "OLS t-interval, 95%", verdict, reason, detail)


#: the scorecard's rows that the paper table (resdyn.beyond.paper_a, paper_b) reuses
claim_schur, claim_phases, claim_lens = _claim_schur, _claim_phases, _claim_lens


def scaling_group(config: Mapping[str, Any], model: str) -> str | None:
    """The ``scaling.groups`` entry that lists ``model`` (the first one), or None.

    Example:
        >>> scaling_group({"scaling": {"groups": {"llama": ["a", "b"]}}}, "b"), scaling_group({}, "b")
        ('llama', None)
    """
    groups = (config.get("scaling") or {}).get("groups") or {}
    for group, members in groups.items():
        if model in members:
            return str(group)
    return None


# --------------------------------------------------------------------------------------------
# the table


def scorecard(
    checkpoints: pd.DataFrame | None,
    ckpt_order: Sequence[str],
    schur_final: pd.DataFrame | None = None,
    phases: Mapping[str, Any] | None = None,
    lens_metrics: pd.DataFrame | None = None,
    phase_widths: pd.DataFrame | None = None,
    group: str | None = None,
    bootstrap: Mapping[str, pd.DataFrame] | None = None,
    replicates: Mapping[str, pd.DataFrame] | None = None,
    complex_tol: float = 1e-6,
    level: float = 0.95,
    lens_ckpt: str | None = None,
    studies: Sequence[str] = ("A", "B"),
    claims: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The scorecard of one model: one row per claim (module docstring), :data:`SCORECARD_COLUMNS`.

    Args:
        checkpoints: ``checkpoints.tsv`` (one row per checkpoint and sublayer; columns ckpt, s,
            complex_frac_J_tol*, henrici, cum_erank, n_significant_layers, sign_dependence_rho/_p).
        ckpt_order: checkpoint names in training order (first = step 0, last = final).
        schur_final: ``schur.tsv`` of the final checkpoint.
        phases, lens_metrics: ``phases.json`` and ``lens_metrics.tsv`` of ``lens_ckpt``
            (default: the final checkpoint).
        phase_widths, group: ``results/scaling/phase_widths.tsv`` and the model's scaling group
            (None: in no group).
        bootstrap, replicates: {checkpoint: ``bootstrap.tsv``} and {checkpoint:
            ``bootstrap_replicates.tsv``} (either may lack checkpoints: no CI then).
        complex_tol: tolerance of the complex-fraction column used (``complex_frac_J_tol{t:.0e}``).
        level: level of the paired-bootstrap intervals.
        studies: the studies that ran (config key ``studies``); claims of the others are ``not run``.
        claims: the claims table whose figures ``study_value`` quotes (default: the packaged one).
    Every claim always gets a row; missing inputs make it ``not testable`` with the reason.
    """
    order = [str(c) for c in ckpt_order]
    if not order:
        raise ValueError("ckpt_order is empty: give the model's checkpoints in training order")
    level = float(level)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    final = order[-1]
    lens_ckpt = final if lens_ckpt is None else str(lens_ckpt)
    boot = dict(bootstrap or {})
    reps = dict(replicates or {})
    col = complex_column(checkpoints, complex_tol) if checkpoints is not None else None
    rows = [
        _claim_gradient(checkpoints, final, col, boot, complex_tol),
        _claim_gradient_learned(checkpoints, order, col, boot, reps, complex_tol, level),
        _claim_collapse(checkpoints, order, boot, reps, level),
        _claim_schur(schur_final, final),
        _claim_coupling_grows(checkpoints, order),
        _claim_coupling_sign(checkpoints, final),
        _claim_phases(phases, lens_ckpt),
        _claim_lens(lens_metrics, lens_ckpt),
        _claim_scaling(phase_widths, group),
    ]
    ran = sorted(set(studies))
    unknown = set(ran) - set(CLAIM_STUDY.values())
    if unknown or not ran:
        raise ValueError(f"studies must be a non-empty subset of ['A', 'B'], got {list(studies)!r}")
    rows = [
        row
        if CLAIM_STUDY[row["claim_id"]] in ran
        else _row(
            row["claim_id"],
            row["statistic"],
            verdict=NOT_RUN,
            reason=f"study {CLAIM_STUDY[row['claim_id']]} is not run (config studies: {ran})",
        )
        for row in rows
    ]
    table = pd.DataFrame(rows, columns=SCORECARD_COLUMNS)
    table["study_value"] = table["claim_id"].map(study_values(claims)).fillna("")
    return table
