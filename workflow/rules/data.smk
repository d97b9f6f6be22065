# Corpora, the zoo tokenizer, and the fixed samples each model's analyses share.


def tokenizer_input(w):
    """Zoo models use the dataset's trained tokenizer; others their first checkpoint's."""
    if config["models"][w.model]["source"] == "train":
        return f"results/data/{dataset_of(w)}/tokenizer"
    return f"models/{w.model}/{ckpts(w.model)[0]}/checkpoint.json"


rule corpus:
    output:
        train="results/data/{dataset}/train.jsonl",
        heldout="results/data/{dataset}/heldout.jsonl",
    params:
        spec=lambda w: config["datasets"][w.dataset],
        code=code("data"),
    log:
        "logs/corpus/{dataset}.log",
    script:
        "../scripts/corpus.py"


rule tokenizer:
    input:
        train="results/data/{dataset}/train.jsonl",
    output:
        directory("results/data/{dataset}/tokenizer"),
    params:
        vocab_size=config["tokenizer"]["vocab_size"],
        code=code("data"),
    log:
        "logs/tokenizer/{dataset}.log",
    script:
        "../scripts/tokenizer.py"


rule samples:
    input:
        heldout=lambda w: f"results/data/{dataset_of(w)}/heldout.jsonl",
        tokenizer=tokenizer_input,
    output:
        "results/{model}/samples.h5",
    params:
        n=config["samples"]["n"],
        length=config["samples"]["length"],
        seed=config["samples"]["seed"],
        dataset=dataset_of,
        code=code("data"),
    log:
        "logs/samples/{model}.log",
    script:
        "../scripts/samples.py"


rule lens_tokens:
    input:
        train=lambda w: f"results/data/{dataset_of(w)}/train.jsonl",
        tokenizer=tokenizer_input,
    output:
        "results/{model}/lens_tokens.h5",
    params:
        n=lambda w: config["lens"]["n_train_blocks"] + config["lens"]["n_heldout_blocks"],
        length=config["samples"]["length"],
        seed=config["lens"]["seed"],
        dataset=dataset_of,
        code=code("data"),
    log:
        "logs/lens_tokens/{model}.log",
    script:
        "../scripts/samples.py"
