"""resdyn: residual-stream dynamics of decoder-only transformers.

Pure, importable logic behind the Snakemake pipeline; nothing here imports Snakemake.
``resdyn.load(PATH)`` reads a run's tables as DataFrames (:func:`resdyn.results.load`); it and
``__version__`` (the installed package's, i.e. pyproject.toml's: the one ``resdyn --version``, the
provenance sidecars and collected tables record) are resolved on first use, so ``import resdyn``
stays free of pandas.
"""

from __future__ import annotations

__all__ = ["load", "__version__"]


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("resdyn")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    if name == "load":
        from resdyn.results import load

        return load
    raise AttributeError(f"module 'resdyn' has no attribute {name!r}")
