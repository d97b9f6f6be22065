"""Figures beyond the two studies: the bridge profiles, the causal test and bootstrap uncertainty."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from resdyn.plots.common import check_frame, empty_figure, num, shade_phases
from resdyn.plots.style import new_figure, styled


@styled
def bridge_profiles(bridge_df: pd.DataFrame, phases: Mapping[str, Any] | None = None, title: str = "") -> Figure:
    """Both studies' profiles on one depth axis (layer L), the RSS phases shaded.

    Panels: RSS at the phase k; Jacobian transport of S_L into S_{L+1} with the random-subspace
    mean ± sd and the chance level k/d; complex fraction and Henrici departure (attn, mlp);
    cumulative effective rank. Columns from :func:`resdyn.beyond.bridge.bridge_tables`.
    """
    df = check_frame(bridge_df, "bridge table")
    if df.empty:
        return empty_figure(title, "layer L", "value", "the bridge table")
    missing = [
        c
        for c in (
            "layer",
            "rss",
            "transport",
            "random_mean",
            "random_sd",
            "complex_frac_attn",
            "complex_frac_mlp",
            "henrici_attn",
            "henrici_mlp",
            "cum_erank",
        )
        if c not in df
    ]
    if missing:
        raise ValueError(f"bridge table lacks columns {missing}; has {list(df.columns)}")
    x = num(df["layer"])
    fig, axes = new_figure(4, panel=(6.0, 1.9), sharex=True)
    axes[0].plot(x, num(df["rss"]), marker="o", label="RSS at the phase k")
    axes[0].set_ylabel("RSS")
    mean, sd = num(df["random_mean"]), num(df["random_sd"])
    axes[1].plot(x, num(df["transport"]), marker="o", label="readout subspace S_L")
    axes[1].plot(x, mean, color="grey", label="random k-subspaces (mean ± sd)")
    axes[1].fill_between(x, mean - sd, mean + sd, color="grey", alpha=0.25)
    if "chance" in df:
        axes[1].axhline(float(num(df["chance"])[0]), color="k", ls=":", lw=1, label="chance k/d")
    axes[1].set_ylabel("transport\n‖P₊ J V‖²/‖J V‖²")
    for kind, ls in (("attn", "-"), ("mlp", "--"), ("layer", ":")):
        if f"complex_frac_{kind}" not in df:
            continue
        axes[2].plot(x, num(df[f"complex_frac_{kind}"]), ls=ls, marker="o", label=f"complex fraction ({kind})")
        axes[2].plot(x, num(df[f"henrici_{kind}"]), ls=ls, marker="s", label=f"Henrici ({kind})")
    axes[2].set_ylabel("operator type")
    axes[3].plot(x, num(df["cum_erank"]), marker="o", label="cumulative erank after layer L")
    axes[3].set_ylabel("cum. eff. rank")
    axes[3].set_xlabel("layer L")
    end = float(np.nanmax(x)) if len(x) else 0.0
    for ax in axes:
        shade_phases(ax, phases, end, label=ax is axes[0])
        ax.legend(fontsize="x-small", loc="best")
    fig.suptitle(title)
    return fig


@styled
def causal_effects(causal_df: pd.DataFrame, title: str = "") -> Figure:
    """Causal test per layer: KL and top-1 flip rate after projecting off (or patching) S_L^(k),
    against random k-subspaces (mean ± sd). Columns from :func:`resdyn.beyond.causal.causal_table`."""
    df = check_frame(causal_df, "causal table")
    if df.empty:
        return empty_figure(title, "layer L", "KL", "the causal table")
    missing = [
        c
        for c in ("layer", "intervention", "kl", "flip_rate", "random_kl_mean", "random_kl_sd", "random_flip_mean")
        if c not in df
    ]
    if missing:
        raise ValueError(f"causal table lacks columns {missing}; has {list(df.columns)}")
    fig, axes = new_figure(2, ncols=2, panel=(4.0, 3.0))
    for i, (name, sub) in enumerate(df.groupby("intervention", sort=False)):
        color = f"C{i}"
        x = num(sub["layer"])
        axes[0].plot(x, num(sub["kl"]), marker="o", color=color, label=f"{name}: readout subspace")
        m, s = num(sub["random_kl_mean"]), num(sub["random_kl_sd"])
        axes[0].plot(x, m, ls="--", color=color, label=f"{name}: random (mean ± sd)")
        axes[0].fill_between(x, m - s, m + s, color=color, alpha=0.15)
        axes[1].plot(x, num(sub["flip_rate"]), marker="o", color=color, label=f"{name}: readout subspace")
        axes[1].plot(x, num(sub["random_flip_mean"]), ls="--", color=color, label=f"{name}: random")
    axes[0].set_ylabel("KL(p_orig ‖ p_mod) (nats)")
    axes[1].set_ylabel("top-1 flip rate")
    for ax in axes:
        ax.set_xlabel("layer L (stream entering L)")
        ax.legend(fontsize="x-small")
    if (df["kl"] > 0).all() and (df["random_kl_mean"] > 0).all():
        axes[0].set_yscale("log")
    fig.suptitle(title)
    return fig


@styled
def uncertainty_bands(boot_df: pd.DataFrame, title: str = "") -> Figure:
    """Bootstrap percentile intervals of the Jacobian metrics vs depth s (bands), one panel per
    metric with a per-sublayer estimate (``bootstrap.tsv``; rows without a layer are skipped)."""
    df = check_frame(boot_df, "bootstrap table")
    need = [c for c in ("metric", "s", "estimate", "ci_low", "ci_high") if c not in df]
    if need:
        raise ValueError(f"bootstrap table lacks columns {need}; has {list(df.columns)}")
    df = df[pd.to_numeric(df["s"], errors="coerce").notna()]
    metrics = list(dict.fromkeys(df["metric"]))
    if not metrics:
        return empty_figure(title, "sublayer depth index s", "value", "per-sublayer bootstrap rows")
    fig, axes = new_figure(len(metrics), panel=(6.0, 2.2), sharex=True)
    for ax, metric in zip(axes, metrics):
        sub = df[df["metric"] == metric].sort_values("s")
        x = num(sub["s"])
        ax.plot(x, num(sub["estimate"]), marker="o", label="estimate")
        ax.fill_between(
            x,
            num(sub["ci_low"]),
            num(sub["ci_high"]),
            alpha=0.3,
            label=f"{float(num(sub['level'])[0]) if 'level' in sub else 0.95:.0%} bootstrap CI",
        )
        ax.set_ylabel(metric)
        ax.legend(fontsize="x-small")
    axes[-1].set_xlabel("sublayer depth index s (2L: attention, 2L+1: MLP)")
    fig.suptitle(title)
    return fig
