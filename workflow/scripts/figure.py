"""Draw the figures of one scope instance (a checkpoint, a model, the run) from the catalogue.

Each figure: PNG + PDF with its own provenance embedded; unchanged ones come back from the render
cache (resdyn.plots.render), so only figures whose inputs, params or code changed are redrawn.
"""

import logging

# Every figure module, imported here so that the rule's code version covers them (render
# reaches them by name).
from resdyn.plots import (  # noqa: F401
    bridge,
    catalogue,
    render,
    study_a_spectra,
    study_a_topology,
    study_b,
    trajectory,
    zoo,
)
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    p = snakemake.params
    log = logging.getLogger(f"resdyn.rule.{snakemake.rule}")
    base = step.provenance()
    for spec in catalogue.of_scope(p.scope):
        if spec.name not in snakemake.output.keys():
            continue  # its study is switched off (config key studies)
        inputs = snakemake.input[spec.name]
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        png, pdf = snakemake.output[spec.name], snakemake.output[f"{spec.name}_pdf"]
        code = catalogue.figure_code_version(spec.name)
        prov = {
            **base,
            "inputs": {i: step.input_hashes[i] for i in inputs},
            "outputs": {png: None, pdf: None},
            "params": {**base["params"], "figure": spec.name, "plot": spec.plot, "caption": spec.caption},
        }
        drawn = render.render(
            spec.name,
            spec.plot,
            prov["inputs"],
            png,
            pdf,
            f"{p.title} · {spec.name}",
            spec.caption,
            p.dpi,
            code,
            prov,
            p.cache,
            pairs=[tuple(x) for x in p.pairs] if spec.scope in catalogue.TRAJECTORY_SCOPES else None,
        )
        log.info("%s %s", "drew" if drawn else "restored unchanged", spec.name)
