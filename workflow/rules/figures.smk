# Figures: one job per checkpoint / model draws every figure of that scope in the catalogue
# (resdyn/plots/catalogue.py), each as PNG + PDF with its provenance embedded. Figures whose
# inputs, params and code are unchanged are restored byte for byte from a content-addressed
# cache (resdyn/plots/render.py), so a rerun job redraws only the figures that changed.

if figs.of_scope("ckpt", config):

    rule figure_ckpt:
        input:
            unpack(figure_inputs("ckpt")),
        output:
            **figure_outputs("ckpt"),
        log:
            "logs/figures/{model}/{ckpt}/figure_ckpt.log",
        benchmark:
            "benchmarks/out/figure_ckpt/{model}/{ckpt}.tsv"
        conda:
            "../../envs/resdyn.yaml"
        params:
            scope="ckpt",
            title=lambda w: f"{w.model} · {w.ckpt}",
            dpi=config["figures"]["dpi"],
            cache=FIGURE_CACHE,
            code=code("figure"),
        script:
            "../scripts/figure.py"


if figs.of_scope("lens", config):

    rule figure_lens:
        input:
            unpack(figure_inputs("lens")),
        output:
            **figure_outputs("lens"),
        log:
            "logs/figures/{model}/{ckpt}/figure_lens.log",
        benchmark:
            "benchmarks/out/figure_lens/{model}/{ckpt}.tsv"
        priority: 1
        conda:
            "../../envs/resdyn.yaml"
        params:
            scope="lens",
            title=lambda w: f"{w.model} · {w.ckpt}",
            dpi=config["figures"]["dpi"],
            cache=FIGURE_CACHE,
            code=code("figure"),
        script:
            "../scripts/figure.py"


if figs.of_scope("model", config):

    rule figure_model:
        input:
            unpack(figure_inputs("model")),
        output:
            **figure_outputs("model"),
        log:
            "logs/figures/{model}/figure_model.log",
        benchmark:
            "benchmarks/out/figure_model/{model}.tsv"
        conda:
            "../../envs/resdyn.yaml"
        params:
            scope="model",
            title=lambda w: w.model,
            dpi=config["figures"]["dpi"],
            cache=FIGURE_CACHE,
            code=code("figure"),
        script:
            "../scripts/figure.py"


rule figure_zoo:
    input:
        unpack(figure_inputs("zoo")),
    output:
        **figure_outputs("zoo"),
    log:
        "logs/figures/{model}/figure_zoo.log",
    benchmark:
        "benchmarks/out/figure_zoo/{model}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        scope="zoo",
        title=lambda w: w.model,
        dpi=config["figures"]["dpi"],
        cache=FIGURE_CACHE,
        code=code("figure"),
    script:
        "../scripts/figure.py"


if figs.of_scope("global", config):

    rule figure_global:
        input:
            unpack(figure_inputs("global")),
        output:
            **figure_outputs("global"),
        log:
            "logs/figures/figure_global.log",
        benchmark:
            "benchmarks/out/figure_global/figure_global.tsv"
        conda:
            "../../envs/resdyn.yaml"
        params:
            scope="global",
            title="all models",
            dpi=config["figures"]["dpi"],
            cache=FIGURE_CACHE,
            code=code("figure"),
        script:
            "../scripts/figure.py"


for _scope in figs.TRAJECTORY_SCOPES:
    if figs.of_scope(_scope, config):

        # Across checkpoints and models: one job per run and scope, every checkpoint's table in.
        rule:
            name:
                f"figure_{_scope}"
            input:
                unpack(figure_inputs(_scope)),
            output:
                **figure_outputs(_scope),
            log:
                f"logs/figures/figure_{_scope}.log",
            benchmark:
                f"benchmarks/out/figure_{_scope}/figure_{_scope}.tsv"
            conda:
                "../../envs/resdyn.yaml"
            params:
                scope=_scope,
                pairs=trajectory_pairs(_scope),
                title="all models",
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
