"""Train the zoo's byte-level BPE tokenizer on a dataset's train split."""

from resdyn import artifacts
from resdyn.infra import data, provenance

with provenance.step(snakemake) as step:
    data.train_tokenizer(artifacts.Corpus.read(snakemake.input.train), snakemake.params.vocab_size, snakemake.output[0])
