"""Study A figures from the Jacobian spectra.

Eigenvalues, operator type, cumulative bottleneck, Schur surgery and the comparison of checkpoints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from resdyn.plots.common import (
    add_legend,
    check_frame,
    empty_figure,
    finite_values,
    fmt_num,
    kind_handles,
    kind_of,
    log_if_positive,
    metric_label,
    num,
    ordered_unique,
    pick,
    plot_kinds,
    require,
    select_metrics,
    sequential_colors,
)
from resdyn.plots.style import (
    CKPT_COLUMNS,
    KIND_STYLE,
    LINESTYLES,
    LOG_METRICS,
    MARKERS,
    PALETTE,
    S_LABEL,
    new_figure,
    styled,
)

_GROUP_RE = re.compile(r"^L(\d+)_(attn|mlp|layer)$")


@styled
def eigenvalue_grid(
    spectra: Mapping[str, Mapping[str, np.ndarray]], title: str, layers_per_row: int | None = None
) -> Figure:
    """Eigenvalues of each sublayer Jacobian in the complex plane, with the unit circle.

    ``spectra``: {``L{layer:03d}_{kind}``: {``eigenvalues``: complex array, …}} as returned
    (first element) by :meth:`resdyn.artifacts.SpectraArrays.read`; the ``(arrays, attrs)`` tuple
    is accepted too. Panels: row = layer, columns attention | MLP; deeper models wrap
    ``layers_per_row`` layers (default: 1 up to 8 layers, else 4) into each row. One axes
    per sublayer present, equal aspect, title with the spectral radius ρ.
    """
    items = _eigenvalue_items(spectra)
    if not items:
        return empty_figure(title, r"Re $\lambda$", r"Im $\lambda$", "the spectra")
    layers = sorted({t[0] for t in items})
    per_row = layers_per_row or (1 if len(layers) <= 8 else 4)
    per_row = max(1, min(int(per_row), len(layers)))
    ncols = 2 * per_row
    nrows = math.ceil(len(layers) / per_row)
    side = 1.55 if per_row > 1 else 1.75
    fig = Figure(figsize=(max(4.6, side * ncols + 0.3), side * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(nrows, ncols, squeeze=False)
    used = set()
    for layer, kind, lam in items:
        pos = layers.index(layer) * 2 + (0 if kind == "attn" else 1)
        r, c = divmod(pos, ncols)
        used.add((r, c))
        _eigenvalue_panel(grid[r, c], layer, kind, lam)
    _label_outer_panels(fig, grid, used, nrows)
    fig.suptitle(title)
    fig.supxlabel(
        r"eigenvalues $\lambda$ of the sublayer Jacobians; dashed: unit circle $|\lambda| = 1$",
        fontsize=6.5,
        color="0.3",
    )
    return fig


def _eigenvalue_items(spectra: Mapping[str, Mapping[str, np.ndarray]]) -> list[tuple[int, str, np.ndarray]]:
    """(layer, kind, eigenvalues as complex128) per group of ``spectra``, attention before MLP per layer.

    Accepts the ``(arrays, attrs)`` tuple of :meth:`resdyn.artifacts.SpectraArrays.read`; a group
    name not of the form ``L{layer:03d}_{kind}`` or a group without ``eigenvalues`` is one ValueError.
    """
    if isinstance(spectra, tuple) and len(spectra) == 2 and isinstance(spectra[0], Mapping):
        spectra = spectra[0]
    if not isinstance(spectra, Mapping):
        raise ValueError(f"spectra must be a dict {{'L000_attn': {{'eigenvalues': …}}}}, got {type(spectra).__name__}")
    items = []
    for name, group in spectra.items():
        m = _GROUP_RE.match(str(name))
        if not m:
            raise ValueError(f"spectra group {name!r} is not of the form L{{layer:03d}}_{{attn|mlp}}")
        if not isinstance(group, Mapping) or "eigenvalues" not in group:
            have = list(group) if isinstance(group, Mapping) else type(group).__name__
            raise ValueError(f"spectra[{name!r}] lacks 'eigenvalues'; it has {have}")
        lam = np.asarray(group["eigenvalues"]).ravel().astype(np.complex128)
        items.append((int(m.group(1)), m.group(2), lam))
    items.sort(key=lambda t: (t[0], t[1] != "attn"))
    return items


def _eigenvalue_panel(ax, layer: int, kind: str, lam: np.ndarray) -> None:
    """One sublayer's finite eigenvalues on ``ax``: unit circle, axes through 0, title with ρ.

    ρ = max |λ| over the finite eigenvalues (NaN if none); the square limits are
    ±1.12 · max(1, ρ).
    """
    theta = np.linspace(0, 2 * np.pi, 241)
    ok = np.isfinite(lam.real) & np.isfinite(lam.imag)
    radius = float(np.max(np.abs(lam[ok]))) if ok.any() else float("nan")
    lim = 1.12 * max(1.0, radius if np.isfinite(radius) else 1.0)
    ax.plot(np.cos(theta), np.sin(theta), color="0.45", lw=0.7, ls="--", zorder=1)
    ax.axhline(0, color="0.8", lw=0.5, zorder=0)
    ax.axvline(0, color="0.8", lw=0.5, zorder=0)
    style = KIND_STYLE[kind]
    ax.scatter(
        lam.real[ok],
        lam.imag[ok],
        s=5,
        color=style["color"],
        marker=style["marker"],
        alpha=0.7,
        lw=0,
        zorder=2,
        rasterized=True,
    )
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal", adjustable="box")
    ax.set_title(f"L{layer} {style['label']}  ρ={fmt_num(radius)}", fontsize=6.5)
    ax.tick_params(labelsize=5.5)
    ax.locator_params(nbins=4)  # small square panels: a few ticks read better (and lay out faster)


def _label_outer_panels(fig: Figure, grid: np.ndarray, used: set[tuple[int, int]], nrows: int) -> None:
    """Remove the unused axes of ``grid`` and label the outer panels.

    Re λ goes under the lowest panel of each column, Im λ beside the leftmost panel of each row.
    """
    for (r, c), ax in np.ndenumerate(grid):
        if (r, c) not in used:
            fig.delaxes(ax)
    for (r, c), ax in np.ndenumerate(grid):
        if (r, c) in used:
            below = any((rr, c) in used for rr in range(r + 1, nrows))
            if not below:
                ax.set_xlabel(r"Re $\lambda$", fontsize=7)
            left = any((r, cc) in used for cc in range(c))
            if not left:
                ax.set_ylabel(r"Im $\lambda$", fontsize=7)


def _tol_columns(df: pd.DataFrame, which: str) -> list[tuple[float, str]]:
    out = []
    for c in df.columns:
        m = re.match(rf"complex_frac_{which}_tol(.+)$", str(c))
        if m:
            try:
                out.append((float(m.group(1)), c))
            except ValueError:
                out.append((float("nan"), c))
    return sorted(out, key=lambda t: (np.nan_to_num(t[0], nan=np.inf), t[1]))


@styled
def operator_profile(spectra_df: pd.DataFrame, title: str) -> Figure:
    """Complex fraction, Henrici departure and self-alignment vs depth index s.

    Columns (``spectra.tsv``, :func:`resdyn.study_a.spectral.spectra_table`): ``s``, ``kind`` (or
    derived from s), ``complex_frac_J_tol*`` (and ``complex_frac_JmI_tol*``: dashed), ``henrici``
    (and ``henrici_JmI``), ``self_alignment_*``, optionally ``symmetry`` (and
    ``symmetry_minus_identity``: a fourth panel). Axes stacked (shared x); attention points filled
    circles, MLP hollow squares.
    """
    df = check_frame(spectra_df, "spectra table")
    if df.empty:
        return empty_figure(title, S_LABEL, "operator metrics", "the spectra table")
    require(df, ["s", "henrici"], "spectra table")
    j_cols, jmi_cols = _tol_columns(df, "J"), _tol_columns(df, "JmI")
    sa_cols = [c for c in ("self_alignment_kfrac", "self_alignment_k1", "self_alignment_kerank") if c in df.columns]
    sa_cols += [c for c in df.columns if str(c).startswith("self_alignment_") and c not in sa_cols]
    if not j_cols:
        raise ValueError(f"spectra table needs complex_frac_J_tol* columns; it has {list(df.columns)}")
    if not sa_cols:
        raise ValueError(f"spectra table needs self_alignment_* columns; it has {list(df.columns)}")
    d = df.assign(_s=num(df["s"])).sort_values("_s", kind="stable")
    s = d["_s"].to_numpy()
    kinds = kind_of(d, s)
    symmetry = "symmetry" in d.columns
    fig, axes = new_figure(4 if symmetry else 3, panel=(6.0, 2.1), sharex=True)
    ax = axes[0]
    tol_colors = {
        t: PALETTE[i % len(PALETTE)]
        for i, (t, _) in enumerate(j_cols + [x for x in jmi_cols if x[0] not in dict(j_cols)])
    }
    for tol, col in j_cols:
        plot_kinds(ax, s, num(d[col]), kinds, tol_colors[tol], "-", f"$J$, tol {col.split('_tol')[1]}")
    for tol, col in jmi_cols:
        plot_kinds(ax, s, num(d[col]), kinds, tol_colors[tol], "--", f"$J-I$, tol {col.split('_tol')[1]}")
    ax.set_ylabel("complex fraction\n" + r"share $|\mathrm{Im}\,\lambda|>\mathrm{tol}\cdot\max(1,|\lambda|)$")
    ax.set_ylim(-0.03, 1.03)
    add_legend(ax, loc="best", ncols=2, extra=kind_handles())
    ax = axes[1]
    plot_kinds(ax, s, num(d["henrici"]), kinds, PALETTE[0], "-", "$J$")
    if "henrici_JmI" in d.columns:
        plot_kinds(ax, s, num(d["henrici_JmI"]), kinds, PALETTE[1], "--", "$J-I$")
    ax.set_ylabel("Henrici departure\n" + r"$\sqrt{\|J\|_F^2-\sum|\lambda_i|^2}\,/\,\|J\|_F$")
    ax.set_ylim(-0.03, 1.03)
    add_legend(ax, loc="best")
    if symmetry:  # next to the Henrici departure: symmetric (= 0) implies normal, not conversely
        ax = axes[2]
        plot_kinds(ax, s, num(d["symmetry"]), kinds, PALETTE[0], "-", "$J$")
        if "symmetry_minus_identity" in d.columns:
            plot_kinds(ax, s, num(d["symmetry_minus_identity"]), kinds, PALETTE[1], "--", "$J-I$")
        ax.set_ylabel("symmetry index\n" + r"$\|J-J^\top\|_F\,/\,\|J\|_F$ (0 = symmetric)")
        ax.set_ylim(-0.05, 2.05)
        add_legend(ax, loc="best")
    ax = axes[-1]
    sa_names = {
        "self_alignment_kfrac": "k = fraction of d",
        "self_alignment_k1": "k = 1",
        "self_alignment_kerank": "k = round(erank)",
    }
    for i, col in enumerate(sa_cols):
        plot_kinds(ax, s, num(d[col]), kinds, PALETTE[i % len(PALETTE)], LINESTYLES[i % 4], sa_names.get(col, col))
    ax.set_ylabel("self-alignment\n" + r"$\|U_k^\top V_k\|_F^2/k$")
    ax.set_ylim(-0.03, 1.03)
    add_legend(ax, loc="best")
    axes[-1].set_xlabel(S_LABEL)
    for a in axes[:-1]:
        a.set_xlabel(S_LABEL)
        a.xaxis.label.set_visible(False)
    fig.suptitle(title)
    return fig


@styled
def funnel(bottleneck_df: pd.DataFrame, title: str) -> Figure:
    """Rank of the cumulative Jacobian P_s along depth (the bottleneck "funnel"), log y.

    Columns (``bottleneck.tsv``, :func:`resdyn.study_a.spectral.bottleneck_table`): ``s``, ``erank`` and
    optionally ``participation_ratio``, the single-sublayer references ``erank_single``,
    ``pr_single`` (dashed) and ``d`` (dotted: full rank). One axes.
    """
    df = check_frame(bottleneck_df, "bottleneck table")
    yl = r"rank of cumulative Jacobian $P_s = J_s\cdots J_0$ (log)"
    if df.empty:
        return empty_figure(title, S_LABEL, yl, "the bottleneck table")
    require(df, ["s", "erank"], "bottleneck table")
    d = df.assign(_s=num(df["s"])).sort_values("_s", kind="stable")
    s = d["_s"].to_numpy()
    fig, (ax,) = new_figure(1, panel=(5.2, 3.4))
    series = [
        ("erank", "effective rank erank($P_s$)", PALETTE[0], "-", "o"),
        ("participation_ratio", "participation ratio PR($P_s$)", PALETTE[1], "-", "^"),
        ("erank_single", "erank($J_s$) (single sublayer)", PALETTE[0], "--", "o"),
        ("pr_single", "PR($J_s$) (single sublayer)", PALETTE[1], "--", "^"),
    ]
    ys = []
    for col, label, color, ls, marker in series:
        if col in d.columns:
            y = num(d[col])
            ys.append(y)
            ax.plot(
                s,
                y,
                color=color,
                ls=ls,
                marker=marker,
                ms=3.5,
                lw=1.2,
                label=label,
                mfc=color if ls == "-" else "white",
            )
    if "d" in d.columns:
        dims = finite_values(num(d["d"]))
        if dims.size:
            ax.axhline(float(dims.max()), color="0.4", ls=":", lw=1.0, label=f"d = {int(dims.max())} (full rank)")
            ys.append(dims)
    log_if_positive(ax, *ys)
    ax.set_xlabel(S_LABEL)
    ax.set_ylabel(yl)
    add_legend(ax, loc="best")
    fig.suptitle(title)
    return fig


@styled
def schur_curves(schur_df: pd.DataFrame, title: str) -> Figure:
    """Cumulative effective rank vs s after Schur surgery, one line per α (sequential colours).

    Columns (``schur.tsv``, :func:`resdyn.study_a.schur.schur_bottleneck`): ``alpha``, ``s``, ``erank``.
    α = 1 is the unaltered Jacobian, α = 0 its normal part. One axes, log y.
    """
    df = check_frame(schur_df, "Schur table")
    yl = r"cumulative effective rank erank($P_s(\alpha)$) (log)"
    if df.empty:
        return empty_figure(title, S_LABEL, yl, "the Schur table")
    require(df, ["alpha", "s", "erank"], "Schur table")
    d = df.assign(_a=num(df["alpha"]), _s=num(df["s"]))
    alphas = sorted(set(finite_values(d["_a"].to_numpy()).tolist()))
    nan_alpha = d["_a"].isna().any()
    colors = sequential_colors(len(alphas))
    fig, (ax,) = new_figure(1, panel=(5.2, 3.4))
    ys = []
    for alpha, color in zip(alphas, colors):
        g = d[d["_a"] == alpha].sort_values("_s", kind="stable")
        y = num(g["erank"])
        ys.append(y)
        note = " (J)" if alpha == 1 else " (normal part)" if alpha == 0 else ""
        ax.plot(g["_s"].to_numpy(), y, color=color, marker="o", ms=3, lw=1.2, label=f"α = {alpha:g}{note}")
    if nan_alpha:
        g = d[d["_a"].isna()].sort_values("_s", kind="stable")
        ax.plot(g["_s"].to_numpy(), num(g["erank"]), color="0.5", ls=":", label="α = NaN")
    log_if_positive(ax, *ys)
    ax.set_xlabel(S_LABEL)
    ax.set_ylabel(yl)
    add_legend(ax, loc="best", title=r"$J(\alpha)=Q(\Lambda+\alpha N)Q^*$", title_fontsize=6.5)
    fig.suptitle(title)
    return fig


DEFAULT_CKPT_METRICS = ("complex_frac_J_tol1e-06", "henrici", "self_alignment_kfrac", "cum_erank")


@styled
def checkpoint_comparison(ckpt_df: pd.DataFrame, metrics: Sequence[str] | None = None, title: str = "") -> Figure:
    """One panel per metric vs s, one line per checkpoint in the order the table lists them.

    Columns (:func:`resdyn.study_a.spectral.checkpoint_table`): ``ckpt`` (or ``checkpoint``), ``s``
    and the ``metrics`` (default: the first ``complex_frac_J_tol*``, ``henrici``,
    ``self_alignment_kfrac``, ``cum_erank`` — those present). Cumulative ranks on log y.
    """
    df = check_frame(ckpt_df, "checkpoint table")
    tol = _tol_columns(df, "J")
    wanted = [
        "complex_frac_J_tol1e-06" if "complex_frac_J_tol1e-06" in df.columns else (tol[0][1] if tol else None),
        "henrici",
        "self_alignment_kfrac",
        "cum_erank",
    ]
    metrics = select_metrics(df, metrics, wanted, "checkpoint table", DEFAULT_CKPT_METRICS)
    if df.empty:
        return empty_figure(title, S_LABEL, ", ".join(metrics), "the checkpoint table")
    ck = pick(df, CKPT_COLUMNS, "checkpoint table")
    require(df, ["s", *metrics], "checkpoint table")
    ckpts = ordered_unique(df[ck].astype(str))
    fig, axes = new_figure(len(metrics), ncols=2 if len(metrics) > 1 else 1, panel=(3.5, 2.5), sharex=True)
    for ax, metric in zip(axes, metrics):
        ys = []
        for i, name in enumerate(ckpts):
            g = df[df[ck].astype(str) == name]
            g = g.assign(_s=num(g["s"])).sort_values("_s", kind="stable")
            y = num(g[metric])
            ys.append(y)
            ax.plot(
                g["_s"].to_numpy(),
                y,
                color=PALETTE[i % len(PALETTE)],
                marker=MARKERS[i % len(MARKERS)],
                ms=3,
                lw=1.1,
                label=name,
            )
        if metric in LOG_METRICS:
            log_if_positive(ax, *ys)
        ax.set_xlabel(S_LABEL, fontsize=6.5)
        ax.set_ylabel(metric_label(metric), fontsize=6.5)
    add_legend(axes[0], loc="best", title="checkpoint", title_fontsize=6.5)
    fig.suptitle(title)
    return fig
