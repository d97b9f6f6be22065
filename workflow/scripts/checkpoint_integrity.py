"""Compare one checkpoint's weights and architecture with the checkpoints before it (duplicates stop here)."""

from resdyn import artifacts
from resdyn.lm import integrity, models
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    record = artifacts.CheckpointRecord.read(snakemake.input[0])
    this = integrity.identity(record["checkpoint"], record["folder"])
    earlier = [integrity.identity(s["checkpoint"], models.tokenizer_folder(s)) for s in snakemake.params.earlier]
    artifacts.CheckpointIntegrity.write(
        integrity.check(snakemake.wildcards.model, earlier, this, snakemake.params.allow), snakemake.output[0]
    )
