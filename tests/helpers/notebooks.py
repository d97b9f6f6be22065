"""Run a Jupyter notebook's code cells in order in one namespace, in this process (no kernel, no
nbclient: the examples need only the project's own dependencies). Figures stay open in
matplotlib's Agg backend for the caller to inspect; a failing cell raises with its index."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def run_notebook(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Execute the code cells of ``path`` with ``env`` added to os.environ; returns the namespace."""
    import matplotlib

    matplotlib.use("Agg")
    nb = json.loads(Path(path).read_text())
    assert nb["nbformat"] == 4, f"{path}: nbformat {nb['nbformat']}, expected 4"
    namespace: dict[str, Any] = {"__name__": "__main__"}
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            try:
                exec(compile(source, f"{path}#cell{i}", "exec"), namespace)  # noqa: S102 - our own notebook
            except Exception as err:
                raise AssertionError(f"{path}: cell {i} failed: {type(err).__name__}: {err}") from err
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return namespace
