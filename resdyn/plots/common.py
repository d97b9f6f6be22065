"""Helpers shared by the figure modules: column picking and checks, NaN handling, legends,
phase shading, and :func:`save_figure` (PNG + PDF with the provenance embedded).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter

from resdyn import artifacts
from resdyn.plots.style import (
    B_LABEL,
    CKPT_COLUMNS,
    KIND_STYLE,
    METRIC_LABELS,
    PHASE_COLORS,
    PHASE_NAMES,
    PROVENANCE_KEY,
    RC,
    new_figure,
)


def check_frame(df: Any, what: str) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{what} must be a pandas DataFrame, got {type(df).__name__}")
    return df


def select_metrics(
    df: pd.DataFrame,
    metrics: str | Sequence[str] | None,
    defaults: Sequence[str | None],
    what: str,
    listed: Sequence[str] | None = None,
) -> list[str]:
    """The columns a multi-metric figure draws: ``metrics`` (one name or a list) when given,
    else those of ``defaults`` that ``df`` has (``listed``: the defaults as the error names them).
    Raises ValueError when no default is present or ``metrics`` is empty."""
    if metrics is None:
        chosen = [m for m in defaults if m is not None and m in df.columns]
        if not chosen:
            raise ValueError(
                f"{what} has none of the default metrics {list(listed or defaults)}; it has {list(df.columns)}"
            )
        return chosen
    chosen = [metrics] if isinstance(metrics, str) else list(metrics)
    if not chosen:
        raise ValueError("metrics must name at least one column")
    return chosen


def require(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}; it has {list(df.columns)}")


def pick(df: pd.DataFrame, candidates: Sequence[str], what: str, required: bool = True) -> str | None:
    """The first of ``candidates`` that is a column of ``df``."""
    for c in candidates:
        if c in df.columns:
            return c
    if required:
        raise ValueError(f"{what} needs one of the columns {list(candidates)}; it has {list(df.columns)}")
    return None


def num(values: Any) -> np.ndarray:
    """Float64 array; anything non-numeric becomes NaN."""
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=np.float64)


def as_bool(values: Any) -> np.ndarray:
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


def opt_int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(round(f)) if math.isfinite(f) else None


def finite_values(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def log_if_positive(ax, *arrays: np.ndarray) -> None:
    """Log y axis when some finite positive value exists (otherwise matplotlib would warn)."""
    vals = np.concatenate([np.ravel(a) for a in arrays]) if arrays else np.zeros(0)
    if np.any(np.isfinite(vals) & (vals > 0)):
        ax.set_yscale("log")
        # plain numbers (2, 5, 10) rather than 2×10⁰; minor labels only on short ranges
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5)))


def add_legend(ax, **kwargs: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    extra = kwargs.pop("extra", [])
    handles, labels = handles + [h for h in extra], labels + [h.get_label() for h in extra]
    if handles:
        ax.legend(handles, labels, **kwargs)


def note(ax, text: str) -> None:
    """Grey text centred in the axes (why it has no data)."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")


def empty_figure(title: str, xlabel: str, ylabel: str, what: str) -> Figure:
    fig, (ax,) = new_figure(1, panel=(4.5, 3.0))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    note(ax, f"no data: {what} is empty")
    fig.suptitle(title)
    return fig


def metric_label(col: str) -> str:
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


def sequential_colors(n: int) -> list:
    """Colour-blind-safe sequential colours (viridis without its palest yellow)."""
    if n <= 1:
        return [mpl.colormaps["viridis"](0.35)]
    return [mpl.colormaps["viridis"](x) for x in np.linspace(0.0, 0.85, n)]


def ordered_unique(values: Any) -> list:
    return list(pd.unique(pd.Series(values)))


def fmt_num(v: float, digits: int = 3) -> str:
    return "nan" if v is None or not np.isfinite(v) else f"{v:.{digits}g}"


def kind_of(df: pd.DataFrame, s: np.ndarray) -> np.ndarray:
    """Sublayer kinds: the ``kind`` column, or from the parity of s (2L attn, 2L+1 MLP)."""
    if "kind" in df.columns:
        return df["kind"].astype(str).str.lower().to_numpy()
    return np.where(np.isfinite(s) & (np.mod(s, 2) == 1), "mlp", "attn")


def plot_kinds(
    ax, x: np.ndarray, y: np.ndarray, kinds: np.ndarray, color: Any, ls: str = "-", label: str | None = None
) -> None:
    """A line through all points, then attention/MLP points with their own markers."""
    ax.plot(x, y, color=color, ls=ls, lw=1.1, label=label)
    for kind, style in KIND_STYLE.items():
        m = kinds == kind
        if m.any():
            ax.plot(
                x[m],
                y[m],
                ls="none",
                marker=style["marker"],
                ms=3.5,
                color=color,
                mfc=color if kind == "attn" else "white",
                mew=0.9,
            )


def kind_handles() -> list:
    return [
        Line2D([], [], ls="none", marker="o", color="0.3", mfc="0.3", label="attention (s = 2L)"),
        Line2D([], [], ls="none", marker="s", color="0.3", mfc="white", label="MLP (s = 2L+1)"),
    ]


def boundary_x(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, str]:
    """x = boundary depth index (2L + [pre-MLP]) and the boundary side (0 attn, 1 MLP)."""
    layer = num(df["layer"])
    if "boundary" in df.columns:
        side = df["boundary"].astype(str).str.lower().str.contains("mlp").to_numpy().astype(int)
        return 2 * layer + side, side, B_LABEL
    return layer, np.zeros(len(df), dtype=int), "layer L"


def group_column(df: pd.DataFrame) -> tuple[list, np.ndarray] | tuple[None, None]:
    """Groups by checkpoint (and model when several): ordered labels and per-row labels."""
    ck = pick(df, CKPT_COLUMNS, "table", required=False)
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
    return ordered_unique(lab), lab


def shade_phases(ax, phases: Mapping[str, Any] | None, x_end: float, label: bool = True) -> None:
    """Shade phase 1 [0, b1], 2 (b1, b2], 3 (b2, x_end] and mark b1, b2 and the peak."""
    if not phases:
        return
    if not isinstance(phases, Mapping):
        raise ValueError(f"phases must be a dict with keys b1, b2, peak, reason; got {type(phases).__name__}")
    b1, b2, peak = (opt_int(phases.get(k)) for k in ("b1", "b2", "peak"))
    if b1 is not None and b2 is not None and b1 <= b2:
        end = max(float(x_end) if np.isfinite(x_end) else b2, b2) + 0.5
        spans = {1: (-0.5, b1 + 0.5), 2: (b1 + 0.5, b2 + 0.5), 3: (b2 + 0.5, end)}
        for ph, (a, b) in spans.items():
            if b > a:
                ax.axvspan(
                    a,
                    b,
                    color=PHASE_COLORS[ph],
                    alpha=0.13,
                    lw=0,
                    zorder=0,
                    label=f"phase {ph} ({PHASE_NAMES[ph]})" if label else None,
                )
    for key, ls in (("b1", "--"), ("peak", ":"), ("b2", "-.")):
        v = opt_int(phases.get(key))
        if v is not None:
            ax.axvline(v, color="0.25", ls=ls, lw=0.9, zorder=1, label=f"{key} = {v}" if label else None)


def reason_note(fig: Figure, phases: Mapping[str, Any] | None) -> None:
    reason = (phases or {}).get("reason") if isinstance(phases, Mapping) else None
    if reason:
        fig.supxlabel("\n".join(textwrap.wrap(f"phase cut fallback: {reason}", 140)), fontsize=5.5, color="0.35")


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


#: OpenType layout tables a PDF viewer never reads (it draws the glyphs at the positions the page
#: gives): dropped from the fonts embedded in a PDF. fontTools subsets them by decompiling them,
#: two thirds of each Type 42 font's subsetting time (0.14 -> 0.04 s per font for DejaVu Sans).
PDF_UNUSED_FONT_TABLES = ("GSUB", "GPOS", "GDEF", "kern")


@contextlib.contextmanager
def pdf_fonts_without_layout_tables() -> Iterator[None]:
    """Within the block, fonts that matplotlib subsets for a PDF leave out :data:`PDF_UNUSED_FONT_TABLES`.

    matplotlib subsets each Type 42 font with ``fontTools.subset.Options()``, whose default list
    of dropped tables this extends for the duration (restored on exit). Where fontTools lacks
    that list, fonts are subset as before (the same PDF, with the tables kept).
    """
    from fontTools import subset

    default = getattr(subset.Options, "_drop_tables_default", None)
    if not isinstance(default, list):
        yield
        return
    subset.Options._drop_tables_default = default + [t for t in PDF_UNUSED_FONT_TABLES if t not in default]
    try:
        yield
    finally:
        subset.Options._drop_tables_default = default


def save_figure(fig: Figure, png_path: str | Path, pdf_path: str | Path, provenance: dict, dpi: int = 120) -> None:
    """Write ``fig`` as PNG and PDF, atomically, with the provenance embedded; close the figure.

    The provenance (``json.dumps``; numpy values and paths converted, NaN → null as in the
    ``.prov.json`` sidecars) goes into the PNG text
    chunk ``resdyn_provenance`` and into the PDF metadata ``Subject``; the PDF ``Keywords`` are
    ``"resdyn; <rule>; <wildcard values…>"`` and its ``Title`` the figure's title. Both files
    are written to temporary names and renamed only after both succeeded, so a failure leaves
    neither (nor any temporary file) behind. The PDF carries no creation date; its fonts are
    TrueType (Type 42) subsets without OpenType layout tables (:func:`pdf_fonts_without_layout_tables`). The figure's
    layout engine (constrained layout) runs once, for the PNG; the PDF uses the same positions.

    Args:
        fig: the figure (from this module or pyplot).
        png_path, pdf_path: destinations.
        provenance: JSON-serialisable record (see :mod:`resdyn.provenance.sidecars`).
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
    pdf_meta = {"Subject": prov, "Keywords": _keywords(provenance), "Creator": "resdyn", "CreationDate": None}
    if title:
        png_meta["Title"] = title
        pdf_meta["Title"] = title
    try:
        # no layout from rcParams: the PDF is saved with no layout engine (artifacts.Figure.write)
        no_rc_layout = {"figure.autolayout": False, "figure.constrained_layout.use": False}
        with mpl.rc_context({**RC, **no_rc_layout}), pdf_fonts_without_layout_tables():
            artifacts.Figure.write(fig, {"png": png_path, "pdf": pdf_path}, dpi, {"png": png_meta, "pdf": pdf_meta})
    finally:
        plt = sys.modules.get("matplotlib.pyplot")  # only pyplot-made figures need closing
        if plt is not None:
            plt.close(fig)
