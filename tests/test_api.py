"""The notebook API (resdyn.api, docs/library.md): its public names are pinned, each wrapper gives
what its engine gives on tiny models, the Jacobian equals autograd through HF's own layer, bad
input is one ValueError line, and examples/library.ipynb runs end to end."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf

import resdyn
from resdyn import api, artifacts, io
from resdyn.lm import decompose, structure
from resdyn.study_a import activations, jacobian, schur, spectral, topology
from resdyn.study_b import lens as lens_mod
from resdyn.study_b import lens_import, phases, readout

from helpers.notebooks import run_notebook
from helpers.tiny_models import LENGTH, PARALLEL, attn_half_oracle, capture_layer_calls, make_model, sample_ids

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = [
    "Cutpoints",
    "Lens",
    "boundary_activations",
    "bottleneck",
    "communities",
    "coupling",
    "import_tuned_lens",
    "load_lens",
    "operator_metrics",
    "phases",
    "readout_subspaces",
    "resolution_sweep",
    "rss_profile",
    "schur_bottleneck",
    "schur_surgery",
    "spectra_table",
    "spectrum",
    "sublayer_jacobians",
    "train_lens",
    "translators",
]


# -- the names -----------------------------------------------------------------------------------


def test_public_names_are_pinned():
    assert api.__all__ == PUBLIC
    assert resdyn.API_NAMES == tuple(PUBLIC)  # the lazy re-exports of resdyn/__init__.py


@pytest.mark.parametrize("name", PUBLIC)
def test_each_name_is_importable_documented_and_typed(name):
    obj = getattr(api, name)
    assert getattr(resdyn, name) is obj
    assert inspect.getdoc(obj) and len(inspect.getdoc(obj)) > 40, name
    if inspect.isclass(obj):  # the engines' own classes, re-exported
        return
    hints = typing.get_type_hints(obj)
    params = [p for p in inspect.signature(obj).parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert "return" in hints, name
    assert all(p.name in hints for p in params), (name, [p.name for p in params if p.name not in hints])


def test_import_resdyn_stays_light():
    code = "import sys, resdyn; print(sorted(m for m in ('torch', 'pandas', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_defaults_are_the_schemas():
    """The API's defaults are the config schema's (a call without options computes a default run)."""
    sig = {name: inspect.signature(getattr(api, name)).parameters for name in PUBLIC if callable(getattr(api, name))}
    readout_d, topo = io.schema_defaults("readout"), io.schema_defaults("topology")
    assert sig["sublayer_jacobians"]["positions"].default == io.schema_defaults("jacobian")["positions"]
    assert list(sig["schur_bottleneck"]["alphas"].default) == io.schema_defaults("schur")["alphas"]
    assert sig["operator_metrics"]["k_fraction"].default == io.schema_defaults("spectra")["k_fraction"]
    assert list(sig["rss_profile"]["k_fractions"].default) == readout_d["k_fractions"]
    assert sig["phases"]["k_fraction"].default == readout_d["phase_k_fraction"]
    assert sig["phases"]["window"].default == io.schema_defaults("phases")["window"]
    assert {k: sig["communities"][k].default for k in ("top_k", "resolution", "boundary_rule")} == {
        k: topo[k] for k in ("top_k", "resolution", "boundary_rule")
    }
    assert sig["coupling"]["gain"].default == topo["gain"]


# -- study A: Jacobians --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama")
    ids = sample_ids()
    return model, ids, api.sublayer_jacobians(model, ids)


def test_jacobians_equal_the_engine(llama):
    model, ids, jacs = llama
    engine = jacobian.sublayer_jacobians(model, ids)
    assert sorted(jacs) == sorted(engine) == [(layer, kind) for layer in range(4) for kind in ("attn", "mlp")]
    for key, j in jacs.items():
        assert j.shape == (32, 32) and j.dtype == np.float32
        np.testing.assert_array_equal(j, engine[key][0].numpy())
    listed = api.sublayer_jacobians(model, ids[None], positions=[LENGTH - 1, 2], layers=[1])
    assert sorted(listed) == [(1, "attn"), (1, "mlp")] and listed[1, "attn"].shape == (2, 32, 32)
    np.testing.assert_array_equal(listed[1, "mlp"][0], jacs[1, "mlp"])


def test_jacobian_equals_autograd_through_hf_layer(llama):
    """Independent oracle: torch.autograd.functional.jacobian of HF's own decoder layer (the
    attention half h_L -> m_L, read by a hook), its diagonal block at the last position."""
    model, ids, jacs = llama
    layer, t = 2, LENGTH - 1
    h = structure.residual_states(model, ids)[0][layer]
    fn = attn_half_oracle("llama", structure.decoder_layers(model)[layer], capture_layer_calls(model, ids)[layer])
    full = torch.autograd.functional.jacobian(fn, h, vectorize=True)  # (T, d, T, d)
    np.testing.assert_allclose(jacs[layer, "attn"], full[t, :, t, :].numpy(), atol=1e-5, rtol=0)


def test_parallel_model_keeps_its_operator_in_the_tables():
    model, ids = make_model(PARALLEL), sample_ids()
    jacs = api.sublayer_jacobians(model, ids)
    assert {kind for _, kind in jacs} == set(jacobian.PARALLEL_KINDS)
    operators = {k: v for k, v in jacs.items() if k[1] == "layer"}
    pd.testing.assert_frame_equal(api.bottleneck(jacs), spectral.bottleneck_table(operators))
    assert api.spectra_table(jacs)["kind"].tolist() == ["layer"] * 4
    acts = api.boundary_activations(model, ids)
    assert sorted(acts) == [(layer, "pre_attn") for layer in range(4)]


def test_spectra_and_bottleneck_equal_the_engine(llama):
    _, _, jacs = llama
    J = jacs[1, "mlp"]
    for key, value in api.spectrum(J).items():
        np.testing.assert_array_equal(value, spectral.spectrum(J)[key])
    assert api.operator_metrics(J) == spectral.sublayer_metrics(J)
    assert api.operator_metrics(J, k_fraction=0.5)["k_frac"] == 16
    pd.testing.assert_frame_equal(api.spectra_table(jacs), spectral.spectra_table(jacs)[0])
    pd.testing.assert_frame_equal(api.bottleneck(jacs), spectral.bottleneck_table(jacs))
    ordered = [jacs[layer, kind] for layer in range(4) for kind in ("attn", "mlp")]
    pd.testing.assert_frame_equal(api.bottleneck(ordered), spectral.bottleneck_table(jacs))
    np.testing.assert_allclose(
        api.bottleneck(ordered)["erank"], spectral.cumulative_effective_rank(ordered), rtol=1e-12, atol=0
    )


def test_schur_equals_the_engine(llama):
    _, _, jacs = llama
    J = jacs[0, "attn"]
    np.testing.assert_array_equal(api.schur_surgery(J, 0.5), schur.scale_nonnormal(J, 0.5))
    np.testing.assert_allclose(api.schur_surgery(J, 1.0), J, atol=1e-5)
    pd.testing.assert_frame_equal(api.schur_bottleneck(jacs), schur.schur_bottleneck(jacs))
    pd.testing.assert_frame_equal(
        api.schur_bottleneck(jacs, alphas=[0.0, 2.0]), schur.schur_bottleneck(jacs, alphas=[0.0, 2.0])
    )


# -- study A: communities and coupling -----------------------------------------------------------


def test_activations_communities_and_coupling_equal_the_engines(llama):
    model, _, jacs = llama
    batch = sample_ids(seed=3, batch=6)
    acts = api.boundary_activations(model, batch)
    states = activations.collect_boundary_states(model, batch.numpy(), 1, progress=False)
    assert sorted(acts) == [(layer, b) for layer in range(4) for b in ("pre_attn", "pre_mlp")]
    np.testing.assert_array_equal(acts[2, "pre_mlp"], states[:, 5].reshape(-1, 32))
    assert acts[0, "pre_attn"].shape == (6 * (LENGTH - 1), 32)

    parts = {}
    for key in [(0, "pre_attn"), (0, "pre_mlp"), (1, "pre_attn")]:
        units, summary = api.communities(acts[key], top_k=5)
        want_units, want_summary = topology.analyse_boundary(acts[key], top_k=5, resolution=0.05, seed=0)
        pd.testing.assert_frame_equal(units, want_units)
        assert summary == want_summary
        parts[key] = units
    table = api.coupling(parts, jacs)
    tables = pd.concat([u.assign(layer=k[0], boundary=k[1]) for k, u in parts.items()], ignore_index=True)
    pd.testing.assert_frame_equal(table, topology.coupling_from_tables(tables, jacs, pd.DataFrame()))
    assert table["henrici"].isna().all() and table["boundary"].tolist() == ["pre_attn", "pre_mlp", "pre_attn"]
    spectra = api.spectra_table(jacs)
    with_h = api.coupling(tables, jacs, gain="J_minus_I", spectra=spectra)
    pd.testing.assert_frame_equal(
        with_h, topology.coupling_from_tables(tables, jacs, spectra, gain="J_minus_I", q_level=0.05)
    )
    assert with_h["henrici"].notna().all()


# -- study B -------------------------------------------------------------------------------------

LENS_OPTIONS = dict(steps=12, eval_every=4, progress=False)


@pytest.fixture(scope="module")
def lensed():
    model = make_model("llama", seed=1)
    train, heldout = sample_ids(seed=4, batch=6, length=16), sample_ids(seed=5, batch=2, length=16)
    return model, train, heldout, api.train_lens(model, train, heldout_ids=heldout, **LENS_OPTIONS)


def test_train_lens_equals_the_engine_with_the_pipelines_batches(lensed):
    model, train, heldout, lens = lensed
    batch = lens_mod.LensOptions().tokens_per_step // train.shape[1]  # the lens rule's batches
    want = lens_mod.train_lens(
        model,
        lens_mod.token_batches(train, batch),
        heldout_batches=lens_mod.token_batches(heldout, batch),
        **LENS_OPTIONS,
    )
    torch.testing.assert_close(lens.weight, want.weight, atol=0, rtol=0)
    torch.testing.assert_close(lens.bias, want.bias, atol=0, rtol=0)
    assert lens.options == want.options and lens.options["optimizer"] == io.schema_defaults("lens")["optimizer"]
    assert float(lens.weight.abs().max()) > 0


def test_save_load_export_import_roundtrip(lensed, tmp_path):
    model, _, _, lens = lensed
    lens.save(tmp_path / "lens")
    loaded = api.load_lens(tmp_path / "lens", model)
    torch.testing.assert_close(loaded.weight, lens.weight, atol=0, rtol=0)
    lens.export_tuned_lens(tmp_path / "tl")
    imported = api.import_tuned_lens(tmp_path / "tl", model)
    want = lens_import.import_tuned_lens(tmp_path / "tl", model)
    torch.testing.assert_close(imported.weight, want.weight, atol=0, rtol=0)
    torch.testing.assert_close(imported.bias, lens.bias, atol=0, rtol=0)
    assert imported.meta["stop_reason"] == "imported"


def test_readout_rss_resolution_phases_equal_the_engines(lensed):
    _, _, _, lens = lensed
    mats = [lens.translator_matrix(layer) for layer in range(lens.n_layers)]
    for got, want in zip(api.translators(lens), mats):
        np.testing.assert_array_equal(got, want)
    subspaces = api.readout_subspaces(lens)
    assert [s.shape for s in subspaces] == [(32, 3)] * 4  # k = 10 % of d = 32, rounded half-up
    np.testing.assert_array_equal(api.readout_subspaces(mats, 5)[2], readout.readout_subspace(mats[2], 5))
    fracs = io.schema_defaults("readout")["k_fractions"]
    ks = sorted({readout.k_from_fraction(32, f) for f in fracs})
    rss = api.rss_profile(lens)
    pd.testing.assert_frame_equal(rss, readout.rss_profile(mats, ks))
    resolution = api.resolution_sweep(lens)
    pd.testing.assert_frame_equal(resolution, readout.resolution_table(mats, fracs))
    # the phases rule's four lines (workflow/scripts/phases.py)
    profile, k = phases.profile_at(rss, 0.1)
    cuts = phases.cutpoints(profile, window=3, method="moving_average").at_k(k, 0.1)
    regime = phases.regime_agreement(rss, phases.middle_regime(resolution), window=3, method="moving_average")
    assert api.phases(lens).to_json() == cuts.with_regime(regime).to_json()
    assert api.phases(mats, window=1, smoothing="none").method == "none"


# -- bad input -----------------------------------------------------------------------------------


def _one_line(err: pytest.ExceptionInfo, *needles: str) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_bad_input_is_one_value_error_line(llama, lensed, tmp_path):
    model, ids, jacs = llama
    with pytest.raises(ValueError) as err:
        api.sublayer_jacobians(model, torch.stack([ids, ids]))
    _one_line(err, "input_ids", "(T,) or (1, T)", "(2, 9)")
    with pytest.raises(ValueError) as err:
        api.sublayer_jacobians(model, ids.float())
    _one_line(err, "input_ids", "integer")
    with pytest.raises(ValueError) as err:
        api.sublayer_jacobians(model, ids, positions=[LENGTH])
    _one_line(err, "position 9", "allowed -9..8")
    with pytest.raises(ValueError) as err:
        api.boundary_activations(model, np.zeros((2, 3, 4), dtype=np.int64))
    _one_line(err, "input_ids", "(N, T)")
    with pytest.raises(ValueError) as err:
        api.operator_metrics(np.ones((3, 4)))
    _one_line(err, "(3, 4)")
    with pytest.raises(ValueError) as err:
        api.bottleneck({**jacs, (1, "attn"): np.eye(5)})
    _one_line(err, "jacobians[(1, 'attn')]", "(5, 5)")
    with pytest.raises(ValueError) as err:
        api.bottleneck([np.eye(3)] * 3)
    _one_line(err, "jacobians", "even length", "got 3")

    bloom = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4))
    with pytest.raises(ValueError) as err:
        api.sublayer_jacobians(bloom, ids)
    _one_line(err, "'bloom' is not supported", "supported families: llama")
    mixtral = tf.MixtralForCausalLM(
        tf.MixtralConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=2,
        )
    )
    with pytest.raises(ValueError) as err:
        api.sublayer_jacobians(mixtral, ids)
    _one_line(err, "mixtral", "mistral")

    lens = lensed[3]
    lens.save(tmp_path / "lens")
    lens.export_tuned_lens(tmp_path / "tl")
    stranger = make_model("llama", seed=7)  # same shapes, another readout
    with pytest.raises(ValueError) as err:
        api.load_lens(tmp_path / "lens", stranger)
    _one_line(err, "unembed_hash mismatch", "config.json")
    with pytest.raises(ValueError) as err:
        api.import_tuned_lens(tmp_path / "tl", stranger)
    _one_line(err, "unembed_hash", "another unembedding")
    with pytest.raises(ValueError) as err:
        api.load_lens(tmp_path / "lens", make_model("olmo2"))  # another family, same shapes
    _one_line(err, "unembed_hash mismatch")
    with pytest.raises(ValueError) as err:
        api.train_lens(model, ids.float())
    _one_line(err, "input_ids", "integer")
    with pytest.raises(ValueError) as err:
        api.train_lens(model, ids, stpes=3)
    _one_line(err, "unknown lens option", "stpes")


# -- the notebook --------------------------------------------------------------------------------


def test_library_notebook_runs_end_to_end():
    """examples/library.ipynb: a random-weight tiny Llama, every API call of docs/library.md (about
    1 s once torch and transformers are loaded, 13 s alone: not marked slow)."""
    nb = json.loads((ROOT / "examples" / "library.ipynb").read_text())
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    called = {name for name in PUBLIC if f"{name}(" in code}
    assert called >= set(PUBLIC) - {"Cutpoints", "Lens"}, set(PUBLIC) - called
    ns = run_notebook(ROOT / "examples" / "library.ipynb")
    assert isinstance(ns["lens"], api.Lens) and isinstance(ns["cuts"], api.Cutpoints)
    assert ns["cuts"].b1 <= ns["cuts"].peak <= ns["cuts"].b2
    assert len(ns["jacobians"]) == 2 * ns["model"].config.num_hidden_layers
    assert artifacts.LensFolder.read_config(ns["folder"])["n_layers"] == ns["model"].config.num_hidden_layers
    assert decompose.family(ns["model"]) == "llama"
