"""Residual states at every sublayer boundary of one checkpoint, one HDF5 file per layer."""

from resdyn import artifacts
from resdyn.lm import models, structure
from resdyn.provenance import sidecars
from resdyn.study_a import activations

with sidecars.step(snakemake) as step:
    p = snakemake.params
    step.pin_numerics(models.pick_device(p.device))
    record = artifacts.CheckpointRecord.read(snakemake.input.ckpt)
    model, _ = models.load_model(record, p.device, placement=p.placement)
    ids, sample_ids, sattrs = artifacts.Samples.read(snakemake.input.samples)
    activations.stream_activation_files(
        model,
        ids,
        sample_ids,
        p.skip_positions,
        snakemake.output[0],
        p.dtype,
        {**models.model_attrs(record), "samples_hash": sattrs["samples_hash"]},
        structure.residual_kind(model),
        where=f"model {record['model']} checkpoint {record['checkpoint']}",
    )
