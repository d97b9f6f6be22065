# Figures: one job per checkpoint / model draws every figure of that scope in the catalogue
# (resdyn/plots/catalogue.py), each as PNG + PDF with its provenance embedded. Figures whose
# inputs, params and code are unchanged are restored byte for byte from a content-addressed
# cache (resdyn/plots/render.py), so a rerun job redraws only the figures that changed.

# Per scope: the wildcards its job runs for (they name its log and benchmark), and the title of
# its figures.
FIGURE_SCOPES = {
    "ckpt": ("{model}/{ckpt}", lambda w: f"{w.model} · {w.ckpt}"),
    "lens": ("{model}/{ckpt}", lambda w: f"{w.model} · {w.ckpt}"),
    "model": ("{model}", lambda w: w.model),
    "zoo": ("{model}", lambda w: w.model),
    "global": ("", "all models"),
    # Across checkpoints and models: one job per run and scope, every checkpoint's table in.
    "trajectory": ("", "all models"),
    "lens_trajectory": ("", "all models"),
}


for _scope, (_job, _title) in FIGURE_SCOPES.items():
    _log_dir = f"{_job}/" if _job else ""
    _bench = _job or f"figure_{_scope}"
    if figs.of_scope(_scope, config):

        rule:
            name:
                f"figure_{_scope}"
            input:
                unpack(figure_inputs(_scope)),
            output:
                **figure_outputs(_scope),
            log:
                f"logs/figures/{_log_dir}figure_{_scope}.log",
            benchmark:
                f"benchmarks/out/figure_{_scope}/{_bench}.tsv"
            priority: 1 if _scope == "lens" else 0
            conda:
                "../../envs/resdyn.yaml"
            params:
                **(
                    {"pairs": trajectory_pairs(_scope)}
                    if _scope in figs.TRAJECTORY_SCOPES
                    else {}
                ),
                scope=_scope,
                title=_title,
                dpi=config["figures"]["dpi"],
                cache=FIGURE_CACHE,
                code=code("figure"),
            script:
                "../scripts/figure.py"


if OFF_FIGURES:

    # A figure of a study that config key studies leaves out: stop with one line saying so
    # (instead of Snakemake's "no rule to produce").
    rule figure_study_off:
        input:
            lambda w: figs.require_studies(config, w.figure, f"{w.path}{w.figure}.png"),
        output:
            "results/figures/{path}{figure}.png",
        log:
            "logs/figures/study_off/{path}{figure}.log",
        wildcard_constraints:
            figure="|".join(OFF_FIGURES),
            path=r"([^/]+/)*",
        conda:
            "../../envs/resdyn.yaml"
        shell:
            "false"
