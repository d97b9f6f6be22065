"""Figures of the pipeline: pandas tables in, ``matplotlib.figure.Figure`` out.

This is the only module of resdyn that imports matplotlib; the numerical modules never do, so
tables can be computed on machines without a display or plotting stack.

Conventions
-----------
* Every figure function takes the pipeline's tables (as read from TSV with
  :func:`resdyn.io.read_tsv`) and a title naming the model/checkpoint, and returns a new
  :class:`~matplotlib.figure.Figure` drawn on an Agg canvas. Figures are created without
  ``pyplot`` (no global figure registry, no interactive backend, nothing to leak).
* Style: seaborn's ``whitegrid`` / context ``paper`` and colour-blind-safe ``colorblind``
  palette (their values, without importing seaborn) (sequential ``viridis`` where the hue encodes an ordered value such as α or k),
  applied through ``matplotlib.rc_context`` while the figure is built — importing this module
  does not change the caller's rcParams. Categories carry a second cue besides colour (marker
  shape or line style).
* Columns are selected by name; a missing column raises ``ValueError`` naming it and the
  columns the table has. NaN values become gaps/omitted points; an empty table gives a figure
  that says so (for example the coupling table of a model without boundary units).
* :func:`save_figure` writes PNG and PDF atomically with the provenance JSON embedded
  (PNG text chunk ``resdyn_provenance``, PDF ``Subject``; read back by
  :func:`resdyn.provenance.read`).

Depth axes: sublayer index ``s = 2L`` (attention half of layer L), ``2L + 1`` (MLP half);
boundary index ``b = 2L`` (pre-attention ``h_L``), ``2L + 1`` (pre-MLP ``m_L``).
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from cycler import cycler
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter

from resdyn.io import atomic_path

__all__ = [
    "save_figure",
    "training_curve",
    "eigenvalue_grid",
    "operator_profile",
    "funnel",
    "schur_curves",
    "checkpoint_comparison",
    "community_sizes",
    "coupling_profile",
    "coupling_vs_henrici",
    "significant_counts",
    "lens_curves",
    "rss_profile_plot",
    "resolution_frontier",
    "phase_metric_profiles",
    "phase_width_scaling",
    "PROVENANCE_KEY",
]

#: PNG text-chunk key of the embedded provenance JSON (read by :func:`resdyn.provenance.read`).
PROVENANCE_KEY = "resdyn_provenance"

# seaborn's "colorblind" palette, ``axes_style("whitegrid")`` and ``plotting_context("paper")``
# as constants (tests/test_plots.py checks them against seaborn): importing seaborn, and the
# scipy.stats it pulls in, cost each of the ~130 figure jobs of the default run 1-2 s of start-up.
# Its "rocket" image colormap is left out: no figure here draws an image.
PALETTE = [
    mpl.colors.to_rgb(c)
    for c in ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9")
]
_SEABORN_WHITEGRID: dict[str, Any] = {
    "figure.facecolor": "white", "axes.labelcolor": ".15", "xtick.direction": "out", "ytick.direction": "out",
    "xtick.color": ".15", "ytick.color": ".15", "axes.axisbelow": True, "grid.linestyle": "-", "text.color": ".15",
    "font.family": ["sans-serif"], "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans", "sans-serif"],
    "lines.solid_capstyle": "round", "patch.edgecolor": "w", "patch.force_edgecolor": True, "xtick.top": False,
    "ytick.right": False, "axes.grid": True, "axes.facecolor": "white", "axes.edgecolor": ".8", "grid.color": ".8",
    "axes.spines.left": True, "axes.spines.bottom": True, "axes.spines.right": True, "axes.spines.top": True,
    "xtick.bottom": False, "ytick.left": False,
}  # fmt: skip
_SEABORN_PAPER: dict[str, Any] = {
    "axes.linewidth": 1.0, "grid.linewidth": 0.8, "lines.linewidth": 1.2, "lines.markersize": 4.8, "patch.linewidth": 0.8,
    "xtick.major.width": 1.0, "ytick.major.width": 1.0, "xtick.minor.width": 0.8, "ytick.minor.width": 0.8,
    "xtick.major.size": 4.8, "ytick.major.size": 4.8, "xtick.minor.size": 3.2, "ytick.minor.size": 3.2,
    "font.size": 9.6, "axes.labelsize": 9.6, "axes.titlesize": 9.6, "xtick.labelsize": 8.8, "ytick.labelsize": 8.8,
    "legend.fontsize": 8.8, "legend.title_fontsize": 9.6,
}  # fmt: skip
_RC: dict[str, Any] = {
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
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_LINESTYLES = ("-", "--", "-.", ":")

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
_LOG_METRICS = ("cum_erank", "cum_pr", "condition_number")

CKPT_COLUMNS = ("ckpt", "checkpoint")
EFFECT_COLUMNS = ("effect_log_median_ratio", "effect", "rank_biserial")
HENRICI_COLUMNS = ("henrici", "henrici_departure", "henrici_J", "henrici_single")
COUNT_COLUMNS = ("n_significant", "significant", "count", "n_sig")
TOTAL_COLUMNS = ("n_boundaries", "n_tests", "n_total")


# --------------------------------------------------------------------------------------------
# helpers


def _styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure inside the resdyn style (rcParams restored afterwards)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with mpl.rc_context(_RC):
            return fn(*args, **kwargs)

    return wrapper


def _figure(n_panels: int, ncols: int = 1, panel: tuple[float, float] = (3.3, 2.4),
            sharex: bool | str = False) -> tuple[Figure, list]:
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


def _check_frame(df: Any, what: str) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{what} must be a pandas DataFrame, got {type(df).__name__}")
    return df


def _require(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}; it has {list(df.columns)}")


def _pick(df: pd.DataFrame, candidates: Sequence[str], what: str, required: bool = True) -> str | None:
    """The first of ``candidates`` that is a column of ``df``."""
    for c in candidates:
        if c in df.columns:
            return c
    if required:
        raise ValueError(f"{what} needs one of the columns {list(candidates)}; it has {list(df.columns)}")
    return None


def _num(values: Any) -> np.ndarray:
    """Float64 array; anything non-numeric becomes NaN."""
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=np.float64)


def _as_bool(values: Any) -> np.ndarray:
    """Booleans from bools, 0/1 or 'True'/'False' strings (TSV); NaN/unknown → False."""
    def one(v: Any) -> bool:
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if isinstance(v, str):
            return v.strip().lower() in ("true", "1", "yes", "t")
        try:
            return bool(np.isfinite(float(v)) and float(v) != 0.0)
        except (TypeError, ValueError):
            return False

    return np.array([one(v) for v in pd.Series(values).tolist()], dtype=bool)


def _opt_int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(round(f)) if math.isfinite(f) else None


def _finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def _log_if_positive(ax, *arrays: np.ndarray) -> None:
    """Log y axis when some finite positive value exists (otherwise matplotlib would warn)."""
    vals = np.concatenate([np.ravel(a) for a in arrays]) if arrays else np.zeros(0)
    if np.any(np.isfinite(vals) & (vals > 0)):
        ax.set_yscale("log")
        # plain numbers (2, 5, 10) rather than 2×10⁰; minor labels only on short ranges
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5)))


def _legend(ax, **kwargs: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    extra = kwargs.pop("extra", [])
    handles, labels = handles + [h for h in extra], labels + [h.get_label() for h in extra]
    if handles:
        ax.legend(handles, labels, **kwargs)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")


def _empty(title: str, xlabel: str, ylabel: str, what: str) -> Figure:
    fig, (ax,) = _figure(1, panel=(4.5, 3.0))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _note(ax, f"no data: {what} is empty")
    fig.suptitle(title)
    return fig


def _metric_label(col: str) -> str:
    if col in METRIC_LABELS:
        return METRIC_LABELS[col]
    m = re.match(r"complex_frac_(J|JmI)_tol(.+)$", col)
    if m:
        mat = "J" if m.group(1) == "J" else "J-I"
        return "complex fraction\n" + rf"of ${mat}$ (tol {m.group(2)})"
    m = re.match(r"(hit[15]|kl|ce)_(\w+)$", col)
    if m and m.group(1) in METRIC_LABELS:
        return f"{METRIC_LABELS[m.group(1)]}\n{m.group(2)} lens"
    return col


def _sequential(n: int) -> list:
    """Colour-blind-safe sequential colours (viridis without its palest yellow)."""
    if n <= 1:
        return [mpl.colormaps["viridis"](0.35)]
    return [mpl.colormaps["viridis"](x) for x in np.linspace(0.0, 0.85, n)]


def _ordered_unique(values: Any) -> list:
    return list(pd.unique(pd.Series(values)))


def _fmt(v: float, digits: int = 3) -> str:
    return "nan" if v is None or not np.isfinite(v) else f"{v:.{digits}g}"


def _kind_of(df: pd.DataFrame, s: np.ndarray) -> np.ndarray:
    """Sublayer kinds: the ``kind`` column, or from the parity of s (2L attn, 2L+1 MLP)."""
    if "kind" in df.columns:
        return df["kind"].astype(str).str.lower().to_numpy()
    return np.where(np.isfinite(s) & (np.mod(s, 2) == 1), "mlp", "attn")


def _plot_kinds(ax, x: np.ndarray, y: np.ndarray, kinds: np.ndarray, color: Any, ls: str = "-",
                label: str | None = None) -> None:
    """A line through all points, then attention/MLP points with their own markers."""
    ax.plot(x, y, color=color, ls=ls, lw=1.1, label=label)
    for kind, style in KIND_STYLE.items():
        m = kinds == kind
        if m.any():
            ax.plot(x[m], y[m], ls="none", marker=style["marker"], ms=3.5, color=color,
                    mfc=color if kind == "attn" else "white", mew=0.9)


def _kind_handles() -> list:
    return [
        Line2D([], [], ls="none", marker="o", color="0.3", mfc="0.3", label="attention (s = 2L)"),
        Line2D([], [], ls="none", marker="s", color="0.3", mfc="white", label="MLP (s = 2L+1)"),
    ]


def _boundary_x(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, str]:
    """x = boundary depth index (2L + [pre-MLP]) and the boundary side (0 attn, 1 MLP)."""
    layer = _num(df["layer"])
    if "boundary" in df.columns:
        side = df["boundary"].astype(str).str.lower().str.contains("mlp").to_numpy().astype(int)
        return 2 * layer + side, side, B_LABEL
    return layer, np.zeros(len(df), dtype=int), "layer L"


def _group_column(df: pd.DataFrame) -> tuple[list, np.ndarray] | tuple[None, None]:
    """Groups by checkpoint (and model when several): ordered labels and per-row labels."""
    ck = _pick(df, CKPT_COLUMNS, "table", required=False)
    multi_model = "model" in df.columns and df["model"].nunique(dropna=False) > 1
    if ck is None and not multi_model:
        return None, None
    parts = []
    if multi_model:
        parts.append(df["model"].astype(str))
    if ck is not None:
        parts.append(df[ck].astype(str))
    lab = parts[0] if len(parts) == 1 else parts[0] + " / " + parts[1]
    lab = lab.to_numpy()
    return _ordered_unique(lab), lab


def _shade_phases(ax, phases: Mapping[str, Any] | None, x_end: float, label: bool = True) -> None:
    """Shade phase 1 [0, b1], 2 (b1, b2], 3 (b2, x_end] and mark b1, b2 and the peak."""
    if not phases:
        return
    if not isinstance(phases, Mapping):
        raise ValueError(f"phases must be a dict with keys b1, b2, peak, reason; got {type(phases).__name__}")
    b1, b2, peak = (_opt_int(phases.get(k)) for k in ("b1", "b2", "peak"))
    if b1 is not None and b2 is not None and b1 <= b2:
        end = max(float(x_end) if np.isfinite(x_end) else b2, b2) + 0.5
        spans = {1: (-0.5, b1 + 0.5), 2: (b1 + 0.5, b2 + 0.5), 3: (b2 + 0.5, end)}
        for ph, (a, b) in spans.items():
            if b > a:
                ax.axvspan(a, b, color=PHASE_COLORS[ph], alpha=0.13, lw=0, zorder=0,
                           label=f"phase {ph} ({PHASE_NAMES[ph]})" if label else None)
    for key, ls in (("b1", "--"), ("peak", ":"), ("b2", "-.")):
        v = _opt_int(phases.get(key))
        if v is not None:
            ax.axvline(v, color="0.25", ls=ls, lw=0.9, zorder=1, label=f"{key} = {v}" if label else None)


def _reason_note(fig: Figure, phases: Mapping[str, Any] | None) -> None:
    reason = (phases or {}).get("reason") if isinstance(phases, Mapping) else None
    if reason:
        fig.supxlabel("\n".join(textwrap.wrap(f"phase cut fallback: {reason}", 140)), fontsize=5.5, color="0.35")


# --------------------------------------------------------------------------------------------
# saving


def _plain(obj: Any) -> Any:
    """JSON-ready copy, as :func:`resdyn.io.write_json` writes sidecars: numpy → Python,
    paths → str, non-finite floats → None (strict JSON); anything else unknown → str."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=str) if isinstance(obj, (set, frozenset)) else obj
        return [_plain(v) for v in items]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def _keywords(provenance: Mapping[str, Any]) -> str:
    words = ["resdyn"]
    if provenance.get("rule"):
        words.append(str(provenance["rule"]))
    wc = provenance.get("wildcards")
    if isinstance(wc, Mapping):
        words += [str(v) for v in wc.values() if v not in (None, "")]
    return "; ".join(words)


def save_figure(fig: Figure, png_path: str | Path, pdf_path: str | Path, provenance: dict,
                dpi: int = 120) -> None:
    """Write ``fig`` as PNG and PDF, atomically, with the provenance embedded; close the figure.

    The provenance (``json.dumps``; numpy values and paths converted, NaN → null as in the
    ``.prov.json`` sidecars) goes into the PNG text
    chunk ``resdyn_provenance`` and into the PDF metadata ``Subject``; the PDF ``Keywords`` are
    ``"resdyn; <rule>; <wildcard values…>"`` and its ``Title`` the figure's title. Both files
    are written to temporary names and renamed only after both succeeded, so a failure leaves
    neither (nor any temporary file) behind. The PDF carries no creation date.

    Args:
        fig: the figure (from this module or pyplot).
        png_path, pdf_path: destinations.
        provenance: JSON-serialisable record (see :mod:`resdyn.provenance`).
        dpi: resolution of the PNG (and of rasterized artists in the PDF).
    """
    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    if not isinstance(provenance, Mapping):
        raise ValueError(f"provenance must be a dict, got {type(provenance).__name__}")
    if Path(png_path).resolve() == Path(pdf_path).resolve():
        raise ValueError(f"png_path and pdf_path are the same file: {png_path}")
    prov = json.dumps(_plain(provenance))
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    png_meta = {PROVENANCE_KEY: prov}
    pdf_meta = {"Subject": prov, "Keywords": _keywords(provenance), "Creator": "resdyn",
                "CreationDate": None}
    if title:
        png_meta["Title"] = title
        pdf_meta["Title"] = title
    try:
        with mpl.rc_context(_RC), atomic_path(png_path) as tmp_png, atomic_path(pdf_path) as tmp_pdf:
            fig.savefig(tmp_png, format="png", dpi=dpi, metadata=png_meta)
            fig.savefig(tmp_pdf, format="pdf", dpi=dpi, metadata=pdf_meta)
    finally:
        plt = sys.modules.get("matplotlib.pyplot")  # only pyplot-made figures need closing
        if plt is not None:
            plt.close(fig)


# --------------------------------------------------------------------------------------------
# zoo


@_styled
def training_curve(df: pd.DataFrame, title: str) -> Figure:
    """Train and held-out loss vs step; unigram baseline dashed.

    Columns: ``step``, ``train_loss``, ``heldout_loss`` and optionally ``unigram_loss``
    (:func:`resdyn.zoo.train_zoo_model`). One axes.
    """
    df = _check_frame(df, "training curve")
    xl, yl = "training step", "cross-entropy loss (nats/token)"
    if df.empty:
        return _empty(title, xl, yl, "the training curve")
    _require(df, ["step", "train_loss", "heldout_loss"], "training curve")
    d = df.assign(_step=_num(df["step"])).sort_values("_step", kind="stable")
    step = d["_step"].to_numpy()
    fig, (ax,) = _figure(1, panel=(4.8, 3.2))
    ax.plot(step, _num(d["train_loss"]), color=PALETTE[0], lw=1.2, marker=".", ms=3,
            label="train (mean since previous eval)")
    ax.plot(step, _num(d["heldout_loss"]), color=PALETTE[1], lw=1.2, marker="o", ms=3, label="held-out")
    if "unigram_loss" in d.columns:
        ax.plot(step, _num(d["unigram_loss"]), color="0.35", ls="--", lw=1.0, label="unigram baseline (held-out)")
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    _legend(ax, loc="upper right")
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------
# Study A: spectra


_GROUP_RE = re.compile(r"^L(\d+)_(attn|mlp|layer)$")


@_styled
def eigenvalue_grid(spectra: Mapping[str, Mapping[str, np.ndarray]], title: str,
                    layers_per_row: int | None = None) -> Figure:
    """Eigenvalues of each sublayer Jacobian in the complex plane, with the unit circle.

    ``spectra``: {``L{layer:03d}_{kind}``: {``eigenvalues``: complex array, …}} as returned
    (first element) by :func:`resdyn.spectral.read_spectra_h5`; the ``(arrays, attrs)`` tuple
    is accepted too. Panels: row = layer, columns attention | MLP; deeper models wrap
    ``layers_per_row`` layers (default: 1 up to 8 layers, else 4) into each row. One axes
    per sublayer present, equal aspect, title with the spectral radius ρ.
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
    if not items:
        return _empty(title, r"Re $\lambda$", r"Im $\lambda$", "the spectra")
    items.sort(key=lambda t: (t[0], t[1] != "attn"))
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
    theta = np.linspace(0, 2 * np.pi, 241)
    for layer, kind, lam in items:
        pos = layers.index(layer) * 2 + (0 if kind == "attn" else 1)
        r, c = divmod(pos, ncols)
        ax = grid[r, c]
        used.add((r, c))
        ok = np.isfinite(lam.real) & np.isfinite(lam.imag)
        radius = float(np.max(np.abs(lam[ok]))) if ok.any() else float("nan")
        lim = 1.12 * max(1.0, radius if np.isfinite(radius) else 1.0)
        ax.plot(np.cos(theta), np.sin(theta), color="0.45", lw=0.7, ls="--", zorder=1)
        ax.axhline(0, color="0.8", lw=0.5, zorder=0)
        ax.axvline(0, color="0.8", lw=0.5, zorder=0)
        style = KIND_STYLE[kind]
        ax.scatter(lam.real[ok], lam.imag[ok], s=5, color=style["color"], marker=style["marker"],
                   alpha=0.7, lw=0, zorder=2, rasterized=True)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal", adjustable="box")
        ax.set_title(f"L{layer} {style['label']}  ρ={_fmt(radius)}", fontsize=6.5)
        ax.tick_params(labelsize=5.5)
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
    fig.suptitle(title)
    fig.supxlabel(r"eigenvalues $\lambda$ of the sublayer Jacobians; dashed: unit circle $|\lambda| = 1$",
                  fontsize=6.5, color="0.3")
    return fig


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


@_styled
def operator_profile(spectra_df: pd.DataFrame, title: str) -> Figure:
    """Complex fraction, Henrici departure and self-alignment vs depth index s.

    Columns (``spectra.tsv``, :func:`resdyn.spectral.spectra_table`): ``s``, ``kind`` (or
    derived from s), ``complex_frac_J_tol*`` (and ``complex_frac_JmI_tol*``: dashed), ``henrici``
    (and ``henrici_JmI``), ``self_alignment_*``. Three axes stacked (shared x); attention
    points filled circles, MLP hollow squares.
    """
    df = _check_frame(spectra_df, "spectra table")
    if df.empty:
        return _empty(title, S_LABEL, "operator metrics", "the spectra table")
    _require(df, ["s", "henrici"], "spectra table")
    j_cols, jmi_cols = _tol_columns(df, "J"), _tol_columns(df, "JmI")
    sa_cols = [c for c in ("self_alignment_kfrac", "self_alignment_k1", "self_alignment_kerank") if c in df.columns]
    sa_cols += [c for c in df.columns if str(c).startswith("self_alignment_") and c not in sa_cols]
    if not j_cols:
        raise ValueError(f"spectra table needs complex_frac_J_tol* columns; it has {list(df.columns)}")
    if not sa_cols:
        raise ValueError(f"spectra table needs self_alignment_* columns; it has {list(df.columns)}")
    d = df.assign(_s=_num(df["s"])).sort_values("_s", kind="stable")
    s = d["_s"].to_numpy()
    kinds = _kind_of(d, s)
    fig, axes = _figure(3, panel=(6.0, 2.1), sharex=True)
    ax = axes[0]
    tol_colors = {t: PALETTE[i % len(PALETTE)] for i, (t, _) in enumerate(j_cols + [x for x in jmi_cols if x[0] not in dict(j_cols)])}
    for tol, col in j_cols:
        _plot_kinds(ax, s, _num(d[col]), kinds, tol_colors[tol], "-", f"$J$, tol {col.split('_tol')[1]}")
    for tol, col in jmi_cols:
        _plot_kinds(ax, s, _num(d[col]), kinds, tol_colors[tol], "--", f"$J-I$, tol {col.split('_tol')[1]}")
    ax.set_ylabel("complex fraction\n" + r"share $|\mathrm{Im}\,\lambda|>\mathrm{tol}\cdot\max(1,|\lambda|)$")
    ax.set_ylim(-0.03, 1.03)
    _legend(ax, loc="best", ncols=2, extra=_kind_handles())
    ax = axes[1]
    _plot_kinds(ax, s, _num(d["henrici"]), kinds, PALETTE[0], "-", "$J$")
    if "henrici_JmI" in d.columns:
        _plot_kinds(ax, s, _num(d["henrici_JmI"]), kinds, PALETTE[1], "--", "$J-I$")
    ax.set_ylabel("Henrici departure\n" + r"$\sqrt{\|J\|_F^2-\sum|\lambda_i|^2}\,/\,\|J\|_F$")
    ax.set_ylim(-0.03, 1.03)
    _legend(ax, loc="best")
    ax = axes[2]
    sa_names = {"self_alignment_kfrac": "k = fraction of d", "self_alignment_k1": "k = 1",
                "self_alignment_kerank": "k = round(erank)"}
    for i, col in enumerate(sa_cols):
        _plot_kinds(ax, s, _num(d[col]), kinds, PALETTE[i % len(PALETTE)], _LINESTYLES[i % 4],
                    sa_names.get(col, col))
    ax.set_ylabel("self-alignment\n" + r"$\|U_k^\top V_k\|_F^2/k$")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(S_LABEL)
    _legend(ax, loc="best")
    for a in axes[:-1]:
        a.set_xlabel(S_LABEL)
        a.xaxis.label.set_visible(False)
    fig.suptitle(title)
    return fig


@_styled
def funnel(bottleneck_df: pd.DataFrame, title: str) -> Figure:
    """Rank of the cumulative Jacobian P_s along depth (the bottleneck "funnel"), log y.

    Columns (``bottleneck.tsv``, :func:`resdyn.spectral.bottleneck_table`): ``s``, ``erank`` and
    optionally ``participation_ratio``, the single-sublayer references ``erank_single``,
    ``pr_single`` (dashed) and ``d`` (dotted: full rank). One axes.
    """
    df = _check_frame(bottleneck_df, "bottleneck table")
    yl = r"rank of cumulative Jacobian $P_s = J_s\cdots J_0$ (log)"
    if df.empty:
        return _empty(title, S_LABEL, yl, "the bottleneck table")
    _require(df, ["s", "erank"], "bottleneck table")
    d = df.assign(_s=_num(df["s"])).sort_values("_s", kind="stable")
    s = d["_s"].to_numpy()
    fig, (ax,) = _figure(1, panel=(5.2, 3.4))
    series = [("erank", "effective rank erank($P_s$)", PALETTE[0], "-", "o"),
              ("participation_ratio", "participation ratio PR($P_s$)", PALETTE[1], "-", "^"),
              ("erank_single", "erank($J_s$) (single sublayer)", PALETTE[0], "--", "o"),
              ("pr_single", "PR($J_s$) (single sublayer)", PALETTE[1], "--", "^")]
    ys = []
    for col, label, color, ls, marker in series:
        if col in d.columns:
            y = _num(d[col])
            ys.append(y)
            ax.plot(s, y, color=color, ls=ls, marker=marker, ms=3.5, lw=1.2, label=label,
                    mfc=color if ls == "-" else "white")
    if "d" in d.columns:
        dims = _finite(_num(d["d"]))
        if dims.size:
            ax.axhline(float(dims.max()), color="0.4", ls=":", lw=1.0, label=f"d = {int(dims.max())} (full rank)")
            ys.append(dims)
    _log_if_positive(ax, *ys)
    ax.set_xlabel(S_LABEL)
    ax.set_ylabel(yl)
    _legend(ax, loc="best")
    fig.suptitle(title)
    return fig


@_styled
def schur_curves(schur_df: pd.DataFrame, title: str) -> Figure:
    """Cumulative effective rank vs s after Schur surgery, one line per α (sequential colours).

    Columns (``schur.tsv``, :func:`resdyn.schur.schur_bottleneck`): ``alpha``, ``s``, ``erank``.
    α = 1 is the unaltered Jacobian, α = 0 its normal part. One axes, log y.
    """
    df = _check_frame(schur_df, "Schur table")
    yl = r"cumulative effective rank erank($P_s(\alpha)$) (log)"
    if df.empty:
        return _empty(title, S_LABEL, yl, "the Schur table")
    _require(df, ["alpha", "s", "erank"], "Schur table")
    d = df.assign(_a=_num(df["alpha"]), _s=_num(df["s"]))
    alphas = sorted(set(_finite(d["_a"].to_numpy()).tolist()))
    nan_alpha = d["_a"].isna().any()
    colors = _sequential(len(alphas))
    fig, (ax,) = _figure(1, panel=(5.2, 3.4))
    ys = []
    for alpha, color in zip(alphas, colors):
        g = d[d["_a"] == alpha].sort_values("_s", kind="stable")
        y = _num(g["erank"])
        ys.append(y)
        note = " (J)" if alpha == 1 else " (normal part)" if alpha == 0 else ""
        ax.plot(g["_s"].to_numpy(), y, color=color, marker="o", ms=3, lw=1.2, label=f"α = {alpha:g}{note}")
    if nan_alpha:
        g = d[d["_a"].isna()].sort_values("_s", kind="stable")
        ax.plot(g["_s"].to_numpy(), _num(g["erank"]), color="0.5", ls=":", label="α = NaN")
    _log_if_positive(ax, *ys)
    ax.set_xlabel(S_LABEL)
    ax.set_ylabel(yl)
    _legend(ax, loc="best", title=r"$J(\alpha)=Q(\Lambda+\alpha N)Q^*$", title_fontsize=6.5)
    fig.suptitle(title)
    return fig


DEFAULT_CKPT_METRICS = ("complex_frac_J_tol1e-06", "henrici", "self_alignment_kfrac", "cum_erank")


@_styled
def checkpoint_comparison(ckpt_df: pd.DataFrame, metrics: Sequence[str] | None = None, title: str = "") -> Figure:
    """One panel per metric vs s, one line per checkpoint in the order the table lists them.

    Columns (:func:`resdyn.spectral.checkpoint_table`): ``ckpt`` (or ``checkpoint``), ``s``
    and the ``metrics`` (default: the first ``complex_frac_J_tol*``, ``henrici``,
    ``self_alignment_kfrac``, ``cum_erank`` — those present). Cumulative ranks on log y.
    """
    df = _check_frame(ckpt_df, "checkpoint table")
    if metrics is None:
        tol = _tol_columns(df, "J")
        wanted = ["complex_frac_J_tol1e-06" if "complex_frac_J_tol1e-06" in df.columns else (tol[0][1] if tol else None),
                  "henrici", "self_alignment_kfrac", "cum_erank"]
        metrics = [m for m in wanted if m is not None and m in df.columns]
        if not metrics:
            raise ValueError(f"checkpoint table has none of the default metrics {list(DEFAULT_CKPT_METRICS)}; "
                             f"it has {list(df.columns)}")
    if isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    if not metrics:
        raise ValueError("metrics must name at least one column")
    if df.empty:
        return _empty(title, S_LABEL, ", ".join(metrics), "the checkpoint table")
    ck = _pick(df, CKPT_COLUMNS, "checkpoint table")
    _require(df, ["s", *metrics], "checkpoint table")
    ckpts = _ordered_unique(df[ck].astype(str))
    fig, axes = _figure(len(metrics), ncols=2 if len(metrics) > 1 else 1, panel=(3.5, 2.5), sharex=True)
    for ax, metric in zip(axes, metrics):
        ys = []
        for i, name in enumerate(ckpts):
            g = df[df[ck].astype(str) == name]
            g = g.assign(_s=_num(g["s"])).sort_values("_s", kind="stable")
            y = _num(g[metric])
            ys.append(y)
            ax.plot(g["_s"].to_numpy(), y, color=PALETTE[i % len(PALETTE)], marker=_MARKERS[i % len(_MARKERS)],
                    ms=3, lw=1.1, label=name)
        if metric in _LOG_METRICS:
            _log_if_positive(ax, *ys)
        ax.set_xlabel(S_LABEL, fontsize=6.5)
        ax.set_ylabel(_metric_label(metric), fontsize=6.5)
    _legend(axes[0], loc="best", title="checkpoint", title_fontsize=6.5)
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------
# Study A: topology


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
            raise ValueError(f"community summary row {row}: sizes {text[:60]!r} is not a list of sizes ({err})") from None
    arr = _num(np.ravel(np.asarray(v, dtype=object)))
    return arr[np.isfinite(arr)]


@_styled
def community_sizes(summary_df: pd.DataFrame, title: str) -> Figure:
    """Community sizes per boundary (strip + median), number of communities and CPM quality.

    Columns (one row per boundary, :func:`resdyn.topology.community_summary` plus identifiers):
    ``layer``, ``boundary`` (pre_attn / pre_mlp), ``n_communities``, ``sizes`` (JSON list
    string or list) and optionally ``quality``. Axes: sizes (log y), number of communities,
    and quality when present.
    """
    df = _check_frame(summary_df, "community summary")
    if df.empty:
        return _empty(title, B_LABEL, "community size (units)", "the community summary")
    _require(df, ["layer", "n_communities", "sizes"], "community summary")
    x, side, xl = _boundary_x(df)
    has_q = "quality" in df.columns
    fig, axes = _figure(3 if has_q else 2, panel=(6.0, 2.1), sharex=True)
    ax = axes[0]
    rng = np.random.default_rng(0)
    medians = np.full(len(df), np.nan)
    all_sizes = []
    for i, v in enumerate(df["sizes"].tolist()):
        sz = _parse_sizes(v, i)
        all_sizes.append(sz)
        if sz.size and np.isfinite(x[i]):
            style = BOUNDARY_STYLE[int(side[i])]
            ax.scatter(x[i] + rng.uniform(-0.18, 0.18, sz.size), sz, s=14, color=style["color"],
                       marker=style["marker"], alpha=0.55, lw=0)
            medians[i] = float(np.median(sz))
    ax.plot(x, medians, ls="none", marker="_", ms=9, mew=1.6, color="black", label="median size")
    _log_if_positive(ax, *all_sizes)
    ax.set_ylabel("community size (units)")
    handles = [Line2D([], [], ls="none", marker=st["marker"], color=st["color"], label=st["label"])
               for k, st in BOUNDARY_STYLE.items() if np.any(side == k)]
    _legend(ax, loc="best", extra=handles)
    ax = axes[1]
    n_com = _num(df["n_communities"])
    order = np.argsort(np.nan_to_num(x, nan=np.inf), kind="stable")
    ax.plot(x[order], n_com[order], color="0.4", lw=1.0, label="number of communities")
    for k, st in BOUNDARY_STYLE.items():
        m = side == k
        if m.any():
            ax.plot(x[m], n_com[m], ls="none", marker=st["marker"], color=st["color"], ms=4)
    ax.set_ylabel("number of communities")
    if has_q:
        ax = axes[2]
        q = _num(df["quality"])
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
        return _as_bool(df["significant"])
    if "q_value" in df.columns:
        q = _num(df["q_value"])
        return np.isfinite(q) & (q <= q_level)
    raise ValueError(f"coupling table needs a 'significant' or 'q_value' column; it has {list(df.columns)}")


def _sig_handles(color: Any = "0.3") -> list:
    return [Line2D([], [], ls="none", marker="o", color=color, mfc=color, label="FDR-significant (BH)"),
            Line2D([], [], ls="none", marker="o", color=color, mfc="white", label="not significant")]


@_styled
def coupling_profile(coupling_df: pd.DataFrame, title: str) -> Figure:
    """Coupling effect (boundary vs interior unit gain) vs boundary depth; filled = FDR-significant.

    Columns: ``layer``, ``boundary`` (pre_attn / pre_mlp; without it x is the layer), an effect
    column (``effect_log_median_ratio``, ``effect`` or ``rank_biserial``) and ``significant``
    (or ``q_value`` ≤ 0.05); optional ``ckpt``/``checkpoint`` (and ``model``): one line each.
    One axes.
    """
    df = _check_frame(coupling_df, "coupling table")
    if df.empty:
        return _empty(title, B_LABEL, "coupling effect", "the coupling table")
    eff = _pick(df, EFFECT_COLUMNS, "coupling table")
    _require(df, ["layer"], "coupling table")
    sig = _significance(df)
    x, _, xl = _boundary_x(df)
    y = _num(df[eff])
    groups, lab = _group_column(df)
    if groups is None:
        groups, lab = ["boundaries"], np.array(["boundaries"] * len(df), dtype=object)
    fig, (ax,) = _figure(1, panel=(5.6, 3.4))
    ax.axhline(0, color="0.5", lw=0.8)
    for i, g in enumerate(groups):
        m = lab == g
        order = np.argsort(np.nan_to_num(x[m], nan=np.inf), kind="stable")
        xg, yg, sg = x[m][order], y[m][order], sig[m][order]
        color = PALETTE[i % len(PALETTE)]
        marker = _MARKERS[i % len(_MARKERS)]
        ax.plot(xg, yg, color=color, lw=1.0, label=str(g))
        ax.plot(xg[sg], yg[sg], ls="none", marker=marker, ms=5, color=color, mfc=color)
        ax.plot(xg[~sg], yg[~sg], ls="none", marker=marker, ms=5, color=color, mfc="white")
    ax.set_xlabel(xl)
    ax.set_ylabel(_metric_label(eff))
    _legend(ax, loc="best", extra=_sig_handles())
    fig.suptitle(title)
    return fig


def _spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float, int]:
    ok = np.isfinite(x) & np.isfinite(y)
    n = int(ok.sum())
    if n < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan"), float("nan"), n
    from scipy import stats

    res = stats.spearmanr(x[ok], y[ok])
    return float(res.statistic), float(res.pvalue), n


def _rho_text(rho: float, p: float, n: int) -> str:
    return f"Spearman ρ = {_fmt(rho, 2)} (p = {_fmt(p, 2)}, n = {n})"


@_styled
def coupling_vs_henrici(coupling_df: pd.DataFrame, title: str) -> Figure:
    """Coupling effect vs Henrici departure, Spearman ρ in the legend (per checkpoint if given).

    Columns: a Henrici column (``henrici``, ``henrici_departure``, ``henrici_J`` or
    ``henrici_single``), an effect column (as :func:`coupling_profile`), optionally
    ``significant``/``q_value`` (filled/hollow) and ``ckpt``/``checkpoint``. One axes.
    """
    df = _check_frame(coupling_df, "coupling table")
    if df.empty:
        return _empty(title, "Henrici departure", "coupling effect", "the coupling table")
    eff = _pick(df, EFFECT_COLUMNS, "coupling table")
    hen = _pick(df, HENRICI_COLUMNS, "coupling table")
    x, y = _num(df[hen]), _num(df[eff])
    try:
        sig = _significance(df)
    except ValueError:
        sig = None
    groups, lab = _group_column(df)
    fig, (ax,) = _figure(1, panel=(4.8, 3.6))
    ax.axhline(0, color="0.6", lw=0.7)
    if groups is None:
        groups, lab = [None], np.array([None] * len(df), dtype=object)
    for i, g in enumerate(groups):
        m = lab == g if g is not None else np.ones(len(df), dtype=bool)
        color = PALETTE[i % len(PALETTE)]
        marker = _MARKERS[i % len(_MARKERS)]
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
    ax.set_xlabel(_metric_label(hen) if hen in METRIC_LABELS else f"Henrici departure ({hen})")
    ax.set_ylabel(_metric_label(eff))
    _legend(ax, loc="best", extra=extra)
    fig.suptitle(title)
    return fig


@_styled
def significant_counts(counts_df: pd.DataFrame, title: str) -> Figure:
    """Number of FDR-significant boundaries: bars per checkpoint, grouped by model.

    Columns: ``ckpt``/``checkpoint``, a count (``n_significant``, ``significant``, ``count``
    or ``n_sig``), optionally ``model`` (groups) and a total (``n_boundaries``, ``n_tests``
    or ``n_total``: bars annotated "count/total"). Checkpoints keep the table's order. One axes.
    """
    df = _check_frame(counts_df, "significance counts")
    yl = "FDR-significant boundaries (count)"
    if df.empty:
        return _empty(title, "model", yl, "the significance counts")
    ck = _pick(df, CKPT_COLUMNS, "significance counts")
    cnt = _pick(df, COUNT_COLUMNS, "significance counts")
    tot = _pick(df, TOTAL_COLUMNS, "significance counts", required=False)
    models = _ordered_unique(df["model"].astype(str)) if "model" in df.columns else [""]
    ckpts = _ordered_unique(df[ck].astype(str))
    mcol = df["model"].astype(str).to_numpy() if "model" in df.columns else np.array([""] * len(df))
    ccol = df[ck].astype(str).to_numpy()
    counts, totals = _num(df[cnt]), (_num(df[tot]) if tot else None)
    width = 0.8 / len(ckpts)
    fig, (ax,) = _figure(1, panel=(max(3.6, 1.1 * len(models) * max(1, len(ckpts)) ** 0.5 + 2.0), 3.2))
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
        bars = ax.bar(xs, np.nan_to_num(hs, nan=0.0), width=width * 0.92, color=PALETTE[j % len(PALETTE)],
                      hatch=hatches[j % len(hatches)], edgecolor="white", lw=0.5, label=c)
        for b, h, t in zip(bars, hs, ts):
            text = "n/a" if not np.isfinite(h) else (f"{h:g}/{t:g}" if np.isfinite(t) else f"{h:g}")
            ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=5.5)
    ax.set_xticks(range(len(models)), models if models != [""] else ["all"])
    ax.set_xlim(-0.6, len(models) - 0.4)
    ax.set_xlabel("model")
    ax.set_ylabel(yl)
    ax.margins(y=0.15)
    _legend(ax, loc="best", title="checkpoint", title_fontsize=6.5)
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------
# Study B


_LENS_STYLE = {"tuned": (PALETTE[0], "-", "o"), "logit": (PALETTE[1], "--", "s")}


@_styled
def lens_curves(metrics_df: pd.DataFrame, title: str) -> Figure:
    """KL, cross-entropy, Hit@1 and Hit@5 vs layer; tuned lens solid, logit lens dashed.

    Columns (``lens_metrics.tsv``, :func:`resdyn.lens.lens_metrics`): ``lens``, ``layer``,
    ``kl``, ``ce``, ``hit1``, ``hit5``. Four axes (2 × 2).
    """
    df = _check_frame(metrics_df, "lens metrics")
    xl = "layer L (stream entering layer L; L = n: model output)"
    if df.empty:
        return _empty(title, xl, "lens metric", "the lens metrics")
    cols = ["kl", "ce", "hit1", "hit5"]
    _require(df, ["lens", "layer", *cols], "lens metrics")
    lenses = _ordered_unique(df["lens"].astype(str))
    fig, axes = _figure(4, ncols=2, panel=(3.4, 2.4), sharex=True)
    for ax, col in zip(axes, cols):
        for i, name in enumerate(lenses):
            g = df[df["lens"].astype(str) == name]
            g = g.assign(_l=_num(g["layer"])).sort_values("_l", kind="stable")
            color, ls, marker = _LENS_STYLE.get(name, (PALETTE[(i + 2) % len(PALETTE)], _LINESTYLES[i % 4], _MARKERS[i % 10]))
            ax.plot(g["_l"].to_numpy(), _num(g[col]), color=color, ls=ls, marker=marker, ms=3, lw=1.1,
                    label=f"{name} lens")
        if col.startswith("hit"):
            ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel(xl, fontsize=6.5)
        ax.set_ylabel(_metric_label(col), fontsize=6.5)
    _legend(axes[0], loc="best")
    fig.suptitle(title)
    return fig


@_styled
def rss_profile_plot(rss_df: pd.DataFrame, phases: Mapping[str, Any] | None, title: str) -> Figure:
    """RSS profile vs layer, one line per k; the phase cut (b1, peak, b2) and phases marked.

    Columns (``rss.tsv``, :func:`resdyn.readout.rss_profile`): ``layer``, ``rss`` and ``k``
    and/or ``k_fraction``. ``phases`` (``phases.json``, :func:`resdyn.phases.cutpoints`):
    keys ``b1``, ``b2``, ``peak`` (int or None), ``reason``; optional ``k`` (the line used for
    the cut, drawn thicker) and ``smoothed`` (drawn dotted). One axes.
    """
    df = _check_frame(rss_df, "RSS table")
    xl = r"layer L (RSS of readout subspaces $S_L$ vs $S_{L+1}$)"
    yl = r"RSS $=\frac{1}{k}\sum_i\cos\theta_i$"
    if df.empty:
        return _empty(title, xl, yl, "the RSS table")
    _require(df, ["layer", "rss"], "RSS table")
    key = _pick(df, ("k", "k_fraction"), "RSS table")
    d = df.assign(_l=_num(df["layer"]), _key=_num(df[key]))
    values = sorted(set(_finite(d["_key"].to_numpy()).tolist()))
    colors = _sequential(len(values))
    cut_k = _opt_int((phases or {}).get("k")) if isinstance(phases, Mapping) else None
    fig, (ax,) = _figure(1, panel=(5.6, 3.6))
    layers = _finite(d["_l"].to_numpy())
    x_end = float(layers.max()) if layers.size else float("nan")
    if isinstance(phases, Mapping) and _opt_int(phases.get("n")) is not None:
        x_end = float(_opt_int(phases.get("n")) - 1)
    _shade_phases(ax, phases, x_end)
    for v, color in zip(values, colors):
        g = d[d["_key"] == v].sort_values("_l", kind="stable")
        if key == "k":
            label = f"k = {v:g}"
            if "k_fraction" in g.columns and np.isfinite(_num(g["k_fraction"])).any():
                label += f" ({np.nanmean(_num(g['k_fraction'])):.0%} of d)"
        else:
            label = f"k = {v:.0%} of d"
        used = key == "k" and cut_k is not None and int(round(v)) == cut_k
        ax.plot(g["_l"].to_numpy(), _num(g["rss"]), color=color, lw=2.4 if used else 1.1, marker="o",
                ms=3.5 if used else 2.5, label=label + (" (phase cut)" if used else ""), zorder=3 if used else 2)
    smoothed = (phases or {}).get("smoothed") if isinstance(phases, Mapping) else None
    if isinstance(smoothed, (list, tuple, np.ndarray)) and len(smoothed):
        sm = _num(np.asarray(smoothed, dtype=object))
        ax.plot(np.arange(sm.size), sm, color="black", ls=":", lw=1.0, label="smoothed (cut profile)", zorder=4)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    _legend(ax, loc="best", ncols=2)
    _reason_note(fig, phases)
    fig.suptitle(title)
    return fig


@_styled
def resolution_frontier(res_df: pd.DataFrame, title: str) -> Figure:
    """Resolution sweep: energy vs visibility per k, Pareto-optimal k highlighted and connected.

    Columns (``resolution.tsv``, :func:`resdyn.readout.resolution_table`): ``energy``,
    ``visibility``, ``k`` (labels; or ``k_fraction``) and ``pareto`` (computed when absent).
    One axes.
    """
    df = _check_frame(res_df, "resolution table")
    xl = r"energy: mean top-k share of $\sum\sigma^2$ of $A_L$"
    yl = "visibility: 1 − mean RSS"
    if df.empty:
        return _empty(title, xl, yl, "the resolution table")
    _require(df, ["energy", "visibility"], "resolution table")
    e, v = _num(df["energy"]), _num(df["visibility"])
    if "pareto" in df.columns:
        front = _as_bool(df["pareto"])
    else:
        from resdyn.readout import pareto_front

        front = pareto_front(e, v)
    fig, (ax,) = _figure(1, panel=(4.8, 3.6))
    ax.plot(e, v, ls="none", marker="o", ms=5, color="0.45", mfc="white", label="k in the sweep")
    order = np.argsort(np.where(front, e, np.inf), kind="stable")[: int(front.sum())]
    ax.plot(e[order], v[order], color=PALETTE[3], marker="o", ms=5.5, lw=1.3, label="Pareto front", zorder=3)
    if "k" in df.columns or "k_fraction" in df.columns:
        ks = _num(df["k"]) if "k" in df.columns else _num(df["k_fraction"])
        fr = _num(df["k_fraction"]) if "k_fraction" in df.columns else np.full(len(df), np.nan)
        for xi, yi, k, f in zip(e, v, ks, fr):
            if np.isfinite(xi) and np.isfinite(yi):
                text = (f"k={k:g}" if "k" in df.columns else f"{k:.0%}")
                if "k" in df.columns and np.isfinite(f):
                    text += f" ({f:.0%})"
                ax.annotate(text, (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=5.5)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    _legend(ax, loc="best")
    fig.suptitle(title)
    return fig


DEFAULT_PHASE_METRICS = ("hidden_erank", "update_orthogonality", "norm_ratio", "relative_update_norm")


@_styled
def phase_metric_profiles(geometry_df: pd.DataFrame, phases: Mapping[str, Any] | None,
                          metrics: Sequence[str] | None = None, title: str = "") -> Figure:
    """Each metric vs layer with the three phases shaded (phase 3 extends to the last row).

    Columns (``layer_geometry``, :func:`resdyn.geometry.layer_geometry`, possibly joined with
    lens columns): ``layer`` and the ``metrics`` (default: those of ``hidden_erank``,
    ``update_orthogonality``, ``norm_ratio``, ``relative_update_norm`` present). One axes per
    metric.
    """
    df = _check_frame(geometry_df, "geometry table")
    if metrics is None:
        metrics = [m for m in DEFAULT_PHASE_METRICS if m in df.columns]
        if not metrics:
            raise ValueError(f"geometry table has none of the default metrics {list(DEFAULT_PHASE_METRICS)}; "
                             f"it has {list(df.columns)}")
    if isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    if not metrics:
        raise ValueError("metrics must name at least one column")
    xl = "layer L"
    if df.empty:
        return _empty(title, xl, ", ".join(metrics), "the geometry table")
    _require(df, ["layer", *metrics], "geometry table")
    d = df.assign(_l=_num(df["layer"])).sort_values("_l", kind="stable")
    x = d["_l"].to_numpy()
    xf = _finite(x)
    x_end = float(xf.max()) if xf.size else float("nan")
    fig, axes = _figure(len(metrics), ncols=1 if len(metrics) <= 3 else 2, panel=(4.6, 2.0), sharex=True)
    for i, (ax, metric) in enumerate(zip(axes, metrics)):
        _shade_phases(ax, phases, x_end, label=i == 0)
        ax.plot(x, _num(d[metric]), color="black", marker="o", ms=3, lw=1.1, label=None, zorder=3)
        ax.set_xlabel(xl)
        ax.set_ylabel(_metric_label(metric), fontsize=6.5)
    _legend(axes[0], loc="best", ncols=2)
    _reason_note(fig, phases)
    fig.suptitle(title)
    return fig


@_styled
def phase_width_scaling(widths_df: pd.DataFrame, fits_df: pd.DataFrame | None, title: str) -> Figure:
    """Phase width vs model depth per phase, with the OLS lines and slope ± CI in the legend.

    ``widths_df``: ``n_layers``, ``phase``, ``width`` (``model`` optional).
    ``fits_df`` (:func:`resdyn.geometry.depth_scaling`): ``phase``, ``status``, ``slope``,
    ``intercept``, ``slope_ci_low``, ``slope_ci_high``; phases whose status is not ``ok``
    (e.g. ``too_few_depths``) get points only. One axes.
    """
    df = _check_frame(widths_df, "phase widths")
    xl = "model depth (number of layers)"
    yl = "phase width (RSS-profile points = layers)"
    if df.empty:
        return _empty(title, xl, yl, "the phase-width table")
    _require(df, ["n_layers", "phase", "width"], "phase widths")
    fits: dict[Any, dict] = {}
    if fits_df is not None:
        fits_df = _check_frame(fits_df, "phase-width fits")
        if not fits_df.empty:
            _require(fits_df, ["phase", "slope", "intercept"], "phase-width fits")
            for rec in fits_df.to_dict("records"):
                fits[_opt_int(rec["phase"]) if _opt_int(rec["phase"]) is not None else rec["phase"]] = rec
    nl, w = _num(df["n_layers"]), _num(df["width"])
    ph_raw = df["phase"].tolist()
    ph = np.array([_opt_int(p) if _opt_int(p) is not None else p for p in ph_raw], dtype=object)
    phases = sorted(set(ph.tolist()) | set(fits), key=lambda p: (not isinstance(p, int), str(p)))
    fig, (ax,) = _figure(1, panel=(5.0, 3.6))
    x_fin = _finite(nl)
    for i, p in enumerate(phases):
        color = PHASE_COLORS.get(p, PALETTE[(i + 5) % len(PALETTE)])
        marker = PHASE_MARKERS.get(p, _MARKERS[i % len(_MARKERS)])
        name = f"phase {p} ({PHASE_NAMES[p]})" if p in PHASE_NAMES else f"phase {p}"
        m = ph == p
        fit = fits.get(p)
        status = str(fit.get("status", "ok")) if fit else None
        slope = _num([fit.get("slope")])[0] if fit else float("nan")
        icpt = _num([fit.get("intercept")])[0] if fit else float("nan")
        ok = fit is not None and status in ("ok", "nan") and np.isfinite(slope) and np.isfinite(icpt)
        if ok:
            lo = _num([fit.get("slope_ci_low")])[0]
            hi = _num([fit.get("slope_ci_high")])[0]
            ci = f" [{_fmt(lo, 3)}, {_fmt(hi, 3)}]" if np.isfinite(lo) and np.isfinite(hi) else ""
            label = f"{name}: slope {_fmt(slope, 3)}{ci} (CI)"
        elif fit is not None:
            label = f"{name}: not fitted ({status})"
        else:
            label = name
        ax.plot(nl[m], w[m], ls="none", marker=marker, ms=5, color=color, label=label, zorder=3)
        if ok and x_fin.size:
            xs = np.array([x_fin.min(), x_fin.max()])
            ax.plot(xs, icpt + slope * xs, color=color, lw=1.2, ls=_LINESTYLES[i % 4], zorder=2)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    _legend(ax, loc="best")
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------
# Beyond the two studies: bridge, causal test, uncertainty


@_styled
def bridge_profiles(bridge_df: pd.DataFrame, phases: Mapping[str, Any] | None = None, title: str = "") -> Figure:
    """Both studies' profiles on one depth axis (layer L), the RSS phases shaded.

    Panels: RSS at the phase k; Jacobian transport of S_L into S_{L+1} with the random-subspace
    mean ± sd and the chance level k/d; complex fraction and Henrici departure (attn, mlp);
    cumulative effective rank. Columns from :func:`resdyn.bridge.bridge_tables`.
    """
    df = _check_frame(bridge_df, "bridge table")
    if df.empty:
        return _empty(title, "layer L", "value", "the bridge table")
    missing = [c for c in ("layer", "rss", "transport", "random_mean", "random_sd", "complex_frac_attn",
                           "complex_frac_mlp", "henrici_attn", "henrici_mlp", "cum_erank") if c not in df]
    if missing:
        raise ValueError(f"bridge table lacks columns {missing}; has {list(df.columns)}")
    x = _num(df["layer"])
    fig, axes = _figure(4, panel=(6.0, 1.9), sharex=True)
    axes[0].plot(x, _num(df["rss"]), marker="o", label="RSS at the phase k")
    axes[0].set_ylabel("RSS")
    mean, sd = _num(df["random_mean"]), _num(df["random_sd"])
    axes[1].plot(x, _num(df["transport"]), marker="o", label="readout subspace S_L")
    axes[1].plot(x, mean, color="grey", label="random k-subspaces (mean ± sd)")
    axes[1].fill_between(x, mean - sd, mean + sd, color="grey", alpha=0.25)
    if "chance" in df:
        axes[1].axhline(float(_num(df["chance"])[0]), color="k", ls=":", lw=1, label="chance k/d")
    axes[1].set_ylabel("transport\n‖P₊ J V‖²/‖J V‖²")
    for kind, ls in (("attn", "-"), ("mlp", "--"), ("layer", ":")):
        if f"complex_frac_{kind}" not in df:
            continue
        axes[2].plot(x, _num(df[f"complex_frac_{kind}"]), ls=ls, marker="o", label=f"complex fraction ({kind})")
        axes[2].plot(x, _num(df[f"henrici_{kind}"]), ls=ls, marker="s", label=f"Henrici ({kind})")
    axes[2].set_ylabel("operator type")
    axes[3].plot(x, _num(df["cum_erank"]), marker="o", label="cumulative erank after layer L")
    axes[3].set_ylabel("cum. eff. rank")
    axes[3].set_xlabel("layer L")
    end = float(np.nanmax(x)) if len(x) else 0.0
    for ax in axes:
        _shade_phases(ax, phases, end, label=ax is axes[0])
        ax.legend(fontsize="x-small", loc="best")
    fig.suptitle(title)
    return fig


@_styled
def causal_effects(causal_df: pd.DataFrame, title: str = "") -> Figure:
    """Causal test per layer: KL and top-1 flip rate after projecting off (or patching) S_L^(k),
    against random k-subspaces (mean ± sd). Columns from :func:`resdyn.causal.causal_table`."""
    df = _check_frame(causal_df, "causal table")
    if df.empty:
        return _empty(title, "layer L", "KL", "the causal table")
    missing = [c for c in ("layer", "intervention", "kl", "flip_rate", "random_kl_mean", "random_kl_sd",
                           "random_flip_mean") if c not in df]
    if missing:
        raise ValueError(f"causal table lacks columns {missing}; has {list(df.columns)}")
    fig, axes = _figure(2, ncols=2, panel=(4.0, 3.0))
    for i, (name, sub) in enumerate(df.groupby("intervention", sort=False)):
        color = f"C{i}"
        x = _num(sub["layer"])
        axes[0].plot(x, _num(sub["kl"]), marker="o", color=color, label=f"{name}: readout subspace")
        m, s = _num(sub["random_kl_mean"]), _num(sub["random_kl_sd"])
        axes[0].plot(x, m, ls="--", color=color, label=f"{name}: random (mean ± sd)")
        axes[0].fill_between(x, m - s, m + s, color=color, alpha=0.15)
        axes[1].plot(x, _num(sub["flip_rate"]), marker="o", color=color, label=f"{name}: readout subspace")
        axes[1].plot(x, _num(sub["random_flip_mean"]), ls="--", color=color, label=f"{name}: random")
    axes[0].set_ylabel("KL(p_orig ‖ p_mod) (nats)")
    axes[1].set_ylabel("top-1 flip rate")
    for ax in axes:
        ax.set_xlabel("layer L (stream entering L)")
        ax.legend(fontsize="x-small")
    if (df["kl"] > 0).all() and (df["random_kl_mean"] > 0).all():
        axes[0].set_yscale("log")
    fig.suptitle(title)
    return fig


@_styled
def uncertainty_bands(boot_df: pd.DataFrame, title: str = "") -> Figure:
    """Bootstrap percentile intervals of the Jacobian metrics vs depth s (bands), one panel per
    metric with a per-sublayer estimate (``bootstrap.tsv``; rows without a layer are skipped)."""
    df = _check_frame(boot_df, "bootstrap table")
    need = [c for c in ("metric", "s", "estimate", "ci_low", "ci_high") if c not in df]
    if need:
        raise ValueError(f"bootstrap table lacks columns {need}; has {list(df.columns)}")
    df = df[pd.to_numeric(df["s"], errors="coerce").notna()]
    metrics = list(dict.fromkeys(df["metric"]))
    if not metrics:
        return _empty(title, "sublayer depth index s", "value", "per-sublayer bootstrap rows")
    fig, axes = _figure(len(metrics), panel=(6.0, 2.2), sharex=True)
    for ax, metric in zip(axes, metrics):
        sub = df[df["metric"] == metric].sort_values("s")
        x = _num(sub["s"])
        ax.plot(x, _num(sub["estimate"]), marker="o", label="estimate")
        ax.fill_between(x, _num(sub["ci_low"]), _num(sub["ci_high"]), alpha=0.3,
                        label=f"{float(_num(sub['level'])[0]) if 'level' in sub else 0.95:.0%} bootstrap CI")
        ax.set_ylabel(metric)
        ax.legend(fontsize="x-small")
    axes[-1].set_xlabel("sublayer depth index s (2L: attention, 2L+1: MLP)")
    fig.suptitle(title)
    return fig
