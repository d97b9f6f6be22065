"""Cut the RSS profile at the configured k into rise / plateau / descent (two-stage Kneedle)."""

from resdyn import artifacts
from resdyn.infra import provenance
from resdyn.study_b import phases

with provenance.step(snakemake) as step:
    p = snakemake.params
    profile, k = phases.profile_at(artifacts.RssProfile.read(snakemake.input[0]), p.k_fraction)
    cuts = phases.cutpoints(profile, window=p.window, method=p.smoothing).at_k(k, p.k_fraction)
    artifacts.PhaseCuts.write(cuts, snakemake.output[0])
