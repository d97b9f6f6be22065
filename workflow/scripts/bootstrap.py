"""Bootstrap over samples: CIs (percentile or studentized) of Henrici departure, complex fraction and
full-depth erank."""

from resdyn import artifacts
from resdyn.beyond import bootstrap
from resdyn.lm import models
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    p = snakemake.params
    table, replicates = bootstrap.jacobian_bootstrap_files(
        snakemake.input.blocks,
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
    artifacts.BootstrapTable.write(table, snakemake.output.table)
    artifacts.BootstrapReplicates.write(replicates, snakemake.output.replicates)
