"""The paper table: each figure the studies state next to this run's number (resdyn.beyond.paper)."""

from resdyn import artifacts
from resdyn.beyond import paper, paper_inputs
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    p = snakemake.params
    widths = snakemake.input.get("phase_widths")
    table = paper.paper_comparison(
        artifacts.ClaimsTable.load(),
        paper_inputs.read_model_tables(snakemake.input, p),
        p.studies,
        None if widths is None else artifacts.ScalingFits.read(widths),
        p.groups,
    )
    artifacts.PaperComparison.write(table, snakemake.output[0])
