"""Artifact input/output: atomic writes, TSV tables, JSON, HDF5 and content hashes.

Every artifact is written to a temporary name in its destination folder and renamed into
place only when complete (``os.replace`` is atomic on POSIX), so a killed job never leaves
a half-written file that Snakemake or a reader could mistake for a result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

PathLike = str | os.PathLike


@contextlib.contextmanager
def atomic_path(path: PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    On any exception the temporary file (or folder) is removed and ``path`` is untouched.
    ``suffix`` defaults to the destination's suffix so libraries that dispatch on the file
    extension (matplotlib, h5py) still see the right one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix if suffix is not None else path.suffix, dir=path.parent
    )
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        publish_modes(tmp_path)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def current_umask() -> int:
    """The process's file-mode creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def publish_modes(path: PathLike) -> None:
    """Give a finished temporary file (or folder tree) the modes a plain ``open``/``mkdir`` would:
    ``0o666 & ~umask`` for files, ``0o777 & ~umask`` for folders (0644/0755 under umask 022).

    ``tempfile.mkstemp``/``mkdtemp`` create 0600/0700 so no other process sees a half-written
    file; the rename keeps those modes, which would hide every result from the user's group.
    """
    mask = current_umask()
    path = Path(path)
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            os.chmod(root, 0o777 & ~mask)
            for name in files:
                os.chmod(os.path.join(root, name), 0o666 & ~mask)
    elif path.exists():
        os.chmod(path, 0o666 & ~mask)


def sha256_file(path: PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (bounded memory for large weights)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest(folder: PathLike, patterns: tuple[str, ...] = ("*",)) -> dict[str, str]:
    """Per-file SHA-256 of a folder's files, keyed by POSIX path relative to the folder (sorted).

    Hidden staging files (a leading ``.`` in any part of the relative path) are left out: they
    are a running job's scratch, not part of the result.
    """
    folder = Path(folder)
    files = sorted({p for pat in patterns for p in folder.rglob(pat) if p.is_file()})
    rels = [(p, p.relative_to(folder)) for p in files]
    return {rel.as_posix(): sha256_file(p) for p, rel in rels if not any(part.startswith(".") for part in rel.parts)}


def tree_digest(files: dict[str, str]) -> str:
    """SHA-256 over sorted (relative name, file hash) pairs of a :func:`manifest`."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode())
        h.update(files[rel].encode())
    return h.hexdigest()


def sha256_tree(folder: PathLike, patterns: tuple[str, ...] = ("*",)) -> str:
    """Content hash of the files in a folder: :func:`tree_digest` of its :func:`manifest`.

    Independent of modification times and of the order the filesystem lists files in.
    """
    return tree_digest(manifest(folder, patterns))


def sha256_array(*arrays: np.ndarray) -> str:
    """Hex SHA-256 of arrays' dtype, shape and bytes (C order)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def resume_mismatch(saved: Any, wanted: str, otherwise: str) -> str:
    """Why a checkpoint whose key is ``saved`` is not resumed by a job whose key is ``wanted``.

    Keys are :func:`resdyn.numerics.precision.resume_key` JSON (``{"numerics": ..., "sha256": ...}``).
    When both parse and their numerics differ (another GPU model, torch/CUDA/cuDNN/cuBLAS version
    or fp32 precision setting), one line naming what each side had; else ``otherwise``.
    """
    try:
        was, now = json.loads(str(saved))["numerics"], json.loads(wanted)["numerics"]
    except (TypeError, ValueError, KeyError):
        return otherwise
    if not isinstance(was, dict) or not isinstance(now, dict) or was == now:
        return otherwise
    keys = [k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]

    def side(rec: dict) -> str:
        return ", ".join(f"{k} {rec.get(k)!r}" for k in keys)

    return (
        f"it was written with {side(was)} and this job runs with {side(now)}: "
        "resuming would mix the numerics of two GPU/library setups"
    )


def _jsonable(obj: Any, where: str, nan_as_null: bool) -> Any:
    """Plain-JSON copy of ``obj`` (numpy scalars/arrays → Python, Path → str).

    A non-finite float (Python or numpy, also inside arrays) becomes ``null`` only where
    ``nan_as_null``; otherwise ValueError naming its place ``where`` (e.g. ``stages.rise.y[3]``).
    """
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, f"{where}.{k}" if where else str(k), nan_as_null) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]", nan_as_null) for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist(), where, nan_as_null)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not np.isfinite(obj):
        if nan_as_null:
            return None
        raise ValueError(f"{obj} at {where or 'the top level'}")
    return obj


def write_json(obj: Any, path: PathLike, *, nan_as_null: tuple[str, ...] = ()) -> None:
    """Write ``obj`` as indented JSON, atomically; numpy scalars/arrays become plain JSON.

    JSON has no NaN or infinity. A non-finite float is refused (ValueError naming the file and
    the value's place) unless it sits under a top-level key listed in ``nan_as_null``: there
    ``null`` is the declared meaning "not a number" and is written instead.
    """
    if nan_as_null and not isinstance(obj, dict):
        raise ValueError(f"{path}: nan_as_null names top-level keys, but the object is a {type(obj).__name__}")
    try:
        if isinstance(obj, dict):
            plain = {str(k): _jsonable(v, str(k), str(k) in nan_as_null) for k, v in obj.items()}
        else:
            plain = _jsonable(obj, "", False)
    except ValueError as err:
        raise ValueError(f"{path}: refusing to write a non-finite number ({err}); JSON has no NaN/Inf") from None
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(plain, indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: PathLike) -> Any:
    """Read a JSON file, naming the file in the error if it is corrupt."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err


#: Columns that name a row; a refused value's message quotes them.
ROW_KEYS = ("model", "ckpt", "checkpoint", "lens", "metric", "layer", "kind", "boundary", "s", "k", "step", "alpha")


def check_finite_table(table: pd.DataFrame, path: PathLike, allow_nan: tuple[str, ...] = ()) -> None:
    """Refuse NaN/Inf where a finite number is required, naming file, column and row.

    A numeric cell may be non-finite only in a column listed in ``allow_nan`` (structural blanks,
    e.g. ``layer`` of a whole-model row) or in a row whose ``reason`` column says why.
    """
    num = table.select_dtypes(include=[np.number, "boolean"])
    if num.empty:
        return
    values = num.to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(values)
    bad[:, [c in allow_nan for c in num.columns]] = False
    if "reason" in table.columns:
        reason = table["reason"].fillna("").astype(str).str.strip().to_numpy() != ""
        bad[reason, :] = False
    if not bad.any():
        return
    row, col = (int(x[0]) for x in np.nonzero(bad))
    parts = Path(path).parts
    where = [
        f"model {parts[i + 1]}" + (f" checkpoint {parts[i + 2]}" if len(parts) > i + 3 else "")
        for i, part in enumerate(parts[:-2])
        if part == "results"
    ][:1]
    rec = table.iloc[row]
    where += [f"{k}={rec[k]}" for k in ROW_KEYS if k in table.columns and pd.notna(rec[k])]
    raise FloatingPointError(
        f"{path}: refusing to write {values[row, col]} in column {num.columns[col]!r} (row {row}: "
        f"{', '.join(where) or 'no row keys'}; {int(bad.sum())} such cell(s)) — a finite number is required "
        "there; an upstream step produced NaN/Inf"
    )


def write_tsv(
    table: pd.DataFrame, path: PathLike, provenance: dict | None = None, allow_nan: tuple[str, ...] = ()
) -> None:
    """Write a table as tab-separated values with a header, atomically.

    Non-finite numbers are refused (:func:`check_finite_table`) unless their column is in
    ``allow_nan`` or their row has a ``reason``. With ``provenance`` the sidecar
    ``<path>.prov.json`` is written too (see resdyn.provenance.sidecars).
    """
    check_finite_table(table, path, allow_nan)
    with atomic_path(path) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.10g")
    if provenance is not None:
        write_json(provenance, prov_path(path))


def read_tsv(path: PathLike) -> pd.DataFrame:
    """Read a TSV written by :func:`write_tsv`; a missing or empty file names the path."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"table {path} does not exist")
    try:
        return pd.read_csv(path, sep="\t")
    except pd.errors.EmptyDataError as err:
        raise ValueError(f"{path}: empty table") from err


def prov_path(path: PathLike) -> Path:
    """The provenance sidecar of an artifact: ``<path>.prov.json``."""
    return Path(str(path) + ".prov.json")


#: The configuration's JSON Schema (package data); :func:`resdyn.pipeline.config.load_schema`
#: validates configs against it, the library reads its defaults (:func:`schema_defaults`).
CONFIG_SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"


def read_config_schema() -> dict[str, Any]:
    """The configuration schema as written in resdyn/schemas/config.schema.yaml (YAML)."""
    import yaml  # only the schema readers need it

    return yaml.safe_load(CONFIG_SCHEMA_PATH.read_text())


def schema_defaults(section: str) -> dict[str, Any]:
    """``{key: default}`` of every property with a ``default`` in the schema's top-level ``section``
    (e.g. ``"lens"``): the values a validated config fills in where it gives none."""
    props = read_config_schema()["properties"][section]["properties"]
    return {key: sub["default"] for key, sub in props.items() if "default" in sub}
