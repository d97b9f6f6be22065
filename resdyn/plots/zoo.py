"""Figures of the zoo: training curves of the models the pipeline trains itself."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from resdyn.plots.common import add_legend, check_frame, empty_figure, num, require
from resdyn.plots.style import PALETTE, new_figure, styled


@styled
def training_curve(df: pd.DataFrame, title: str) -> Figure:
    """Train and held-out loss vs step; unigram baseline dashed.

    Columns: ``step``, ``train_loss``, ``heldout_loss`` and optionally ``unigram_loss``
    (:func:`resdyn.lm.zoo.train_zoo_model`). One axes.
    """
    df = check_frame(df, "training curve")
    xl, yl = "training step", "cross-entropy loss (nats/token)"
    if df.empty:
        return empty_figure(title, xl, yl, "the training curve")
    require(df, ["step", "train_loss", "heldout_loss"], "training curve")
    d = df.assign(_step=num(df["step"])).sort_values("_step", kind="stable")
    step = d["_step"].to_numpy()
    fig, (ax,) = new_figure(1, panel=(4.8, 3.2))
    ax.plot(
        step, num(d["train_loss"]), color=PALETTE[0], lw=1.2, marker=".", ms=3, label="train (mean since previous eval)"
    )
    ax.plot(step, num(d["heldout_loss"]), color=PALETTE[1], lw=1.2, marker="o", ms=3, label="held-out")
    if "unigram_loss" in d.columns:
        ax.plot(step, num(d["unigram_loss"]), color="0.35", ls="--", lw=1.0, label="unigram baseline (held-out)")
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    add_legend(ax, loc="upper right")
    fig.suptitle(title)
    return fig
