# The embedded zoo (source: train) and checkpoint resolution for every source.


rule zoo_train:
    input:
        train=lambda w: f"results/data/{dataset_of(w)}/train.jsonl",
        heldout=lambda w: f"results/data/{dataset_of(w)}/heldout.jsonl",
        tokenizer=lambda w: f"results/data/{dataset_of(w)}/tokenizer",
    output:
        weights=directory("models/{model}/weights"),
        curve=report(
            "models/{model}/training.tsv",
            caption="../report/training.rst",
            category="Zoo",
            labels={"model": "{model}", "table": "training loss"},
        ),
    log:
        "logs/zoo_train/{model}.log",
    benchmark:
        "benchmarks/out/zoo_train/{model}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: config["threads"]
    resources:
        mem_mb=cost("zoo_train", "mem_mb"),
        runtime=cost("zoo_train", "runtime"),
    params:
        arch=lambda w: {
            k: config["models"][w.model].get(k)
            for k in (
                "family",
                "n_layers",
                "d_model",
                "n_heads",
                "n_kv_heads",
                "d_ff",
                "max_position",
            )
        },
        train=lambda w: config["models"][w.model]["train"],
        code=code("zoo_train"),
    script:
        "../scripts/zoo_train.py"


rule resolve_checkpoint:
    input:
        lambda w: rc.checkpoint_inputs(config, w.model, w.ckpt),
    output:
        "models/{model}/{ckpt}/checkpoint.json",
    log:
        "logs/resolve_checkpoint/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/resolve_checkpoint/{model}/{ckpt}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    resources:
        mem_mb=cost("resolve_checkpoint", "mem_mb"),
        runtime=cost("resolve_checkpoint", "runtime"),
    params:
        spec=lambda w: rc.checkpoint_spec(config, w.model, w.ckpt),
        code=code("resolve_checkpoint"),
    script:
        "../scripts/resolve_checkpoint.py"


rule checkpoint_integrity:
    input:
        ckpt_record,
    output:
        "models/{model}/{ckpt}/integrity.json",
    log:
        "logs/checkpoint_integrity/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/checkpoint_integrity/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        allow=lambda w: bool(
            config["models"][w.model].get("allow_duplicate_weights", False)
        ),
        # the checkpoints before this one, in training order, found by the job itself: a setting,
        # so that adding, removing or reordering checkpoints reruns no other checkpoint's check
        earlier=setting(
            lambda w: [
                rc.checkpoint_spec(config, w.model, c)
                for c in ckpts_through(w.model, w.ckpt)[:-1]
            ]
        ),
        code=code("checkpoint_integrity", family=model_family),
    script:
        "../scripts/checkpoint_integrity.py"
