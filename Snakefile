# resdyn: residual-stream dynamics of decoder-only transformers (see README.md).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/zoo.smk"
include: "workflow/rules/jacobians.smk"
include: "workflow/rules/spectra.smk"
include: "workflow/rules/topology.smk"
include: "workflow/rules/lens.smk"
include: "workflow/rules/readout.smk"
include: "workflow/rules/phases.smk"
include: "workflow/rules/figures.smk"


report: "workflow/report/workflow.rst"


rule all:
    input:
        all_targets(),
    default_target: True
