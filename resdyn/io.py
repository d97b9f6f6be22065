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
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def sha256_file(path: PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (bounded memory for large weights)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_tree(folder: PathLike, patterns: tuple[str, ...] = ("*",)) -> str:
    """Content hash of the files in a folder: SHA-256 over sorted (relative name, file hash).

    Independent of modification times and of the order the filesystem lists files in.
    """
    folder = Path(folder)
    files = sorted({p for pat in patterns for p in folder.rglob(pat) if p.is_file()})
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(folder)).encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def sha256_array(*arrays: np.ndarray) -> str:
    """Hex SHA-256 of arrays' dtype, shape and bytes (C order)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def write_json(obj: Any, path: PathLike) -> None:
    """Write ``obj`` as indented JSON, atomically; numpy scalars/arrays become plain JSON."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: PathLike) -> Any:
    """Read a JSON file, naming the file in the error if it is corrupt."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err


def write_tsv(table: pd.DataFrame, path: PathLike, provenance: dict | None = None) -> None:
    """Write a table as tab-separated values with a header, atomically.

    With ``provenance`` the sidecar ``<path>.prov.json`` is written too (see resdyn.provenance).
    """
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
