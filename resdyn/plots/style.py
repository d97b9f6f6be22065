"""Style of every figure: seaborn's whitegrid/paper look and colour-blind palette as constants, axis
labels of the pipeline's columns, and the decorator that builds a figure inside that style.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import matplotlib as mpl
from cycler import cycler
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: PNG text-chunk key of the embedded provenance JSON (read by :func:`resdyn.provenance.sidecars.read`).
PROVENANCE_KEY = "resdyn_provenance"


# seaborn's "colorblind" palette, ``axes_style("whitegrid")`` and ``plotting_context("paper")``
# as constants (tests/test_plots.py checks them against seaborn): importing seaborn, and the
# scipy.stats it pulls in, cost each of the ~130 figure jobs of the default run 1-2 s of start-up.
# Its "rocket" image colormap is left out: no figure here draws an image.
PALETTE = [
    mpl.colors.to_rgb(c)
    for c in (
        "#0173b2",
        "#de8f05",
        "#029e73",
        "#d55e00",
        "#cc78bc",
        "#ca9161",
        "#fbafe4",
        "#949494",
        "#ece133",
        "#56b4e9",
    )
]

_SEABORN_WHITEGRID: dict[str, Any] = {
    "figure.facecolor": "white", "axes.labelcolor": ".15", "xtick.direction": "out", "ytick.direction": "out",
    "xtick.color": ".15", "ytick.color": ".15", "axes.axisbelow": True, "grid.linestyle": "-", "text.color": ".15",
    "font.family": ["sans-serif"],
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans", "sans-serif"],
    "lines.solid_capstyle": "round", "patch.edgecolor": "w", "patch.force_edgecolor": True, "xtick.top": False,
    "ytick.right": False, "axes.grid": True, "axes.facecolor": "white", "axes.edgecolor": ".8", "grid.color": ".8",
    "axes.spines.left": True, "axes.spines.bottom": True, "axes.spines.right": True, "axes.spines.top": True,
    "xtick.bottom": False, "ytick.left": False,
}  # fmt: skip

_SEABORN_PAPER: dict[str, Any] = {
    "axes.linewidth": 1.0, "grid.linewidth": 0.8, "lines.linewidth": 1.2, "lines.markersize": 4.8,
    "patch.linewidth": 0.8,
    "xtick.major.width": 1.0, "ytick.major.width": 1.0, "xtick.minor.width": 0.8, "ytick.minor.width": 0.8,
    "xtick.major.size": 4.8, "ytick.major.size": 4.8, "xtick.minor.size": 3.2, "ytick.minor.size": 3.2,
    "font.size": 9.6, "axes.labelsize": 9.6, "axes.titlesize": 9.6, "xtick.labelsize": 8.8, "ytick.labelsize": 8.8,
    "legend.fontsize": 8.8, "legend.title_fontsize": 9.6,
}  # fmt: skip

RC: dict[str, Any] = {
    **_SEABORN_WHITEGRID,
    **_SEABORN_PAPER,
    "axes.prop_cycle": cycler(color=PALETTE),
    "pdf.fonttype": 42,  # TrueType in the PDF: text stays text
    "legend.fontsize": 6.5,
    "legend.framealpha": 0.85,
}

KIND_STYLE = {
    "attn": {"color": PALETTE[0], "marker": "o", "label": "attention"},
    "mlp": {"color": PALETTE[1], "marker": "s", "label": "MLP"},
    "layer": {"color": PALETTE[2], "marker": "D", "label": "parallel layer"},
}

BOUNDARY_STYLE = {
    0: {"color": PALETTE[0], "marker": "o", "label": r"pre-attention $h_L$"},
    1: {"color": PALETTE[1], "marker": "s", "label": r"pre-MLP $m_L$"},
}

PHASE_NAMES = {1: "rise", 2: "plateau", 3: "descent"}

PHASE_COLORS = {1: PALETTE[2], 2: PALETTE[4], 3: PALETTE[3]}

PHASE_MARKERS = {1: "o", 2: "s", 3: "^"}

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")

LINESTYLES = ("-", "--", "-.", ":")

S_LABEL = "sublayer depth index s (2L: attention, 2L+1: MLP)"

B_LABEL = r"boundary depth index (2L: pre-attention $h_L$, 2L+1: pre-MLP $m_L$)"

#: Axis labels of known columns (with definitions); unknown columns are labelled by name.
METRIC_LABELS: dict[str, str] = {
    "henrici": r"Henrici departure $\|N\|_F/\|J\|_F$",
    "henrici_JmI": r"Henrici departure of $J-I$",
    "self_alignment_kfrac": "self-alignment\n" + r"$\|U_k^\top V_k\|_F^2/k$ (k = fraction of d)",
    "self_alignment_k1": r"self-alignment $|u_1^\top v_1|^2$ (k = 1)",
    "self_alignment_kerank": "self-alignment\n" + r"$\|U_k^\top V_k\|_F^2/k$ (k = erank)",
    "erank_J": r"effective rank of $J$ (Roy–Vetterli)",
    "pr_J": r"participation ratio of $J$",
    "erank_JmI": r"effective rank of $J-I$",
    "pr_JmI": r"participation ratio of $J-I$",
    "expansive_frac_eig": "expansive fraction\n" + r"share of $|\lambda|>1$",
    "expansive_frac_sv": r"share of $\sigma>1$",
    "spectral_radius": r"spectral radius $\max|\lambda|$",
    "condition_number": r"condition number $\sigma_{max}/\sigma_{min}$",
    "cum_erank": "cumulative effective rank\n" + r"erank($P_s$), $P_s=J_s\cdots J_0$",
    "cum_pr": "cumulative participation\n" + r"ratio PR($P_s$)",
    "hidden_erank": "hidden-state effective rank\n(centred tokens × d)",
    "update_orthogonality": "update alignment\n" + r"mean $|\cos(\Delta_L, h_L)|$",
    "attn_orthogonality": r"mean $|\cos(\Delta_{attn}, h_L)|$",
    "mlp_orthogonality": r"mean $|\cos(\Delta_{MLP}, m_L)|$",
    "norm_ratio": "update-norm ratio (token mean)\n" + r"$\|\Delta_{MLP}\|/\|\Delta_{attn}\|$",
    "norm_ratio_of_means": r"mean $\|\Delta_{MLP}\|$ / mean $\|\Delta_{attn}\|$",
    "relative_update_norm": "relative update norm\n" + r"$\|\Delta_L\|/\|h_L\|$",
    "hit1": "Hit@1\n(lens top-1 = model top-1)",
    "hit5": "Hit@5\n(model top-1 in lens top-5)",
    "kl": r"KL($p_{final}\,\|\,p_{lens}$) (nats)",
    "ce": "next-token cross-entropy (nats)",
    "effect_log_median_ratio": "coupling effect: log(median gain\nboundary / median gain interior)",
    "rank_biserial": "coupling effect: rank-biserial r\n(boundary vs interior gain)",
    "effect": "coupling effect\n(boundary vs interior unit gain)",
}

LOG_METRICS = ("cum_erank", "cum_pr", "condition_number")

CKPT_COLUMNS = ("ckpt", "checkpoint")

EFFECT_COLUMNS = ("effect_log_median_ratio", "effect", "rank_biserial")

HENRICI_COLUMNS = ("henrici", "henrici_departure", "henrici_J", "henrici_single")

COUNT_COLUMNS = ("n_significant", "significant", "count", "n_sig")

TOTAL_COLUMNS = ("n_boundaries", "n_tests", "n_total")


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure inside the resdyn style (rcParams restored afterwards)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with mpl.rc_context(RC):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(
    n_panels: int, ncols: int = 1, panel: tuple[float, float] = (3.3, 2.4), sharex: bool | str = False
) -> tuple[Figure, list]:
    """A new constrained-layout figure on an Agg canvas with ``n_panels`` axes (row-major)."""
    n_panels = max(1, int(n_panels))
    ncols = max(1, min(int(ncols), n_panels))
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    axes = list(grid.ravel())
    for ax in axes[n_panels:]:
        fig.delaxes(ax)
    return fig, axes[:n_panels]
