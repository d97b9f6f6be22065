"""The paper table: each figure the studies state (the claims table) next to this run's number.

One row per (claim, model, checkpoint, measure) of ``results/paper_comparison.tsv``
(:class:`resdyn.artifacts.PaperComparison`): the study's figure as stated (with the model it
was stated for), this run's comparable number, its interval where one exists (bootstrap over
samples for study A's whole-model statistics, the OLS t-interval for phase-width slopes), the
unit and the table it comes from. A number that cannot be given is a row with a ``reason``:
the claim's study switched off (config key ``studies``), a table or column the run lacks
(e.g. per-layer coupling counts), a phase without layers, or a claim id the comparison does
not know (a new line in resdyn/data/claims.tsv without code here).

How each claim's run value is computed (the choices are listed in docs/design.md):

- ``erank_single_layer``: bottleneck erank at s = 0 (P_0 = J_0, the first attention half),
  final checkpoint; ``erank_full_depth``: bottleneck erank at the last s, with the bootstrap
  interval of ``cum_erank_full_depth``.
- ``complex_share_early``: complex fraction, first third of sublayers minus the last third
  (:func:`resdyn.beyond.scorecard.complex_gradient`), final checkpoint, with the bootstrap
  interval of ``complex_fraction_early_minus_late``.
- ``significant_layers_{step0,mid,final}``: ``n_significant_layers`` (of ``n_layers``) of
  ``coupling_counts.tsv`` at the first checkpoint, those in between, and the final one.
- ``phase{1,2}_width_slope``: the slope of ``phase_widths.tsv`` for the model's scaling group,
  one row per group.
- ``update_norm_growth_phase3``: ``max_{L ∈ phase 3} ‖Δ_L‖ / mean_{L ∈ phase 2} ‖Δ_L‖``
  (``update_norm`` of ``geometry.tsv``; layers by :func:`resdyn.study_b.phases.phase_of_layer`
  rules: L ≤ b1 → 1, L ≤ b2 → 2, else 3; the last layer, without an RSS point, in phase 3).
- ``update_erank_falls_phase3``: phase-3 over phase-2 mean of ``update_erank`` (phase_metrics).
- ``hidden_erank_peaks_phase2``: the phase of the layer with the largest ``hidden_erank``.
- ``hit_ratio_falls_phase3``: ``tuned_hit1`` and ``tuned_hit5_over_hit1`` per phase.
- ``middle_regime``: the compromise k of the frontier in % of d, and the largest b1/b2 shift
  across the regime's k (``phases.json`` ``regime``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from resdyn import artifacts
from resdyn.beyond import scorecard as sc
from resdyn.study_b.geometry import PHASE_NAMES

__all__ = ["ModelTables", "paper_comparison", "COMPARISONS", "PAPER_COLUMNS", "NO_LAYER_COUNTS"]

PAPER_COLUMNS = list(artifacts.PaperComparison.columns)
NO_LAYER_COUNTS = "per-layer coupling counts not available"


@dataclass
class ModelTables:
    """The tables of one model that the comparison reads (None: not produced by this run).

    ``ckpts``: checkpoints in training order; ``lens_ckpt``: the checkpoint of the study-B
    tables (the final lens checkpoint); ``bottleneck``, ``bootstrap``: {checkpoint: table};
    ``phases``: the ``phases.json`` object; ``complex_tol``: the complex-fraction tolerance of the bootstrap (config
    ``bootstrap.complex_tol``),
    so value and interval count the same eigenvalues.
    """

    model: str
    ckpts: Sequence[str]
    lens_ckpt: str | None = None
    checkpoints: pd.DataFrame | None = None
    coupling_counts: pd.DataFrame | None = None
    bottleneck: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    bootstrap: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    phases: Mapping[str, Any] | None = None
    geometry: pd.DataFrame | None = None
    phase_metrics: pd.DataFrame | None = None
    complex_tol: float = 1e-6


def _row(
    claim: Mapping[str, str],
    model: str,
    ckpt: str,
    measure: str,
    value: float = math.nan,
    ci: tuple[float, float] | None = None,
    unit: str | None = None,
    source: str = "",
    reason: str = "",
) -> dict:
    lo, hi = ci if ci is not None else (math.nan, math.nan)
    value = float(value)
    if not math.isfinite(value) and not reason:
        reason = "the run's value is not finite"
    return {
        "claim": claim["claim_id"],
        "study": claim["study"],
        "model": model,
        "ckpt": ckpt,
        "measure": measure,
        "stated_value": f"{claim['stated_value']} ({claim['study_model']}, {claim['study_ckpt']})",
        "run_value": value,
        "ci_low": float(lo),
        "ci_high": float(hi),
        "unit": claim["unit"] if unit is None else unit,
        "source_table": source,
        "reason": reason,
    }


def _boot_ci(boot: pd.DataFrame | None, metric: str) -> tuple[tuple[float, float] | None, str]:
    """The bootstrap interval of a whole-model metric and a note of what it rests on, or
    (None, "") (no table, not bootstrapped)."""
    if boot is None:
        return None, ""
    rows = boot[(boot["metric"] == metric) & boot["bootstrapped"].astype(bool)]
    if rows.empty:
        return None, ""
    r = rows.iloc[0]
    note = (
        f"bootstrap.tsv {metric}: {int(r['n_bootstrap_samples'])} of {int(r['n_samples_total'])} samples"
        if {"n_bootstrap_samples", "n_samples_total"} <= set(r.index)
        else f"bootstrap.tsv {metric}"
    )
    return (float(r["ci_low"]), float(r["ci_high"])), note


def _final(t: ModelTables) -> str:
    return str(t.ckpts[-1])


# --------------------------------------------------------------------------------------------
# study A


def _erank(claim, t: ModelTables, last: bool) -> list[dict]:
    ck = _final(t)
    measure = "erank of the cumulative product at full depth" if last else "erank of P_0 (the first sublayer, s = 0)"
    table = t.bottleneck.get(ck)
    src = f"results/{t.model}/{ck}/bottleneck.tsv"
    if table is None or table.empty:
        return [_row(claim, t.model, ck, measure, source=src, reason="bottleneck.tsv not available")]
    rows = table.sort_values("s")
    value = float(rows["erank"].iloc[-1 if last else 0])
    ci, note = _boot_ci(t.bootstrap.get(ck), "cum_erank_full_depth") if last else (None, "")
    if ci is not None:
        src += f" (interval: {note})"
    return [_row(claim, t.model, ck, measure, value, ci, source=src)]


def _complex_early(claim, t: ModelTables) -> list[dict]:
    ck = _final(t)
    measure = f"complex fraction (tol {t.complex_tol:g}), first third of sublayers − last third"
    src = f"results/{t.model}/checkpoints.tsv"
    col = None if t.checkpoints is None else sc.complex_column(t.checkpoints, t.complex_tol)
    if col is None:
        return [
            _row(
                claim,
                t.model,
                ck,
                measure,
                source=src,
                reason=f"checkpoints.tsv with complex_frac_J_tol{t.complex_tol:.0e} not available",
            )
        ]
    rows = t.checkpoints[t.checkpoints["ckpt"].astype(str) == ck].sort_values("s")
    value, _ = sc.complex_gradient(rows, col)
    ci, note = _boot_ci(t.bootstrap.get(ck), "complex_fraction_early_minus_late")
    if ci is not None:
        src += f" (interval: {note})"
    return [_row(claim, t.model, ck, measure, value, ci, source=src)]


def _significant_layers(position: str) -> Callable[..., list[dict]]:
    """Rows of the checkpoints at ``position`` (first | mid | final) in training order."""

    def compute(claim, t: ModelTables) -> list[dict]:
        order = [str(c) for c in t.ckpts]
        picks = {"first": order[:1] if len(order) > 1 else [], "mid": order[1:-1], "final": order[-1:]}[position]
        src = f"results/{t.model}/coupling_counts.tsv"
        measure = "FDR-significant layers"
        if not picks:
            why = "only one checkpoint" if position == "first" else "no checkpoint between the first and the final"
            return [_row(claim, t.model, "", measure, source=src, reason=why)]
        cc = t.coupling_counts
        if cc is None or not {"n_significant_layers", "n_layers"} <= set(cc.columns):
            return [_row(claim, t.model, c, measure, source=src, reason=NO_LAYER_COUNTS) for c in picks]
        out = []
        for c in picks:
            r = cc[cc["ckpt"].astype(str) == c]
            if r.empty or not np.isfinite(r[["n_significant_layers", "n_layers"]].to_numpy(dtype=float)).all():
                out.append(_row(claim, t.model, c, measure, source=src, reason=f"no coupling count for checkpoint {c}"))
                continue
            n = int(r["n_layers"].iloc[0])
            out.append(
                _row(claim, t.model, c, f"{measure} (of {n})", float(r["n_significant_layers"].iloc[0]), source=src)
            )
        return out

    return compute


# --------------------------------------------------------------------------------------------
# study B


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


def _norm_growth(claim, t: ModelTables) -> list[dict]:
    ck = t.lens_ckpt or _final(t)
    measure = "largest update norm ‖Δ_L‖ in phase 3 / mean in phase 2"
    src = f"results/{t.model}/{ck}/geometry.tsv, phases.json"
    lp = _layer_phases(t)
    if lp is None or "update_norm" not in lp[0].columns:
        return [
            _row(
                claim,
                t.model,
                ck,
                measure,
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
            _row(
                claim,
                t.model,
                ck,
                measure,
                source=src,
                reason=f"phase {empty} has no layer (b1 = {t.phases['b1']}, b2 = {t.phases['b2']})",
            )
        ]
    if float(p2.mean()) <= 0:
        return [_row(claim, t.model, ck, measure, source=src, reason="phase-2 updates are all zero")]
    return [_row(claim, t.model, ck, measure, float(p3.max() / p2.mean()), source=src)]


def _phase_mean(pm: pd.DataFrame, metric: str, phase: int) -> tuple[float, str]:
    r = pm[(pm["metric"] == metric) & (pm["phase"] == phase)]
    if r.empty:
        return math.nan, f"phase_metrics.tsv has no {metric}"
    value = float(r["mean"].iloc[0])
    reason = (
        ""
        if math.isfinite(value)
        else (
            str(r["reason"].iloc[0])
            if "reason" in r and str(r["reason"].iloc[0]) not in ("", "nan")
            else f"no finite {metric} in phase {phase}"
        )
    )
    return value, reason


def _erank_falls(claim, t: ModelTables) -> list[dict]:
    ck = t.lens_ckpt or _final(t)
    measure = "mean update_erank in phase 3 / in phase 2"
    src = f"results/{t.model}/{ck}/phase_metrics.tsv"
    if t.phase_metrics is None:
        return [_row(claim, t.model, ck, measure, source=src, reason="phase_metrics.tsv not available")]
    e2, why2 = _phase_mean(t.phase_metrics, "update_erank", 2)
    e3, why3 = _phase_mean(t.phase_metrics, "update_erank", 3)
    if why2 or why3 or e2 <= 0:
        return [_row(claim, t.model, ck, measure, source=src, reason=why2 or why3 or "phase-2 update erank is 0")]
    return [_row(claim, t.model, ck, measure, e3 / e2, source=src)]


def _erank_peak(claim, t: ModelTables) -> list[dict]:
    ck = t.lens_ckpt or _final(t)
    measure = "phase of the layer with the largest hidden_erank"
    src = f"results/{t.model}/{ck}/geometry.tsv, phases.json"
    lp = _layer_phases(t)
    if lp is None:
        return [_row(claim, t.model, ck, measure, source=src, reason="geometry.tsv or phases.json not available")]
    g, phase = lp
    er = g["hidden_erank"].to_numpy(dtype=np.float64)
    if not np.isfinite(er).any():
        return [_row(claim, t.model, ck, measure, source=src, reason="no finite hidden_erank")]
    i = int(np.nanargmax(er))
    return [_row(claim, t.model, ck, f"{measure} (layer {int(g['layer'].iloc[i])})", float(phase[i]), source=src)]


def _hits(claim, t: ModelTables) -> list[dict]:
    ck = t.lens_ckpt or _final(t)
    src = f"results/{t.model}/{ck}/phase_metrics.tsv"
    out = []
    for metric, what, unit in (
        ("tuned_hit1", "tuned-lens Hit@1", "share of tokens"),
        ("tuned_hit5_over_hit1", "tuned-lens Hit@5/Hit@1", "ratio"),
    ):
        for ph in (1, 2, 3):
            measure = f"{what}, phase {ph} ({PHASE_NAMES[ph]}) mean over layers"
            if t.phase_metrics is None:
                out.append(
                    _row(claim, t.model, ck, measure, unit=unit, source=src, reason="phase_metrics.tsv not available")
                )
                continue
            value, why = _phase_mean(t.phase_metrics, metric, ph)
            out.append(_row(claim, t.model, ck, measure, value, unit=unit, source=src, reason=why))
    return out


def _regime(claim, t: ModelTables) -> list[dict]:
    ck = t.lens_ckpt or _final(t)
    src = f"results/{t.model}/{ck}/phases.json (regime), resolution.tsv"
    regime = (t.phases or {}).get("regime")
    names = ("compromise k of the energy/visibility Pareto frontier", "largest shift of b1/b2 across the regime's k")
    if not regime:
        return [
            _row(claim, t.model, ck, m, unit=u, source=src, reason="phases.json has no middle regime")
            for m, u in zip(names, ("% of d", "layers"))
        ]
    ks = ", ".join(f"{100 * f:g}" for f in regime["k_fraction"])
    center = (
        regime["k_fraction"][regime["k"].index(regime["k_center"])] if regime["k_center"] in regime["k"] else math.nan
    )
    return [
        _row(claim, t.model, ck, f"{names[0]} (regime: k = {ks} % of d)", 100 * center, unit="% of d", source=src),
        _row(
            claim,
            t.model,
            ck,
            f"{names[1]} (b1 {regime['b1_shift']}, b2 {regime['b2_shift']})",
            float(regime["max_shift"]),
            unit="layers",
            source=src,
            reason=regime.get("reason", ""),
        ),
    ]


#: claim id → the rows of one model (study-level claims, the slopes, are in :func:`_slopes`)
COMPARISONS: dict[str, Callable[..., list[dict]]] = {
    "erank_single_layer": lambda c, t: _erank(c, t, last=False),
    "erank_full_depth": lambda c, t: _erank(c, t, last=True),
    "complex_share_early": _complex_early,
    "significant_layers_step0": _significant_layers("first"),
    "significant_layers_mid": _significant_layers("mid"),
    "significant_layers_final": _significant_layers("final"),
    "update_norm_growth_phase3": _norm_growth,
    "update_erank_falls_phase3": _erank_falls,
    "hidden_erank_peaks_phase2": _erank_peak,
    "hit_ratio_falls_phase3": _hits,
    "middle_regime": _regime,
}
#: claims about a scaling group (one row per group): claim id → phase whose width slope it quotes
SLOPE_CLAIMS = {"phase1_width_slope": 1, "phase2_width_slope": 2}


def _slopes(claim, phase: int, widths: pd.DataFrame | None, groups: Mapping[str, Sequence[str]]) -> list[dict]:
    src = "results/scaling/phase_widths.tsv"
    measure = f"OLS slope of phase-{phase} width on depth"
    if not groups:
        return [_row(claim, "", "", measure, source=src, reason="no scaling group in config scaling.groups")]
    out = []
    for group, members in groups.items():
        m = f"{measure} over {', '.join(members)}"
        rows = (
            None if widths is None else widths[(widths["group"].astype(str) == str(group)) & (widths["phase"] == phase)]
        )
        if rows is None or rows.empty:
            out.append(
                _row(claim, str(group), "final", m, source=src, reason=f"no phase-{phase} fit for group {group}")
            )
            continue
        r = rows.iloc[0]
        if r["status"] != "ok":
            out.append(_row(claim, str(group), "final", m, source=src, reason=str(r.get("reason") or r["status"])))
            continue
        out.append(
            _row(
                claim,
                str(group),
                "final",
                m,
                float(r["slope"]),
                (float(r["slope_ci_low"]), float(r["slope_ci_high"])),
                source=src,
            )
        )
    return out


def paper_comparison(
    claims: pd.DataFrame,
    models: Sequence[ModelTables],
    studies: Sequence[str] = ("A", "B"),
    phase_widths: pd.DataFrame | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The paper table of a run: :data:`PAPER_COLUMNS`, claims in the claims table's order.

    Args:
        claims: the claims table (:meth:`resdyn.artifacts.ClaimsTable.load`).
        models: the tables of each model (:class:`ModelTables`), in config order.
        studies: the studies that ran (config ``studies``); a claim of another study gets one
            row with the reason.
        phase_widths, groups: ``results/scaling/phase_widths.tsv`` and config
            ``scaling.groups`` for the slope claims.
    Every claim gets at least one row; a number that cannot be given has a reason.
    """
    ran = sorted(set(studies))
    rows: list[dict] = []
    for claim in claims.to_dict("records"):
        cid = claim["claim_id"]
        if claim["study"] not in ran:
            rows.append(_row(claim, "", "", "", reason=f"study {claim['study']} is not run (config studies: {ran})"))
        elif cid in SLOPE_CLAIMS:
            rows += _slopes(claim, SLOPE_CLAIMS[cid], phase_widths, groups or {})
        elif cid not in COMPARISONS:
            rows.append(
                _row(
                    claim,
                    "",
                    "",
                    "",
                    reason=f"claim {cid!r} has no comparison in resdyn.beyond.paper "
                    f"(known: {sorted([*COMPARISONS, *SLOPE_CLAIMS])})",
                )
            )
        else:
            for t in models:
                rows += COMPARISONS[cid](claim, t)
    return pd.DataFrame(rows, columns=PAPER_COLUMNS)
