# Study A inputs: exact sublayer Jacobians and boundary activations (GPU rules on SLURM).


def jacobian_blocks(w):
    return expand(
        "results/{model}/{ckpt}/jacobians/{block}",
        model=w.model,
        ckpt=w.ckpt,
        block=rc.layer_blocks(config, w.model),
    )


rule jacobians:
    input:
        ckpt=ckpt_record,
        samples="results/{model}/samples.h5",
    output:
        directory("results/{model}/{ckpt}/jacobians/{block}"),
    params:
        positions=config["jacobian"]["positions"],
        store_dtype=config["jacobian"]["store_dtype"],
        store_first_n=config["jacobian"]["store_first_n"],
        checkpoint_every=config["jacobian"]["checkpoint_every"],
        device=config["device"],
        code=code("arch", "jacobian", "models"),
    threads: config["threads"]
    resources:
        mem_mb=8000,
        runtime=240,
    benchmark:
        "benchmarks/out/jacobians/{model}/{ckpt}/{block}.tsv"
    log:
        "logs/jacobians/{model}/{ckpt}/{block}.log",
    script:
        "../scripts/jacobians.py"


rule activations:
    input:
        ckpt=ckpt_record,
        samples="results/{model}/samples.h5",
    output:
        directory("results/{model}/{ckpt}/activations"),
    params:
        skip_positions=config["activations"]["skip_positions"],
        dtype=config["activations"]["dtype"],
        device=config["device"],
        code=code("arch", "activations", "models"),
    threads: config["threads"]
    resources:
        mem_mb=8000,
        runtime=120,
    log:
        "logs/activations/{model}/{ckpt}.log",
    script:
        "../scripts/activations.py"
