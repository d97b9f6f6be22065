"""Study A's statements in the paper table: this run's numbers and a verdict for each.

Functions ``claim, ModelTables -> rows`` (:func:`resdyn.beyond.paper_rows.row`); the verdict
rules are :mod:`resdyn.beyond.verdicts`. Sublayers are split into thirds by
:func:`resdyn.beyond.bootstrap.early_late` (first third "early", last third "late"; "early and
middle" is everything before the last third). Symmetry index and Henrici departure are those of
J − I (``symmetry_minus_identity``, ``henrici_JmI`` of ``checkpoints.tsv``): ‖I‖ dominates J's own.

Magnitudes that depend on the model's size (effective ranks of 436 and 7, layer counts of 14
and 24) are tested only when the run's model has the study model's width (:data:`STUDY_WIDTH`)
or depth (:data:`STUDY_DEPTH`); otherwise the row gives the number and says why it is not tested.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from resdyn.beyond import bootstrap as bs
from resdyn.beyond import scorecard as sc
from resdyn.beyond import verdicts as vd
from resdyn.beyond.paper_rows import ModelTables, boot_ci, deciding, final, from_scorecard, row

__all__ = [
    "COMPARISONS_A",
    "STUDY_WIDTH",
    "STUDY_DEPTH",
    "NO_LAYER_COUNTS",
    "SINGLE_LAYER_S",
    "SINGLE_LAYERS",
    "single_layer_row",
]

NO_LAYER_COUNTS = "per-layer coupling counts not available"
#: hidden width d of the models study A states magnitudes for
STUDY_WIDTH = {"Llama 3.1 8B": 4096, "OLMo 3 7B": 4096}
#: layers of OLMo 3 7B, the model of the coupling counts
STUDY_DEPTH = {"OLMo 3 7B": 32}
#: the sublayer index s of the single-layer baseline: P_1 = J_1 J_0, the first whole layer
SINGLE_LAYER_S = 1


def _ck(t: ModelTables, ckpt: str, cols: list[str]) -> tuple[pd.DataFrame | None, str]:
    """The checkpoints.tsv rows of ``ckpt`` (sorted by s), or (None, why)."""
    if t.checkpoints is None:
        return None, "checkpoints.tsv not available"
    missing = [c for c in cols if c not in t.checkpoints.columns]
    if missing:
        return None, f"checkpoints.tsv lacks {missing}"
    rows = t.checkpoints[t.checkpoints["ckpt"].astype(str) == str(ckpt)].sort_values("s")
    if len(rows) < 2:
        return None, f"checkpoints.tsv has {len(rows)} sublayer(s) of {ckpt} (< 2)"
    return rows, ""


def _thirds(values: np.ndarray) -> tuple[float, float, float]:
    """Means over the early third, the late third, and everything before the late third."""
    early, late = bs.early_late(values.size)
    return float(values[early].mean()), float(values[late].mean()), float(values[: late[0]].mean())


def _src(t: ModelTables) -> str:
    return f"results/{t.model}/checkpoints.tsv"


def _complex_col(t: ModelTables) -> str:
    """The checkpoints.tsv column of the complex share ``t.complex_rule`` chooses."""
    return "complex_frac_beyond_noise" if t.complex_rule == "beyond_noise" else f"complex_frac_J_tol{t.complex_tol:.0e}"


def _complex_what(t: ModelTables) -> str:
    """How that share counts an eigenvalue as complex, for the measure's label."""
    if t.complex_rule == "beyond_noise":
        return "complex fraction beyond the sampling-noise bound τ"
    return f"complex fraction (tol {t.complex_tol:g})"


def _complex_boot(t: ModelTables) -> str:
    """The bootstrap metric of that share's early-minus-late difference."""
    if t.complex_rule == "beyond_noise":
        return "complex_fraction_beyond_noise_early_minus_late"
    return "complex_fraction_early_minus_late"


def _n_samples(claim, t: ModelTables) -> list[dict]:
    m = "samples the Jacobians are averaged over (config samples.n)"
    if t.n_samples is None:
        return [row(claim, t.model, "", m, source="config", reason="config samples.n not given")]
    why = vd.untestable("a setup figure, not a finding: this run's sample count is its config")
    return [row(claim, t.model, "", m, float(t.n_samples), source="config samples.n", verdict=why)]


def _complex_share(claim, t: ModelTables) -> list[dict]:
    ck, col = final(t), _complex_col(t)
    m = f"{_complex_what(t)}, mean over the first third of sublayers"
    rows, why = _ck(t, ck, [col])
    if rows is None:
        return [row(claim, t.model, ck, m, source=_src(t), reason=why)]
    early, _, _ = _thirds(rows[col].to_numpy(dtype=np.float64))
    return [row(claim, t.model, ck, m, early, source=_src(t), verdict=vd.approx(early, 0.98))]


def _rotational(claim, t: ModelTables) -> list[dict]:
    ck, col = final(t), _complex_col(t)
    out = []
    rows, why = _ck(t, ck, ["symmetry_minus_identity"])
    m = "symmetry index of J − I, first third − last third of sublayers"
    if rows is None:
        out.append(row(claim, t.model, ck, m, source=_src(t), reason=why))
    else:
        e, l_, _ = _thirds(rows["symmetry_minus_identity"].to_numpy(dtype=np.float64))
        out.append(row(claim, t.model, ck, m, e - l_, source=_src(t), verdict=vd.compare(e - l_, ">", 0.0)))
    rows, why = _ck(t, ck, [col])
    m = f"{_complex_what(t)}, first third − last third of sublayers"
    if rows is None:
        out.append(row(claim, t.model, ck, m, source=_src(t), reason=why))
        return out
    value, _ = sc.complex_gradient(rows, col)
    ci, note = boot_ci(t.bootstrap.get(ck), _complex_boot(t))
    src = _src(t) + (f" (interval: {note})" if ci else "")
    out.append(
        row(
            claim,
            t.model,
            ck,
            m,
            value,
            ci,
            source=src,
            verdict=vd.compare(value, ">", 0.0, deciding(ci, t.bootstrap.get(ck), _complex_boot(t))),
        )
    )
    return out


def _late_symmetric(claim, t: ModelTables) -> list[dict]:
    ck = final(t)
    m = "symmetry index of J − I, mean over the last third of sublayers"
    rows, why = _ck(t, ck, ["symmetry_minus_identity"])
    if rows is None:
        return [row(claim, t.model, ck, m, source=_src(t), reason=why)]
    _, late, _ = _thirds(rows["symmetry_minus_identity"].to_numpy(dtype=np.float64))
    return [row(claim, t.model, ck, m, late, source=_src(t), verdict=vd.compare(late, "<", vd.NEAR_SYMMETRIC_MAX))]


def _monotonic(claim, t: ModelTables) -> list[dict]:
    ck = final(t)
    m = "Spearman rho(s, Henrici departure of J − I)"
    rows, why = _ck(t, ck, ["henrici_JmI"])
    if rows is None or len(rows) < 3:
        return [row(claim, t.model, ck, m, source=_src(t), reason=why or "fewer than 3 sublayers")]
    from scipy.stats import spearmanr  # only this claim needs scipy.stats

    res = spearmanr(rows["s"].to_numpy(dtype=float), rows["henrici_JmI"].to_numpy(dtype=float))
    rho, p = float(res.statistic), float(res.pvalue)
    if not math.isfinite(rho):
        return [row(claim, t.model, ck, m, source=_src(t), reason="Henrici of J − I is constant over depth")]
    v = vd.compare(rho, "<", 0.0)
    if v.startswith(vd.HOLDS) and not p < vd.ALPHA:
        v = f"{vd.FAILS}: rho {vd.fmt(rho)} < 0 but p {vd.fmt(p)} ≥ {vd.ALPHA:g}"
    return [row(claim, t.model, ck, f"{m} (p {vd.fmt(p)})", rho, source=_src(t), verdict=v)]


def _step0_symmetric(claim, t: ModelTables) -> list[dict]:
    first = str(t.ckpts[0])
    m = "largest symmetry index of J − I over the sublayers of the first checkpoint"
    if len(t.ckpts) < 2:
        return [row(claim, t.model, first, m, source=_src(t), reason="only one checkpoint (no step 0)")]
    rows, why = _ck(t, first, ["symmetry_minus_identity"])
    if rows is None:
        return [row(claim, t.model, first, m, source=_src(t), reason=why)]
    top = float(rows["symmetry_minus_identity"].max())
    return [row(claim, t.model, first, m, top, source=_src(t), verdict=vd.compare(top, "<", vd.NEAR_SYMMETRIC_MAX))]


def _pulls_rotational(claim, t: ModelTables) -> list[dict]:
    first, ck = str(t.ckpts[0]), final(t)
    out = []
    for col, what in (("symmetry_minus_identity", "symmetry index of J − I"), (_complex_col(t), _complex_what(t))):
        m = f"{what}, mean over the early and middle sublayers: final − first checkpoint"
        if len(t.ckpts) < 2:
            out.append(row(claim, t.model, ck, m, source=_src(t), reason="only one checkpoint (no step 0)"))
            continue
        r0, why0 = _ck(t, first, [col])
        r1, why1 = _ck(t, ck, [col])
        if r0 is None or r1 is None:
            out.append(row(claim, t.model, ck, m, source=_src(t), reason=why0 or why1))
            continue
        v0 = _thirds(r0[col].to_numpy(dtype=np.float64))[2]
        v1 = _thirds(r1[col].to_numpy(dtype=np.float64))[2]
        m += f" ({vd.fmt(v0)} → {vd.fmt(v1)})"
        out.append(
            row(claim, t.model, f"{first},{ck}", m, v1 - v0, source=_src(t), verdict=vd.compare(v1 - v0, ">", 0.0))
        )
    return out


def _erank(claim, t: ModelTables, last: bool) -> list[dict]:
    ck = final(t)
    table = t.bottleneck.get(ck)
    src = f"results/{t.model}/{ck}/bottleneck.tsv"
    if table is None or table.empty:
        return [row(claim, t.model, ck, "erank", source=src, reason="bottleneck.tsv not available")]
    rows = table.sort_values("s")
    target = 7.0 if last else 436.0
    if last:
        value = float(rows["erank"].iloc[-1])
        ci, note = boot_ci(t.bootstrap.get(ck), "cum_erank_full_depth")
        m = "erank of the cumulative product at full depth"
        return [
            row(
                claim,
                t.model,
                ck,
                m,
                value,
                ci,
                source=src + (f" (interval: {note})" if ci else ""),
                verdict=_erank_verdict(
                    claim, t, value, target, deciding(ci, t.bootstrap.get(ck), "cum_erank_full_depth")
                ),
            )
        ]
    return [single_layer_row(claim, t, s) for s in (SINGLE_LAYER_S, 0)]


#: the single-layer baselines: sublayer index s → what P_s is
SINGLE_LAYERS = {1: "P_1, the first whole layer (default)", 0: "P_0, the first attention half"}


def single_layer_row(claim, t: ModelTables, s: int) -> dict:
    """The "≈ 436 (single layer)" row with the cumulative product P_s as the single layer."""
    ck = final(t)
    src = f"results/{t.model}/{ck}/bottleneck.tsv"
    m = f"erank of {SINGLE_LAYERS[s]}, s = {s}"
    table = t.bottleneck.get(ck)
    r = None if table is None else table[table["s"] == s]
    if r is None or r.empty:
        return row(claim, t.model, ck, m, source=src, reason=f"bottleneck.tsv has no s = {s}")
    value = float(r["erank"].iloc[0])
    return row(claim, t.model, ck, m, value, source=src, verdict=_erank_verdict(claim, t, value, 436.0, None))


def _erank_verdict(claim, t: ModelTables, value: float, target: float, ci) -> str:
    rows, _ = _ck(t, final(t), ["d"])
    d = int(rows["d"].iloc[0]) if rows is not None else None
    want = STUDY_WIDTH.get(claim["study_model"])
    if d is None or d != want:
        return vd.untestable(f"a magnitude for {claim['study_model']} (d = {want}); this model's d = {d}")
    if ci is not None and all(math.isfinite(c) for c in ci):
        lo, hi = target * (1 - vd.APPROX_REL), target * (1 + vd.APPROX_REL)
        return vd.in_range(value, lo, hi, ci)
    return vd.approx(value, target)


def _full_depth_share(t: ModelTables, ckpt: str) -> tuple[float, float, str]:
    """(full-depth cumulative erank, d, why) of a checkpoint from checkpoints.tsv."""
    rows, why = _ck(t, ckpt, ["cum_erank", "d"])
    if rows is None:
        return math.nan, math.nan, why
    return float(rows["cum_erank"].iloc[-1]), float(rows["d"].iloc[0]), ""


def _collapse_not_architectural(claim, t: ModelTables) -> list[dict]:
    first = str(t.ckpts[0])
    m = "full-depth cumulative erank / d at the first checkpoint"
    if len(t.ckpts) < 2:
        return [row(claim, t.model, first, m, source=_src(t), reason="only one checkpoint (no step 0)")]
    e0, d, why = _full_depth_share(t, first)
    if why:
        return [row(claim, t.model, first, m, source=_src(t), reason=why)]
    share = e0 / d
    m += f" ({vd.fmt(e0)} of {int(d)})"
    return [row(claim, t.model, first, m, share, source=_src(t), verdict=vd.compare(share, ">", vd.HIGH_RANK_SHARE))]


def _collapse_learned(claim, t: ModelTables) -> list[dict]:
    first, ck = str(t.ckpts[0]), final(t)
    m = "full-depth cumulative erank, final / first checkpoint"
    if len(t.ckpts) < 2:
        return [row(claim, t.model, ck, m, source=_src(t), reason="only one checkpoint (no step 0)")]
    e0, d, why0 = _full_depth_share(t, first)
    e1, _, why1 = _full_depth_share(t, ck)
    if why0 or why1:
        return [row(claim, t.model, ck, m, source=_src(t), reason=why0 or why1)]
    if e0 <= 0:
        return [row(claim, t.model, ck, m, source=_src(t), reason="step-0 full-depth erank is 0")]
    ratio = e1 / e0
    v = vd.compare(ratio, "<", vd.COLLAPSE_FRACTION)
    if v.startswith(vd.HOLDS) and not e0 / d > vd.HIGH_RANK_SHARE:
        v = f"{vd.FAILS}: final / first {vd.fmt(ratio)}, but step 0 is already low ({vd.fmt(e0 / d)} of d)"
    m += f" ({vd.fmt(e0)} → {vd.fmt(e1)}, d = {int(d)})"
    return [row(claim, t.model, f"{first},{ck}", m, ratio, source=_src(t), verdict=v)]


def _schur(claim, t: ModelTables) -> list[dict]:
    ck = final(t)
    card = sc.claim_schur(t.schur, ck)
    return [from_scorecard(claim, t.model, ck, card, f"results/{t.model}/{ck}/schur.tsv")]


def coupling_by_class(coupling: pd.DataFrame, checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Each tested boundary's effect with the Henrici class of its sublayer (J − I).

    ``coupling``: ``coupling.tsv`` (``s``, ``effect_log_median_ratio``); ``checkpoints``: the
    checkpoint's rows of ``checkpoints.tsv`` (``s``, ``henrici_JmI``). Classes:
    :func:`resdyn.beyond.verdicts.henrici_classes` over the checkpoint's sublayers.
    """
    h = checkpoints[["s", "henrici_JmI"]].drop_duplicates("s").copy()
    h["cls"] = vd.henrici_classes(h["henrici_JmI"].to_numpy(dtype=np.float64))
    c = coupling[np.isfinite(coupling["effect_log_median_ratio"].to_numpy(dtype=np.float64))]
    return c[["s", "effect_log_median_ratio"]].merge(h, on="s", how="inner")


def _coupling_sign(cls: str, sign: int) -> Callable[..., list[dict]]:
    def compute(claim, t: ModelTables) -> list[dict]:
        ck = final(t)
        src = f"results/{t.model}/{ck}/coupling.tsv, checkpoints.tsv henrici_JmI"
        m = f"boundary effects in the {cls} sublayers (Henrici of J − I, {'lowest' if sign > 0 else 'highest'} third)"
        rows, why = _ck(t, ck, ["henrici_JmI"])
        if t.coupling is None or "effect_log_median_ratio" not in t.coupling.columns:
            why = "coupling.tsv not available"
        if why:
            return [row(claim, t.model, ck, m, source=src, reason=why)]
        tab = coupling_by_class(t.coupling, rows)
        effects = tab.loc[tab["cls"] == cls, "effect_log_median_ratio"].to_numpy(dtype=np.float64)
        verdict, mean, n, p = vd.class_sign(effects, sign)
        m += f": {n} boundaries, Wilcoxon p {vd.fmt(p)}"
        reason = "" if math.isfinite(mean) else verdict.split(": ", 1)[1]
        return [row(claim, t.model, ck, m, mean, source=src, reason=reason, verdict=verdict)]

    return compute


def _counts(t: ModelTables) -> tuple[list[str], list[float], str]:
    """Checkpoints in training order, their significant-layer counts, and why they are missing."""
    order = [str(c) for c in t.ckpts]
    cc = t.coupling_counts
    if cc is None or not {"n_significant_layers", "n_layers"} <= set(cc.columns):
        return order, [], NO_LAYER_COUNTS
    counts = []
    for c in order:
        r = cc[cc["ckpt"].astype(str) == c]
        counts.append(float(r["n_significant_layers"].iloc[0]) if len(r) else math.nan)
    return order, counts, ""


def _significant_layers(position: str) -> Callable[..., list[dict]]:
    """Rows of the checkpoints at ``position`` (first | mid | final) in training order."""

    def compute(claim, t: ModelTables) -> list[dict]:
        order, counts, why = _counts(t)
        idx = {"first": [0] if len(order) > 1 else [], "mid": list(range(1, len(order) - 1)), "final": [len(order) - 1]}
        picks = idx[position]
        src = f"results/{t.model}/coupling_counts.tsv"
        measure = "FDR-significant layers"
        if not picks:
            why0 = "only one checkpoint" if position == "first" else "no checkpoint between the first and the final"
            return [row(claim, t.model, "", measure, source=src, reason=why0)]
        if why:
            return [row(claim, t.model, order[i], measure, source=src, reason=why) for i in picks]
        cc = t.coupling_counts
        out = []
        for i in picks:
            value = counts[i]
            if not math.isfinite(value):
                out.append(
                    row(
                        claim,
                        t.model,
                        order[i],
                        measure,
                        source=src,
                        reason=f"no coupling count for checkpoint {order[i]}",
                    )
                )
                continue
            n = int(cc.loc[cc["ckpt"].astype(str) == order[i], "n_layers"].iloc[0])
            out.append(
                row(
                    claim,
                    t.model,
                    order[i],
                    f"{measure} (this model has {n} layers)",
                    value,
                    source=src,
                    verdict=_count_verdict(claim, value, n),
                )
            )
        return out

    return compute


def _count_verdict(claim, value: float, n_layers: int) -> str:
    """0 is tested at any depth; 14 and 24 only at the study model's depth."""
    stated = float(claim["stated_value"])
    if stated == 0:
        return vd.in_range(value, 0.0, 0.0)
    want = STUDY_DEPTH.get(claim["study_model"])
    if want != n_layers:
        return vd.untestable(f"a count for {claim['study_model']} ({want} layers); this model has {n_layers}")
    return vd.approx(value, stated)


def _emerges(claim, t: ModelTables) -> list[dict]:
    order, counts, why = _counts(t)
    src = f"results/{t.model}/coupling_counts.tsv"
    m = "FDR-significant layers in training order, last − first"
    if why or len(order) < 2:
        return [row(claim, t.model, "", m, source=src, reason=why or "only one checkpoint")]
    v = vd.emerges(counts)
    value = counts[-1] - counts[0]
    return [
        row(
            claim,
            t.model,
            ",".join(order),
            m,
            value,
            source=src,
            reason="" if math.isfinite(value) else "a checkpoint has no coupling count",
            verdict=v,
        )
    ]


def _communities(claim, t: ModelTables) -> list[dict]:
    first, ck = str(t.ckpts[0]), final(t)
    src = f"results/{t.model}/partition_similarity.tsv"
    m = "mean NMI of the first checkpoint's communities against the final's"
    ps = t.partitions
    if len(t.ckpts) < 2:
        return [row(claim, t.model, first, m, source=src, reason="only one checkpoint (no step 0)")]
    if ps is None or not {"nmi", "nmi_p", "nmi_null_q95"} <= set(ps.columns):
        why = "partition_similarity.tsv with the NMI's permutation null (nmi_p, nmi_null_q95) not available"
        return [row(claim, t.model, first, m, source=src, reason=why)]
    sel = ps[(ps["ckpt"].astype(str) == first) & (ps["reference"].astype(str) == "final")]
    nmi = sel["nmi"].to_numpy(dtype=np.float64)
    if not np.isfinite(nmi).any():
        return [
            row(claim, t.model, first, m, source=src, reason="no finite NMI of the first checkpoint against the final")
        ]
    verdict = vd.above_null(nmi, sel["nmi_null_q95"].to_numpy(dtype=np.float64), sel["nmi_p"].to_numpy(dtype=float))
    m += f" ({int(np.isfinite(nmi).sum())} boundaries, against a label-permutation null)"
    return [row(claim, t.model, f"{first},{ck}", m, float(np.nanmean(nmi)), source=src, verdict=verdict)]


#: claim id → the rows of one model (study A)
COMPARISONS_A: dict[str, Callable[..., list[dict]]] = {
    "n_samples": _n_samples,
    "complex_share_early": _complex_share,
    "rotational_early_symmetric_late": _rotational,
    "late_near_symmetric": _late_symmetric,
    "nonnormality_monotonic": _monotonic,
    "step0_near_symmetric": _step0_symmetric,
    "training_pulls_rotational": _pulls_rotational,
    "erank_single_layer": lambda c, t: _erank(c, t, last=False),
    "erank_full_depth": lambda c, t: _erank(c, t, last=True),
    "collapse_not_architectural": _collapse_not_architectural,
    "collapse_learned": _collapse_learned,
    "schur_dissolves": _schur,
    "coupling_amplified_symmetric": _coupling_sign("near-symmetric", +1),
    "coupling_attenuated_nonnormal": _coupling_sign("strongly non-normal", -1),
    "significant_layers_step0": _significant_layers("first"),
    "significant_layers_mid": _significant_layers("mid"),
    "significant_layers_final": _significant_layers("final"),
    "coupling_emerges_monotonically": _emerges,
    "communities_partly_architectural": _communities,
}
