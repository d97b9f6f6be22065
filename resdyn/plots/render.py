"""Render the figures of one figure job, restoring unchanged ones from a content-addressed cache.

A figure job draws all figures of one checkpoint (or model); Snakemake deletes every output of a
job before running it. So that only the figures whose inputs, params or code changed are drawn
again, each drawn figure is also stored under a key

    sha256(figure name, plot function, output paths, input paths and SHA-256s, title, caption,
           dpi, the figure's own code version, matplotlib version)

and a figure whose key is in the cache is copied back byte for byte instead of being drawn.
The figure's code version (:func:`resdyn.plots.catalogue.figure_code_version`) leaves out the
module's other figure functions, so editing one plot function re-renders that figure only. The
cache keeps one entry per figure file (older keys are removed when a new one is stored); an
entry whose bytes no longer match the SHA-256 recorded beside it is not restored but redrawn.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resdyn.infra import io


def load(path: str | Path) -> Any:
    """A figure input: TSV → DataFrame, JSON → dict, ``spectra.h5`` → its arrays."""
    suffix = Path(path).suffix
    if suffix == ".tsv":
        return io.read_tsv(path)
    if suffix == ".json":
        return io.read_json(path)
    if suffix == ".h5":
        from resdyn.artifacts import SpectraArrays  # the one spectra.h5 reader (validating)

        return SpectraArrays.read(path)[0]
    raise ValueError(f"figure input {path}: unsupported type {suffix} (allowed: .tsv, .json, .h5)")


def cache_key(name: str, plot: str, outputs: Sequence[str], inputs: Mapping[str, str | None], title: str,
              caption: str, dpi: int, code: str) -> str:
    """Hex SHA-256 of everything a figure's bytes depend on (but its provenance's times)."""
    import matplotlib

    record = {"figure": name, "plot": plot, "outputs": [str(o) for o in outputs],
              "inputs": [[str(p), h] for p, h in inputs.items()], "title": title, "caption": caption,
              "dpi": int(dpi), "code": code, "matplotlib": matplotlib.__version__}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _entry(cache: Path, out: str | Path, key: str) -> Path:
    """Cache file of output ``out`` under ``key``: <cache>/<out's folder>/<stem>.<key16><suffix>,
    the folder taken relative to the cache's parent when ``out`` lies under it."""
    out, base = Path(out).absolute(), cache.absolute().parent
    rel = out.parent.relative_to(base) if out.parent.is_relative_to(base) else out.parent.relative_to(out.anchor)
    return cache / rel / f"{out.stem}.{key[:16]}{out.suffix}"


def _copy(src: Path, dst: str | Path) -> None:
    with io.atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def _digest_file(entry: Path) -> Path:
    return entry.with_name(entry.name + ".sha256")


def restore(cache: Path, outputs: Sequence[str], key: str) -> bool:
    """Copy the cached files of ``key`` onto ``outputs``; False (nothing written) if any is
    missing or no longer has the SHA-256 recorded when it was stored (then it is drawn again)."""
    entries = [_entry(cache, o, key) for o in outputs]
    for e in entries:
        digest = _digest_file(e)
        if not (e.is_file() and digest.is_file() and digest.read_text().strip() == io.sha256_file(e)):
            return False
    for e, o in zip(entries, outputs):
        _copy(e, o)
    return True


def store(cache: Path, outputs: Sequence[str], key: str) -> None:
    """Put ``outputs`` into the cache under ``key`` (with their SHA-256), dropping the file's
    entries of other keys."""
    for o in outputs:
        e = _entry(cache, o, key)
        for old in e.parent.glob(f"{Path(o).stem}.*{Path(o).suffix}*"):
            if not old.name.startswith(e.name) and old.name.split(".")[0] == Path(o).stem:
                old.unlink(missing_ok=True)
        _copy(Path(o), e)
        with io.atomic_path(_digest_file(e)) as tmp:
            tmp.write_text(io.sha256_file(e) + "\n")


def plot_function(plot: str):
    """The function ``"module:function"`` of ``resdyn.plots``."""
    module, function = plot.split(":")
    return getattr(importlib.import_module(f"resdyn.plots.{module}"), function)


def render(name: str, plot: str, inputs: Mapping[str, str | None], png: str, pdf: str, title: str, caption: str,
           dpi: int, code: str, provenance: dict, cache: str | Path | None) -> bool:
    """Draw one figure into ``png`` and ``pdf`` (provenance embedded), or restore it from ``cache``.

    ``inputs`` maps each input path, in the order of the plot function's positional arguments,
    to its SHA-256. Returns True when the figure was drawn, False when it was restored.
    """
    from resdyn.plots.common import save_figure

    key = cache_key(name, plot, [png, pdf], inputs, title, caption, dpi, code)
    if cache is not None and restore(Path(cache), [png, pdf], key):
        return False
    fig = plot_function(plot)(*[load(p) for p in inputs], title=title)
    save_figure(fig, png, pdf, {**provenance, "figure": name, "figure_code": code, "cache_key": key}, dpi=dpi)
    if cache is not None:
        store(Path(cache), [png, pdf], key)
    return True
