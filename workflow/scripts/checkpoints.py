"""Study A metrics across a model's checkpoints (step 0 = architecture-only null)."""

from resdyn import io, provenance, spectral, topology

with provenance.step(snakemake) as step:
    names = snakemake.params.ckpts
    table = spectral.checkpoint_table(
        {c: io.read_tsv(f) for c, f in zip(names, snakemake.input.spectra)},
        {c: io.read_tsv(f) for c, f in zip(names, snakemake.input.bottleneck)},
    )
    counts = topology.significant_counts({c: io.read_tsv(f) for c, f in zip(names, snakemake.input.coupling)})
    io.write_tsv(table.merge(counts, on="ckpt", how="left"), snakemake.output.table)
    io.write_tsv(counts.assign(model=snakemake.wildcards.model), snakemake.output.counts)
