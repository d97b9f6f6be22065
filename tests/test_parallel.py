"""Parallel-residual layers (GPT-NeoX / Pythia) through every downstream stage.

One boundary per layer and one operator J_L = I + J_A + J_F (kind 'layer', depth slot s = 2L+1).
Oracles: the cumulative product of the layer operators computed directly (numpy), HF's own
forward for the continuation, and the autograd-checked Jacobians of tests/test_jacobian.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from resdyn import artifacts
from resdyn.beyond import bridge, causal
from resdyn.lm import structure
from resdyn.study_a import activations, jacobian, schur, spectral, topology

from helpers.tiny_models import PARALLEL, make_model, sample_ids

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py

N_LAYERS, D = 4, 32


@pytest.fixture(scope="module")
def parallel_files(tmp_path_factory):
    """Mean Jacobians of the tiny parallel model written by the HDF5 writer."""
    model = make_model(PARALLEL)
    folder = tmp_path_factory.mktemp("jac")
    samples = np.stack([sample_ids(seed).numpy() for seed in range(3)])
    paths = {layer: folder / f"layer{layer:03d}.h5" for layer in range(N_LAYERS)}
    jacobian.write_layer_block(model, samples, [0, 1, 2], range(N_LAYERS), paths, progress=False, store_first_n=3)
    loaders, _ = artifacts.JacobianBlocks.read_means([folder])
    return model, folder, loaders


def test_spectra_and_bottleneck_use_the_layer_operator(parallel_files):
    _, _, loaders = parallel_files
    table, arrays = spectral.spectra_table(loaders)
    assert table["kind"].tolist() == ["layer"] * N_LAYERS
    assert table["s"].tolist() == [2 * L + 1 for L in range(N_LAYERS)]
    assert sorted(arrays) == [f"L{L:03d}_layer" for L in range(N_LAYERS)]
    bn = spectral.bottleneck_table(loaders)
    product = np.eye(D)
    for L in range(N_LAYERS):
        product = loaders[(L, "layer")]() @ product
        sv = np.linalg.svd(product, compute_uv=False)
        assert bn["erank"].iloc[L] == pytest.approx(spectral.effective_rank(sv), rel=1e-9)
    sb = schur.schur_bottleneck(loaders, alphas=[0.0, 1.0])
    np.testing.assert_allclose(sb[sb["alpha"] == 1.0]["erank"].to_numpy(), bn["erank"].to_numpy(), rtol=1e-8)
    profiles = bridge.operator_profiles(table, bn)
    assert profiles["complex_frac_attn"].isna().all()
    np.testing.assert_allclose(profiles["henrici_layer"], table["henrici"])
    np.testing.assert_allclose(profiles["cum_erank"], bn["erank"])
    np.testing.assert_array_equal(bridge.layer_jacobian(loaders, 2), loaders[(2, "layer")]())


def test_chain_validation_names_what_is_missing():
    eye = np.eye(2)
    spectral.check_chain([(0, "layer"), (1, "attn"), (1, "mlp")])  # mixed models are fine per layer
    with pytest.raises(ValueError, match=r"missing \(layer, kind\): \(1, 'attn'\), \(1, 'mlp'\)"):
        spectral.bottleneck_table({(0, "layer"): eye, (2, "layer"): eye})
    with pytest.raises(ValueError, match="mix 'layer'"):
        spectral.bottleneck_table({(0, "layer"): eye, (0, "attn"): eye})


def test_bootstrap_reads_parallel_files(parallel_files):
    _, folder, _ = parallel_files
    per, means, info = artifacts.JacobianBlocks.read_per_sample([folder])
    assert sorted(per) == [(L, "layer") for L in range(N_LAYERS)] and info["n_bootstrap_samples"] == 3


def test_activations_and_coupling_use_the_single_boundary(parallel_files, tmp_path):
    model, _, loaders = parallel_files
    ids = np.stack([sample_ids(seed).numpy() for seed in range(3)])
    states = activations.collect_boundary_states(model, ids, 1, progress=False)
    paths = artifacts.Activations.write(
        states, np.arange(3), 1, tmp_path, "float32", {}, structure.residual_kind(model)
    )
    assert artifacts.Activations.boundaries(paths[0]) == ("pre_attn",)
    X = artifacts.Activations.read_boundary(paths[1], "pre_attn")
    units, _ = topology.analyse_boundary(X.reshape(-1, D), top_k=4, seed=0)
    table = units.assign(layer=1, boundary="pre_attn")
    spectra_tsv, _ = spectral.spectra_table(loaders)
    out = topology.coupling_from_tables(table, loaders, spectra_tsv)
    assert out["kind"].tolist() == ["layer"] and out["s"].tolist() == [2]
    gains = topology.unit_gains(loaders[(1, "layer")]())  # columns of I + J_A + J_F
    is_b = table["is_boundary"].astype(str).str.lower().isin(["true", "1"]).to_numpy()
    expected = topology.coupling_stats(gains[table["unit"].to_numpy()], is_b)
    numeric = {k: v for k, v in expected.items() if isinstance(v, (int, float))}
    assert numeric and all(out[k].iloc[0] == pytest.approx(v, rel=1e-12, nan_ok=True) for k, v in numeric.items())
    assert out["henrici"].iloc[0] == pytest.approx(float(spectra_tsv.set_index("layer").loc[1, "henrici"]))


def test_continuation_runs_the_parallel_layers_like_hf():
    model = make_model(PARALLEL)
    x = torch.stack([sample_ids(seed) for seed in range(2)])
    cont = causal.Continuation(model, x)
    with torch.no_grad():
        reference = model(input_ids=x, use_cache=False).logits
    for L in range(N_LAYERS + 1):
        final = cont.run(cont.stream(L), L)
        torch.testing.assert_close(structure.unembed_logits(model, final), reference, atol=1e-5, rtol=0)


def test_plots_style_the_layer_operator(parallel_files):
    from resdyn.plots import style as plots

    assert "layer" in plots.KIND_STYLE
    _, _, loaders = parallel_files
    table, _ = spectral.spectra_table(loaders)
    assert isinstance(table, pd.DataFrame) and set(table["kind"]) <= set(plots.KIND_STYLE)


def test_cost_model_prices_parallel_layers_and_imported_lenses():
    """The plan's cost model: GPT-NeoX has a plain MLP (2·d·d_ff weights), stores three Jacobian
    groups per layer and has one operator (and boundary) per layer; an imported lens costs no
    training."""
    import copy

    from resdyn.cluster import cost

    base = {
        "samples": {"n": 8, "length": 16},
        "jacobian": {"positions": "last", "store_first_n": 2, "store_dtype": "float32"},
        "lens": {"tokens_per_step": 64, "steps": 10, "eval_every": 5, "n_heldout_blocks": 2, "n_train_blocks": 4},
    }
    shape = dict(source="hf", n_layers=4, d_model=32, n_heads=4, d_ff=128, vocab_size=100, dtype="float32")
    neox = {**base, "models": {"m": {**shape, "family": "gpt_neox"}}}
    llama = {**base, "models": {"m": {**shape, "family": "llama"}}}
    s_neox, s_llama = cost.model_shape(neox, "m"), cost.model_shape(llama, "m")
    assert s_neox.parallel and s_neox.mlp_mats == 2 and not s_llama.parallel
    assert s_llama.layer_params - s_neox.layer_params == 32 * 128  # one MLP matrix fewer
    disk = [cost.cost_jacobians(c, s, [0, 1], gpu=True).disk_bytes for c, s in ((neox, s_neox), (llama, s_llama))]
    assert disk[0] == pytest.approx(1.5 * disk[1])  # layer, attn_branch, mlp_branch vs attn, mlp
    assert cost._n_sublayers(s_neox) == 4 and cost._n_sublayers(s_llama) == 8
    trained = cost.cost_lens(neox, s_neox, gpu=True)
    imported_cfg = copy.deepcopy(neox)
    imported_cfg["lens"]["source"] = "tuned_lens"
    imported = cost.cost_lens(imported_cfg, s_neox, gpu=True)
    assert imported.flops < trained.flops / 100 and imported.device_bytes < trained.device_bytes
