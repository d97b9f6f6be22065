"""Load a dataset's documents and split them into train / held-out (seeded, whole documents)."""

from resdyn import artifacts
from resdyn.infra import data, provenance

with provenance.step(snakemake) as step:
    spec = snakemake.params.spec
    docs = data.load_documents(spec, name=snakemake.wildcards.dataset)
    train, heldout = data.split_documents(docs, spec["heldout_fraction"], spec["seed"])
    step.extra["dataset"] = {"name": snakemake.wildcards.dataset, **spec}
    artifacts.Corpus.write(train, snakemake.output.train)
    artifacts.Corpus.write(heldout, snakemake.output.heldout)
