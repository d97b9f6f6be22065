"""Replication scorecard: one row per headline claim, with statistic, interval and verdict."""

from resdyn import io, provenance, scorecard

with provenance.step(snakemake) as step:
    p = snakemake.params
    inp = snakemake.input
    table = scorecard.scorecard_from_files(
        inp.checkpoints, p.ckpts, inp.schur, inp.phases, inp.lens_metrics,
        inp.get("phase_widths"), p.group,
        dict(zip(p.ckpts, inp.bootstrap)), dict(zip(p.ckpts, inp.replicates)),
        complex_tol=p.complex_tol, level=p.level,
    )
    io.write_tsv(table, snakemake.output[0])
