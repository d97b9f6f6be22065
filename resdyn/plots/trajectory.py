"""Figures across checkpoints and models: headline metrics against training step, every model of
the run in one panel, with intervals (catalogue scopes ``trajectory`` / ``lens_trajectory``).

Inputs are the concatenated per-checkpoint tables of :func:`resdyn.plots.render.trajectory_table`
(``model``, ``ckpt``, ``ckpt_index``, ``step`` in front). The x axis is the training step when
every checkpoint of the figure names one, else the position in training order (``main``, a local
model), with the checkpoint names as ticks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from resdyn.plots.common import check_frame, empty_figure, num
from resdyn.plots.style import new_figure, styled


def _x(df: pd.DataFrame) -> tuple[str, str]:
    """The x column (``step``, or ``ckpt_index`` when a checkpoint names no step) and its label."""
    if num(df["step"]).size and np.isfinite(num(df["step"])).all():
        return "step", "training step"
    return "ckpt_index", "checkpoint (training order)"


def _marks(integrity_df: pd.DataFrame | None) -> dict[tuple[str, str], str]:
    """(model, ckpt) -> the checkpoint's integrity mark (``duplicate of …``), for marked ones only."""
    if integrity_df is None or "integrity" not in integrity_df:
        return {}
    rows = integrity_df[integrity_df["integrity"].fillna("").astype(str) != ""]
    return {(str(r.model), str(r.ckpt)): str(r.integrity) for r in rows.itertuples()}


def _mark_points(ax, rows: pd.DataFrame, x: str, y: str, marks: dict, model: str) -> None:
    """A red cross and the mark's text over every point of a marked checkpoint (a copy of another)."""
    model = model.split(" · ")[0]
    for r in rows.itertuples():
        mark = marks.get((model, str(r.ckpt)))
        if mark:
            xv, yv = float(getattr(r, x)), float(getattr(r, y))
            ax.plot([xv], [yv], marker="x", color="red", markersize=9, linestyle="none")
            ax.annotate(mark, (xv, yv), fontsize="xx-small", color="red", xytext=(3, 3), textcoords="offset points")


def _panel(ax, df: pd.DataFrame, y: str, low: str | None, high: str | None, x: str, marks: dict | None = None) -> None:
    for model, rows in df.groupby("model", sort=False):
        rows = rows.sort_values(x)
        xs, ys = num(rows[x]), num(rows[y])
        (line,) = ax.plot(xs, ys, marker="o", label=str(model))
        _mark_points(ax, rows, x, y, marks or {}, str(model))
        if low and high:
            err = np.vstack([ys - num(rows[low]), num(rows[high]) - ys])
            ax.errorbar(
                xs, ys, yerr=np.clip(np.nan_to_num(err), 0, None), fmt="none", capsize=3, color=line.get_color()
            )
    if x == "ckpt_index":
        ticks = df.drop_duplicates("ckpt_index").sort_values("ckpt_index")
        ax.set_xticks(num(ticks["ckpt_index"]), [str(c) for c in ticks["ckpt"]], rotation=30, fontsize="x-small")


@styled
def study_a_trajectory(boot_df: pd.DataFrame, integrity_df: pd.DataFrame | None = None, title: str = "") -> Figure:
    """Whole-model Study A statistics of ``bootstrap.tsv`` (rows without a layer that were
    bootstrapped: e.g. cumulative erank at full depth, complex fraction and Henrici departure
    early minus late) against training step, one line per model, the bootstrap interval as
    error bars; one panel per statistic. A checkpoint whose integrity record marks it (a copy
    of an earlier one, ``allow_duplicate_weights``) gets a red cross and its mark."""
    df = check_frame(boot_df, "bootstrap trajectory table")
    need = [c for c in ("model", "metric", "layer", "estimate", "ci_low", "ci_high", "bootstrapped") if c not in df]
    if need:
        raise ValueError(f"bootstrap trajectory table lacks columns {need}; has {list(df.columns)}")
    whole = df[pd.to_numeric(df["layer"], errors="coerce").isna() & df["bootstrapped"].astype(str).eq("True")]
    metrics = list(dict.fromkeys(whole["metric"]))
    x, xlabel = _x(whole) if len(whole) else ("step", "training step")
    if not metrics:
        return empty_figure(title, xlabel, "value", "whole-model bootstrap rows")
    fig, axes = new_figure(len(metrics), ncols=min(3, len(metrics)), panel=(3.6, 2.6))
    for ax, metric in zip(axes, metrics):
        _panel(ax, whole[whole["metric"] == metric], "estimate", "ci_low", "ci_high", x, _marks(integrity_df))
        ax.set_title(metric, fontsize="small")
        ax.set_xlabel(xlabel)
    axes[0].legend(fontsize="x-small")
    fig.suptitle(title)
    return fig


@styled
def study_b_trajectory(phase_df: pd.DataFrame, integrity_df: pd.DataFrame | None = None, title: str = "") -> Figure:
    """Study B phase metrics of ``phase_metrics.tsv`` against training step: one panel per metric,
    one line per (model, phase), the interval mean ± sd over the layers of the phase (none where
    a phase has one layer); marked checkpoints as in :func:`study_a_trajectory`."""
    df = check_frame(phase_df, "phase-metrics trajectory table")
    need = [c for c in ("model", "phase", "phase_name", "metric", "mean", "sd") if c not in df]
    if need:
        raise ValueError(f"phase-metrics trajectory table lacks columns {need}; has {list(df.columns)}")
    metrics = list(dict.fromkeys(df["metric"]))
    x, xlabel = _x(df) if len(df) else ("step", "training step")
    if not metrics:
        return empty_figure(title, xlabel, "value", "phase metrics")
    df = df.assign(
        low=num(df["mean"]) - num(df["sd"]),
        high=num(df["mean"]) + num(df["sd"]),
        model=df["model"].astype(str) + " · " + df["phase_name"].astype(str),
    )
    fig, axes = new_figure(len(metrics), ncols=min(3, len(metrics)), panel=(3.6, 2.6))
    for ax, metric in zip(axes, metrics):
        _panel(ax, df[df["metric"] == metric], "mean", "low", "high", x, _marks(integrity_df))
        ax.set_title(metric, fontsize="small")
        ax.set_xlabel(xlabel)
    axes[0].legend(fontsize="x-small")
    fig.suptitle(title)
    return fig
