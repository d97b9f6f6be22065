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
Files are the artifacts layer's: the inputs are read by their classes (found by the catalogue's
path templates), the cache is :class:`resdyn.artifacts.FigureCache`, the figure files
:class:`resdyn.artifacts.Figure`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resdyn import artifacts
from resdyn.plots import catalogue


def load(path: str | Path, template: str) -> Any:
    """A figure input read by the artifact class of its catalogue path ``template``: a table
    (DataFrame), ``phases.json`` (dict), ``spectra.h5`` (its arrays) or a lens folder (its
    ``curves.tsv`` alone: the translators are not drawn), validated."""
    cls = artifacts.by_relpath(template)
    if cls is artifacts.LensFolder:
        return cls.read_curves(path)
    data = cls.read(path)
    return data[0] if cls is artifacts.SpectraArrays else data  # spectra.h5: arrays; its attrs are provenance


def trajectory_table(tables: Sequence[Any], pairs: Sequence[tuple[str, str]]) -> Any:
    """The tables of one trajectory input, one per (model, ckpt) of ``pairs`` (config and training
    order), as one DataFrame with ``model``, ``ckpt``, ``ckpt_index`` (the checkpoint's position
    in its model's training order) and ``step`` (the training step the checkpoint name carries,
    :func:`resdyn.lm.hub.revision_step`; NaN for ``main`` or a local model) in front. A record
    (``integrity.json``) becomes one row with its mark (:func:`resdyn.lm.integrity.marks`)."""
    import numpy as np
    import pandas as pd

    from resdyn.lm.hub import revision_step

    if len(tables) != len(pairs):
        raise ValueError(f"trajectory input: {len(tables)} tables for {len(pairs)} (model, checkpoint) pairs")
    parts, index = [], {}
    for table, (model, ckpt) in zip(tables, pairs):
        if isinstance(table, dict):  # a checkpoint's integrity record: its mark as a one-row table
            from resdyn.lm.integrity import marks

            table = pd.DataFrame({"integrity": [marks({ckpt: table})[ckpt]]})
        parsed = revision_step(ckpt)
        index[model] = index.get(model, -1) + 1
        front = pd.DataFrame(
            {"model": model, "ckpt": ckpt, "ckpt_index": index[model], "step": float(parsed[1]) if parsed else np.nan},
            index=table.index,
        )
        parts.append(pd.concat([front, table.drop(columns=[c for c in front if c in table.columns])], axis=1))
    return pd.concat(parts, ignore_index=True)


def cache_key(
    name: str,
    plot: str,
    outputs: Sequence[str],
    inputs: Mapping[str, str | None],
    title: str,
    caption: str,
    dpi: int,
    code: str,
) -> str:
    """Hex SHA-256 of everything a figure's bytes depend on (but its provenance's times)."""
    import matplotlib

    record = {
        "figure": name,
        "plot": plot,
        "outputs": [str(o) for o in outputs],
        "inputs": [[str(p), h] for p, h in inputs.items()],
        "title": title,
        "caption": caption,
        "dpi": int(dpi),
        "code": code,
        "matplotlib": matplotlib.__version__,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def plot_function(plot: str):
    """The function ``"module:function"`` of ``resdyn.plots``."""
    module, function = plot.split(":")
    return getattr(importlib.import_module(f"resdyn.plots.{module}"), function)


def render(
    name: str,
    plot: str,
    inputs: Mapping[str, str | None],
    png: str,
    pdf: str,
    title: str,
    caption: str,
    dpi: int,
    code: str,
    provenance: dict,
    cache: str | Path | None,
    pairs: Sequence[tuple[str, str]] | None = None,
) -> bool:
    """Draw one figure into ``png`` and ``pdf`` (provenance embedded), or restore it from ``cache``.

    ``inputs`` maps each input path, in the order of the plot function's positional arguments,
    to its SHA-256; for a trajectory figure, each template's paths for every (model, ckpt) of
    ``pairs`` (:func:`resdyn.plots.catalogue.trajectory_inputs`), read as one
    :func:`trajectory_table` per template. Returns True when the figure was drawn, False when
    it was restored.
    """
    from resdyn.plots.common import save_figure

    key = cache_key(name, plot, [png, pdf], inputs, title, caption, dpi, code)
    store = None if cache is None else artifacts.FigureCache(cache)
    if store is not None and store.restore([png, pdf], key):
        return False
    templates = catalogue.by_name(name).inputs
    n = len(pairs) if pairs is not None else 1
    if len(templates) * n != len(inputs):
        raise ValueError(
            f"figure {name!r}: {len(inputs)} inputs given, the catalogue declares {len(templates)}"
            + (f" templates × {n} checkpoints" if pairs is not None else "")
        )
    paths = list(inputs)
    if pairs is None:
        args = [load(p, t) for p, t in zip(paths, templates)]
    else:
        args = [
            trajectory_table([load(p, t) for p in paths[i * n : (i + 1) * n]], pairs) for i, t in enumerate(templates)
        ]
    fig = plot_function(plot)(*args, title=title)
    save_figure(fig, png, pdf, {**provenance, "figure": name, "figure_code": code, "cache_key": key}, dpi=dpi)
    if store is not None:
        store.store([png, pdf], key)
    return True
