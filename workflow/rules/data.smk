# Corpora, the zoo tokenizer, and the fixed samples each model's analyses share.


rule corpus:
    input:
        lambda w: rc.dataset_inputs(config, w.dataset),
    output:
        train="results/data/{dataset}/train.jsonl",
        heldout="results/data/{dataset}/heldout.jsonl",
    log:
        "logs/corpus/{dataset}.log",
    benchmark:
        "benchmarks/out/corpus/{dataset}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    resources:
        mem_mb=cost("corpus", "mem_mb"),
        runtime=cost("corpus", "runtime"),
    params:
        spec=lambda w: config["datasets"][w.dataset],
        code=code("corpus"),
    script:
        "../scripts/corpus.py"


rule tokenizer:
    input:
        train="results/data/{dataset}/train.jsonl",
    output:
        directory("results/data/{dataset}/tokenizer"),
    log:
        "logs/tokenizer/{dataset}.log",
    benchmark:
        "benchmarks/out/tokenizer/{dataset}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    resources:
        mem_mb=cost("tokenizer", "mem_mb"),
        runtime=cost("tokenizer", "runtime"),
    params:
        vocab_size=config["tokenizer"]["vocab_size"],
        code=code("tokenizer"),
    script:
        "../scripts/tokenizer.py"


rule resolve_tokenizer:
    output:
        directory("models/{model}/tokenizer"),
    log:
        "logs/resolve_tokenizer/{model}.log",
    benchmark:
        "benchmarks/out/resolve_tokenizer/{model}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    resources:
        mem_mb=cost("resolve_tokenizer", "mem_mb"),
        runtime=cost("resolve_tokenizer", "runtime"),
    params:
        identity=lambda w: rmodels.tokenizer_identity(first_ckpt_spec(w)),
        spec=setting(first_ckpt_spec),
        code=code("resolve_tokenizer"),
    script:
        "../scripts/resolve_tokenizer.py"


rule samples:
    input:
        heldout=lambda w: f"results/data/{dataset_of(w)}/heldout.jsonl",
        tokenizer=tokenizer_input,
    output:
        "results/{model}/samples.h5",
    log:
        "logs/samples/{model}.log",
    benchmark:
        "benchmarks/out/samples/{model}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    resources:
        mem_mb=cost("samples", "mem_mb"),
        runtime=cost("samples", "runtime"),
    params:
        n=of_model("samples", "n"),
        length=of_model("samples", "length"),
        seed=of_model("samples", "seed"),
        dataset=dataset_of,
        code=code("samples"),
    script:
        "../scripts/samples.py"


rule lens_tokens:
    input:
        train=lambda w: f"results/data/{dataset_of(w)}/train.jsonl",
        tokenizer=tokenizer_input,
    output:
        "results/{model}/lens_tokens.h5",
    log:
        "logs/lens_tokens/{model}.log",
    benchmark:
        "benchmarks/out/lens_tokens/{model}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    resources:
        mem_mb=cost("lens_tokens", "mem_mb"),
        runtime=cost("lens_tokens", "runtime"),
    params:
        n=lambda w: rc.lens_train_blocks(config, w.model)
        + model_cfg(w)["lens"]["n_heldout_blocks"],
        length=of_model("samples", "length"),
        seed=of_model("lens", "seed"),
        dataset=dataset_of,
        train_tokens=of_model("lens", "train_tokens"),
        code=code("samples"),
    script:
        "../scripts/samples.py"
