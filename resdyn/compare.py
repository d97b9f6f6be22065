"""Compare two runs table by table: does a result reproduce on another machine or library version?

Both runs are read with :func:`resdyn.results.load` (a run folder, its ``results/`` or a folder
written by ``resdyn collect``). Tables and table files (one per model/checkpoint, the ``file``
column) present in both are compared row by row in their written order; what only one run has is
listed as not compared (two runs of different configs share only part of their tables).

Tolerances: a float cell agrees when ``|a − b| ≤ atol + rtol·|b|`` (NaN agrees with NaN, ±Inf
with itself), with :data:`DEFAULT_TOLERANCE` unless the column is in :data:`TOLERANCES`;
integer, boolean and label columns must be equal (identity and provenance columns are not
compared); a partition column (:data:`PARTITIONS`) must be
equal up to relabelling of its communities within each group of rows. Each differing table file
is listed with its provenance difference: code version, resdyn version, commit, device, package
versions and the rule's params (e.g. a seed), from the sidecars.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from resdyn.io import PathLike
from resdyn.results import IDENTITY_COLUMNS, PROVENANCE_COLUMNS, Results, load

__all__ = [
    "DEFAULT_TOLERANCE",
    "TOLERANCES",
    "PARTITIONS",
    "FileDifference",
    "Comparison",
    "relabel",
    "column_differences",
    "provenance_difference",
    "compare_tables",
    "compare_runs",
]

#: (rtol, atol) of a float column: fp32 Jacobians on another device or BLAS agree to ~1e-6 relative.
DEFAULT_TOLERANCE: tuple[float, float] = (1e-5, 1e-8)
#: Columns with a wider tolerance, and why: p-values from tail areas amplify relative error.
TOLERANCES: dict[str, tuple[float, float]] = {
    "p_value": (1e-3, 1e-6),
    "q_value": (1e-3, 1e-6),
    "kl_p": (1e-3, 1e-6),
    "random_p": (1e-3, 1e-6),
    "sign_dependence_p": (1e-3, 1e-6),
}
#: Partition columns: {column: the columns whose groups each hold one partition}.
PARTITIONS: dict[str, tuple[str, ...]] = {"community": ("layer", "boundary")}
#: Columns that say who made a row rather than hold a result: not compared (identity columns
#: also depend on what the run folder still holds, e.g. models/ for the zoo's token counts).
_NOT_VALUES = set(PROVENANCE_COLUMNS) | set(IDENTITY_COLUMNS)


def relabel(labels: pd.Series, groups: pd.DataFrame | None = None) -> np.ndarray:
    """Labels renamed 0, 1, 2, … in order of first appearance within each group (row order kept):
    two partitions equal up to relabelling give equal arrays."""
    out = np.empty(len(labels), dtype=np.int64)
    keys = (
        [tuple(r) for r in groups.astype(str).to_numpy()]
        if groups is not None and groups.shape[1]
        else [()] * len(labels)
    )
    seen: dict[tuple, dict] = {}
    for i, (key, lab) in enumerate(zip(keys, labels.tolist())):
        names = seen.setdefault(key, {})
        out[i] = names.setdefault(lab, len(names))
    return out


def _tolerance(column: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    r, a = TOLERANCES.get(column, DEFAULT_TOLERANCE)
    return (r if rtol is None else rtol, a if atol is None else atol)


def column_differences(
    a: pd.DataFrame, b: pd.DataFrame, rtol: float | None = None, atol: float | None = None
) -> list[str]:
    """One line per column of the equally long tables ``a`` and ``b`` whose cells disagree
    (module docstring's rules); columns only one has are named too."""
    lines = []
    for col in [c for c in a.columns if c not in b.columns and c not in _NOT_VALUES]:
        lines.append(f"column {col} only in A")
    for col in [c for c in b.columns if c not in a.columns and c not in _NOT_VALUES]:
        lines.append(f"column {col} only in B")
    for col in [c for c in a.columns if c in b.columns and c not in _NOT_VALUES]:
        x, y = a[col].reset_index(drop=True), b[col].reset_index(drop=True)
        if col in PARTITIONS:
            groups = [g for g in PARTITIONS[col] if g in a.columns and g in b.columns]
            bad = relabel(x, a[groups].reset_index(drop=True)) != relabel(y, b[groups].reset_index(drop=True))
            if bad.any():
                lines.append(f"{col}: partitions differ (beyond relabelling) in {int(bad.sum())} of {len(x)} rows")
            continue
        numeric = all(pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s) for s in (x, y))
        if numeric and (pd.api.types.is_float_dtype(x) or pd.api.types.is_float_dtype(y)):
            u, v = x.to_numpy(dtype=float, na_value=np.nan), y.to_numpy(dtype=float, na_value=np.nan)
            r, t = _tolerance(col, rtol, atol)
            integral = all(pd.api.types.is_integer_dtype(s) for s in (x, y))
            ok = (u == v) | (np.isnan(u) & np.isnan(v))
            if not integral:
                with np.errstate(invalid="ignore"):
                    ok |= np.isfinite(u) & np.isfinite(v) & (np.abs(u - v) <= t + r * np.abs(v))
            if not ok.all():
                delta = np.abs(u - v)[~ok]
                finite = delta[np.isfinite(delta)]
                worst = f"max |Δ| {finite.max():.3g}" if finite.size else "NaN/Inf vs a number"
                lines.append(f"{col}: {int((~ok).sum())} of {len(u)} rows beyond rtol={r:g}, atol={t:g} ({worst})")
            continue
        xs, ys = x.astype(object).where(x.notna(), None), y.astype(object).where(y.notna(), None)
        bad = np.array([p != q for p, q in zip(xs.tolist(), ys.tolist())], dtype=bool)
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            lines.append(
                f"{col}: {int(bad.sum())} of {len(x)} rows differ (exact; e.g. row {i}: "
                f"{xs.iloc[i]!r} vs {ys.iloc[i]!r})"
            )
    return lines


def _versions(text: object) -> dict[str, str]:
    return dict(p.split("=", 1) for p in str(text or "").split() if "=" in p)


def provenance_difference(a: pd.Series, b: pd.Series) -> str:
    """What differs between the provenance columns of two rows (:data:`resdyn.results.PROVENANCE_COLUMNS`):
    code version, resdyn version, commit, device, package versions, params; "none" when nothing."""
    parts = []
    for col in ("code_version", "resdyn_version", "commit", "device"):
        if str(a.get(col)) != str(b.get(col)):
            parts.append(f"{col} {a.get(col)} → {b.get(col)}")
    va, vb = _versions(a.get("versions")), _versions(b.get("versions"))
    pk = [f"{k} {va.get(k)} → {vb.get(k)}" for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]
    if pk:
        parts.append("versions " + ", ".join(pk))
    pa, pb = (json.loads(s) if isinstance(s, str) and s else {} for s in (a.get("params"), b.get("params")))
    pp = [
        f"{k} {json.dumps(pa.get(k))} → {json.dumps(pb.get(k))}"
        for k in sorted(set(pa) | set(pb))
        if pa.get(k) != pb.get(k)
    ]
    if pp:
        parts.append("params " + ", ".join(pp))
    return "; ".join(parts) or "none"


@dataclass
class FileDifference:
    """One table file whose numbers differ: the table, the file, the differing columns, the provenance difference."""

    table: str
    file: str
    columns: list[str]
    provenance: str


@dataclass
class Comparison:
    """What :func:`compare_runs` found."""

    a: str
    b: str
    rtol: float | None
    atol: float | None
    compared: dict[str, int] = field(default_factory=dict)  # table -> files compared
    differences: list[FileDifference] = field(default_factory=list)
    not_shared: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def tolerance_line(self) -> str:
        r, t = _tolerance("", self.rtol, self.atol)
        wide = (
            ""
            if self.rtol is not None or self.atol is not None
            else "; " + ", ".join(f"{c}: rtol={v[0]:g}, atol={v[1]:g}" for c, v in TOLERANCES.items())
        )
        return (
            f"tolerance: float cells |a-b| <= atol + rtol*|b| with rtol={r:g}, atol={t:g}{wide}; integer, "
            f"bool and label columns exact; {', '.join(PARTITIONS)} partitions up to relabelling"
        )

    def render(self) -> str:
        """The report: what was compared, what not, and each differing file with its provenance difference."""
        lines = [
            f"compared {len(self.compared)} tables ({sum(self.compared.values())} table files) of "
            f"A={self.a} and B={self.b}",
            self.tolerance_line(),
        ]
        lines += [f"not compared: {x}" for x in self.not_shared]
        lines += [f"note: {x}" for x in self.notes]
        for d in self.differences:
            lines.append(f"DIFFERENT {d.table}: {d.file}: " + "; ".join(d.columns))
            lines.append(f"  provenance difference: {d.provenance}")
        tables = sorted({d.table for d in self.differences})
        lines.append(
            f"{len(self.differences)} table file(s) differ"
            + (f" (tables: {', '.join(tables)})" if tables else ": no differences")
        )
        return "\n".join(lines)


def compare_tables(name: str, a: pd.DataFrame, b: pd.DataFrame, out: Comparison) -> None:
    """Compare one table kind of both runs file by file into ``out``."""
    files_a, files_b = list(dict.fromkeys(a["file"])), list(dict.fromkeys(b["file"]))
    for f in files_a:
        if f not in files_b:
            out.not_shared.append(f"{name}: {f} only in A")
    for f in files_b:
        if f not in files_a:
            out.not_shared.append(f"{name}: {f} only in B")
    for f in [f for f in files_a if f in files_b]:
        x, y = a[a["file"] == f], b[b["file"] == f]
        for label, t in (("A", x), ("B", y)):
            stale = [s for s in set(t["stale"].dropna()) if s]
            if stale:
                out.notes.append(f"{label} {f}: {stale[0]}")
        out.compared[name] = out.compared.get(name, 0) + 1
        if len(x) != len(y):
            cols = [f"{len(x)} rows in A vs {len(y)} in B"]
        else:
            cols = column_differences(x, y, out.rtol, out.atol)
        if cols:
            out.differences.append(
                FileDifference(
                    name, f, cols, provenance_difference(x.iloc[0], y.iloc[0]) if len(x) and len(y) else "n/a"
                )
            )


def compare_runs(
    run_a: PathLike | Results, run_b: PathLike | Results, rtol: float | None = None, atol: float | None = None
) -> Comparison:
    """Compare every table the two runs share (module docstring); tolerances override the per-metric
    defaults when given. Stale tables are compared too, with a note."""
    ra = run_a if isinstance(run_a, Results) else load(run_a, allow_stale=True)
    rb = run_b if isinstance(run_b, Results) else load(run_b, allow_stale=True)
    out = Comparison(a=str(ra.path), b=str(rb.path), rtol=rtol, atol=atol)
    for name in ra:
        if name not in rb:
            out.not_shared.append(f"table {name} only in A")
    for name in rb:
        if name not in ra:
            out.not_shared.append(f"table {name} only in B")
    for name in [n for n in ra if n in rb]:
        compare_tables(name, ra[name], rb[name], out)
    return out
