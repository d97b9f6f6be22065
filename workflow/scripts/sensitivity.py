"""Every open choice computed both ways (resdyn.beyond.sensitivity): results/sensitivity.tsv."""

from pathlib import Path

from resdyn import artifacts
from resdyn.beyond import paper_inputs
from resdyn.beyond import sensitivity as sv
from resdyn.provenance import sidecars
from resdyn.study_a import spectral

with sidecars.step(snakemake) as step:
    p, inp = snakemake.params, snakemake.input
    models = paper_inputs.read_model_tables(inp, p)
    # the option of these choices that the run did not compute (the other is its own tables)
    other = {c: next(o for o in sv.CHOICES[c] if o != p.defaults[c]) for c in ("readout_matrix", "boundary_rule")}

    def blocks_of(model, ckpt):
        """The Jacobian block folders of one checkpoint (results/{model}/{ckpt}/jacobians/{block})."""
        return [f for f in inp.blocks if Path(f).parts[-4:-2] == (model, ckpt)]

    def per_ckpt(key, model, read):
        return {c: read(f) for (m, c), f in zip(p.pairs, inp.get(key), strict=True) if m == model}

    def boundary_alternative(model):
        means = {c: artifacts.JacobianBlocks.read_means(blocks_of(model, c))[0] for c in p.ckpts[model]}
        parts = per_ckpt("communities", model, artifacts.CommunityPartitions.read_folder)
        spectra = per_ckpt("spectra", model, artifacts.SpectraTable.read)
        k = int(other["boundary_rule"][-1])
        return sv.boundary_coupling(parts, means, spectra, k, p.gain, p.fdr_q)

    def first_n(model):
        folders = blocks_of(model, p.ckpts[model][-1])
        jf = artifacts.JacobianBlocks.read(folders)
        if jf.n_stored == 0:
            return "no per-sample Jacobians stored (config jacobian.store_first_n is 0)"
        gflop = sv.product_gflop(jf.n_stored, len(jf.means), jf.d)
        too_much = sv.over_budget(gflop, p.max_gflop, "the mean of the first n samples' products")
        return too_much or spectral.mean_of_products_bottleneck(jf.per_sample)

    def readout_alternative(model):
        translators = artifacts.LensFolder.read_translator_matrices(inp.lens[p.models.index(model)])
        gflop = sv.readout_gflop(len(translators), translators[0].shape[0])
        too_much = sv.over_budget(gflop, p.max_gflop, f"the readout subspaces of {other['readout_matrix']}")
        if too_much:
            return too_much
        args = (p.k_fractions, p.phase_k_fraction, p.window, p.smoothing)
        return sv.readout_phases(translators, other["readout_matrix"], *args)

    options, alt_phases = [], {}
    for t in models:
        opts = {"single_layer_baseline": {"P_1": t, "P_0": t}, "complex_rule": sv.complex_options(t)}
        if "A" in p.studies:
            opts["erank_weights"] = sv.erank_options(t)
            if p.boundary_rule == "neighbours":
                opts["boundary_rule"] = sv.boundary_options(t, other["boundary_rule"], boundary_alternative(t.model))
            else:
                why = f"config topology.boundary_rule is {p.boundary_rule}: boundary units are not a neighbour count"
                opts["boundary_rule"] = dict.fromkeys(sv.CHOICES["boundary_rule"], why)
            opts["jacobian_product"] = sv.product_options(t, first_n(t.model))
        if "B" in p.studies:
            alt_phases[t.model] = readout_alternative(t.model)
            opts["readout_matrix"] = sv.readout_options(t, other["readout_matrix"], alt_phases[t.model])
        options.append(opts)
    fits = None
    if "B" in p.studies and p.groups:
        widths = inp.get("phase_widths")
        missing = [f"{m}: {why}" for m, why in alt_phases.items() if isinstance(why, str)]
        fits = {
            p.defaults["readout_matrix"]: None if widths is None else artifacts.ScalingFits.read(widths),
            other["readout_matrix"]: missing[0] if missing else sv.width_fits(alt_phases, p.groups, p.n_layers),
        }
    table = sv.sensitivity_table(artifacts.ClaimsTable.load(), options, p.defaults, p.studies, fits, p.groups)
    artifacts.SensitivityTable.write(table, snakemake.output[0])
