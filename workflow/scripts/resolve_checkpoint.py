"""Resolve a checkpoint (hub snapshot, local folder or zoo weights) and record its content hash."""

from resdyn import artifacts
from resdyn.infra import models, provenance

with provenance.step(snakemake) as step:
    artifacts.CheckpointRecord.write(models.resolve_checkpoint(snakemake.params.spec), snakemake.output[0])
