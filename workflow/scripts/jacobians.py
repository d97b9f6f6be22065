"""Mean sublayer Jacobians of one layer block over the model's samples (resumable)."""

from pathlib import Path

from resdyn import config, data, io, jacobian, models, provenance

with provenance.step(snakemake) as step:
    p = snakemake.params
    record = io.read_json(snakemake.input.ckpt)
    model, _ = models.load_model(record, p.device)
    ids, sample_ids, sattrs = data.read_samples(snakemake.input.samples)
    layers = config.block_layers(snakemake.wildcards.block)
    out = Path(snakemake.output[0])
    # Partial sums live beside, not inside, the declared output folder: Snakemake clears the
    # outputs of an incomplete job before rerunning it, which would discard them.
    jacobian.write_layer_block(
        model, ids, sample_ids, layers,
        {layer: out / f"layer{layer:03d}.h5" for layer in layers},
        positions=p.positions, store_dtype=p.store_dtype, store_first_n=p.store_first_n,
        checkpoint_every=p.checkpoint_every,
        checkpoint_dir=out.with_name(f".{out.name}.partial"),
        attrs={**models.model_attrs(record), "samples_hash": sattrs["samples_hash"], "code_version": p.code},
    )
