"""Do boundary units carry different Jacobian gain than interior units? Per boundary with BH FDR, and per
layer (Simes over its boundaries, BH over layers: the unit study A counts)."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_a import topology

with sidecars.step(snakemake) as step:
    jacobians, _ = artifacts.JacobianBlocks.read_means(snakemake.input.blocks)
    table = topology.coupling_from_tables(
        artifacts.CommunityPartitions.read_folder(snakemake.input.communities),
        jacobians,
        artifacts.SpectraTable.read(snakemake.input.spectra),
        gain=snakemake.params.gain,
        q_level=snakemake.params.fdr_q,
    )
    artifacts.CouplingTable.write(table, snakemake.output.table)
    artifacts.CouplingLayers.write(
        topology.layer_significance(table, q_level=snakemake.params.fdr_q), snakemake.output.layers
    )
