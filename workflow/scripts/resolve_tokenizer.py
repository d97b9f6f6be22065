"""Copy a hub or local model's tokenizer into the run (its first configured checkpoint's files)."""

from resdyn.lm import models
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    step.extra["tokenizer_hash"] = models.copy_tokenizer(snakemake.params.spec, snakemake.output[0])
