"""resdyn: residual-stream dynamics of decoder-only transformers.

Pure, importable logic behind the Snakemake pipeline; nothing here imports Snakemake.
"""

__version__ = "0.1.0"
