"""Study A metrics across a model's checkpoints (step 0 = architecture-only null)."""

from resdyn import artifacts
from resdyn.infra import provenance
from resdyn.study_a import spectral, topology

with provenance.step(snakemake) as step:
    names = snakemake.params.ckpts
    table = spectral.checkpoint_table(
        {c: artifacts.SpectraTable.read(f) for c, f in zip(names, snakemake.input.spectra)},
        {c: artifacts.BottleneckTable.read(f) for c, f in zip(names, snakemake.input.bottleneck)},
    )
    counts = topology.significant_counts(
        {c: artifacts.CouplingTable.read(f) for c, f in zip(names, snakemake.input.coupling)}
    )
    artifacts.CheckpointsTable.write(table.merge(counts, on="ckpt", how="left"), snakemake.output.table)
    artifacts.CouplingCounts.write(counts.assign(model=snakemake.wildcards.model), snakemake.output.counts)
