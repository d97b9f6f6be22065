# Study B: Kneedle phases of the RSS profile, phase metrics, and phase width vs depth.


rule phases:
    input:
        rss="results/{model}/{ckpt}/rss.tsv",
        resolution="results/{model}/{ckpt}/resolution.tsv",
    output:
        "results/{model}/{ckpt}/phases.json",
    log:
        "logs/phases/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/phases/{model}/{ckpt}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    params:
        k_fraction=config["readout"]["phase_k_fraction"],
        smoothing=config["phases"]["smoothing"],
        window=config["phases"]["window"],
        code=code("phases"),
    script:
        "../scripts/phases.py"


rule phase_metrics:
    input:
        activations="results/{model}/{ckpt}/activations",
        lens_metrics="results/{model}/{ckpt}/lens_metrics.tsv",
        phases="results/{model}/{ckpt}/phases.json",
    output:
        geometry="results/{model}/{ckpt}/geometry.tsv",
        table=report(
            "results/{model}/{ckpt}/phase_metrics.tsv",
            caption="../report/phase_metrics.rst",
            category="Study B",
            subcategory="phases",
            labels={
                "model": "{model}",
                "checkpoint": "{ckpt}",
                "table": "phase metrics",
            },
        ),
    log:
        "logs/phase_metrics/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/phase_metrics/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("phase_metrics", "threads")
    resources:
        mem_mb=cost("phase_metrics", "mem_mb"),
        runtime=cost("phase_metrics", "runtime"),
    params:
        code=code("phase_metrics"),
    script:
        "../scripts/phase_metrics.py"


rule scaling:
    input:
        # no scaling groups: stop with one line (rc.scaling_groups) before any job
        phases=lambda w: [
            f"results/{m}/{final_ckpt(m)}/phases.json"
            for members in rc.scaling_groups(config).values()
            for m in members
        ],
    output:
        widths="results/scaling/widths.tsv",
        fits=report(
            "results/scaling/phase_widths.tsv",
            caption="../report/scaling.rst",
            category="Study B",
            subcategory="phases",
            labels={"table": "phase width vs depth"},
        ),
    log:
        "logs/scaling/scaling.log",
    benchmark:
        "benchmarks/out/scaling/scaling.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        groups=config["scaling"]["groups"],
        # the model of each phases.json, in input order (not parsed from its path)
        models=[m for members in config["scaling"]["groups"].values() for m in members],
        n_layers={
            m: config["models"][m]["n_layers"]
            for members in config["scaling"]["groups"].values()
            for m in members
        },
        code=code("scaling"),
    script:
        "../scripts/scaling.py"
