"""Cut the RSS profile at the configured k into rise / plateau / descent (two-stage Kneedle)."""

from resdyn import io, phases, provenance

with provenance.step(snakemake) as step:
    p = snakemake.params
    rss = io.read_tsv(snakemake.input[0])
    profile, k = phases.profile_at(rss, p.k_fraction)
    result = phases.cutpoints(profile, window=p.window, method=p.smoothing)
    io.write_json({**result, "k": k, "k_fraction_requested": p.k_fraction, "profile": profile}, snakemake.output[0])
