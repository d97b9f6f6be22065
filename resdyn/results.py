"""Results out of the pipeline: every table of a run as one tidy data set.

:func:`collect` gathers each TSV table kind of a run (every :class:`resdyn.artifacts.TsvArtifact`
class, so a table added to the artifacts layer is collected without a change here) into one
DataFrame per kind, each row carrying who and what made it:

* identity: ``model``, ``family``, ``n_layers``, ``d_model`` (the checkpoint's config.json),
  ``ckpt``, ``step`` (training step: the zoo's own, or parsed from the hub revision; NaN with
  ``step_reason`` saying why for a revision that names none, a local model or a per-model
  table), ``tokens`` (training tokens where known: the zoo's step × batch × sequence length, an
  OLMo revision's ``tokensN``);
* provenance (from the table's ``.prov.json`` sidecar, :mod:`resdyn.provenance.sidecars`):
  ``resdyn_version``, ``code_version`` (the rule's code version), ``commit``, ``device``,
  ``versions`` (the scientific stack, ``name=version`` pairs), ``params`` (the rule's config
  values as JSON), ``file`` (the table's path in the run) and ``stale`` (why the sidecar does
  not vouch for the table: "" when it does).

A table column whose name is also an identity column (e.g. ``phase_metrics.n_layers``, the
layers of one phase) is kept as ``<table>_<column>``. A table without a sidecar, or whose content
or inputs changed since its rule wrote it, is skipped (and named) unless ``allow_stale``.

:func:`write_collected` stores one parquet file per table kind plus ``catalog.json`` (tables,
columns, kinds, units from the artifact classes' ``units``); :func:`load` reads either a run or a
collected folder lazily, table by table.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from resdyn import artifacts as A
from resdyn import io
from resdyn.io import PathLike

__all__ = [
    "IDENTITY_COLUMNS",
    "PROVENANCE_COLUMNS",
    "NotAResultsTree",
    "TableFile",
    "Collected",
    "Results",
    "table_classes",
    "RunLayout",
    "run_layout",
    "find_tables",
    "sidecar_problem",
    "checkpoint_step",
    "collect",
    "write_collected",
    "load",
    "CATALOG",
]

CATALOG = "catalog.json"

#: Identity columns of every collected row: {name: (kind, unit)}.
IDENTITY_COLUMNS: dict[str, tuple[str, str]] = {
    "model": ("str", ""),
    "family": ("str", ""),
    "n_layers": ("int", "layers"),
    "d_model": ("int", "dimensions"),
    "ckpt": ("str", ""),
    "step": ("float", "optimizer steps"),
    "step_reason": ("str", ""),
    "tokens": ("float", "tokens"),
}
#: Provenance columns of every collected row (from the table's sidecar): {name: (kind, unit)}.
PROVENANCE_COLUMNS: dict[str, tuple[str, str]] = {
    "resdyn_version": ("str", ""),
    "code_version": ("str", ""),
    "commit": ("str", ""),
    "device": ("str", ""),
    "versions": ("str", ""),
    "params": ("str", ""),
    "file": ("str", ""),
    "stale": ("str", ""),
}
_KEYS = ("model", "ckpt")  # identity read from a table's own columns when it has them
_TOKENS = re.compile(r"(?:^|[-_/])tokens(\d+(?:\.\d+)?)([KMBT]?)(?=$|[-_/])")
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


class NotAResultsTree(ValueError):
    """The folder holds none of the pipeline's tables (the message names it)."""


def table_classes() -> dict[str, type[A.TsvArtifact]]:
    """{table name: artifact class} of every TSV table kind; the name is the file (or folder) stem."""
    out: dict[str, type[A.TsvArtifact]] = {}
    for cls in A.artifact_classes():
        if issubclass(cls, A.TsvArtifact):
            name = Path(cls.relpath).name.removesuffix(".tsv")
            if name in out:
                raise ValueError(f"table name {name!r} is claimed by {out[name].__name__} and {cls.__name__}")
            out[name] = cls
    return out


@dataclass(frozen=True)
class RunLayout:
    """Where a run's files are: its results folder (any name: a copy from a cluster may be renamed)
    and the folder above it (``models/``, the run folder the sidecars' input paths are relative to).
    Artifact paths (``results/…``, ``models/…``) map to files by :meth:`locate` and back by
    :meth:`logical`, so two runs' tables pair up by the same logical path."""

    results: Path

    @property
    def run(self) -> Path:
        return self.results.parent

    def locate(self, rel: str) -> Path:
        """The file of the run-relative artifact path ``rel``."""
        head, _, tail = str(rel).partition("/")
        return self.results / tail if head == "results" else self.run / rel

    def logical(self, path: Path) -> str:
        """The run-relative artifact path of a file of this run."""
        if path.is_relative_to(self.results):
            return "results/" + path.relative_to(self.results).as_posix()
        return path.relative_to(self.run).as_posix()


def run_layout(path: PathLike) -> RunLayout:
    """The layout of a run given its results folder or the run folder holding ``results/``;
    NotAResultsTree naming ``path`` when it is not a folder."""
    p = Path(path)
    if not p.is_dir():
        raise NotAResultsTree(f"{p}: not a results tree (no such folder)")
    return RunLayout(p / "results" if (p / "results").is_dir() else p)


@dataclass(frozen=True)
class TableFile:
    """One table file of a run: its kind, path (a folder for the community partitions) and wildcards."""

    name: str
    cls: type[A.TsvArtifact]
    path: Path
    wildcards: dict[str, str]


def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)
    rx = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(rx + "$")


def find_tables(layout: RunLayout, names: list[str] | None = None) -> list[TableFile]:
    """Every table file of the kinds ``names`` (default: all) of the run, in path order."""
    found = []
    for name, cls in table_classes().items():
        if names is not None and name not in names:
            continue
        pattern = _pattern(cls.relpath)
        head, _, tail = cls.relpath.partition("/")
        base, glob = (layout.results, tail) if head == "results" else (layout.run, cls.relpath)
        if not base.is_dir():
            continue
        for path in sorted(base.glob(re.sub(r"\{\w+\}", "*", glob))):
            rel = layout.logical(path)
            m = pattern.match(rel)
            if m and not any(part.startswith(".") for part in Path(rel).parts):
                found.append(TableFile(name, cls, path, m.groupdict()))
    return found


def sidecar_problem(path: PathLike, layout: RunLayout) -> str:
    """Why the sidecar of ``path`` does not vouch for it ("" when it does): missing or unreadable,
    the content changed since its rule wrote it, or an input was rebuilt since (its own sidecar
    records other content than this one read). Hashes only ``path`` itself, not its inputs."""
    side = io.prov_path(path)
    if not side.is_file():
        return f"no provenance sidecar {side.name}"
    try:
        prov = io.read_json(side)
        recorded = prov["artifact"]["sha256"]
    except (ValueError, KeyError, TypeError) as err:
        return f"unreadable sidecar {side.name} ({err})"
    from resdyn.provenance.sidecars import fingerprint

    if fingerprint(path)["sha256"] != recorded:
        return f"changed since rule {prov.get('rule')} wrote it (sha256 differs from its sidecar)"
    for inp, digest in (prov.get("inputs") or {}).items():
        up = layout.locate(inp)
        up_side = io.prov_path(up)
        if digest and up_side.is_file():
            try:
                now = io.read_json(up_side)["artifact"]["sha256"]
            except (ValueError, KeyError, TypeError):
                continue
            if now != digest:
                return f"stale: made from an older {inp} (rebuilt since)"
    return ""


def checkpoint_step(ckpt: str, record: Mapping[str, Any] | None) -> tuple[float, str]:
    """(training step, reason when NaN) of a checkpoint from its record: a zoo checkpoint's
    ``step``, else the step in its hub revision name (:func:`resdyn.lm.hub.revision_step`)."""
    from resdyn.lm.hub import revision_step

    record = record or {}
    if isinstance(record.get("step"), int):
        return float(record["step"]), ""
    if record.get("source") == "local":
        return np.nan, "local checkpoint: no training step"
    revision = record.get("revision") or ckpt
    parsed = revision_step(str(revision))
    if parsed is None:
        return np.nan, f"revision {revision!r} names no training step"
    return float(parsed[1]), ""


def _tokens(record: Mapping[str, Any], step: float, train: Mapping[str, Any] | None) -> float:
    """Training tokens seen at the checkpoint: the revision's ``tokensN[KMBT]``, or for a zoo model
    step × batch_size × seq_len; NaN when unknown."""
    m = _TOKENS.search(str(record.get("revision") or ""))
    if m:
        return float(m[1]) * _SCALE[m[2]]
    if train and np.isfinite(step) and record.get("source") == "train":
        return step * float(train["batch_size"]) * float(train["seq_len"])
    return np.nan


class _Identity:
    """Identity columns of (model, ckpt), read once each from the run's records and sidecars."""

    def __init__(self, layout: RunLayout):
        self.run = layout.run
        self._cache: dict[tuple[str, str | None], dict[str, Any]] = {}
        self.sidecar_checkpoints: dict[tuple[str, str], dict] = {}

    def _record(self, model: str, ckpt: str) -> dict:
        path = A.CheckpointRecord.path(self.run, model=model, ckpt=ckpt)
        if path.is_file():
            return io.read_json(path)
        return self.sidecar_checkpoints.get((model, ckpt)) or {}

    def _zoo(self, model: str) -> dict:
        side = io.prov_path(self.run / "models" / model / "weights")
        return (io.read_json(side).get("params") or {}) if side.is_file() else {}

    def _arch(self, record: Mapping[str, Any], zoo: Mapping[str, Any]) -> dict:
        from resdyn.lm.hub import architecture, read_config_json

        cfg = Path(str(record.get("folder") or "")) / "config.json"
        if record.get("folder") and cfg.is_file():
            arch = architecture(read_config_json(cfg))
        else:
            arch = dict(zoo.get("arch") or {})
        return {"family": arch.get("family"), "n_layers": arch.get("n_layers"), "d_model": arch.get("d_model")}

    def ckpts(self, model: str) -> list[str]:
        folder = self.run / "models" / model
        names = sorted(p.parent.name for p in folder.glob("*/checkpoint.json")) if folder.is_dir() else []
        return names or sorted(c for m, c in self.sidecar_checkpoints if m == model)

    def __call__(self, model: Any, ckpt: Any) -> dict[str, Any]:
        ckpt = ckpt if isinstance(ckpt, str) and ckpt else None
        key = (str(model), ckpt)
        if key in self._cache:
            return self._cache[key]
        out: dict[str, Any] = {"family": None, "n_layers": None, "d_model": None, "step": np.nan, "tokens": np.nan}
        if not isinstance(model, str) or not model:
            out["step_reason"] = "not a per-model table"
        else:
            zoo = self._zoo(model)
            known = self.ckpts(model)
            record = self._record(model, ckpt or (known[-1] if known else ""))
            out.update(self._arch(record, zoo))
            if ckpt is None:
                out["step_reason"] = "per-model table: no checkpoint"
            else:
                out["step"], out["step_reason"] = checkpoint_step(ckpt, record)
                out["tokens"] = _tokens(record, out["step"], zoo.get("train"))
        self._cache[key] = out
        return out


def _provenance(path: Path, layout: RunLayout) -> dict[str, Any]:
    side = io.prov_path(path)
    try:
        prov = io.read_json(side) if side.is_file() else {}
    except ValueError:
        prov = {}
    if not isinstance(prov, dict):  # a sidecar that is JSON but not a record: no provenance columns
        prov = {}
    params = prov.get("params") if isinstance(prov.get("params"), dict) else {}
    params = dict(params)
    versions = prov.get("versions") or {}
    return {
        "resdyn_version": versions.get("resdyn"),
        "code_version": params.pop("code", None),
        "commit": (prov.get("git") or {}).get("commit"),
        "device": prov.get("device"),
        "versions": " ".join(f"{k}={v}" for k, v in sorted(versions.items())) or None,
        "params": json.dumps(params, sort_keys=True) if prov else None,
        "file": layout.logical(path),
        "checkpoint": prov.get("checkpoint"),
    }


def _read(tf: TableFile) -> pd.DataFrame:
    if hasattr(tf.cls, "read_folder"):
        return tf.cls.read_folder(tf.path)
    return tf.cls.read(tf.path)


def _tidy(name: str, table: pd.DataFrame, tf: TableFile, prov: dict, stale: str, ident: _Identity) -> pd.DataFrame:
    """The table with identity and provenance columns in front (clashing own columns renamed)."""
    own = set(IDENTITY_COLUMNS) | set(PROVENANCE_COLUMNS)
    table = table.rename(columns={c: f"{name}_{c}" for c in table.columns if c in own and c not in _KEYS})
    models = table["model"] if "model" in table.columns else pd.Series([tf.wildcards.get("model")] * len(table))
    ckpts = table["ckpt"] if "ckpt" in table.columns else pd.Series([tf.wildcards.get("ckpt")] * len(table))
    rows = [ident(m, c) for m, c in zip(models.tolist(), ckpts.tolist())]
    front = pd.DataFrame(
        {
            "model": models.to_numpy(dtype=object),
            "family": [r["family"] for r in rows],
            "n_layers": pd.array([r["n_layers"] for r in rows], dtype="Int64"),
            "d_model": pd.array([r["d_model"] for r in rows], dtype="Int64"),
            "ckpt": ckpts.to_numpy(dtype=object),
            "step": np.array([r["step"] for r in rows], dtype=float),
            "step_reason": [r["step_reason"] for r in rows],
            "tokens": np.array([r["tokens"] for r in rows], dtype=float),
        },
        index=table.index,
    )
    for col in PROVENANCE_COLUMNS:
        front[col] = stale if col == "stale" else prov[col]
    return pd.concat([front, table.drop(columns=[c for c in _KEYS if c in table.columns])], axis=1)


@dataclass
class Collected:
    """What :func:`collect` returns: the results folder, the tables by name, the files read (logical
    paths) and the lines about skipped ones."""

    run: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def collect(path: PathLike, allow_stale: bool = False, names: list[str] | None = None) -> Collected:
    """Every table of the run at ``path`` (or of the kinds ``names``) as tidy DataFrames (module docstring).

    A file whose sidecar does not vouch for it (:func:`sidecar_problem`) is skipped with one line
    in ``skipped``, or kept with the reason in ``stale`` when ``allow_stale``. A file that does
    not read through its artifact class is skipped with the reader's message. NotAResultsTree
    when the folder holds no table at all.
    """
    layout = run_layout(path)
    files = find_tables(layout, names)
    if not files and names is None:
        raise NotAResultsTree(
            f"{path}: not a results tree (none of the pipeline's tables, e.g. "
            f"{A.SpectraTable.relpath}, in it or in a results/ folder in it)"
        )
    out = Collected(run=layout.results)
    ident = _Identity(layout)
    provs = {tf.path: _provenance(tf.path, layout) for tf in files}
    for tf in files:  # checkpoint records from the sidecars, for runs copied without models/
        ck = provs[tf.path]["checkpoint"]
        if isinstance(ck, dict) and ck.get("model") and ck.get("checkpoint"):
            ident.sidecar_checkpoints.setdefault((ck["model"], ck["checkpoint"]), ck)
    parts: dict[str, list[pd.DataFrame]] = {}
    for tf in files:
        rel = layout.logical(tf.path)
        stale = sidecar_problem(tf.path, layout)
        if stale and not allow_stale:
            out.skipped.append(f"{rel}: {stale} — skipped (rerun snakemake to rebuild it, or --allow-stale)")
            continue
        try:
            table = _read(tf)
        except (OSError, ValueError) as err:
            out.skipped.append(f"{rel}: unreadable ({err}) — skipped")
            continue
        parts.setdefault(tf.name, []).append(_tidy(tf.name, table, tf, provs[tf.path], stale, ident))
        out.files.setdefault(tf.name, []).append(rel)
    for name, frames in parts.items():
        out.tables[name] = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return out


def _column_kind(series: pd.Series) -> str:
    if pd.api.types.is_bool_dtype(series):
        return "bool"
    if pd.api.types.is_integer_dtype(series):
        return "int"
    if pd.api.types.is_numeric_dtype(series):
        return "float"
    return "str"


def catalog_entry(name: str, table: pd.DataFrame, files: list[str]) -> dict[str, Any]:
    """The catalog record of one collected table: artifact class, source files, rows, and per
    column its kind (declared by the artifact class, else the column's dtype), unit and role."""
    cls = table_classes()[name]
    units = getattr(cls, "units", {})
    cols = {}
    for col in table.columns:
        if col in IDENTITY_COLUMNS or col in PROVENANCE_COLUMNS:
            kind, unit = (IDENTITY_COLUMNS | PROVENANCE_COLUMNS)[col]
            role = "identity" if col in IDENTITY_COLUMNS else "provenance"
        else:
            src = col.removeprefix(f"{name}_") if col.removeprefix(f"{name}_") in cls.columns else col
            kind, unit, role = cls.columns.get(src) or _column_kind(table[col]), units.get(src, ""), "value"
        cols[col] = {"kind": kind, "unit": unit, "role": role}
    doc = (cls.__doc__ or "").strip().splitlines()
    return {
        "file": f"{name}.parquet",
        "artifact": cls.__name__,
        "relpath": cls.relpath,
        "description": doc[0] if doc else "",
        "rows": int(len(table)),
        "sources": files,
        "columns": cols,
    }


class CollectRefused(ValueError):
    """``resdyn collect -o DIR`` would write into the results tree or over files it did not write."""


def check_collect_target(collected: Collected, out: PathLike, force: bool = False) -> None:
    """Refuse an output folder inside the run's results tree (its parquets would become files
    without sidecars there), and, unless ``force``, same-named files in ``out`` that no earlier
    ``resdyn collect`` wrote (its ``catalog.json`` lists the tables it wrote: that is its manifest)."""
    out, run = Path(out).resolve(), Path(collected.run).resolve()
    if out == run or run in out.parents:
        raise CollectRefused(f"{out} is inside the results tree {run}: choose a folder outside it")
    wanted = [f"{name}.parquet" for name in collected.tables] + [CATALOG]
    present = [name for name in wanted if (out / name).exists()]
    if force or not present:
        return
    ours: set[str] = set()
    try:
        catalog = io.read_json(out / CATALOG) if (out / CATALOG).is_file() else None
    except ValueError:
        catalog = None
    if (
        isinstance(catalog, dict)
        and catalog.get("format") == "resdyn.collected/1"
        and isinstance(catalog.get("tables"), dict)
    ):
        ours = {CATALOG, *(f"{name}.parquet" for name in catalog["tables"])}
    foreign = [name for name in present if name not in ours]
    if foreign:
        raise CollectRefused(
            f"{out} holds {', '.join(foreign[:5])}{' …' if len(foreign) > 5 else ''}, which no "
            "resdyn collect wrote there: choose another folder, or pass --force to overwrite"
        )


def write_collected(collected: Collected, out: PathLike, force: bool = False) -> Path:
    """One ``<table>.parquet`` per table kind and ``catalog.json`` in ``out`` (each written atomically;
    the catalog last, so its presence marks a complete folder). Returns the catalog's path.
    :func:`check_collect_target` first: :class:`CollectRefused` before anything is written."""
    from importlib.metadata import version

    check_collect_target(collected, out, force)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for name, table in sorted(collected.tables.items()):
        with io.atomic_path(out / f"{name}.parquet") as tmp:
            table.to_parquet(tmp, index=False)
        tables[name] = catalog_entry(name, table, collected.files.get(name, []))
    catalog = {
        "format": "resdyn.collected/1",
        "resdyn_version": version("resdyn"),
        "run": str(collected.run),
        "skipped": collected.skipped,
        "tables": tables,
    }
    io.write_json(catalog, out / CATALOG)
    return out / CATALOG


class Results(Mapping):
    """The tables of a run or a collected folder, read on first access: ``results["spectra"]``.

    ``list(results)`` names the tables present; ``results.catalog`` describes a collected folder
    (None for a run); ``results.skipped`` lists the files left out so far (stale or unreadable).
    """

    def __init__(self, path: PathLike, allow_stale: bool = False):
        self.path = Path(path)
        self.allow_stale = allow_stale
        self._tables: dict[str, pd.DataFrame] = {}
        self.skipped: list[str] = []
        if (self.path / CATALOG).is_file():
            self.catalog: dict | None = io.read_json(self.path / CATALOG)
            self._names = sorted(self.catalog["tables"])
        else:
            self.catalog = None
            self._names = sorted({tf.name for tf in find_tables(run_layout(self.path))})
            if not self._names:
                raise NotAResultsTree(
                    f"{path}: not a results tree nor a collected folder (no {CATALOG}, none of the pipeline's tables)"
                )

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._names:
            raise KeyError(f"{self.path}: no table {name!r}; it has {self._names}")
        if name not in self._tables:
            if self.catalog is not None:
                self._tables[name] = pd.read_parquet(self.path / self.catalog["tables"][name]["file"])
            else:
                got = collect(self.path, allow_stale=self.allow_stale, names=[name])
                for line in got.skipped:
                    warnings.warn(line, stacklevel=2)
                self.skipped += got.skipped
                if name not in got.tables:
                    raise KeyError(f"{self.path}: every {name!r} table was skipped: {'; '.join(got.skipped)}")
                self._tables[name] = got.tables[name]
        return self._tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"Results({str(self.path)!r}: {', '.join(self._names)})"


def load(path: PathLike, allow_stale: bool = False) -> Results:
    """The tables of a run (its folder or its ``results/``) or of a folder written by ``resdyn collect``,
    as pandas DataFrames read lazily by name (:class:`Results`)."""
    return Results(path, allow_stale=allow_stale)
