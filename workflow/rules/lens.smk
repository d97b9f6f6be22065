# Study B core: tuned-lens translators and per-layer prediction metrics (GPU rules on SLURM).

# lens.source = tuned_lens imports a published lens instead of training one (same output).
LENS_IMPORT_KEYS = ("source", "path", "repo", "repo_type", "revision")


rule lens:
    input:
        ckpt=ckpt_record,
        integrity=ckpt_integrity,
        tokens="results/{model}/lens_tokens.h5",
    output:
        directory("results/{model}/{ckpt}/lens"),
    log:
        "logs/lens/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/lens/{model}/{ckpt}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    threads: config["threads"]
    resources:
        mem_mb=cost("lens", "mem_mb"),
        runtime=cost("lens", "runtime"),
        gpu=cost("lens", "gpu"),
    params:
        options=lambda w: {
            k: v
            for k, v in model_cfg(w)["lens"].items()
            if k
            not in (
                "checkpoints",
                "n_train_blocks",
                "n_heldout_blocks",
                "train_tokens",
                "checkpoint_every",
                *LENS_IMPORT_KEYS,
            )
        },
        source=lambda w: rc.lens_import_spec(config, w.model, w.ckpt),
        n_train=lambda w: rc.lens_train_blocks(config, w.model),
        fresh=lambda w: model_cfg(w)["lens"]["train_tokens"] > 0,
        checkpoint_every=setting(of_model("lens", "checkpoint_every")),
        placement=setting(lambda w: dag.placement_param(config, "lens", w)),
        device=setting(of_model("device")),
        code=code("lens"),
    script:
        "../scripts/lens.py"


rule lens_metrics:
    input:
        ckpt=ckpt_record,
        integrity=ckpt_integrity,
        lens="results/{model}/{ckpt}/lens",
        samples="results/{model}/samples.h5",
    output:
        report(
            "results/{model}/{ckpt}/lens_metrics.tsv",
            caption="../report/lens_metrics.rst",
            category="Study B",
            subcategory="lens",
            labels={
                "model": "{model}",
                "checkpoint": "{ckpt}",
                "table": "lens metrics",
            },
        ),
    log:
        "logs/lens_metrics/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/lens_metrics/{model}/{ckpt}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    threads: config["threads"]
    resources:
        mem_mb=cost("lens_metrics", "mem_mb"),
        runtime=cost("lens_metrics", "runtime"),
        gpu=cost("lens_metrics", "gpu"),
    params:
        placement=setting(lambda w: dag.placement_param(config, "lens_metrics", w)),
        device=setting(of_model("device")),
        code=code("lens_metrics"),
    script:
        "../scripts/lens_metrics.py"
