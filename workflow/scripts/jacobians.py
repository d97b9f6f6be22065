"""Mean sublayer Jacobians of one layer block over the model's samples (resumable)."""

import shutil
from pathlib import Path

from resdyn import artifacts
from resdyn.infra import config, models, provenance
from resdyn.study_a import jacobian

with provenance.step(snakemake) as step:
    p = snakemake.params
    record = artifacts.CheckpointRecord.read(snakemake.input.ckpt)
    model, _ = models.load_model(record, p.device)
    ids, sample_ids, sattrs = artifacts.Samples.read(snakemake.input.samples)
    layers = config.block_layers(snakemake.wildcards.block)
    out = Path(snakemake.output[0])
    # Files and resumable partial sums are written to a staging folder beside the declared
    # output and moved into place at the end: Snakemake clears the outputs of an incomplete job
    # before rerunning it, which would discard the partial sums.
    staging = out.with_name(f".{out.name}.staging")
    jacobian.write_layer_block(
        model, ids, sample_ids, layers,
        {layer: staging / f"layer{layer:03d}.h5" for layer in layers},
        positions=p.positions, store_dtype=p.store_dtype, store_first_n=p.store_first_n,
        checkpoint_every=p.checkpoint_every,
        attrs={**models.model_attrs(record), "samples_hash": sattrs["samples_hash"], "code_version": p.code},
    )
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
