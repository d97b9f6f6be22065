"""Train one zoo model; save HF checkpoints at the configured steps and the loss curve."""

import shutil
from pathlib import Path

from resdyn import artifacts
from resdyn.lm import corpus, zoo
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    arch, t = snakemake.params.arch, snakemake.params.train
    tokenizer = corpus.load_tokenizer(snakemake.input.tokenizer)
    train_stream = corpus.token_stream(tokenizer, artifacts.Corpus.read(snakemake.input.train))
    heldout_stream = corpus.token_stream(tokenizer, artifacts.Corpus.read(snakemake.input.heldout))
    weights = Path(snakemake.output.weights)
    # Checkpoints and the resumable state live outside the declared output until training ends:
    # Snakemake clears outputs of an incomplete job, which would lose checkpoints already saved.
    staging = weights.with_name(".weights.staging")
    curve = zoo.train_zoo_model(
        zoo.Architecture(**{**arch, "n_kv_heads": arch["n_kv_heads"] or arch["n_heads"]}),
        train_stream,
        heldout_stream,
        snakemake.input.tokenizer,
        {s: staging / f"step{s}" for s in t["checkpoints"]},
        steps=t["steps"],
        batch_size=t["batch_size"],
        seq_len=t["seq_len"],
        lr=t["lr"],
        warmup=t["warmup"],
        weight_decay=t["weight_decay"],
        eval_every=t["eval_every"],
        n_eval_windows=t["n_eval_windows"],
        seed=t["seed"],
        state_path=staging / "training_state.pt",
        precision=t["precision"],
    )
    shutil.rmtree(weights, ignore_errors=True)
    staging.rename(weights)
    artifacts.TrainingCurve.write(curve, snakemake.output.curve)
