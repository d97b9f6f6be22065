"""Per-layer hidden-state geometry and lens hits, aggregated over the three RSS phases."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_b import geometry, phases

with sidecars.step(snakemake) as step:
    per_layer = geometry.layer_geometry(artifacts.Activations.view(snakemake.input.activations))
    per_layer = geometry.with_lens_hits(per_layer, artifacts.LensMetrics.read(snakemake.input.lens_metrics))
    cuts = phases.Cutpoints.from_json(artifacts.PhaseCuts.read(snakemake.input.phases), source=snakemake.input.phases)
    artifacts.LayerGeometry.write(per_layer, snakemake.output.geometry)
    artifacts.PhaseMetrics.write(geometry.phase_table(per_layer, cuts), snakemake.output.table)
