"""Study A figures from the topology: community sizes, topology-dynamics coupling, significant
layers per checkpoint and the partitions compared across checkpoints.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from resdyn.plots.common import (
    add_legend,
    as_bool,
    boundary_x,
    check_frame,
    empty_figure,
    fmt_num,
    group_column,
    log_if_positive,
    metric_label,
    num,
    ordered_unique,
    pick,
    require,
)
from resdyn.plots.style import (
    B_LABEL,
    BOUNDARY_STYLE,
    CKPT_COLUMNS,
    COUNT_COLUMNS,
    EFFECT_COLUMNS,
    HENRICI_COLUMNS,
    LINESTYLES,
    MARKERS,
    METRIC_LABELS,
    PALETTE,
    TOTAL_COLUMNS,
    new_figure,
    styled,
)


def _parse_sizes(v: Any, row: int) -> np.ndarray:
    if v is None:
        return np.zeros(0)
    if isinstance(v, float) and math.isnan(v):
        return np.zeros(0)
    if isinstance(v, str):
        text = v.strip()
        if not text:
            return np.zeros(0)
        # communities_summary.tsv writes sizes comma-joined (one TSV cell); JSON lists also accepted
        try:
            v = json.loads(text if text.startswith("[") else f"[{text}]")
        except json.JSONDecodeError as err:
            raise ValueError(
                f"community summary row {row}: sizes {text[:60]!r} is not a list of sizes ({err})"
            ) from None
    arr = num(np.ravel(np.asarray(v, dtype=object)))
    return arr[np.isfinite(arr)]


@styled
def community_sizes(summary_df: pd.DataFrame, title: str) -> Figure:
    """Community sizes per boundary (strip + median), number of communities and CPM quality.

    Columns (one row per boundary, :func:`resdyn.study_a.topology.community_summary` plus identifiers):
    ``layer``, ``boundary`` (pre_attn / pre_mlp), ``n_communities``, ``sizes`` (JSON list
    string or list) and optionally ``quality``. Axes: sizes (log y), number of communities,
    and quality when present.
    """
    df = check_frame(summary_df, "community summary")
    if df.empty:
        return empty_figure(title, B_LABEL, "community size (units)", "the community summary")
    require(df, ["layer", "n_communities", "sizes"], "community summary")
    x, side, xl = boundary_x(df)
    has_q = "quality" in df.columns
    fig, axes = new_figure(3 if has_q else 2, panel=(6.0, 2.1), sharex=True)
    ax = axes[0]
    rng = np.random.default_rng(0)
    medians = np.full(len(df), np.nan)
    all_sizes = []
    for i, v in enumerate(df["sizes"].tolist()):
        sz = _parse_sizes(v, i)
        all_sizes.append(sz)
        if sz.size and np.isfinite(x[i]):
            style = BOUNDARY_STYLE[int(side[i])]
            ax.scatter(
                x[i] + rng.uniform(-0.18, 0.18, sz.size),
                sz,
                s=14,
                color=style["color"],
                marker=style["marker"],
                alpha=0.55,
                lw=0,
            )
            medians[i] = float(np.median(sz))
    ax.plot(x, medians, ls="none", marker="_", ms=9, mew=1.6, color="black", label="median size")
    log_if_positive(ax, *all_sizes)
    ax.set_ylabel("community size (units)")
    handles = [
        Line2D([], [], ls="none", marker=st["marker"], color=st["color"], label=st["label"])
        for k, st in BOUNDARY_STYLE.items()
        if np.any(side == k)
    ]
    add_legend(ax, loc="best", extra=handles)
    ax = axes[1]
    n_com = num(df["n_communities"])
    order = np.argsort(np.nan_to_num(x, nan=np.inf), kind="stable")
    ax.plot(x[order], n_com[order], color="0.4", lw=1.0, label="number of communities")
    for k, st in BOUNDARY_STYLE.items():
        m = side == k
        if m.any():
            ax.plot(x[m], n_com[m], ls="none", marker=st["marker"], color=st["color"], ms=4)
    ax.set_ylabel("number of communities")
    if has_q:
        ax = axes[2]
        q = num(df["quality"])
        ax.plot(x[order], q[order], color=PALETTE[2], marker="o", ms=3, lw=1.0, label="signed CPM quality")
        ax.set_ylabel("partition quality\n(signed CPM)")
    for a in axes:
        a.set_xlabel(xl)
    for a in axes[:-1]:
        a.xaxis.label.set_visible(False)
    fig.suptitle(title)
    return fig


def _significance(df: pd.DataFrame, q_level: float = 0.05) -> np.ndarray:
    if "significant" in df.columns:
        return as_bool(df["significant"])
    if "q_value" in df.columns:
        q = num(df["q_value"])
        return np.isfinite(q) & (q <= q_level)
    raise ValueError(f"coupling table needs a 'significant' or 'q_value' column; it has {list(df.columns)}")


def _sig_handles(color: Any = "0.3") -> list:
    return [
        Line2D([], [], ls="none", marker="o", color=color, mfc=color, label="FDR-significant (BH)"),
        Line2D([], [], ls="none", marker="o", color=color, mfc="white", label="not significant"),
    ]


@styled
def coupling_profile(coupling_df: pd.DataFrame, title: str) -> Figure:
    """Coupling effect (boundary vs interior unit gain) vs boundary depth; filled = FDR-significant.

    Columns: ``layer``, ``boundary`` (pre_attn / pre_mlp; without it x is the layer), an effect
    column (``effect_log_median_ratio``, ``effect`` or ``rank_biserial``) and ``significant``
    (or ``q_value`` ≤ 0.05); optional ``ckpt``/``checkpoint`` (and ``model``): one line each.
    One axes.
    """
    df = check_frame(coupling_df, "coupling table")
    if df.empty:
        return empty_figure(title, B_LABEL, "coupling effect", "the coupling table")
    eff = pick(df, EFFECT_COLUMNS, "coupling table")
    require(df, ["layer"], "coupling table")
    sig = _significance(df)
    x, _, xl = boundary_x(df)
    y = num(df[eff])
    groups, lab = group_column(df)
    if groups is None:
        groups, lab = ["boundaries"], np.array(["boundaries"] * len(df), dtype=object)
    fig, (ax,) = new_figure(1, panel=(5.6, 3.4))
    ax.axhline(0, color="0.5", lw=0.8)
    for i, g in enumerate(groups):
        m = lab == g
        order = np.argsort(np.nan_to_num(x[m], nan=np.inf), kind="stable")
        xg, yg, sg = x[m][order], y[m][order], sig[m][order]
        color = PALETTE[i % len(PALETTE)]
        marker = MARKERS[i % len(MARKERS)]
        ax.plot(xg, yg, color=color, lw=1.0, label=str(g))
        ax.plot(xg[sg], yg[sg], ls="none", marker=marker, ms=5, color=color, mfc=color)
        ax.plot(xg[~sg], yg[~sg], ls="none", marker=marker, ms=5, color=color, mfc="white")
    ax.set_xlabel(xl)
    ax.set_ylabel(metric_label(eff))
    add_legend(ax, loc="best", extra=_sig_handles())
    fig.suptitle(title)
    return fig


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``a``, ties getting their mean rank (as ``scipy.stats.rankdata``)."""
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    first = np.r_[True, sorted_a[1:] != sorted_a[:-1]]
    group = np.cumsum(first) - 1  # tie group of each sorted position
    bounds = np.r_[np.flatnonzero(first), len(a)]  # start of each group, then n
    ranks = np.empty(len(a))
    ranks[order] = 0.5 * (bounds[group] + bounds[group + 1] + 1)
    return ranks


def _spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float, int]:
    """Spearman ρ (Pearson r of average ranks) and its two-sided p from t = ρ √((n−2)/(1−ρ²))
    on n−2 degrees of freedom, as ``scipy.stats.spearmanr`` computes them (without importing
    scipy.stats: half a second of every figure job's start)."""
    ok = np.isfinite(x) & np.isfinite(y)
    n = int(ok.sum())
    if n < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan"), float("nan"), n
    from scipy.special import stdtr

    rho = float(np.corrcoef(_average_ranks(x[ok]), _average_ranks(y[ok]))[0, 1])
    dof = n - 2
    with np.errstate(divide="ignore"):
        t = (
            rho * math.sqrt(max(dof / ((rho + 1.0) * (1.0 - rho)), 0.0))
            if abs(rho) < 1
            else math.copysign(math.inf, rho)
        )
    return rho, float(2.0 * stdtr(dof, -abs(t))), n


def _rho_text(rho: float, p: float, n: int) -> str:
    return f"Spearman ρ = {fmt_num(rho, 2)} (p = {fmt_num(p, 2)}, n = {n})"


@styled
def coupling_vs_henrici(coupling_df: pd.DataFrame, title: str) -> Figure:
    """Coupling effect vs Henrici departure, Spearman ρ in the legend (per checkpoint if given).

    Columns: a Henrici column (``henrici``, ``henrici_departure``, ``henrici_J`` or
    ``henrici_single``), an effect column (as :func:`coupling_profile`), optionally
    ``significant``/``q_value`` (filled/hollow) and ``ckpt``/``checkpoint``. One axes.
    """
    df = check_frame(coupling_df, "coupling table")
    if df.empty:
        return empty_figure(title, "Henrici departure", "coupling effect", "the coupling table")
    eff = pick(df, EFFECT_COLUMNS, "coupling table")
    hen = pick(df, HENRICI_COLUMNS, "coupling table")
    x, y = num(df[hen]), num(df[eff])
    try:
        sig = _significance(df)
    except ValueError:
        sig = None
    groups, lab = group_column(df)
    fig, (ax,) = new_figure(1, panel=(4.8, 3.6))
    ax.axhline(0, color="0.6", lw=0.7)
    if groups is None:
        groups, lab = [None], np.array([None] * len(df), dtype=object)
    for i, g in enumerate(groups):
        m = lab == g if g is not None else np.ones(len(df), dtype=bool)
        color = PALETTE[i % len(PALETTE)]
        marker = MARKERS[i % len(MARKERS)]
        rho, p, n = _spearman(x[m], y[m])
        label = _rho_text(rho, p, n) if g is None else f"{g}: {_rho_text(rho, p, n)}"
        filled = sig[m] if sig is not None else np.ones(int(m.sum()), dtype=bool)
        # all points filled (the legend entry), then the non-significant ones hollow on top
        ax.plot(x[m], y[m], ls="none", marker=marker, ms=4.5, color=color, mfc=color, label=label)
        ax.plot(x[m][~filled], y[m][~filled], ls="none", marker=marker, ms=4.5, color=color, mfc="white")
    extra = []
    if len(groups) > 1:
        rho, p, n = _spearman(x, y)
        extra.append(Line2D([], [], ls="none", label="all: " + _rho_text(rho, p, n)))
    if sig is not None:
        extra += _sig_handles()
    ax.set_xlabel(metric_label(hen) if hen in METRIC_LABELS else f"Henrici departure ({hen})")
    ax.set_ylabel(metric_label(eff))
    add_legend(ax, loc="best", extra=extra)
    fig.suptitle(title)
    return fig


#: Count and total columns, study A's unit (layers) first; the others are read when a table has no layer count.
LAYER_COUNT_COLUMNS = ("n_significant_layers", *COUNT_COLUMNS)
LAYER_TOTAL_COLUMNS = ("n_layers", *TOTAL_COLUMNS)


@styled
def significant_counts(counts_df: pd.DataFrame, title: str) -> Figure:
    """Number of FDR-significant layers (study A's unit): bars per checkpoint, grouped by model.

    Columns: ``ckpt``/``checkpoint``, a count (``n_significant_layers``; for other tables
    ``n_significant``, ``significant``, ``count`` or ``n_sig``), optionally ``model`` (groups) and
    a total (``n_layers``; else ``n_boundaries``, ``n_tests`` or ``n_total``: bars annotated
    "count/total"). Checkpoints keep the table's order. One axes.
    """
    df = check_frame(counts_df, "significance counts")
    if df.empty:
        return empty_figure(title, "model", "FDR-significant layers (count)", "the significance counts")
    ck = pick(df, CKPT_COLUMNS, "significance counts")
    cnt = pick(df, LAYER_COUNT_COLUMNS, "significance counts")
    tot = pick(df, LAYER_TOTAL_COLUMNS, "significance counts", required=False)
    yl = f"FDR-significant {'layers' if cnt == 'n_significant_layers' else 'tests'} (count)"
    models = ordered_unique(df["model"].astype(str)) if "model" in df.columns else [""]
    ckpts = ordered_unique(df[ck].astype(str))
    mcol = df["model"].astype(str).to_numpy() if "model" in df.columns else np.array([""] * len(df))
    ccol = df[ck].astype(str).to_numpy()
    counts, totals = num(df[cnt]), (num(df[tot]) if tot else None)
    width = 0.8 / len(ckpts)
    fig, (ax,) = new_figure(1, panel=(max(3.6, 1.1 * len(models) * max(1, len(ckpts)) ** 0.5 + 2.0), 3.2))
    hatches = ("", "//", "..", "xx", "\\\\", "oo")
    for j, c in enumerate(ckpts):
        xs, hs, ts = [], [], []
        for i, mname in enumerate(models):
            m = (mcol == mname) & (ccol == c)
            if m.any():
                xs.append(i - 0.4 + width * (j + 0.5))
                hs.append(float(counts[m][0]))
                ts.append(float(totals[m][0]) if totals is not None else float("nan"))
        if not xs:
            continue
        bars = ax.bar(
            xs,
            np.nan_to_num(hs, nan=0.0),
            width=width * 0.92,
            color=PALETTE[j % len(PALETTE)],
            hatch=hatches[j % len(hatches)],
            edgecolor="white",
            lw=0.5,
            label=c,
        )
        for b, h, t in zip(bars, hs, ts):
            text = "n/a" if not np.isfinite(h) else (f"{h:g}/{t:g}" if np.isfinite(t) else f"{h:g}")
            ax.annotate(
                text,
                (b.get_x() + b.get_width() / 2, b.get_height()),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=5.5,
            )
    ax.set_xticks(range(len(models)), models if models != [""] else ["all"])
    ax.set_xlim(-0.6, len(models) - 0.4)
    ax.set_xlabel("model")
    ax.set_ylabel(yl)
    ax.margins(y=0.15)
    add_legend(ax, loc="best", title="checkpoint", title_fontsize=6.5)
    fig.suptitle(title)
    return fig


@styled
def partition_similarity_plot(similarity_df: pd.DataFrame, title: str) -> Figure:
    """Communities compared across checkpoints: NMI and adjusted Rand vs boundary depth, one line
    per pair of checkpoints, and each checkpoint's signed modularity.

    Columns (``partition_similarity.tsv``, :func:`resdyn.study_a.partitions.partition_similarity`):
    ``ckpt``, ``layer``, ``boundary``, ``reference_ckpt``, ``nmi``, ``ari``, ``modularity``. A
    checkpoint compared with itself (1 by definition) is not drawn, and each unordered pair once
    (both indices are symmetric). Three axes: NMI, ARI, modularity.
    """
    df = check_frame(similarity_df, "partition similarity")
    if df.empty:
        return empty_figure(title, B_LABEL, "NMI", "the partition similarity table")
    require(df, ["ckpt", "layer", "reference_ckpt", "nmi", "ari", "modularity"], "partition similarity")
    x, _, xl = boundary_x(df)
    xl = r"boundary index (2L: $h_L$, 2L+1: $m_L$)" if xl == B_LABEL else xl  # B_LABEL is too wide for 3 panels
    ckpt, ref = df["ckpt"].astype(str).to_numpy(), df["reference_ckpt"].astype(str).to_numpy()
    fig, axes = new_figure(3, ncols=3, panel=(3.4, 2.8))
    pairs: list[tuple[str, str]] = []
    for a, b in zip(ckpt, ref):
        if a != b and (a, b) not in pairs and (b, a) not in pairs:
            pairs.append((a, b))
    for ax, col, label in ((axes[0], "nmi", "normalised mutual information"), (axes[1], "ari", "adjusted Rand index")):
        y = num(df[col])
        for i, (a, b) in enumerate(pairs):
            m = (ckpt == a) & (ref == b)
            order = np.argsort(np.nan_to_num(x[m], nan=np.inf), kind="stable")
            ax.plot(
                x[m][order],
                y[m][order],
                color=PALETTE[i % len(PALETTE)],
                marker=MARKERS[i % len(MARKERS)],
                ms=3.5,
                lw=1.0,
                ls=LINESTYLES[i % len(LINESTYLES)],
                label=f"{a} vs {b}",
            )
        if not pairs:
            ax.text(
                0.5,
                0.5,
                "one checkpoint: nothing to compare",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=8,
                color="0.35",
            )
        finite = y[np.isfinite(y)]
        ax.set_ylim(min(0.0, float(finite.min()) if finite.size else 0.0) - 0.05, 1.05)  # both indices are ≤ 1
        ax.set_xlabel(xl)
        ax.set_ylabel(label)
        add_legend(ax, loc="best", fontsize=6)
    mod = num(df["modularity"])
    once = ~df.duplicated([c for c in ("ckpt", "layer", "boundary") if c in df.columns]).to_numpy()
    for i, c in enumerate(ordered_unique(ckpt)):
        m = (ckpt == c) & once  # a checkpoint's modularity is on each of its reference rows: draw it once
        order = np.argsort(np.nan_to_num(x[m], nan=np.inf), kind="stable")
        axes[2].plot(
            x[m][order],
            mod[m][order],
            color=PALETTE[i % len(PALETTE)],
            marker=MARKERS[i % len(MARKERS)],
            ms=3.5,
            lw=1.0,
            label=c,
        )
    axes[2].set_xlabel(xl)
    axes[2].set_ylabel("signed modularity")
    add_legend(axes[2], loc="best", title="checkpoint", title_fontsize=6.5, fontsize=6)
    fig.suptitle(title)
    return fig
