"""Replication scorecard: one row per headline claim, with statistic, interval and verdict."""

from resdyn import io, provenance, scorecard

with provenance.step(snakemake) as step:
    p = snakemake.params
    inp = snakemake.input
    # tables of a study switched off are absent: its claims say "not run"
    table = scorecard.scorecard_from_files(
        inp.get("checkpoints"), p.ckpts, inp.get("schur"), inp.get("phases"), inp.get("lens_metrics"),
        inp.get("phase_widths"), p.group,
        dict(zip(p.ckpts, inp.get("bootstrap", []))), dict(zip(p.ckpts, inp.get("replicates", []))),
        complex_tol=p.complex_tol, level=p.level, studies=p.studies,
    )
    io.write_tsv(table, snakemake.output[0])
