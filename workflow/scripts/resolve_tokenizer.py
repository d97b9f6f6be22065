"""Copy a hub or local model's tokenizer into the run (its first configured checkpoint's files)."""

from resdyn.infra import models, provenance

with provenance.step(snakemake) as step:
    step.extra["tokenizer_hash"] = models.copy_tokenizer(snakemake.params.spec, snakemake.output[0])
