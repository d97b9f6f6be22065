"""Residual states at every sublayer boundary of one checkpoint, one HDF5 file per layer."""

from resdyn import activations, arch, data, io, models, provenance

with provenance.step(snakemake) as step:
    p = snakemake.params
    record = io.read_json(snakemake.input.ckpt)
    model, _ = models.load_model(record, p.device)
    ids, sample_ids, sattrs = data.read_samples(snakemake.input.samples)
    activations.stream_activation_files(
        model, ids, sample_ids, p.skip_positions, snakemake.output[0], p.dtype,
        {**models.model_attrs(record), "samples_hash": sattrs["samples_hash"]}, arch.residual_kind(model),
        where=f"model {record['model']} checkpoint {record['checkpoint']}",
    )
