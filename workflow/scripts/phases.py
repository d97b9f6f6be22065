"""Cut the RSS profile at the configured k into rise / plateau / descent (two-stage Kneedle), and
at every k of the middle resolution regime (from the Pareto frontier) to report their agreement."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_b import phases

with sidecars.step(snakemake) as step:
    p = snakemake.params
    rss = artifacts.RssProfile.read(snakemake.input.rss)
    profile, k = phases.profile_at(rss, p.k_fraction)
    cuts = phases.cutpoints(profile, window=p.window, method=p.smoothing).at_k(k, p.k_fraction)
    regime = phases.middle_regime(artifacts.ResolutionTable.read(snakemake.input.resolution))
    regime = phases.regime_agreement(rss, regime, window=p.window, method=p.smoothing)
    artifacts.PhaseCuts.write(cuts.with_regime(regime), snakemake.output[0])
