# Validation and lookups. The logic lives in resdyn.config, where pytest reaches it.
from resdyn import config as rc
from resdyn.codeversion import script_code_version

rc.validate_config(config)

MODELS = list(config["models"])


# Light steps (tables from tables, figures) run on the submit host instead of as cluster jobs,
# which would cost more in scheduling than they compute.
localrules:
    all,
    phases,
    scaling,
    checkpoints,
    scorecard,
    figure_ckpt,
    figure_model,
    figure_scaling,


ZOO = [m for m in MODELS if config["models"][m]["source"] == "train"]


wildcard_constraints:
    model="|".join(MODELS),
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset="|".join(config["datasets"]),
    block=r"layers\d{3}-\d{3}",


def ckpts(model):
    return rc.checkpoints(config, model)


def ckpt_record(w):
    return f"models/{w.model}/{w.ckpt}/checkpoint.json"


def final_ckpt(model):
    return ckpts(model)[-1]


def dataset_of(w):
    return config["models"][w.model]["dataset"]


def code(script):
    """Code version of a rule: workflow/scripts/<script>.py and every resdyn module it reaches."""
    return script_code_version(f"{workflow.basedir}/workflow/scripts/{script}.py")


def per_ckpt(pattern, model):
    return expand(pattern, model=model, ckpt=ckpts(model))


def all_targets():
    targets = []
    for m in MODELS:
        targets += per_ckpt("results/{model}/{ckpt}/spectra.tsv", m)
        targets += per_ckpt("results/{model}/{ckpt}/bottleneck.tsv", m)
        targets += per_ckpt("results/{model}/{ckpt}/schur.tsv", m)
        targets += per_ckpt("results/{model}/{ckpt}/coupling.tsv", m)
        targets += per_ckpt("results/{model}/{ckpt}/bootstrap.tsv", m)
        targets.append(f"results/{m}/scorecard.tsv")
        targets.append(f"results/{m}/checkpoints.tsv")
        for c in rc.lens_checkpoints(config, m):
            targets += [
                f"results/{m}/{c}/lens_metrics.tsv",
                f"results/{m}/{c}/rss.tsv",
                f"results/{m}/{c}/resolution.tsv",
                f"results/{m}/{c}/phases.json",
                f"results/{m}/{c}/phase_metrics.tsv",
                f"results/{m}/{c}/bridge.tsv",
                f"results/{m}/{c}/causal.tsv",
            ]
        if m in ZOO:
            targets.append(f"models/{m}/training.tsv")
    targets.append("results/scaling/phase_widths.tsv")
    targets += figure_targets()
    return targets


def tokenizer_input(w):
    """Zoo models use the dataset's trained tokenizer; others their first checkpoint's."""
    if config["models"][w.model]["source"] == "train":
        return f"results/data/{dataset_of(w)}/tokenizer"
    return f"models/{w.model}/{ckpts(w.model)[0]}/checkpoint.json"


def jacobian_blocks(w):
    return expand(
        "results/{model}/{ckpt}/jacobians/{block}",
        model=w.model,
        ckpt=w.ckpt,
        block=rc.layer_blocks(config, w.model),
    )


def figure_targets():
    out = ["results/figures/scaling/phase_widths.png"]
    for m in MODELS:
        figs = ["checkpoints", "significant"] + (["training"] if m in ZOO else [])
        out += [f"results/figures/{m}/{f}.png" for f in figs]
        lens_ckpts = rc.lens_checkpoints(config, m)
        for c in ckpts(m):
            out += [
                f"results/figures/{m}/{c}/{f}.png"
                for f in rc.CKPT_FIGURES
                if f not in rc.LENS_FIGURES or c in lens_ckpts
            ]
    return out
