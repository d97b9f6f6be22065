"""Causal test: project off / patch each layer's readout subspace and rerun the model, vs random subspaces."""

from resdyn import artifacts
from resdyn.beyond import causal
from resdyn.lm import models, structure
from resdyn.provenance import sidecars
from resdyn.study_b import lens, phases, readout

with sidecars.step(snakemake) as step:
    p = snakemake.params
    step.pin_numerics(models.pick_device(p.device))
    model, _ = models.load_model(artifacts.CheckpointRecord.read(snakemake.input.ckpt), p.device, placement=p.placement)
    fitted = lens.Lens.load(snakemake.input.lens, model)
    ids, _, _ = artifacts.Samples.read(snakemake.input.samples)
    cuts = phases.Cutpoints.from_json(artifacts.PhaseCuts.read(snakemake.input.phases), source=snakemake.input.phases)
    translators = [fitted.translator_matrix(L) for L in range(fitted.n_layers)]
    table = causal.causal_table(
        model,
        ids[: p.n_samples],
        translators,
        k=readout.k_from_fraction(structure.hidden_size(model), p.k_fraction),
        n_random=p.n_random,
        seed=p.seed,
        phases=cuts.to_json(),
    )
    artifacts.CausalTable.write(table, snakemake.output[0])
