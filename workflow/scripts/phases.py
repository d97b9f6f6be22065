"""Cut the RSS profile at the configured k into rise / plateau / descent (two-stage Kneedle)."""

from resdyn import io, phases, provenance

with provenance.step(snakemake) as step:
    p = snakemake.params
    rss = io.read_tsv(snakemake.input[0])
    profile, k = phases.profile_at(rss, p.k_fraction)
    cuts = phases.cutpoints(profile, window=p.window, method=p.smoothing).at_k(k, p.k_fraction)
    io.write_json(cuts.to_json(), snakemake.output[0])
