"""RSS profile: mean principal-angle cosine between consecutive readout subspaces, per k."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_b import readout

with sidecars.step(snakemake) as step:
    translators = readout.readout_matrices(
        artifacts.LensFolder.read_translator_matrices(snakemake.input[0]), snakemake.params.matrix
    )
    d = translators[0].shape[0]
    ks = sorted({readout.k_from_fraction(d, f) for f in snakemake.params.k_fractions})
    artifacts.RssProfile.write(readout.rss_profile(translators, ks), snakemake.output[0])
