# Study A results 1-2: spectra, cumulative bottleneck, Schur surgery, checkpoint comparison.


rule spectra:
    input:
        blocks=jacobian_blocks,
    output:
        table=report(
            "results/{model}/{ckpt}/spectra.tsv",
            caption="../report/spectra.rst",
            category="Study A",
            subcategory="spectra",
            labels={"model": "{model}", "checkpoint": "{ckpt}", "table": "spectra"},
        ),
        arrays="results/{model}/{ckpt}/spectra.h5",
        bottleneck="results/{model}/{ckpt}/bottleneck.tsv",
    log:
        "logs/spectra/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/spectra/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("spectra", "threads")
    resources:
        mem_mb=cost("spectra", "mem_mb"),
        runtime=cost("spectra", "runtime"),
        gpu=cost("spectra", "gpu"),
    params:
        k_fraction=config["spectra"]["k_fraction"],
        tolerances=config["spectra"]["complex_tolerances"],
        noise_draws=config["spectra"]["noise_draws"],
        noise_level=config["spectra"]["noise_level"],
        device=setting(lambda w: rcost.linalg_device(model_cfg(w))),
        code=code("spectra"),
    script:
        "../scripts/spectra.py"


rule schur:
    input:
        blocks=jacobian_blocks,
    output:
        "results/{model}/{ckpt}/schur.tsv",
    log:
        "logs/schur/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/schur/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("schur", "threads")
    resources:
        mem_mb=cost("schur", "mem_mb"),
        runtime=cost("schur", "runtime"),
    params:
        alphas=config["schur"]["alphas"],
        code=code("schur"),
    script:
        "../scripts/schur.py"


rule checkpoints:
    input:
        spectra=lambda w: per_ckpt("results/{model}/{ckpt}/spectra.tsv", w.model),
        bottleneck=lambda w: per_ckpt("results/{model}/{ckpt}/bottleneck.tsv", w.model),
        coupling=lambda w: per_ckpt("results/{model}/{ckpt}/coupling.tsv", w.model),
        coupling_layers=lambda w: per_ckpt(
            "results/{model}/{ckpt}/coupling_layers.tsv", w.model
        ),
        communities=lambda w: per_ckpt("results/{model}/{ckpt}/communities", w.model),
        communities_summary=lambda w: per_ckpt(
            "results/{model}/{ckpt}/communities_summary.tsv", w.model
        ),
        integrity=lambda w: per_ckpt("models/{model}/{ckpt}/integrity.json", w.model),
    output:
        table=report(
            "results/{model}/checkpoints.tsv",
            caption="../report/checkpoints.rst",
            category="Study A",
            subcategory="checkpoints",
            labels={"model": "{model}", "table": "checkpoint comparison"},
        ),
        counts=report(
            "results/{model}/coupling_counts.tsv",
            caption="../report/coupling_counts.rst",
            category="Study A",
            subcategory="topology",
            labels={"model": "{model}", "table": "significant layers"},
        ),
        similarity=report(
            "results/{model}/partition_similarity.tsv",
            caption="../report/partition_similarity.rst",
            category="Study A",
            subcategory="topology",
            labels={"model": "{model}", "table": "partition similarity"},
        ),
    log:
        "logs/checkpoints/{model}.log",
    benchmark:
        "benchmarks/out/checkpoints/{model}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        ckpts=lambda w: ckpts(w.model),
        nmi_permutations=config["topology"]["nmi_permutations"],
        seed=config["topology"]["seed"],
        code=code("checkpoints"),
    script:
        "../scripts/checkpoints.py"
