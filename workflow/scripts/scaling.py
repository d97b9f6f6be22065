"""Phase width vs depth across models of one family: OLS slope with a 95% CI per phase (widths from
Kneedle fallback cuts flagged and left out of the fit)."""

from resdyn import artifacts
from resdyn.provenance import sidecars
from resdyn.study_b import geometry, phases

with sidecars.step(snakemake) as step:
    p = snakemake.params
    cuts = {
        model: phases.Cutpoints.from_json(artifacts.PhaseCuts.read(path), source=path).to_json()
        for model, path in zip(p.models, snakemake.input.phases, strict=True)
    }
    widths = geometry.phase_widths(cuts, p.groups, p.n_layers)
    artifacts.ScalingWidths.write(widths, snakemake.output.widths)
    artifacts.ScalingFits.write(geometry.group_fits(widths), snakemake.output.fits)
