"""Compare one checkpoint's weights and architecture with the checkpoints before it (duplicates stop here)."""

from resdyn import artifacts
from resdyn.lm import integrity
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    *earlier, this = [integrity.identity(artifacts.CheckpointRecord.read(f)) for f in snakemake.input.records]
    record = integrity.check(snakemake.wildcards.model, earlier, this, snakemake.params.allow)
    artifacts.CheckpointIntegrity.write(record, snakemake.output[0])
