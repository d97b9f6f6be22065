"""Study A metrics across a model's checkpoints (step 0 = architecture-only null): operator metrics, coupling
counts (layers, boundaries as detail) and community partitions compared with the final and the first checkpoint."""

from resdyn import artifacts
from resdyn.lm import integrity
from resdyn.provenance import sidecars
from resdyn.study_a import partitions, spectral, topology

with sidecars.step(snakemake) as step:
    names, inp = snakemake.params.ckpts, snakemake.input
    table = spectral.checkpoint_table(
        {c: artifacts.SpectraTable.read(f) for c, f in zip(names, inp.spectra)},
        {c: artifacts.BottleneckTable.read(f) for c, f in zip(names, inp.bottleneck)},
    )
    counts = topology.significant_counts(
        {c: artifacts.CouplingTable.read(f) for c, f in zip(names, inp.coupling)},
        {c: artifacts.CouplingLayers.read(f) for c, f in zip(names, inp.coupling_layers)},
    )
    marks = integrity.marks({c: artifacts.CheckpointIntegrity.read(f) for c, f in zip(names, inp.integrity)})
    table = table.merge(counts, on="ckpt", how="left").assign(integrity=lambda t: t["ckpt"].map(marks))
    artifacts.CheckpointsTable.write(table, snakemake.output.table)
    artifacts.CouplingCounts.write(counts.assign(model=snakemake.wildcards.model), snakemake.output.counts)
    similarity = partitions.partition_similarity(
        {c: artifacts.CommunityPartitions.read_folder(f) for c, f in zip(names, inp.communities)},
        {c: artifacts.CommunitiesSummary.read(f) for c, f in zip(names, inp.communities_summary)},
        n_permutations=snakemake.params.nmi_permutations,
        seed=snakemake.params.seed,
    )
    artifacts.PartitionSimilarity.write(similarity, snakemake.output.similarity)
