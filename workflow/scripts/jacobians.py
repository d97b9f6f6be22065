"""Mean sublayer Jacobians of one layer block over the model's samples (resumable)."""

from resdyn import artifacts
from resdyn.lm import models
from resdyn.pipeline import config
from resdyn.provenance import sidecars
from resdyn.study_a import jacobian

with sidecars.step(snakemake) as step:
    p = snakemake.params
    step.pin_numerics(models.pick_device(p.device))
    record = artifacts.CheckpointRecord.read(snakemake.input.ckpt)
    model, _ = models.load_model(record, p.device)
    ids, sample_ids, sattrs = artifacts.Samples.read(snakemake.input.samples)
    layers = config.block_layers(snakemake.wildcards.block)
    out = snakemake.output[0]
    # Files and resumable partial sums go to a staging folder beside the declared output, moved
    # into place at the end (artifacts.JacobianBlocks.staging says why).
    staging = artifacts.JacobianBlocks.staging(out)
    jacobian.write_layer_block(
        model,
        ids,
        sample_ids,
        layers,
        {layer: artifacts.JacobianBlocks.layer_file(staging, layer) for layer in layers},
        positions=p.positions,
        store_dtype=p.store_dtype,
        store_first_n=p.store_first_n,
        checkpoint_every=p.checkpoint_every,
        n_groups=p.n_groups,
        group_dtype=p.group_dtype,
        attrs={**models.model_attrs(record), "samples_hash": sattrs["samples_hash"], "code_version": p.code},
    )
    artifacts.JacobianBlocks.publish(staging, out)
