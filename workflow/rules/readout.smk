# Study B: readout subspaces, RSS on the Grassmannian, and the resolution sweep over k.


rule rss:
    input:
        "results/{model}/{ckpt}/lens",
    output:
        report(
            "results/{model}/{ckpt}/rss.tsv",
            caption="../report/rss.rst",
            category="Study B",
            subcategory="readout",
            labels={"model": "{model}", "checkpoint": "{ckpt}", "table": "RSS"},
        ),
    log:
        "logs/rss/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/rss/{model}/{ckpt}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("rss", "threads")
    resources:
        mem_mb=cost("rss", "mem_mb"),
        runtime=cost("rss", "runtime"),
    params:
        k_fractions=config["readout"]["k_fractions"],
        matrix=config["readout"]["matrix"],
        code=code("rss"),
    script:
        "../scripts/rss.py"


rule resolution:
    input:
        "results/{model}/{ckpt}/lens",
    output:
        "results/{model}/{ckpt}/resolution.tsv",
    log:
        "logs/resolution/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/resolution/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("resolution", "threads")
    resources:
        mem_mb=cost("resolution", "mem_mb"),
        runtime=cost("resolution", "runtime"),
    params:
        k_fractions=config["readout"]["k_fractions"],
        matrix=config["readout"]["matrix"],
        code=code("resolution"),
    script:
        "../scripts/resolution.py"
