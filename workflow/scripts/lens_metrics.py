"""KL, cross-entropy, Hit@1/Hit@5 per layer for the tuned lens and the logit lens (held-out samples)."""

from resdyn import artifacts
from resdyn.lm import models
from resdyn.provenance import sidecars
from resdyn.study_b import lens

with sidecars.step(snakemake) as step:
    step.pin_numerics(models.pick_device(snakemake.params.device))
    record = artifacts.CheckpointRecord.read(snakemake.input.ckpt)
    model, _ = models.load_model(record, snakemake.params.device, placement=snakemake.params.placement)
    fitted = lens.Lens.load(snakemake.input.lens, model)
    ids, _, _ = artifacts.Samples.read(snakemake.input.samples)
    artifacts.LensMetrics.write(lens.lens_metrics(model, fitted, lens.token_batches(ids, 16)), snakemake.output[0])
