"""Resolve a checkpoint (hub snapshot, local folder or zoo weights) and record its content hash."""

from resdyn import artifacts
from resdyn.lm import models
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    artifacts.CheckpointRecord.write(models.resolve_checkpoint(snakemake.params.spec), snakemake.output[0])
