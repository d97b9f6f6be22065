"""The base of the artifacts package: :class:`Artifact` (a path relative to the run folder, and the
registry every artifact class enters when it is defined), :class:`TsvArtifact` (a TSV table's
schema, its validating reader and its writer), :class:`ArtifactError` and the schema helpers.

TSV column kinds: ``int`` (integer values; a float column of integral values where NaN is
allowed), ``float`` (any number), ``bool`` (True/False), ``str`` (a label: any cell). A
numeric cell may be NaN/Inf only in a column listed in ``allow_nan`` or in a row whose
``reason`` column is non-empty — the same rule :func:`resdyn.io.write_tsv` applies on write.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from resdyn import io
from resdyn.io import PathLike

__all__ = ["Artifact", "ArtifactError", "TsvArtifact", "CKPT_DIR", "kinds", "registered"]

#: The folder of one checkpoint's results, relative to the run folder (most ``relpath`` values start with it).
CKPT_DIR = "results/{model}/{ckpt}/"


class ArtifactError(ValueError):
    """An artifact on disk does not have the layout its class declares (the message names the file)."""


_KINDS = ("int", "float", "bool", "str")


def _is_integral(values: pd.Series) -> bool:
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    v = v[np.isfinite(v)]
    return bool(np.all(v == np.round(v)))


#: Every subclass of :class:`Artifact`, in the order they were defined (:meth:`Artifact.__init_subclass__`).
_REGISTRY: list[type[Artifact]] = []


def registered() -> tuple[type[Artifact], ...]:
    """Every subclass of :class:`Artifact` defined so far, in definition order (abstract bases such as
    :class:`TsvArtifact` and classes without a ``relpath`` included)."""
    return tuple(_REGISTRY)


class Artifact:
    """Base of every artifact: ``relpath`` is its file (or folder) relative to the run folder.

    Each subclass enters the registry (:func:`registered`) when its class statement runs, so
    importing a module registers all of its artifact classes.
    """

    relpath: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY.append(cls)

    @classmethod
    def path(cls, run: PathLike = ".", **wildcards: Any) -> Path:
        """The file (or folder) of this artifact under the run folder ``run`` (wildcards fill ``relpath``)."""
        return Path(run) / cls.relpath.format(**wildcards)


class TsvArtifact(Artifact):
    """Base of a TSV table artifact (tab-separated, header row, written by :func:`resdyn.io.write_tsv`).

    Subclasses set ``relpath`` (a template relative to the run folder, e.g.
    ``results/{model}/{ckpt}/spectra.tsv``), ``columns`` ({name: kind}, the columns every file
    has), ``allow_nan`` (columns whose numbers may be NaN) and ``extra_columns`` (whether
    further columns may follow; their cells are not checked for kind); ``units`` ({column:
    unit}) only where a column has a physical unit (``resdyn collect``'s catalog reports them).
    """

    columns: ClassVar[Mapping[str, str]] = {}
    units: ClassVar[Mapping[str, str]] = {}
    allow_nan: ClassVar[tuple[str, ...]] = ()
    extra_columns: ClassVar[bool] = False

    @classmethod
    def validate(cls, table: pd.DataFrame, where: PathLike) -> pd.DataFrame:
        """Check ``table`` against the schema; ArtifactError naming ``where`` and the problem."""
        missing = [c for c in cls.columns if c not in table.columns]
        if missing:
            raise ArtifactError(f"{where}: lacks column(s) {missing} ({cls.__name__} has {list(cls.columns)})")
        extra = [c for c in table.columns if c not in cls.columns]
        if extra and not cls.extra_columns:
            raise ArtifactError(f"{where}: unexpected column(s) {extra} ({cls.__name__} has {list(cls.columns)})")
        for name, kind in cls.columns.items():
            col = table[name]
            if kind == "str" or col.isna().all():
                continue
            numeric = pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)
            if kind == "bool":
                ok = pd.api.types.is_bool_dtype(col) or set(col.dropna().astype(str)) <= {"True", "False"}
            elif kind == "int":
                ok = numeric and _is_integral(col)
            else:
                ok = numeric
            if not ok:
                bad = col.dropna().iloc[0]
                raise ArtifactError(
                    f"{where}: column {name!r} must hold {kind} values, got dtype {col.dtype} (e.g. {bad!r})"
                )
        cls._check_finite(table, where)
        return table

    @classmethod
    def _check_finite(cls, table: pd.DataFrame, where: PathLike) -> None:
        numeric = [c for c, k in cls.columns.items() if k in ("int", "float") and c not in cls.allow_nan]
        if not numeric or table.empty:
            return
        values = table[numeric].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        bad = ~np.isfinite(values)
        if "reason" in table.columns:
            reason = table["reason"].astype(object).where(table["reason"].notna(), "")
            bad[reason.astype(str).str.strip().to_numpy() != "", :] = False
        if bad.any():
            row, col = (int(x[0]) for x in np.nonzero(bad))
            raise ArtifactError(
                f"{where}: column {numeric[col]!r} row {row} is {values[row, col]}; "
                f"{cls.__name__} allows NaN only in {list(cls.allow_nan)} or in rows with a reason"
            )

    @classmethod
    def read(cls, path: PathLike) -> pd.DataFrame:
        """Read and validate the table at ``path`` (pandas' dtypes, as written)."""
        return cls.validate(io.read_tsv(path), path)

    @classmethod
    def write(cls, table: pd.DataFrame, path: PathLike, provenance: dict | None = None) -> None:
        """Write ``table`` atomically after checking its columns (:func:`resdyn.io.write_tsv`)."""
        missing = [c for c in cls.columns if c not in table.columns]
        if missing:
            raise ArtifactError(f"{path}: refusing to write a {cls.__name__} without column(s) {missing}")
        io.write_tsv(table, path, provenance, allow_nan=cls.allow_nan)


def kinds(spec: str) -> dict[str, str]:
    """``"layer:int kind:str"`` → {"layer": "int", "kind": "str"} (kinds checked)."""
    out = {}
    for item in spec.split():
        name, kind = item.split(":")
        assert kind in _KINDS, kind
        out[name] = kind
    return out
