"""Train the zoo's byte-level BPE tokenizer on a dataset's train split."""

from resdyn import artifacts
from resdyn.lm import corpus
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    corpus.train_tokenizer(
        artifacts.Corpus.read(snakemake.input.train), snakemake.params.vocab_size, snakemake.output[0]
    )
