# resdyn: residual-stream dynamics of decoder-only transformers (see README.md).
import sys

from snakemake.utils import min_version

min_version("9.0")

# This checkout's resdyn is importable without installing it: Snakemake hands the main process's
# sys.path to every rule's script, also inside `--sdm conda` envs (envs/resdyn.yaml holds only the
# dependencies, since a path to the package would not survive Snakemake's copy of the env file).
sys.path.insert(0, workflow.basedir)


# A preset given with --configfile (configs/*.yaml) is a complete config and replaces the
# embedded default instead of being merged into it (which would mix their model lists).
# From the workflow's folder, so that `--directory DIR` (results, models, logs, benchmarks under
# DIR) finds it too.
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config.yaml"


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
include: "workflow/rules/beyond.smk"


# the front page, with a line for each figure the run does not draw (workflow/rules/common.smk)
report: workflow_description()


rule all:
    default_target: True
    input:
        all_targets(),
