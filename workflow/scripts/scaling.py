"""Phase width vs depth across models of one family: OLS slope with a 95% CI per phase (widths from
Kneedle fallback cuts flagged and left out of the fit)."""

import pandas as pd

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_b import geometry, phases

with sidecars.step(snakemake) as step:
    p = snakemake.params
    model_of = {m: g for g, members in p.groups.items() for m in members}
    rows = []
    for model, path in zip(p.models, snakemake.input.phases, strict=True):
        cuts = phases.Cutpoints.from_json(artifacts.PhaseCuts.read(path), source=path)
        flags = geometry.fallback_widths(cuts.b1_found, cuts.b2_found)
        for phase, (width, fallback) in enumerate(zip(cuts.widths, flags, strict=True), start=1):
            rows.append(
                {
                    "group": model_of[model],
                    "model": model,
                    "n_layers": p.n_layers[model],
                    "phase": phase,
                    "width": width,
                    "fallback": fallback,
                }
            )
    widths = pd.DataFrame(rows, columns=list(artifacts.ScalingWidths.columns))
    fits = [geometry.depth_scaling(sub).assign(group=g) for g, sub in widths.groupby("group")]
    artifacts.ScalingWidths.write(widths, snakemake.output.widths)
    artifacts.ScalingFits.write(
        pd.concat(fits, ignore_index=True) if fits else geometry.depth_scaling(widths), snakemake.output.fits
    )
