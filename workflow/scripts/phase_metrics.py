"""Per-layer hidden-state geometry and lens hits, aggregated over the three RSS phases."""

from resdyn import activations, geometry, io, phases, provenance

with provenance.step(snakemake) as step:
    per_layer = geometry.layer_geometry(activations.BoundaryView(snakemake.input.activations))
    per_layer = geometry.with_lens_hits(per_layer, io.read_tsv(snakemake.input.lens_metrics))
    cuts = phases.Cutpoints.from_json(io.read_json(snakemake.input.phases), source=snakemake.input.phases)
    # the output row has no update after it
    io.write_tsv(per_layer, snakemake.output.geometry, allow_nan=geometry.UPDATE_COLUMNS)
    io.write_tsv(geometry.phase_table(per_layer, cuts), snakemake.output.table)
