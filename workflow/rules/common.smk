# Validation and lookups. The logic lives in resdyn.pipeline.config, where pytest reaches it.
from resdyn.pipeline import config as rc
from resdyn.pipeline import dag
from resdyn.cluster import cost as rcost
from resdyn import io as rio
from resdyn.lm import models as rmodels
from resdyn.provenance.codeversion import cached_code_version
from resdyn.cluster.site import check_workdir
from resdyn.plots import catalogue as figs
from resdyn.beyond.scorecard import scaling_group
from resdyn.artifacts import ClaimsTable

# Duplicate keys first: Snakemake's YAML loading keeps the last one silently.
rc.check_config_files(workflow.configfiles)
rc.validate_config(config)
dag.check_fits(
    config
)  # a GPU job that fits no node of RESDYN_GPU_KIND stops here, not in the queue
check_workdir(os.getcwd())  # `--directory DIR`: everything is written under DIR

MODELS = list(config["models"])


# Light steps (tables from tables, figures) run on the submit host instead of as cluster jobs,
# which would cost more in scheduling than they compute; corpus, resolve_checkpoint and
# resolve_tokenizer too, since they fetch from the hub and on clusters only the submit host has
# internet. The list is resdyn.cluster.cost.LOCALRULES, which the SLURM settings also read.
workflow.localrules(*rcost.LOCALRULES)


ZOO = [m for m in MODELS if config["models"][m]["source"] == "train"]


wildcard_constraints:
    model="|".join(MODELS),
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset="|".join(config["datasets"]),
    block=r"layers\d{3}-\d{3}",


def cost(rule, what):
    """Resource ``what`` of a job of ``rule`` from the cost model (resdyn.cluster.cost), the numbers
    `resdyn plan` prints; memory and runtime grow with the attempt."""

    def value(wildcards, attempt):
        return dag.resources(config, rule, dict(wildcards.items()), attempt)[what]

    return value


def model_cfg(w):
    """The config as this job's model sees it: its overrides merged in (rc.model_config)."""
    return rc.model_config(config, w.model)


def of_model(*keys):
    """A params callable: the model's value of a config key (its overrides first)."""

    def value(w):
        out = model_cfg(w)
        for key in keys:
            out = out[key]
        return out

    return value


def ckpts(model):
    return rc.checkpoints(config, model)


def ckpt_record(w):
    return f"models/{w.model}/{w.ckpt}/checkpoint.json"


def ckpt_integrity(w):
    """The checkpoint's integrity record, which every model job waits for (a duplicate stops the
    run there); ancient: a re-check after an added revision reruns no model job."""
    return ancient(f"models/{w.model}/{w.ckpt}/integrity.json")


def ckpts_through(model, ckpt):
    """The checkpoints of ``model`` up to and including ``ckpt``, in training order."""
    names = ckpts(model)
    return names[: names.index(ckpt) + 1]


def final_ckpt(model):
    return ckpts(model)[-1]


def dataset_of(w):
    return config["models"][w.model]["dataset"]


CODE_CACHE = ".snakemake/resdyn/code"


def code(script, family=None):
    """Code version of a rule: the normalised code workflow/scripts/<script>.py reaches, symbol by
    symbol (resdyn.provenance.codeversion); family=model_family: only the job's family's adapter.
    """
    path = f"{workflow.basedir}/workflow/scripts/{script}.py"
    if family is None:
        return cached_code_version(path, CODE_CACHE)
    return lambda w: cached_code_version(path, CODE_CACHE, family(w))


def model_family(w):
    return config["models"][w.model]["family"]


def setting(value):
    """A param that changes no number (device, GPU placement, checkpoint spacing; docs/reruns.md): Snakemake
    does not count params computed from resources as a rerun trigger. Scripts and provenance
    see it as any param."""
    if callable(
        value
    ):  # a function of the wildcards (e.g. of_model): evaluated per job
        return lambda wildcards, resources: value(wildcards)
    return lambda wildcards, resources: value


def per_ckpt(pattern, model):
    return expand(pattern, model=model, ckpt=ckpts(model))


def all_targets():
    """Every final output of the studies switched on by config key studies."""
    targets = []
    for m in MODELS:
        if rc.runs(config, "A"):
            for t in ("spectra", "bottleneck", "schur", "coupling", "bootstrap"):
                targets += per_ckpt(f"results/{{model}}/{{ckpt}}/{t}.tsv", m)
            targets.append(f"results/{m}/checkpoints.tsv")
        targets.append(f"results/{m}/scorecard.tsv")
        lens_tables = []
        if rc.runs(config, "B"):
            lens_tables += ["lens_metrics.tsv", "rss.tsv", "resolution.tsv"]
            lens_tables += ["phases.json", "phase_metrics.tsv", "causal.tsv"]
        if rc.runs(config, "A", "B"):
            lens_tables.append("bridge.tsv")
        for c in rc.lens_checkpoints(config, m):
            targets += [f"results/{m}/{c}/{t}" for t in lens_tables]
        if m in ZOO:
            targets.append(f"models/{m}/training.tsv")
    # no scaling groups: no depth series to fit, so neither the table nor its figure
    if rc.runs(config, "B") and config["scaling"]["groups"]:
        targets.append("results/scaling/phase_widths.tsv")
    targets.append("results/paper_comparison.tsv")
    targets.append("results/sensitivity.tsv")
    targets += figure_targets()
    return targets


def tokenizer_input(w):
    """Zoo models use the dataset's trained tokenizer; others the copy resolve_tokenizer makes of
    their first checkpoint's (all checkpoints of a model share it), whose path names no revision:
    adding, removing or reordering revisions reruns no samples (docs/reruns.md)."""
    if config["models"][w.model]["source"] == "train":
        return f"results/data/{dataset_of(w)}/tokenizer"
    return f"models/{w.model}/tokenizer"


def first_ckpt_spec(w):
    """Checkpoint spec of the model's first configured checkpoint (where its tokenizer is read)."""
    return rc.checkpoint_spec(config, w.model, ckpts(w.model)[0])


def jacobian_blocks(w):
    return expand(
        "results/{model}/{ckpt}/jacobians/{block}",
        model=w.model,
        ckpt=w.ckpt,
        block=rc.layer_blocks(config, w.model),
    )


def figure_targets():
    """Every figure of the catalogue (resdyn.plots.catalogue) whose studies run."""
    out = []
    for scope in ("global", *figs.TRAJECTORY_SCOPES):
        out += [figs.output_path(f) for f in figs.of_scope(scope, config)]
    for m in MODELS:
        for scope in ["model", "zoo"] if m in ZOO else ["model"]:
            out += [figs.output_path(f, model=m) for f in figs.of_scope(scope, config)]
        for scope, cs in (("ckpt", ckpts(m)), ("lens", rc.lens_checkpoints(config, m))):
            for c in cs:
                out += [
                    figs.output_path(f, model=m, ckpt=c)
                    for f in figs.of_scope(scope, config)
                ]
    return out


def scorecard_inputs(w):
    """The tables of the studies that run; claims of a study switched off say "not run"."""
    final = f"results/{w.model}/{final_ckpt(w.model)}"
    out = {}
    if rc.runs(config, "A"):
        out["checkpoints"] = f"results/{w.model}/checkpoints.tsv"
        out["schur"] = f"{final}/schur.tsv"
        out["bootstrap"] = per_ckpt("results/{model}/{ckpt}/bootstrap.tsv", w.model)
        out["replicates"] = per_ckpt(
            "results/{model}/{ckpt}/bootstrap_replicates.tsv", w.model
        )
    if rc.runs(config, "B"):
        out["phases"] = f"{final}/phases.json"
        out["lens_metrics"] = f"{final}/lens_metrics.tsv"
        # phase widths only for models in a scaling group (else: not testable)
        if scaling_group(config, w.model):
            out["phase_widths"] = "results/scaling/phase_widths.tsv"
    return out


# The studies' stated figures (package data): a param (their content hash) of the tables that
# quote them, so that editing the figures reruns those tables; not an input, whose path would
# change with where the workflow lies (a copy, --directory) and rerun them for nothing.
CLAIMS_SHA256 = rio.sha256_file(ClaimsTable.packaged())


def lens_final(model):
    return rc.lens_checkpoints(config, model)[-1]


def paper_comparison_inputs(wildcards):
    """The tables the paper table reads, of the studies that run (one list entry per model)."""
    out = {}
    if rc.runs(config, "A"):
        out["checkpoints"] = [f"results/{m}/checkpoints.tsv" for m in MODELS]
        out["coupling_counts"] = [f"results/{m}/coupling_counts.tsv" for m in MODELS]
        out["bottleneck"] = [
            f"results/{m}/{final_ckpt(m)}/bottleneck.tsv" for m in MODELS
        ]
        out["bootstrap"] = [
            f"results/{m}/{final_ckpt(m)}/bootstrap.tsv" for m in MODELS
        ]
        for key, name in (("coupling", "coupling.tsv"), ("schur", "schur.tsv")):
            out[key] = [f"results/{m}/{final_ckpt(m)}/{name}" for m in MODELS]
        out["partitions"] = [f"results/{m}/partition_similarity.tsv" for m in MODELS]
    if rc.runs(config, "B"):
        for key, name in (
            ("phases", "phases.json"),
            ("geometry", "geometry.tsv"),
            ("phase_metrics", "phase_metrics.tsv"),
            ("lens_metrics", "lens_metrics.tsv"),
        ):
            out[key] = [f"results/{m}/{lens_final(m)}/{name}" for m in MODELS]
        if config["scaling"]["groups"]:  # no groups: no fit (its rows say why)
            out["phase_widths"] = "results/scaling/phase_widths.tsv"
    return out


def sensitivity_inputs(wildcards):
    """The paper table's inputs, and what the options the run did not compute are recomputed from:
    every checkpoint's partitions, spectra and Jacobian blocks (study A), the final lens (study B).
    """
    out = paper_comparison_inputs(wildcards)
    pairs = [(m, c) for m in MODELS for c in ckpts(m)]
    if rc.runs(config, "A"):
        out["communities"] = [f"results/{m}/{c}/communities" for m, c in pairs]
        out["spectra"] = [f"results/{m}/{c}/spectra.tsv" for m, c in pairs]
        out["blocks"] = [
            f"results/{m}/{c}/jacobians/{b}"
            for m, c in pairs
            for b in rc.layer_blocks(config, m)
        ]
    if rc.runs(config, "B"):
        out["lens"] = [f"results/{m}/{lens_final(m)}/lens" for m in MODELS]
    return out


def sensitivity_defaults():
    """The configured option of each open choice (resdyn.beyond.sensitivity.CHOICES)."""
    return {
        "single_layer_baseline": "P_1",
        "readout_matrix": config["readout"]["matrix"],
        "boundary_rule": f"min_other_{config['topology']['boundary_min_other']}",
        "complex_rule": config["spectra"]["complex_rule"],
        "erank_weights": "sigma",
        "jacobian_product": "product_of_means",
    }


# --- figures (the catalogue: resdyn/plots/catalogue.py) ---

FIGURE_CACHE = "results/figures/.cache"
FIGURE_CAPTION = f"{workflow.basedir}/workflow/report/figure.rst"
FIGURE_WILDCARDS = {
    "ckpt": ("model", "ckpt"),
    "lens": ("model", "ckpt"),
    "model": ("model",),
    "zoo": ("model",),
    "global": (),
    "trajectory": (),
    "lens_trajectory": (),
}


def workflow_description():
    """The report's front page: workflow/report/workflow.rst, and a line for each figure the
    run does not draw saying why (resdyn.plots.catalogue.not_drawn), written (when changed)
    under .snakemake/ like the figure captions."""
    path = Path(".snakemake/resdyn/workflow.rst").resolve()
    text = Path(f"{workflow.basedir}/workflow/report/workflow.rst").read_text()
    missing = figs.not_drawn(config)
    if missing:
        text += "\n**Figures not drawn.**\n\n" + "".join(
            f"- {line}\n" for line in missing
        )
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def figure_caption(spec):
    """The report caption of one figure: workflow/report/figure.rst with the catalogue's text in
    it, written (when changed) under .snakemake/, since a caption file is one per output.
    """
    path = Path(".snakemake/resdyn/captions", f"{spec.name}.rst").resolve()
    text = Path(FIGURE_CAPTION).read_text().replace("{{ caption }}", spec.caption)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def figure_outputs(scope):
    """Named outputs of a figure job: <name> (PNG, in the report) and <name>_pdf per figure."""
    out = {}
    for f in figs.of_scope(scope, config):
        labels = {w: f"{{{w}}}" for w in FIGURE_WILDCARDS[scope]} | {"figure": f.name}
        out[f.name] = report(
            figs.output_path(f),
            caption=figure_caption(f),
            category=f.category,
            subcategory=f.subcategory,
            labels=labels,
        )
        out[f"{f.name}_pdf"] = figs.output_path(f, "pdf")
    return out


def trajectory_pairs(scope):
    """(model, ckpt) of every checkpoint (lens_trajectory: with a tuned lens) of every model, in
    config and training order: what a trajectory figure reads."""
    of = (
        (lambda m: rc.lens_checkpoints(config, m))
        if scope == "lens_trajectory"
        else ckpts
    )
    return [[m, c] for m in MODELS for c in of(m)]


def figure_inputs(scope):
    """Named inputs of a figure job: per figure, the artifacts it reads."""

    def inputs(w):
        if scope in figs.TRAJECTORY_SCOPES:
            pairs = trajectory_pairs(scope)
            return {
                f.name: figs.trajectory_inputs(f, pairs)
                for f in figs.of_scope(scope, config)
            }
        return {
            f.name: figs.input_paths(f, **dict(w.items()))
            for f in figs.of_scope(scope, config)
        }

    return inputs


OFF_FIGURES = [f.name for f in figs.FIGURES if not figs.enabled(config, f)]
