"""Signed Leiden communities and boundary units at every residual boundary of a checkpoint."""

from pathlib import Path

import pandas as pd

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_a import topology

with sidecars.step(snakemake) as step:
    p = snakemake.params
    out, summaries = Path(snakemake.output.folder), []
    for layer, path in artifacts.Activations.layers(snakemake.input[0]):
        tables = []
        for boundary in artifacts.Activations.boundaries(path):
            X = artifacts.Activations.read_boundary(path, boundary)
            units, summary = topology.analyse_boundary(
                X.reshape(-1, X.shape[-1]),
                top_k=p.top_k,
                min_abs_r=p.min_abs_r,
                resolution=p.resolution,
                seed=p.seed,
                boundary_rule=p.boundary_rule,
                participation_quantile=p.participation_quantile,
                min_other=p.boundary_min_other,
            )
            tables.append(units.assign(layer=layer, boundary=boundary))
            summaries.append({"layer": layer, "boundary": boundary, **summary})
        artifacts.CommunityPartitions.write(
            pd.concat(tables, ignore_index=True), artifacts.CommunityPartitions.layer_file(out, layer)
        )
    artifacts.CommunitiesSummary.write(pd.DataFrame(summaries), snakemake.output.summary)
