"""Bootstrap over samples: CIs (percentile or studentized) of Henrici departure, complex fraction and full-depth erank."""

from resdyn import bootstrap, io, models, provenance

with provenance.step(snakemake) as step:
    p = snakemake.params
    table, replicates = bootstrap.jacobian_bootstrap_files(
        snakemake.input.blocks, n_resamples=p.n_resamples, seed=p.seed, level=p.ci, complex_tol=p.complex_tol,
        device=models.device_name(p.device), method=p.method, interval=p.interval,
    )
    # whole-model rows (early-minus-late, RSS) have no layer or sublayer index
    io.write_tsv(table, snakemake.output.table, allow_nan=("layer", "s"))
    io.write_tsv(replicates, snakemake.output.replicates)
