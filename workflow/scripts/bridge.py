"""Bridge A<->B: Jacobian transport of readout subspaces, and cut points vs operator-type changes."""

from resdyn import bridge, io, jacobian, provenance, readout

with provenance.step(snakemake) as step:
    p = snakemake.params
    jacobians, _ = jacobian.mean_jacobians(snakemake.input.blocks)
    translators = readout.read_translator_matrices(snakemake.input.lens)
    table, alignment = bridge.bridge_tables(
        jacobians, translators, io.read_tsv(snakemake.input.spectra), io.read_tsv(snakemake.input.bottleneck),
        io.read_tsv(snakemake.input.rss), io.read_json(snakemake.input.phases),
        k=readout.k_from_fraction(translators[0].shape[0], p.k_fraction),
        n_random=p.n_random, seed=p.seed, complex_tol=p.complex_tol,
    )
    io.write_tsv(table, snakemake.output.table)
    io.write_tsv(alignment, snakemake.output.alignment)
