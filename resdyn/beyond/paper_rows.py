"""The rows of the paper table (:mod:`resdyn.beyond.paper`): the tables a model gives and one row.

Shared by the study-A and study-B comparisons (:mod:`resdyn.beyond.paper_a`,
:mod:`resdyn.beyond.paper_b`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from resdyn import artifacts
from resdyn.beyond import verdicts as vd
from resdyn.beyond.scorecard import MIN_BOOTSTRAP_SAMPLES

__all__ = ["ModelTables", "row", "from_scorecard", "boot_ci", "deciding", "final", "lens_ckpt", "PAPER_COLUMNS"]

PAPER_COLUMNS = list(artifacts.PaperComparison.columns)


@dataclass
class ModelTables:
    """The tables of one model that the comparison reads (None: not produced by this run).

    ``ckpts``: checkpoints in training order; ``lens_ckpt``: the checkpoint of the study-B
    tables (the final lens checkpoint); ``bottleneck``, ``bootstrap``: {checkpoint: table};
    ``phases``: the ``phases.json`` object; ``complex_tol``: the complex-fraction tolerance of
    the bootstrap (config ``bootstrap.complex_tol``), so value and interval count the same
    eigenvalues; ``coupling``, ``schur``: ``coupling.tsv`` and ``schur.tsv`` of the final
    checkpoint; ``partitions``: ``partition_similarity.tsv``; ``lens_metrics`` of the lens
    checkpoint; ``n_samples``: config ``samples.n``; ``complex_rule``: config ``spectra.complex_rule``
    (``beyond_noise``: the share above the noise bound τ, ``tolerance``: the ``complex_tol`` rule).
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
    coupling: pd.DataFrame | None = None
    schur: pd.DataFrame | None = None
    partitions: pd.DataFrame | None = None
    lens_metrics: pd.DataFrame | None = None
    n_samples: int | None = None
    complex_rule: str = "beyond_noise"


def row(
    claim: Mapping[str, str],
    model: str,
    ckpt: str,
    measure: str,
    value: float = math.nan,
    ci: tuple[float, float] | None = None,
    unit: str | None = None,
    source: str = "",
    reason: str = "",
    verdict: str = "",
) -> dict:
    """One row of the paper table (:data:`PAPER_COLUMNS`).

    ``reason`` says why ``value`` is empty (a non-finite value without one gets "the run's value
    is not finite"); ``verdict`` defaults to ``not testable: <reason>`` when there is a reason.
    """
    lo, hi = ci if ci is not None else (math.nan, math.nan)
    value = float(value)
    if not math.isfinite(value) and not reason:
        reason = "the run's value is not finite"
    if not verdict:
        verdict = vd.untestable(reason or "no verdict rule for this row")
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
        "verdict": verdict,
    }


def from_scorecard(claim: Mapping[str, str], model: str, ckpt: str, card: Mapping[str, Any], source: str) -> dict:
    """A paper row from a scorecard row (:mod:`resdyn.beyond.scorecard`) that tests the same statement:
    its statistic and detail as the measure, its value, and its verdict with the reason."""
    measure = f"{card['statistic']} ({card['detail']})" if card["detail"] else card["statistic"]
    value = float(card["value"])
    untested = card["verdict"] == vd.UNTESTABLE
    verdict = vd.untestable(card["reason"]) if untested else f"{card['verdict']}: {card['reason']}"
    reason = "" if math.isfinite(value) else card["reason"]
    return row(claim, model, ckpt, measure, value, source=source, reason=reason, verdict=verdict)


def boot_ci(boot: pd.DataFrame | None, metric: str) -> tuple[tuple[float, float] | None, str]:
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


def deciding(ci: tuple[float, float] | None, boot: pd.DataFrame | None, metric: str) -> tuple[float, float] | None:
    """The interval a verdict may use: None when it rests on fewer than
    :data:`resdyn.beyond.scorecard.MIN_BOOTSTRAP_SAMPLES` samples (it is still reported)."""
    if ci is None or boot is None or "n_bootstrap_samples" not in boot.columns:
        return ci
    n = boot.loc[boot["metric"] == metric, "n_bootstrap_samples"]
    return ci if n.empty or int(n.iloc[0]) >= MIN_BOOTSTRAP_SAMPLES else None


def final(t: ModelTables) -> str:
    """The model's final checkpoint."""
    return str(t.ckpts[-1])


def lens_ckpt(t: ModelTables) -> str:
    """The checkpoint of the model's study-B tables."""
    return t.lens_ckpt or final(t)
