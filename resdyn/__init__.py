"""resdyn: residual-stream dynamics of decoder-only transformers.

Pure, importable logic behind the Snakemake pipeline; nothing here imports Snakemake.
``resdyn.load(PATH)`` reads a run's tables as DataFrames (:func:`resdyn.results.load`); it and
``__version__`` (the installed package's, i.e. pyproject.toml's: the one ``resdyn --version``, the
provenance sidecars and collected tables record) are resolved on first use, so ``import resdyn``
stays free of pandas. The notebook API, :mod:`resdyn.api` (docs/library.md), is re-exported the same way:
``resdyn.sublayer_jacobians``, ``resdyn.train_lens``, … import torch on first use only.
"""

from __future__ import annotations

__all__ = ["load", "__version__"]

#: The names of :mod:`resdyn.api` (its ``__all__``; tests/test_api.py holds the two equal), resolved on first use.
API_NAMES = (
    "Cutpoints",
    "Lens",
    "boundary_activations",
    "bottleneck",
    "communities",
    "coupling",
    "import_tuned_lens",
    "load_lens",
    "operator_metrics",
    "phases",
    "readout_subspaces",
    "resolution_sweep",
    "rss_profile",
    "schur_bottleneck",
    "schur_surgery",
    "spectra_table",
    "spectrum",
    "sublayer_jacobians",
    "train_lens",
    "translators",
)


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
    if name == "api" or name in API_NAMES:
        import resdyn.api as api  # not "from resdyn import api": that asks this __getattr__ again

        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'resdyn' has no attribute {name!r}")
