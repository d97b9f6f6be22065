"""Study B figures: lens quality, RSS profile with phase cuts, resolution sweep, phase metrics and
phase width vs depth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from resdyn.plots.common import (
    add_legend,
    as_bool,
    check_frame,
    empty_figure,
    finite_values,
    fmt_num,
    metric_label,
    note,
    num,
    opt_int,
    ordered_unique,
    pick,
    reason_note,
    require,
    select_metrics,
    sequential_colors,
    shade_phases,
)
from resdyn.plots.style import (
    LINESTYLES,
    MARKERS,
    PALETTE,
    PHASE_COLORS,
    PHASE_MARKERS,
    PHASE_NAMES,
    new_figure,
    styled,
)

_LENS_STYLE = {"tuned": (PALETTE[0], "-", "o"), "logit": (PALETTE[1], "--", "s")}


@styled
def lens_curves(metrics_df: pd.DataFrame, curves_df: pd.DataFrame | None, title: str) -> Figure:
    """KL, cross-entropy, Hit@1 and Hit@5 vs layer (tuned lens solid, logit lens dashed), and the
    held-out KL of the fit against training tokens seen.

    Columns of ``metrics_df`` (``lens_metrics.tsv``, :func:`resdyn.study_b.lens.lens_metrics`):
    ``lens``, ``layer``, ``kl``, ``ce``, ``hit1``, ``hit5``. ``curves_df`` (the lens folder's
    ``curves.tsv``, :meth:`resdyn.artifacts.LensFolder.read_curves`): ``tokens_seen``, ``layer``,
    ``split``, ``kl``; None or empty (an imported lens) leaves a note. Six axes (3 × 2): the four
    metrics, then the held-out KL per layer, and the mean over layers of held-out and train KL,
    against tokens seen: a curve still falling at its end says the lens had not converged.
    """
    df = check_frame(metrics_df, "lens metrics")
    xl = "layer L (stream entering layer L; L = n: model output)"
    if df.empty:
        return empty_figure(title, xl, "lens metric", "the lens metrics")
    cols = ["kl", "ce", "hit1", "hit5"]
    require(df, ["lens", "layer", *cols], "lens metrics")
    lenses = ordered_unique(df["lens"].astype(str))
    fig, axes = new_figure(6, ncols=2, panel=(3.4, 2.4))
    for ax, col in zip(axes, cols):
        for i, name in enumerate(lenses):
            g = df[df["lens"].astype(str) == name]
            g = g.assign(_l=num(g["layer"])).sort_values("_l", kind="stable")
            color, ls, marker = _LENS_STYLE.get(
                name, (PALETTE[(i + 2) % len(PALETTE)], LINESTYLES[i % 4], MARKERS[i % 10])
            )
            ax.plot(
                g["_l"].to_numpy(), num(g[col]), color=color, ls=ls, marker=marker, ms=3, lw=1.1, label=f"{name} lens"
            )
        if col.startswith("hit"):
            ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel(xl, fontsize=6.5)
        ax.set_ylabel(metric_label(col), fontsize=6.5)
    add_legend(axes[0], loc="best")
    _fit_curves(axes[4], axes[5], curves_df)
    fig.suptitle(title)
    return fig


def _fit_curves(ax_layers, ax_mean, curves_df: pd.DataFrame | None) -> None:
    """Held-out KL per layer (sequential colours, layer 0 darkest) and the layer mean of held-out
    (solid) and train (dashed) KL, against training tokens seen (``curves.tsv``)."""
    xl = "training tokens seen"
    for ax, yl in ((ax_layers, "held-out KL per layer"), (ax_mean, "KL, mean over layers")):
        ax.set_xlabel(xl, fontsize=6.5)
        ax.set_ylabel(yl, fontsize=6.5)
    c = None if curves_df is None else check_frame(curves_df, "lens curves")
    if c is None or c.empty:
        for ax in (ax_layers, ax_mean):
            note(ax, "no training curve (an imported lens)")
        return
    require(c, ["tokens_seen", "layer", "split", "kl"], "lens curves")
    c = c.assign(_t=num(c["tokens_seen"]), _l=num(c["layer"]), _kl=num(c["kl"]))
    held = c[c["split"].astype(str) == "heldout"]
    layers = sorted(set(finite_values(held["_l"].to_numpy()).tolist()))
    for layer, color in zip(layers, sequential_colors(len(layers))):
        g = held[held["_l"] == layer].sort_values("_t", kind="stable")
        ax_layers.plot(g["_t"].to_numpy(), g["_kl"].to_numpy(), color=color, lw=0.9, label=f"L = {layer:g}")
    for split, ls, color in (("heldout", "-", PALETTE[0]), ("train", "--", PALETTE[1])):
        g = c[c["split"].astype(str) == split].groupby("_t", sort=True)["_kl"].mean()
        if len(g):
            ax_mean.plot(g.index.to_numpy(), g.to_numpy(), color=color, ls=ls, marker="o", ms=2.5, lw=1.1, label=split)
    if len(layers) <= 12:
        add_legend(ax_layers, loc="best", fontsize=5)
    add_legend(ax_mean, loc="best")


@styled
def rss_profile_plot(rss_df: pd.DataFrame, phases: Mapping[str, Any] | None, title: str) -> Figure:
    """RSS profile vs layer, one line per k; the phase cut (b1, peak, b2) and phases marked.

    Columns (``rss.tsv``, :func:`resdyn.study_b.readout.rss_profile`): ``layer``, ``rss`` and ``k``
    and/or ``k_fraction``. ``phases`` (``phases.json``, :func:`resdyn.study_b.phases.cutpoints`):
    keys ``b1``, ``b2``, ``peak`` (int or None), ``reason``; optional ``k`` (the line used for
    the cut, drawn thicker) and ``smoothed`` (drawn dotted). One axes.
    """
    df = check_frame(rss_df, "RSS table")
    xl = r"layer L (RSS of readout subspaces $S_L$ vs $S_{L+1}$)"
    yl = r"RSS $=\frac{1}{k}\sum_i\cos\theta_i$"
    if df.empty:
        return empty_figure(title, xl, yl, "the RSS table")
    require(df, ["layer", "rss"], "RSS table")
    key = pick(df, ("k", "k_fraction"), "RSS table")
    d = df.assign(_l=num(df["layer"]), _key=num(df[key]))
    values = sorted(set(finite_values(d["_key"].to_numpy()).tolist()))
    colors = sequential_colors(len(values))
    cut_k = opt_int((phases or {}).get("k")) if isinstance(phases, Mapping) else None
    fig, (ax,) = new_figure(1, panel=(5.6, 3.6))
    layers = finite_values(d["_l"].to_numpy())
    x_end = float(layers.max()) if layers.size else float("nan")
    if isinstance(phases, Mapping) and opt_int(phases.get("n")) is not None:
        x_end = float(opt_int(phases.get("n")) - 1)
    shade_phases(ax, phases, x_end)
    for v, color in zip(values, colors):
        g = d[d["_key"] == v].sort_values("_l", kind="stable")
        if key == "k":
            label = f"k = {v:g}"
            if "k_fraction" in g.columns and np.isfinite(num(g["k_fraction"])).any():
                label += f" ({np.nanmean(num(g['k_fraction'])):.0%} of d)"
        else:
            label = f"k = {v:.0%} of d"
        used = key == "k" and cut_k is not None and int(round(v)) == cut_k
        ax.plot(
            g["_l"].to_numpy(),
            num(g["rss"]),
            color=color,
            lw=2.4 if used else 1.1,
            marker="o",
            ms=3.5 if used else 2.5,
            label=label + (" (phase cut)" if used else ""),
            zorder=3 if used else 2,
        )
    smoothed = (phases or {}).get("smoothed") if isinstance(phases, Mapping) else None
    if isinstance(smoothed, (list, tuple, np.ndarray)) and len(smoothed):
        sm = num(np.asarray(smoothed, dtype=object))
        ax.plot(np.arange(sm.size), sm, color="black", ls=":", lw=1.0, label="smoothed (cut profile)", zorder=4)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    add_legend(ax, loc="best", ncols=2)
    reason_note(fig, phases)
    fig.suptitle(title)
    return fig


@styled
def resolution_frontier(res_df: pd.DataFrame, title: str) -> Figure:
    """Resolution sweep: energy vs visibility per k, Pareto-optimal k highlighted and connected.

    Columns (``resolution.tsv``, :func:`resdyn.study_b.readout.resolution_table`): ``energy``,
    ``visibility``, ``k`` (labels; or ``k_fraction``) and ``pareto`` (computed when absent).
    One axes.
    """
    df = check_frame(res_df, "resolution table")
    xl = r"energy: mean top-k share of $\sum\sigma^2$ of $A_L$"
    yl = "visibility: 1 − mean RSS"
    if df.empty:
        return empty_figure(title, xl, yl, "the resolution table")
    require(df, ["energy", "visibility"], "resolution table")
    e, v = num(df["energy"]), num(df["visibility"])
    if "pareto" in df.columns:
        front = as_bool(df["pareto"])
    else:
        from resdyn.study_b.readout import pareto_front

        front = pareto_front(e, v)
    fig, (ax,) = new_figure(1, panel=(4.8, 3.6))
    ax.plot(e, v, ls="none", marker="o", ms=5, color="0.45", mfc="white", label="k in the sweep")
    order = np.argsort(np.where(front, e, np.inf), kind="stable")[: int(front.sum())]
    ax.plot(e[order], v[order], color=PALETTE[3], marker="o", ms=5.5, lw=1.3, label="Pareto front", zorder=3)
    if "k" in df.columns or "k_fraction" in df.columns:
        ks = num(df["k"]) if "k" in df.columns else num(df["k_fraction"])
        fr = num(df["k_fraction"]) if "k_fraction" in df.columns else np.full(len(df), np.nan)
        for xi, yi, k, f in zip(e, v, ks, fr):
            if np.isfinite(xi) and np.isfinite(yi):
                text = f"k={k:g}" if "k" in df.columns else f"{k:.0%}"
                if "k" in df.columns and np.isfinite(f):
                    text += f" ({f:.0%})"
                ax.annotate(text, (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=5.5)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    add_legend(ax, loc="best")
    fig.suptitle(title)
    return fig


DEFAULT_PHASE_METRICS = ("hidden_erank", "update_orthogonality", "norm_ratio", "relative_update_norm")


@styled
def phase_metric_profiles(
    geometry_df: pd.DataFrame, phases: Mapping[str, Any] | None, metrics: Sequence[str] | None = None, title: str = ""
) -> Figure:
    """Each metric vs layer with the three phases shaded (phase 3 extends to the last row).

    Columns (``layer_geometry``, :func:`resdyn.study_b.geometry.layer_geometry`, possibly joined with
    lens columns): ``layer`` and the ``metrics`` (default: those of ``hidden_erank``,
    ``update_orthogonality``, ``norm_ratio``, ``relative_update_norm`` present). One axes per
    metric.
    """
    df = check_frame(geometry_df, "geometry table")
    metrics = select_metrics(df, metrics, DEFAULT_PHASE_METRICS, "geometry table")
    xl = "layer L"
    if df.empty:
        return empty_figure(title, xl, ", ".join(metrics), "the geometry table")
    require(df, ["layer", *metrics], "geometry table")
    d = df.assign(_l=num(df["layer"])).sort_values("_l", kind="stable")
    x = d["_l"].to_numpy()
    xf = finite_values(x)
    x_end = float(xf.max()) if xf.size else float("nan")
    fig, axes = new_figure(len(metrics), ncols=1 if len(metrics) <= 3 else 2, panel=(4.6, 2.0), sharex=True)
    for i, (ax, metric) in enumerate(zip(axes, metrics)):
        shade_phases(ax, phases, x_end, label=i == 0)
        ax.plot(x, num(d[metric]), color="black", marker="o", ms=3, lw=1.1, label=None, zorder=3)
        ax.set_xlabel(xl)
        ax.set_ylabel(metric_label(metric), fontsize=6.5)
    add_legend(axes[0], loc="best", ncols=2)
    reason_note(fig, phases)
    fig.suptitle(title)
    return fig


@styled
def phase_width_scaling(widths_df: pd.DataFrame, fits_df: pd.DataFrame | None, title: str) -> Figure:
    """Phase width vs model depth per phase, with the OLS lines and slope ± CI in the legend.

    ``widths_df``: ``n_layers``, ``phase``, ``width`` (``model`` optional).
    ``fits_df`` (:func:`resdyn.study_b.geometry.depth_scaling`): ``phase``, ``status``, ``slope``,
    ``intercept``, ``slope_ci_low``, ``slope_ci_high``; phases whose status is not ``ok``
    (e.g. ``too_few_depths``) get points only. One axes.
    """
    df = check_frame(widths_df, "phase widths")
    xl = "model depth (number of layers)"
    yl = "phase width (RSS-profile points = layers)"
    if df.empty:
        return empty_figure(title, xl, yl, "the phase-width table")
    require(df, ["n_layers", "phase", "width"], "phase widths")
    fits: dict[Any, dict] = {}
    if fits_df is not None:
        fits_df = check_frame(fits_df, "phase-width fits")
        if not fits_df.empty:
            require(fits_df, ["phase", "slope", "intercept"], "phase-width fits")
            for rec in fits_df.to_dict("records"):
                fits[opt_int(rec["phase"]) if opt_int(rec["phase"]) is not None else rec["phase"]] = rec
    nl, w = num(df["n_layers"]), num(df["width"])
    ph_raw = df["phase"].tolist()
    ph = np.array([opt_int(p) if opt_int(p) is not None else p for p in ph_raw], dtype=object)
    phases = sorted(set(ph.tolist()) | set(fits), key=lambda p: (not isinstance(p, int), str(p)))
    fig, (ax,) = new_figure(1, panel=(5.0, 3.6))
    x_fin = finite_values(nl)
    for i, p in enumerate(phases):
        color = PHASE_COLORS.get(p, PALETTE[(i + 5) % len(PALETTE)])
        marker = PHASE_MARKERS.get(p, MARKERS[i % len(MARKERS)])
        name = f"phase {p} ({PHASE_NAMES[p]})" if p in PHASE_NAMES else f"phase {p}"
        m = ph == p
        fit = fits.get(p)
        status = str(fit.get("status", "ok")) if fit else None
        slope = num([fit.get("slope")])[0] if fit else float("nan")
        icpt = num([fit.get("intercept")])[0] if fit else float("nan")
        ok = fit is not None and status in ("ok", "nan") and np.isfinite(slope) and np.isfinite(icpt)
        if ok:
            lo = num([fit.get("slope_ci_low")])[0]
            hi = num([fit.get("slope_ci_high")])[0]
            ci = f" [{fmt_num(lo, 3)}, {fmt_num(hi, 3)}]" if np.isfinite(lo) and np.isfinite(hi) else ""
            label = f"{name}: slope {fmt_num(slope, 3)}{ci} (CI)"
        elif fit is not None:
            label = f"{name}: not fitted ({status})"
        else:
            label = name
        ax.plot(nl[m], w[m], ls="none", marker=marker, ms=5, color=color, label=label, zorder=3)
        if ok and x_fin.size:
            xs = np.array([x_fin.min(), x_fin.max()])
            ax.plot(xs, icpt + slope * xs, color=color, lw=1.2, ls=LINESTYLES[i % 4], zorder=2)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    add_legend(ax, loc="best")
    fig.suptitle(title)
    return fig
