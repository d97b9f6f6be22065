"""Resolution sweep over k: energy(k), visibility(k) and the Pareto frontier."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_b import readout

with sidecars.step(snakemake) as step:
    translators = readout.readout_matrices(
        artifacts.LensFolder.read_translator_matrices(snakemake.input[0]), snakemake.params.matrix
    )
    artifacts.ResolutionTable.write(
        readout.resolution_table(translators, snakemake.params.k_fractions), snakemake.output[0]
    )
