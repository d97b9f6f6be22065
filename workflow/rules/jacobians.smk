# Study A inputs: exact sublayer Jacobians and boundary activations (GPU rules on SLURM).


rule jacobians:
    input:
        ckpt=ckpt_record,
        integrity=ckpt_integrity,
        samples="results/{model}/samples.h5",
    output:
        directory("results/{model}/{ckpt}/jacobians/{block}"),
    log:
        "logs/jacobians/{model}/{ckpt}/{block}.log",
    benchmark:
        "benchmarks/out/jacobians/{model}/{ckpt}/{block}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: config["threads"]
    resources:
        mem_mb=cost("jacobians", "mem_mb"),
        runtime=cost("jacobians", "runtime"),
        gpu=cost("jacobians", "gpu"),
    params:
        positions=config["jacobian"]["positions"],
        store_dtype=config["jacobian"]["store_dtype"],
        store_first_n=of_model("jacobian", "store_first_n"),
        n_groups=of_model("jacobian", "n_groups"),
        group_dtype=of_model("jacobian", "group_dtype"),
        checkpoint_every=setting(config["jacobian"]["checkpoint_every"]),
        device=setting(of_model("device")),
        code=code("jacobians", family=model_family),
    script:
        "../scripts/jacobians.py"


rule activations:
    input:
        ckpt=ckpt_record,
        integrity=ckpt_integrity,
        samples="results/{model}/samples.h5",
    output:
        directory("results/{model}/{ckpt}/activations"),
    log:
        "logs/activations/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/activations/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: config["threads"]
    resources:
        mem_mb=cost("activations", "mem_mb"),
        runtime=cost("activations", "runtime"),
        gpu=cost("activations", "gpu"),
    params:
        skip_positions=config["activations"]["skip_positions"],
        dtype=config["activations"]["dtype"],
        placement=setting(lambda w: dag.placement_param(config, "activations", w)),
        device=setting(of_model("device")),
        code=code("activations", family=model_family),
    script:
        "../scripts/activations.py"
