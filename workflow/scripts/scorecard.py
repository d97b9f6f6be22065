"""Replication scorecard: one row per headline claim, with statistic, interval and verdict."""

from resdyn import artifacts
from resdyn.beyond import scorecard
from resdyn.provenance import sidecars
from resdyn.study_b import phases

with sidecars.step(snakemake) as step:
    p = snakemake.params
    inp = snakemake.input

    def read(cls, key):
        """The table of ``key``, or None where its study is switched off (its claims say "not run")."""
        path = inp.get(key)
        return None if path is None else cls.read(path)

    phases_path = inp.get("phases")
    cuts = (
        None
        if phases_path is None
        else phases.Cutpoints.from_json(artifacts.PhaseCuts.read(phases_path), source=phases_path)
    )
    table = scorecard.scorecard(
        read(artifacts.CheckpointsTable, "checkpoints"),
        p.ckpts,
        read(artifacts.SchurCurves, "schur"),
        None if cuts is None else cuts.to_json(),
        read(artifacts.LensMetrics, "lens_metrics"),
        read(artifacts.ScalingFits, "phase_widths"),
        p.group,
        {c: artifacts.BootstrapTable.read(f) for c, f in zip(p.ckpts, inp.get("bootstrap", []))},
        {c: artifacts.BootstrapReplicates.read(f) for c, f in zip(p.ckpts, inp.get("replicates", []))},
        complex_tol=p.complex_tol,
        level=p.level,
        studies=p.studies,
        claims=artifacts.ClaimsTable.load(),
    )
    artifacts.ScorecardTable.write(table, snakemake.output[0])
