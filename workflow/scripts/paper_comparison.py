"""The paper table: each figure the studies state next to this run's number (resdyn.beyond.paper)."""

from resdyn import artifacts
from resdyn.beyond import paper
from resdyn.provenance import sidecars
from resdyn.study_b import phases

with sidecars.step(snakemake) as step:
    p = snakemake.params
    inp = snakemake.input

    def per_model(key, read):
        """{model: table} of an input list (one entry per model, in p.models order), or {} when absent."""
        files = inp.get(key)
        return {} if files is None else {m: read(f) for m, f in zip(p.models, files)}

    def cuts(path):
        return phases.Cutpoints.from_json(artifacts.PhaseCuts.read(path), source=path).to_json()

    tables = {
        key: per_model(key, read)
        for key, read in (
            ("checkpoints", artifacts.CheckpointsTable.read),
            ("coupling_counts", artifacts.CouplingCounts.read),
            ("bottleneck", artifacts.BottleneckTable.read),
            ("bootstrap", artifacts.BootstrapTable.read),
            ("phases", cuts),
            ("geometry", artifacts.LayerGeometry.read),
            ("phase_metrics", artifacts.PhaseMetrics.read),
            ("coupling", artifacts.CouplingTable.read),
            ("schur", artifacts.SchurCurves.read),
            ("partitions", artifacts.PartitionSimilarity.read),
            ("lens_metrics", artifacts.LensMetrics.read),
        )
    }
    models = [
        paper.ModelTables(
            model=m,
            ckpts=p.ckpts[m],
            lens_ckpt=p.lens_ckpts[m],
            checkpoints=tables["checkpoints"].get(m),
            coupling_counts=tables["coupling_counts"].get(m),
            bottleneck={p.ckpts[m][-1]: tables["bottleneck"][m]} if m in tables["bottleneck"] else {},
            bootstrap={p.ckpts[m][-1]: tables["bootstrap"][m]} if m in tables["bootstrap"] else {},
            phases=tables["phases"].get(m),
            geometry=tables["geometry"].get(m),
            phase_metrics=tables["phase_metrics"].get(m),
            complex_tol=p.complex_tol,
            complex_rule=p.complex_rule,
            coupling=tables["coupling"].get(m),
            schur=tables["schur"].get(m),
            partitions=tables["partitions"].get(m),
            lens_metrics=tables["lens_metrics"].get(m),
            n_samples=p.n_samples,
        )
        for m in p.models
    ]
    widths = inp.get("phase_widths")
    table = paper.paper_comparison(
        artifacts.ClaimsTable.load(),
        models,
        p.studies,
        None if widths is None else artifacts.ScalingFits.read(widths),
        p.groups,
    )
    artifacts.PaperComparison.write(table, snakemake.output[0])
