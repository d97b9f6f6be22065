"""Do boundary units carry different Jacobian gain than interior units? Per boundary, with BH FDR."""

from resdyn import io, jacobian, provenance, topology

with provenance.step(snakemake) as step:
    jacobians, _ = jacobian.mean_jacobians(snakemake.input.blocks)
    table = topology.coupling_from_files(
        snakemake.input.communities, jacobians, io.read_tsv(snakemake.input.spectra),
        gain=snakemake.params.gain, q_level=snakemake.params.fdr_q,
    )
    io.write_tsv(table, snakemake.output[0])
