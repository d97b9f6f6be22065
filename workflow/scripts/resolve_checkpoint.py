"""Resolve a checkpoint (hub snapshot, local folder or zoo weights) and record its content hash."""

from resdyn import io, models, provenance

with provenance.step(snakemake) as step:
    io.write_json(models.resolve_checkpoint(snakemake.params.spec), snakemake.output[0])
