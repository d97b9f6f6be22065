# Study A result 3: activation-correlation communities and topology-dynamics coupling.


rule communities:
    input:
        "results/{model}/{ckpt}/activations",
    output:
        folder=directory("results/{model}/{ckpt}/communities"),
        summary=report(
            "results/{model}/{ckpt}/communities_summary.tsv",
            caption="../report/communities.rst",
            category="Study A",
            subcategory="topology",
            labels={
                "model": "{model}",
                "checkpoint": "{ckpt}",
                "table": "communities",
            },
        ),
    log:
        "logs/communities/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/communities/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("communities", "threads")
    resources:
        mem_mb=cost("communities", "mem_mb"),
        runtime=cost("communities", "runtime"),
    params:
        top_k=config["topology"]["top_k"],
        min_abs_r=config["topology"]["min_abs_r"],
        resolution=config["topology"]["resolution"],
        seed=config["topology"]["seed"],
        boundary_rule=config["topology"]["boundary_rule"],
        boundary_min_other=config["topology"]["boundary_min_other"],
        participation_quantile=config["topology"]["participation_quantile"],
        code=code("communities"),
    script:
        "../scripts/communities.py"


rule coupling:
    input:
        communities="results/{model}/{ckpt}/communities",
        blocks=jacobian_blocks,
        spectra="results/{model}/{ckpt}/spectra.tsv",
    output:
        table=report(
            "results/{model}/{ckpt}/coupling.tsv",
            caption="../report/coupling.rst",
            category="Study A",
            subcategory="topology",
            labels={"model": "{model}", "checkpoint": "{ckpt}", "table": "coupling"},
        ),
        layers=report(
            "results/{model}/{ckpt}/coupling_layers.tsv",
            caption="../report/coupling_layers.rst",
            category="Study A",
            subcategory="topology",
            labels={
                "model": "{model}",
                "checkpoint": "{ckpt}",
                "table": "coupling per layer",
            },
        ),
    log:
        "logs/coupling/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/coupling/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("coupling", "threads")
    resources:
        mem_mb=cost("coupling", "mem_mb"),
        runtime=cost("coupling", "runtime"),
    params:
        gain=config["topology"]["gain"],
        fdr_q=config["topology"]["fdr_q"],
        code=code("coupling"),
    script:
        "../scripts/coupling.py"
