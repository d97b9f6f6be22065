"""Study B's statements in the paper table: each phase statement tested in its own phase.

Functions ``claim, ModelTables -> rows`` (:func:`resdyn.beyond.paper_rows.row`); verdict rules:
:mod:`resdyn.beyond.verdicts`. Layers fall into phases by the cuts of ``phases.json``
(L ≤ b1 → 1, L ≤ b2 → 2, else 3; the last layer, without an RSS point, in phase 3); RSS points
likewise (:func:`resdyn.study_b.phases.phase_of_layer`). Per-phase means are
``phase_metrics.tsv``'s; the peaks and ranges within a phase come from ``geometry.tsv``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from resdyn.beyond import scorecard as sc
from resdyn.beyond import verdicts as vd
from resdyn.beyond.paper_rows import ModelTables, from_scorecard, lens_ckpt, row
from resdyn.study_b.geometry import PHASE_NAMES
from resdyn.study_b.phases import phase_of_layer

__all__ = ["COMPARISONS_B", "SLOPE_CLAIMS", "slopes", "rss_steps"]


def _src(t: ModelTables, name: str) -> str:
    return f"results/{t.model}/{lens_ckpt(t)}/{name}"


def _layer_phases(t: ModelTables) -> tuple[pd.DataFrame, np.ndarray] | None:
    """The geometry rows of the model's layers (no output row) and each layer's phase."""
    if t.geometry is None or t.phases is None:
        return None
    g = t.geometry
    if "state" in g.columns:
        g = g[g["state"] != "output"]
    g = g.sort_values("layer")
    b1, b2 = int(t.phases["b1"]), int(t.phases["b2"])
    layers = g["layer"].to_numpy(dtype=int)
    return g, np.where(layers <= b1, 1, np.where(layers <= b2, 2, 3))


def _means(t: ModelTables, metric: str) -> tuple[dict[int, float], str]:
    """{phase: mean} of a phase_metrics.tsv metric, and why it is missing."""
    pm = t.phase_metrics
    if pm is None:
        return {}, "phase_metrics.tsv not available"
    r = pm[pm["metric"] == metric]
    if r.empty:
        return {}, f"phase_metrics.tsv has no {metric}"
    return {int(p): float(v) for p, v in zip(r["phase"], r["mean"])}, ""


def _phase_value(t: ModelTables, metric: str, phase: int) -> tuple[float, str]:
    means, why = _means(t, metric)
    value = means.get(phase, math.nan)
    if not why and not math.isfinite(value):
        why = f"no finite {metric} in phase {phase}"
    return value, why


def _in_phase(metric: str, phase: int, rule: Callable[[float], str], what: str) -> Callable[..., list[dict]]:
    """A statement about one phase-mean: ``rule(value)`` is its verdict."""

    def compute(claim, t: ModelTables) -> list[dict]:
        value, why = _phase_value(t, metric, phase)
        m = f"{what}, phase {phase} ({PHASE_NAMES[phase]}) mean over layers"
        src = _src(t, "phase_metrics.tsv")
        if why:
            return [row(claim, t.model, lens_ckpt(t), m, source=src, reason=why)]
        return [row(claim, t.model, lens_ckpt(t), m, value, source=src, verdict=rule(value))]

    return compute


def _extreme(metric: str, phase: int, lowest: bool, what: str) -> Callable[..., list[dict]]:
    """ "Phase ``phase`` has the lowest / highest mean ``metric``"."""

    def compute(claim, t: ModelTables) -> list[dict]:
        means, why = _means(t, metric)
        m = f"{what}, phase {phase} ({PHASE_NAMES[phase]}) mean over layers"
        src = _src(t, "phase_metrics.tsv")
        if why:
            return [row(claim, t.model, lens_ckpt(t), m, source=src, reason=why)]
        value = means.get(phase, math.nan)
        v = vd.phase_extreme(means, phase, lowest)
        reason = "" if math.isfinite(value) else f"no finite {metric} in phase {phase}"
        return [row(claim, t.model, lens_ckpt(t), m, value, source=src, reason=reason, verdict=v)]

    return compute


def _versus(metric: str, other: str, phase: int, op: str, what: str) -> Callable[..., list[dict]]:
    """ "In ``phase``, ``metric`` op ``other``" (``other``: a metric name, or ``"phase N"`` for the
    same metric in phase N); the row's value is the difference."""

    def compute(claim, t: ModelTables) -> list[dict]:
        a, why_a = _phase_value(t, metric, phase)
        if other.startswith("phase "):
            b, why_b = _phase_value(t, metric, int(other.split()[1]))
        else:
            b, why_b = _phase_value(t, other, phase)
        m = f"{what}, phase {phase} ({PHASE_NAMES[phase]}): {metric} − {other} ({vd.fmt(a)} − {vd.fmt(b)})"
        src = _src(t, "phase_metrics.tsv")
        if why_a or why_b:
            return [row(claim, t.model, lens_ckpt(t), m, source=src, reason=why_a or why_b)]
        return [row(claim, t.model, lens_ckpt(t), m, a - b, source=src, verdict=vd.compare(a - b, op, 0.0))]

    return compute


def _peak(column: str, rule: Callable[[int, int, int, int], str], what: str) -> Callable[..., list[dict]]:
    """The phase of the layer with the largest ``column``; ``rule(layer, phase, b1, b2)`` decides."""

    def compute(claim, t: ModelTables) -> list[dict]:
        m = f"phase of the layer with the largest {what}"
        src = _src(t, "geometry.tsv") + ", phases.json"
        lp = _layer_phases(t)
        if lp is None or column not in lp[0].columns:
            return [
                row(
                    claim,
                    t.model,
                    lens_ckpt(t),
                    m,
                    source=src,
                    reason=f"geometry.tsv with {column} or phases.json not available",
                )
            ]
        g, phase = lp
        v = g[column].to_numpy(dtype=np.float64)
        if not np.isfinite(v).any():
            return [row(claim, t.model, lens_ckpt(t), m, source=src, reason=f"no finite {column}")]
        i = int(np.nanargmax(v))
        layer, b1, b2 = int(g["layer"].iloc[i]), int(t.phases["b1"]), int(t.phases["b2"])
        m += f" (layer {layer}; b1 = {b1}, b2 = {b2})"
        return [
            row(
                claim, t.model, lens_ckpt(t), m, float(phase[i]), source=src, verdict=rule(layer, int(phase[i]), b1, b2)
            )
        ]

    return compute


def _near_end_of_phase1(layer: int, phase: int, b1: int, b2: int) -> str:
    """Holds when the peak is in the second half of phase 1 or at the first layer after b1."""
    lo = math.ceil(b1 / 2)
    ok = lo <= layer <= b1 + 1
    where = f"{'' if ok else 'not '}in [{lo}, {b1 + 1}] (second half of phase 1 to the cut)"
    return f"{vd.HOLDS if ok else vd.FAILS}: peak at layer {layer}, {where}"


def _in_phase2(layer: int, phase: int, b1: int, b2: int) -> str:
    return f"{vd.HOLDS if phase == 2 else vd.FAILS}: peak at layer {layer}, phase {phase}"


def _stabilises(claim, t: ModelTables) -> list[dict]:
    m = "range of hidden_erank over phase 2 − range over phase 1"
    src = _src(t, "geometry.tsv") + ", phases.json"
    lp = _layer_phases(t)
    if lp is None or "hidden_erank" not in lp[0].columns:
        return [row(claim, t.model, lens_ckpt(t), m, source=src, reason="geometry.tsv or phases.json not available")]
    g, phase = lp
    v = g["hidden_erank"].to_numpy(dtype=np.float64)
    r1, r2 = (v[(phase == p) & np.isfinite(v)] for p in (1, 2))
    if r1.size < 2 or r2.size < 2:
        return [row(claim, t.model, lens_ckpt(t), m, source=src, reason="phase 1 or 2 has fewer than 2 layers")]
    diff = float(np.ptp(r2) - np.ptp(r1))
    m += f" ({vd.fmt(float(np.ptp(r2)))} − {vd.fmt(float(np.ptp(r1)))})"
    return [row(claim, t.model, lens_ckpt(t), m, diff, source=src, verdict=vd.compare(diff, "<", 0.0))]


def rss_steps(smoothed: Sequence[float], b1: int, b2: int) -> dict[int, np.ndarray]:
    """The steps s[i+1] − s[i] of the smoothed RSS whose both points lie in the same phase.

    Example:
        >>> {p: v.tolist() for p, v in rss_steps([0.0, 1.0, 1.0, 1.0, 0.0], 1, 3).items()}
        {1: [1.0], 2: [0.0, 0.0], 3: []}
    """
    s = np.asarray(smoothed, dtype=np.float64)
    ph = phase_of_layer(s.size, b1, b2)
    step, same = np.diff(s), ph[1:] == ph[:-1]
    return {p: step[same & (ph[1:] == p)] for p in (1, 2, 3)}


def _rss(phase: int) -> Callable[..., list[dict]]:
    """Phase 1: RSS rises (mean step > 0); 3: descends (< 0); 2: flattest (lowest mean |step|)."""

    def compute(claim, t: ModelTables) -> list[dict]:
        src = _src(t, "phases.json")
        what = "mean |step|" if phase == 2 else "mean step"
        m = f"{what} of the smoothed RSS, phase {phase} ({PHASE_NAMES[phase]})"
        if not t.phases or "smoothed" not in t.phases:
            return [
                row(
                    claim,
                    t.model,
                    lens_ckpt(t),
                    m,
                    source=src,
                    reason="phases.json with a smoothed profile not available",
                )
            ]
        steps = rss_steps(t.phases["smoothed"], int(t.phases["b1"]), int(t.phases["b2"]))
        if steps[phase].size == 0:
            return [
                row(claim, t.model, lens_ckpt(t), m, source=src, reason=f"phase {phase} has fewer than 2 RSS points")
            ]
        if phase == 2:
            means = {p: float(np.abs(v).mean()) if v.size else math.nan for p, v in steps.items()}
            return [
                row(
                    claim,
                    t.model,
                    lens_ckpt(t),
                    m,
                    means[2],
                    source=src,
                    verdict=vd.phase_extreme(means, 2, lowest=True),
                )
            ]
        value = float(steps[phase].mean())
        return [
            row(
                claim,
                t.model,
                lens_ckpt(t),
                m,
                value,
                source=src,
                verdict=vd.compare(value, ">" if phase == 1 else "<", 0.0),
            )
        ]

    return compute


def _norm_growth(claim, t: ModelTables) -> list[dict]:
    m = "largest update norm ‖Δ_L‖ in phase 3 / mean in phase 2"
    src = _src(t, "geometry.tsv") + ", phases.json"
    lp = _layer_phases(t)
    if lp is None or "update_norm" not in lp[0].columns:
        return [
            row(
                claim,
                t.model,
                lens_ckpt(t),
                m,
                source=src,
                reason="geometry.tsv with update_norm or phases.json not available",
            )
        ]
    g, phase = lp
    norms = g["update_norm"].to_numpy(dtype=np.float64)
    p2, p3 = norms[(phase == 2) & np.isfinite(norms)], norms[(phase == 3) & np.isfinite(norms)]
    if p2.size == 0 or p3.size == 0:
        empty = "2" if p2.size == 0 else "3"
        return [
            row(
                claim,
                t.model,
                lens_ckpt(t),
                m,
                source=src,
                reason=f"phase {empty} has no layer (b1 = {t.phases['b1']}, b2 = {t.phases['b2']})",
            )
        ]
    if float(p2.mean()) <= 0:
        return [row(claim, t.model, lens_ckpt(t), m, source=src, reason="phase-2 updates are all zero")]
    ratio = float(p3.max() / p2.mean())
    v = vd.compare(ratio, ">", 1.0)
    if v.startswith(vd.HOLDS) and ratio > 10.0:
        v = f"{vd.FAILS}: ratio {vd.fmt(ratio)} > 1 but above the stated 'up to 10x'"
    return [row(claim, t.model, lens_ckpt(t), m, ratio, source=src, verdict=v)]


def _erank_falls(claim, t: ModelTables) -> list[dict]:
    m = "mean update_erank in phase 3 / in phase 2"
    src = _src(t, "phase_metrics.tsv")
    e2, why2 = _phase_value(t, "update_erank", 2)
    e3, why3 = _phase_value(t, "update_erank", 3)
    if why2 or why3 or e2 <= 0:
        return [row(claim, t.model, lens_ckpt(t), m, source=src, reason=why2 or why3 or "phase-2 update erank is 0")]
    return [row(claim, t.model, lens_ckpt(t), m, e3 / e2, source=src, verdict=vd.compare(e3 / e2, "<", 1.0))]


def _family(family: str, inner: Callable[..., list[dict]]) -> Callable[..., list[dict]]:
    """A statement about one model family: other models get the number, not a verdict."""

    def compute(claim, t: ModelTables) -> list[dict]:
        rows = inner(claim, t)
        if family.lower() not in t.model.lower():
            for r in rows:
                r["verdict"] = vd.untestable(f"stated for {family} only; {t.model} is not of that family")
        return rows

    return compute


def _regime(claim, t: ModelTables) -> list[dict]:
    src = _src(t, "phases.json") + " (regime), resolution.tsv"
    regime = (t.phases or {}).get("regime")
    names = ("compromise k of the energy/visibility Pareto frontier", "largest shift of b1/b2 across the regime's k")
    if not regime:
        return [
            row(claim, t.model, lens_ckpt(t), mm, unit=u, source=src, reason="phases.json has no middle regime")
            for mm, u in zip(names, ("% of d", "layers"))
        ]
    ks = ", ".join(f"{100 * f:g}" for f in regime["k_fraction"])
    center = (
        regime["k_fraction"][regime["k"].index(regime["k_center"])] if regime["k_center"] in regime["k"] else math.nan
    )
    note = (
        "every k on the frontier: chosen by the nearest-(1, 1) rule alone"
        if regime.get("frontier_selects") is False
        else "nearest-(1, 1) rule on the frontier"
    )
    first = f"{names[0]} (regime: k = {ks} % of d; {note})"
    shift = f"{names[1]} (b1 {regime['b1_shift']}, b2 {regime['b2_shift']})"
    return [
        row(
            claim,
            t.model,
            lens_ckpt(t),
            first,
            100 * center,
            unit="% of d",
            source=src,
            verdict=vd.in_range(100 * center, 5.0, 15.0),
        ),
        row(
            claim,
            t.model,
            lens_ckpt(t),
            shift,
            float(regime["max_shift"]),
            unit="layers",
            source=src,
            reason=regime.get("reason", ""),
            verdict=vd.untestable("the study states no shift; this run's stability of the cuts across the regime"),
        ),
    ]


def _setup(what: str) -> Callable[..., list[dict]]:
    def compute(claim, t: ModelTables) -> list[dict]:
        return [
            row(
                claim,
                t.model,
                lens_ckpt(t),
                what,
                source="config",
                reason="a setup figure, not a finding: the run's value is its config",
            )
        ]

    return compute


def _unimodal(claim, t: ModelTables) -> list[dict]:
    if not t.phases or not {"smoothed", "peak"} <= set(t.phases):
        why = "phases.json with a smoothed profile not available"
        return [
            row(
                claim,
                t.model,
                lens_ckpt(t),
                "prominent peaks of the smoothed RSS",
                source=_src(t, "phases.json"),
                reason=why,
            )
        ]
    card = sc.claim_phases(t.phases, lens_ckpt(t))
    return [from_scorecard(claim, t.model, lens_ckpt(t), card, _src(t, "phases.json"))]


def _early_prediction(claim, t: ModelTables) -> list[dict]:
    card = sc.claim_lens(t.lens_metrics, lens_ckpt(t))
    return [from_scorecard(claim, t.model, lens_ckpt(t), card, _src(t, "lens_metrics.tsv"))]


#: claim id → the rows of one model (study B; the scaling-group claims are :data:`SLOPE_CLAIMS`)
COMPARISONS_B: dict[str, Callable[..., list[dict]]] = {
    "resolution_range": _setup("resolution k range of the frontier (config readout.k_fractions)"),
    "middle_regime": _regime,
    "rss_unimodal": _unimodal,
    "rss_rises_phase1": _rss(1),
    "hidden_erank_peaks_phase1": _peak("hidden_erank", _near_end_of_phase1, "hidden_erank"),
    "updates_orthogonal_phase1": _in_phase(
        "update_orthogonality", 1, lambda v: vd.compare(v, "<", vd.ORTHOGONAL_MAX), "|cos(Δ_L, h_L)|"
    ),
    "ffn_dominant_qwen_phase1": _family(
        "Qwen2.5", _in_phase("norm_ratio", 1, lambda v: vd.compare(v, ">", 1.0), "‖Δ_mlp‖/‖Δ_attn‖")
    ),
    "hit1_phase1": _in_phase("tuned_hit1", 1, lambda v: vd.in_range(v, 0.20, 0.33), "tuned-lens Hit@1"),
    "logit_lens_ineffective_phase1": _versus("logit_hit1", "tuned_hit1", 1, "<", "Hit@1 logit − tuned lens"),
    "rss_flat_phase2": _rss(2),
    "hidden_erank_stabilises_phase2": _stabilises,
    "update_cos_lowest_phase2": _extreme("update_orthogonality", 2, True, "|cos(Δ_L, h_L)|"),
    "update_erank_peaks_phase2": _peak("update_erank", _in_phase2, "update_erank"),
    "hit1_phase2": _in_phase("tuned_hit1", 2, lambda v: vd.approx(v, 0.56), "tuned-lens Hit@1"),
    "hit_ratio_falls_phase2": _versus(
        "tuned_hit5_over_hit1", "phase 1", 2, "<", "tuned-lens Hit@5/Hit@1 against phase 1"
    ),
    "logit_lens_low_phase2": _versus("logit_hit1", "tuned_hit1", 2, "<", "Hit@1 logit − tuned lens"),
    "rss_falls_phase3": _rss(3),
    "update_erank_falls_phase3": _erank_falls,
    "update_cos_highest_phase3": _extreme("update_orthogonality", 3, False, "|cos(Δ_L, h_L)|"),
    "update_norm_growth_phase3": _norm_growth,
    "ffn_dominant_phase3": _in_phase("norm_ratio", 3, lambda v: vd.compare(v, ">", 1.0), "‖Δ_mlp‖/‖Δ_attn‖"),
    "logit_hit1_phase3": _in_phase("logit_hit1", 3, lambda v: vd.in_range(v, 0.30, 0.50), "logit-lens Hit@1"),
    "prediction_present_early": _early_prediction,
}

#: claims about a scaling group (one row per group): claim id → (phase, stated range)
SLOPE_CLAIMS: dict[str, tuple[int, float, float]] = {
    "phase1_width_slope": (1, -math.inf, 0.26),
    "phase2_width_slope": (2, 0.6, 1.0),
    "phase3_width_constant": (3, -0.26, 0.26),
}


def _fit(widths: pd.DataFrame | None, group: str, phase: int) -> tuple[pd.Series | None, str]:
    rows = None if widths is None else widths[(widths["group"].astype(str) == str(group)) & (widths["phase"] == phase)]
    if rows is None or rows.empty:
        return None, f"no phase-{phase} fit for group {group}"
    r = rows.iloc[0]
    if r["status"] != "ok":
        return None, str(r.get("reason") or r["status"])
    return r, ""


def slopes(claim, widths: pd.DataFrame | None, groups: Mapping[str, Sequence[str]]) -> list[dict]:
    """Rows of a width-slope claim, one per scaling group: the slope, its OLS interval, and
    the verdict of the interval against the stated range (``capacity_in_phase2``: the phase-2
    slope above the phase-1 and phase-3 slopes). Widths from Kneedle fallback cuts are not in
    the fit (``n_fallback`` of ``phase_widths.tsv``); the measure says how many were left out."""
    src = "results/scaling/phase_widths.tsv"
    cid = claim["claim_id"]
    phase = SLOPE_CLAIMS[cid][0] if cid in SLOPE_CLAIMS else 2
    measure = f"OLS slope of phase-{phase} width on depth"
    if not groups:
        return [row(claim, "", "", measure, source=src, reason="no scaling group in config scaling.groups")]
    out = []
    for group, members in groups.items():
        m = f"{measure} over {', '.join(members)}"
        r, why = _fit(widths, group, phase)
        if r is None:
            out.append(row(claim, str(group), "final", m, source=src, reason=why))
            continue
        ci = (float(r["slope_ci_low"]), float(r["slope_ci_high"]))
        n_fb = int(r.get("n_fallback", 0) or 0)
        if n_fb:
            m += f" ({n_fb} width(s) from Kneedle fallback cuts left out of the fit)"
        if cid in SLOPE_CLAIMS:
            _, lo, hi = SLOPE_CLAIMS[cid]
            verdict = vd.in_range(float(r["slope"]), lo, hi, ci)
        else:
            others = [_fit(widths, group, p)[0] for p in (1, 3)]
            if any(o is None for o in others):
                verdict = vd.untestable("no phase-1 or phase-3 fit to compare with")
            else:
                gap = float(r["slope"]) - max(float(o["slope"]) for o in others)
                m += f" − the larger of the phase-1 and phase-3 slopes ({vd.fmt(gap)})"
                verdict = vd.compare(gap, ">", 0.0)
        out.append(row(claim, str(group), "final", m, float(r["slope"]), ci, source=src, verdict=verdict))
    return out
