"""Resolution sweep over k: energy(k), visibility(k) and the Pareto frontier."""

from resdyn import artifacts
from resdyn.infra import provenance
from resdyn.study_b import readout

with provenance.step(snakemake) as step:
    translators = artifacts.LensFolder.read_translator_matrices(snakemake.input[0])
    artifacts.ResolutionTable.write(readout.resolution_table(translators, snakemake.params.k_fractions), snakemake.output[0])
