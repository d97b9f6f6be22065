"""Bootstrap over samples: CIs (percentile, studentized or the group jackknife) of Henrici departure,
complex fraction and erank; with group means, the first-n bootstrap beside it as a second method."""

from resdyn import artifacts
from resdyn.beyond import bootstrap
from resdyn.lm import models
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    p = snakemake.params
    options = dict(
        n_resamples=p.n_resamples,
        seed=p.seed,
        level=p.ci,
        complex_tol=p.complex_tol,
        device=models.device_name(p.device),
        method=p.method,
        interval=p.interval,
        spectra=artifacts.SpectraTable.read(snakemake.input.spectra),
        per_depth_erank=p.per_depth_erank,
    )
    table, replicates = bootstrap.jacobian_bootstrap_files(snakemake.input.blocks, **options)
    first_n = bootstrap.first_n_bootstrap_files(snakemake.input.blocks, p.first_n, **options)
    artifacts.BootstrapTable.write(table, snakemake.output.table)
    artifacts.BootstrapReplicates.write(replicates, snakemake.output.replicates)
    artifacts.BootstrapFirstNTable.write(first_n, snakemake.output.first_n)
