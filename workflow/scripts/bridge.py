"""Bridge A<->B: Jacobian transport of readout subspaces, and cut points vs operator-type changes."""

from resdyn import artifacts
from resdyn.beyond import bridge
from resdyn.provenance import sidecars
from resdyn.study_b import phases, readout

with sidecars.step(snakemake) as step:
    p = snakemake.params
    jacobians, _ = artifacts.JacobianBlocks.read_means(snakemake.input.blocks)
    cuts = phases.Cutpoints.from_json(artifacts.PhaseCuts.read(snakemake.input.phases), source=snakemake.input.phases)
    translators = artifacts.LensFolder.read_translator_matrices(snakemake.input.lens)
    table, alignment = bridge.bridge_tables(
        jacobians,
        translators,
        artifacts.SpectraTable.read(snakemake.input.spectra),
        artifacts.BottleneckTable.read(snakemake.input.bottleneck),
        artifacts.RssProfile.read(snakemake.input.rss),
        cuts.to_json(),
        k=readout.k_from_fraction(translators[0].shape[0], p.k_fraction),
        n_random=p.n_random,
        seed=p.seed,
        complex_tol=p.complex_tol,
    )
    artifacts.BridgeTable.write(table, snakemake.output.table)
    artifacts.BridgeAlignment.write(alignment, snakemake.output.alignment)
