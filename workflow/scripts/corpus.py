"""Load a dataset's documents and split them into train / held-out (seeded, whole documents)."""

from resdyn import artifacts
from resdyn.lm import corpus
from resdyn.provenance import sidecars

with sidecars.step(snakemake) as step:
    spec = snakemake.params.spec
    docs = corpus.load_documents(spec, name=snakemake.wildcards.dataset)
    train, heldout = corpus.split_documents(docs, spec["heldout_fraction"], spec["seed"])
    step.extra["dataset"] = {"name": snakemake.wildcards.dataset, **spec}
    artifacts.Corpus.write(train, snakemake.output.train)
    artifacts.Corpus.write(heldout, snakemake.output.heldout)
