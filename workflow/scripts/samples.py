"""Tokenise a split and draw fixed-length samples (held-out samples, or lens-fitting windows)."""

from resdyn import artifacts
from resdyn.lm import corpus
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    p = snakemake.params
    docs_path = snakemake.input.get("heldout") or snakemake.input.train
    tokenizer = corpus.load_token_encoder(snakemake.input.tokenizer)
    stream = corpus.token_stream(tokenizer, artifacts.Corpus.read(docs_path))
    where = f"dataset {p.dataset!r} ({docs_path})"
    train_tokens = p.get("train_tokens", 0)
    if train_tokens:
        n_heldout = p.n - corpus.lens_train_blocks({"train_tokens": train_tokens}, p.length)
        corpus.check_lens_stream(len(stream), train_tokens, n_heldout, p.length, where)
    keys = "samples.n" if snakemake.input.get("heldout") else "lens.n_train_blocks + lens.n_heldout_blocks"
    ids, sample_ids = corpus.draw_blocks(stream, p.n, p.length, p.seed, where, keys)
    step.extra["samples_hash"] = artifacts.Samples.write(
        snakemake.output[0],
        ids,
        sample_ids,
        {"dataset": p.dataset, "split_file": docs_path, "seed": p.seed, "stream_tokens": len(stream)},
    )
