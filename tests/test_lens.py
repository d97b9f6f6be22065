"""Tests of resdyn.study_b.lens: tuned-lens translators, the logit lens, persistence, export, metrics.

Models are tiny (d = 32, 4 layers, vocab 100, fp32) Llama / OLMo 2 / Gemma 2 built from their
config classes and trained a few steps on a synthetic pattern (noisy bigram chain, then a copy
of it), so that the final distribution is peaked and the lens has something to learn.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
)

from resdyn import artifacts
from resdyn.lm import structure
from resdyn.study_b import lens as L
from resdyn.study_b.lens import trainer as LT

from helpers import sigkill
from helpers.lens_models import (
    N_LAYERS,
    PINNED,
    RESUME,
    VOCAB,
    D,
    build,
    common_config,
    synthetic_batches,
)

FAST = dict(steps=400, eval_every=10, patience=5, tol=1e-2, progress=False)


def train_pinned(model, batches, **options):
    """:func:`resdyn.study_b.lens.train_lens` with :data:`PINNED` under the given options."""
    return L.train_lens(model, batches, **{**PINNED, **options})


@pytest.fixture(scope="module")
def train_data():
    return synthetic_batches(20, seed=1)


@pytest.fixture(scope="module")
def heldout_data():
    return synthetic_batches(2, seed=2)


@pytest.fixture(scope="module")
def llama():
    return build("llama")


@pytest.fixture(scope="module")
def olmo2():
    return build("olmo2")


@pytest.fixture(scope="module")
def models(llama, olmo2):
    return {"llama": llama, "olmo2": olmo2}


@pytest.fixture(scope="module")
def llama_lens(llama, train_data, heldout_data):
    return train_pinned(
        llama,
        train_data,
        heldout_batches=heldout_data,
        model_id="tiny-llama",
        model_revision="r1",
        model_hash="abc",
        **FAST,
    )


def heldout_curve(lens: L.Lens) -> pd.DataFrame:
    c = lens.curves
    return c[c.split == "heldout"].pivot(index="step", columns="layer", values="kl")


# --- readout: logit lens, identity reference ------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "olmo2"])
def test_logit_lens_at_last_index_is_the_models_own_logits(models, heldout_data, family):
    model = models[family]
    ids = heldout_data[0]
    with torch.no_grad():
        own = model(input_ids=ids).logits
        states = structure.residual_states(model, ids)
        got = L.logit_lens_logits(model, states[:, N_LAYERS], N_LAYERS)
    torch.testing.assert_close(got, own, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["llama", "olmo2"])
def test_cached_states_reproduce_the_models_output(models, heldout_data, family):
    """The lens's own state capture (decoder without the head) gives the model's exact logits."""
    model = models[family]
    ids = heldout_data[0]
    with torch.no_grad():
        states = L.layer_major_states(model, ids)  # (n+1, B·T, d)
        want = model(input_ids=ids).logits.reshape(-1, VOCAB)
        assert torch.equal(
            states, structure.residual_states(model, ids).permute(1, 0, 2, 3).reshape(N_LAYERS + 1, -1, D)
        )
        torch.testing.assert_close(L.logit_lens_logits(model, states[N_LAYERS], N_LAYERS), want, atol=1e-6, rtol=0)


def test_tuned_lens_reference_index_is_identity(llama, llama_lens, heldout_data):
    ids = heldout_data[0]
    np.testing.assert_array_equal(llama_lens.translator_matrix(N_LAYERS), np.eye(D))
    np.testing.assert_array_equal(llama_lens.translator_bias(N_LAYERS), np.zeros(D))
    with torch.no_grad():
        h = structure.residual_states(llama, ids)[:, N_LAYERS]
        assert torch.equal(llama_lens.logits(h, N_LAYERS), L.logit_lens_logits(llama, h, N_LAYERS))
        torch.testing.assert_close(llama_lens.logits(h, N_LAYERS), llama(input_ids=ids).logits, atol=1e-6, rtol=0)


def test_logit_lens_is_the_zero_translator(llama, heldout_data):
    """W = 0, b = 0 through the tuned-lens path reproduces the logit lens at every layer."""
    zero = L.Lens(llama, torch.zeros(N_LAYERS, D, D), torch.zeros(N_LAYERS, D))
    with torch.no_grad():
        states = structure.residual_states(llama, heldout_data[0])
        for layer in range(N_LAYERS + 1):
            h = states[:, layer]
            ref = L.logit_lens_logits(llama, h, layer)
            torch.testing.assert_close(zero.logits(h, layer), ref, atol=1e-6, rtol=0)
            np.testing.assert_array_equal(zero.translator_matrix(layer), np.eye(D))


def test_translator_formula(llama_lens):
    """T_L(h) = A_L h + b_L with A_L = translator_matrix(L)."""
    h = torch.randn(7, D, generator=torch.Generator().manual_seed(3))
    for layer in range(N_LAYERS):
        a, b = llama_lens.translator_matrix(layer), llama_lens.translator_bias(layer)
        want = h.double().numpy() @ a.T + b
        np.testing.assert_allclose(llama_lens.transform(h, layer).double().numpy(), want, atol=1e-5)


def test_bad_layer_index_raises(llama_lens, llama):
    with pytest.raises(ValueError, match=r"layer=5; allowed: integers 0\.\.4"):
        llama_lens.translator_matrix(5)
    with pytest.raises(ValueError, match="layer=-1"):
        L.logit_lens_logits(llama, torch.zeros(1, D), -1)


# --- training ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "olmo2"])
def test_heldout_kl_decreases_at_every_layer(models, llama_lens, train_data, heldout_data, family):
    lens = (
        llama_lens
        if family == "llama"
        else train_pinned(models[family], train_data, heldout_batches=heldout_data, **FAST)
    )
    curve = heldout_curve(lens)
    assert curve.index[0] == 0  # step 0 = logit lens
    first, last = curve.iloc[0], curve.iloc[-1]
    assert (first > 1e-4).all(), "the pretrained model should give the logit lens something to fix"
    assert (last < 0.9 * first).all(), f"held-out KL did not decrease: {first.values} → {last.values}"
    conv = lens.convergence
    assert list(conv.columns) == L.CONVERGENCE_COLUMNS
    np.testing.assert_allclose(conv.final_heldout_kl.to_numpy(), last.to_numpy())
    train = lens.curves[lens.curves.split == "train"]
    assert len(train) == N_LAYERS * (len(curve) - 1)


def test_identity_layer_translator_stays_identity(train_data, heldout_data):
    """If the last layer is the identity map, the stream entering it *is* the final stream.

    Then the logit lens at n−1 already matches p_final exactly (KL = 0), the KL gradient at
    W = 0 vanishes, and the trained translator n−1 stays the identity.
    """
    model = build("llama", pretrain_steps=150)
    last = structure.decoder_layers(model)[-1]
    with torch.no_grad():
        last.self_attn.o_proj.weight.zero_()
        last.mlp.down_proj.weight.zero_()
    lens = train_pinned(
        model,
        train_data[:5],
        heldout_batches=heldout_data,
        steps=60,
        eval_every=10,
        patience=3,
        tol=1e-2,
        progress=False,
    )
    w = lens.translator_matrix(N_LAYERS - 1) - np.eye(D)
    assert np.linalg.norm(w) < 1e-5
    assert np.linalg.norm(lens.translator_bias(N_LAYERS - 1)) < 1e-5
    curve = heldout_curve(lens)
    assert curve.loc[0, N_LAYERS - 1] == 0.0  # logit lens: bit-identical to the final readout
    # Afterwards W_{n−1} ~ 1e-7 (gradients of float32 rounding), so the KL is rounding noise:
    # float32 log-softmax errors ~ eps32 · |log p| ≈ 1e-7 per token, far below the other layers.
    assert curve[N_LAYERS - 1].abs().max() < 1e-6
    assert curve.iloc[-1, 0] < curve.iloc[0, 0]  # the other layers do learn


@pytest.mark.parametrize("optimizer", ["sgd_nesterov", "adam"])
def test_both_optimizers_reduce_kl(llama, train_data, heldout_data, optimizer):
    lens = train_pinned(
        llama,
        train_data,
        heldout_batches=heldout_data,
        optimizer=optimizer,
        steps=40,
        eval_every=10,
        warmup_steps=5,
        progress=False,
    )
    curve = heldout_curve(lens)
    assert (curve.iloc[-1] < curve.iloc[0]).all()
    assert lens.options["optimizer"] == optimizer
    assert lens.options["lr"] == L.DEFAULT_LR[optimizer]


def test_same_seed_gives_identical_translators(llama, train_data, heldout_data):
    kw = dict(steps=30, eval_every=10, tokens_per_step=100, progress=False, seed=7)
    a = train_pinned(llama, train_data, heldout_batches=heldout_data, **kw)
    b = train_pinned(llama, train_data, heldout_batches=heldout_data, **kw)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    pd.testing.assert_frame_equal(a.curves, b.curves)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_all_layers_in_one_pass_equal_a_per_layer_loop(llama, train_data, scope):
    """Oracle: a naive loop, one nn.Linear and one backward per layer, autograd's KL, same SGD.

    scope "layer": n independent trainings (one optimizer and one clip per layer); "global":
    tuned-lens's trainer (one clip over all translators, one optimizer step).
    """
    steps, clip, wd, lr, mom = 5, 1.0, 1e-3, 1.0, 0.9
    ours = train_pinned(
        llama,
        train_data,
        steps=steps,
        weight_decay=wd,
        lr=lr,
        momentum=mom,
        clip_grad_norm=clip,
        clip_scope=scope,
        progress=False,
    )
    translators = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(N_LAYERS))
    for t in translators:
        torch.nn.init.zeros_(t.weight)
        torch.nn.init.zeros_(t.bias)
    groups = [list(t.parameters()) for t in translators] if scope == "layer" else [list(translators.parameters())]
    opts = [torch.optim.SGD(g, lr=lr * (1 - mom), momentum=mom, nesterov=True, weight_decay=wd) for g in groups]
    for p in llama.parameters():
        p.requires_grad_(False)
    for ids in train_data[:steps]:
        states = structure.residual_states(llama, ids)
        with torch.no_grad():
            logp = torch.log_softmax(structure.unembed_logits(llama, states[:, N_LAYERS]), -1)
        for layer, t in enumerate(translators):
            h = states[:, layer]
            logq = torch.log_softmax(structure.unembed_logits(llama, h + t(h)), -1)
            F.kl_div(logq.flatten(0, 1), logp.flatten(0, 1), log_target=True, reduction="batchmean").backward()
        for g, o in zip(groups, opts):
            torch.nn.utils.clip_grad_norm_(g, clip)
            o.step()
            o.zero_grad()
    for p in llama.parameters():
        p.requires_grad_(True)
    for layer, t in enumerate(translators):
        torch.testing.assert_close(ours.weight[layer], t.weight.detach(), atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(ours.bias[layer], t.bias.detach(), atol=1e-6, rtol=1e-4)


def test_chunked_readout_matches_unchunked(llama, train_data):
    """A logits budget below one layer's tokens × vocab forces (layer, token) chunks."""
    kw = dict(steps=5, progress=False)
    whole = train_pinned(llama, train_data, **kw)
    chunked = train_pinned(llama, train_data, chunk_elements=3 * VOCAB * 17, **kw)
    torch.testing.assert_close(chunked.weight, whole.weight, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(chunked.bias, whole.bias, atol=1e-6, rtol=1e-4)


def test_token_stream_serves_exact_slices_in_order(llama, train_data):
    batches = train_data[:2]  # 2 × 256 tokens, cycled
    full = torch.cat([L.layer_major_states(llama, b) for b in batches + batches], dim=1)[:, :700]
    teacher = lambda final: (final * 2, final.sum(-1))  # any token-major statistics  # noqa: E731
    for cache in (0, 1 << 30):  # recomputed every epoch, or kept
        stream = L.TokenStream(llama, batches, k=100, teacher=teacher, cache_bytes=cache)
        assert (stream.cache is None) == (cache == 0)
        parts = [stream.take() for _ in range(7)]  # 700 tokens: wraps once
        got = torch.cat([p[0] for p in parts], dim=1)
        assert got.shape == (N_LAYERS + 1, 700, D)
        assert torch.equal(got, full)
        for i, stat in enumerate(teacher(full[-1])):
            assert torch.equal(torch.cat([p[1][i] for p in parts]), stat)


def test_model_is_left_untouched(llama, train_data):
    before = {k: v.clone() for k, v in llama.state_dict().items()}
    flags = [p.requires_grad for p in llama.parameters()]
    llama.train()
    train_pinned(llama, train_data, steps=3, progress=False)
    assert llama.training
    llama.eval()
    assert [p.requires_grad for p in llama.parameters()] == flags
    assert all(p.grad is None for p in llama.parameters())
    assert all(torch.equal(before[k], v) for k, v in llama.state_dict().items())


# --- convergence ---------------------------------------------------------------------------------


def test_convergence_window_known_answer():
    # layer 0 plateaus (1.0 → best 0.999 over the window: r = 1e-3), layer 1 still falls (r = 0.5).
    history = np.array([[2.0, 8.0], [1.0, 4.0], [1.0, 3.0], [0.999, 2.0]])
    rel, conv = L.convergence_window(history, patience=2, tol=1e-2)
    np.testing.assert_allclose(rel, [1e-3, 0.5])
    assert conv.tolist() == [True, False]
    rel, conv = L.convergence_window(history[:2], patience=2, tol=1e-2)  # too short
    assert np.isnan(rel).all() and not conv.any()
    rel, _ = L.convergence_window(np.zeros((3, 1)), patience=2, tol=0.0)
    assert rel.tolist() == [0.0]


def test_training_stops_when_converged(llama_lens):
    assert llama_lens.meta["stop_reason"] == "converged"
    steps = llama_lens.meta["steps_trained"]
    assert steps < FAST["steps"]
    conv = llama_lens.convergence
    assert conv.converged.all() and (conv.steps == steps).all()
    assert ((conv.converged_step > 0) & (conv.converged_step <= steps)).all()
    assert (conv.rel_change < FAST["tol"]).all()


def test_without_heldout_runs_all_steps_and_reports_unconverged(llama, train_data, heldout_data, tmp_path):
    lens = train_pinned(llama, train_data, steps=12, eval_every=5, progress=False)
    assert lens.meta["steps_trained"] == 12 and lens.meta["stop_reason"] == "max_steps"
    assert not lens.convergence.converged.any()
    assert lens.convergence.final_heldout_kl.isna().all()
    assert set(lens.curves.split) == {"train"}
    assert sorted(set(lens.curves.step)) == [5, 10, 12]
    # the Python API's lens round-trips: its own writers accept it (no held-out KL: null in config.json, NaN back), and
    # the metrics of the reloaded lens say why their held-out KL is empty
    back = L.Lens.load(lens.save(tmp_path / "lens"), llama)
    assert json.loads((tmp_path / "lens" / "config.json").read_text())["convergence"][0]["final_heldout_kl"] is None
    pd.testing.assert_frame_equal(back.convergence, lens.convergence, check_dtype=False, check_exact=True)
    metrics = L.lens_metrics(llama, back, heldout_data[:1])
    artifacts.LensMetrics.write(metrics, tmp_path / "lens_metrics.tsv")
    tuned = artifacts.LensMetrics.read(tmp_path / "lens_metrics.tsv").query("lens == 'tuned' and layer < @N_LAYERS")
    assert (tuned["reason"] == "no held-out batches: no held-out KL").all() and tuned["final_heldout_kl"].isna().all()


def test_lr_schedule():
    opt = L.LensOptions(steps=10, warmup_steps=4, lr_schedule="linear")
    assert [L.lr_factor(s, opt) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert L.lr_factor(9, opt) == pytest.approx(1 / 6)
    assert L.lr_factor(3, L.LensOptions(warmup_steps=0, lr_schedule="constant")) == 1.0


def test_options_default_to_the_schema(llama, train_data, heldout_data, monkeypatch):
    """LensOptions's defaults are the config schema's lens defaults for every option both have, and
    train_lens without options trains as the pipeline does: the schema's steps and optimizer."""
    from resdyn.pipeline.config import load_schema

    props = load_schema()["properties"]["lens"]["properties"]
    schema = {key: sub["default"] for key, sub in props.items() if "default" in sub}
    fields = {f.name: f.default for f in dataclasses.fields(L.LensOptions)}
    shared = {
        L.SCHEMA_NAMES.get(key, key): value for key, value in schema.items() if L.SCHEMA_NAMES.get(key, key) in fields
    }
    assert set(shared) == {
        "steps",
        "tokens_per_step",
        "optimizer",
        "lr",
        "weight_decay",
        "warmup_steps",
        "lr_schedule",
        "eval_every",
        "patience",
        "tol",
        "readout_dtype",
    }
    assert {key: fields[key] for key in shared} == shared
    assert inspect.signature(L.train_lens).parameters["checkpoint_every"].default == schema["checkpoint_every"]

    made = []
    make = LT._make_optimizer
    monkeypatch.setattr(LT, "_make_optimizer", lambda params, opt: made.append(make(params, opt)) or made[-1])
    lens = L.train_lens(llama, train_data, heldout_batches=heldout_data, progress=False)
    assert (
        lens.options["steps"] == schema["steps"] == 600 and lens.options["optimizer"] == schema["optimizer"] == "adam"
    )
    assert isinstance(made[0], torch.optim.AdamW) and made[0].defaults["lr"] == schema["lr"]
    assert {key: lens.options[key] for key in shared} == shared
    assert 0 < lens.meta["steps_trained"] <= schema["steps"]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"optimizer": "lbfgs"}, r"optimizer='lbfgs'; allowed: \('sgd_nesterov', 'adam'\)"),
        ({"lr_schedule": "cosine"}, "lr_schedule='cosine'"),
        ({"clip_scope": "model"}, r"clip_scope='model'; allowed: \('layer', 'global'\)"),
        ({"steps": 0}, "steps=0"),
        ({"tokens_per_step": 0}, "tokens_per_step=0"),
        ({"readout_dtype": "float16"}, r"readout_dtype='float16'; allowed: \('float32', 'bfloat16'\)"),
        ({"kl_kernel": "fast"}, r"kl_kernel='fast'; allowed: \('flash', 'matmul'\)"),
        ({"learning_rate": 1.0}, r"unknown lens option\(s\) \['learning_rate'\]"),
    ],
)
def test_bad_options_raise(llama, train_data, options, message):
    with pytest.raises(ValueError, match=message):
        train_pinned(llama, train_data, **options)


def test_bad_batches_raise(llama):
    with pytest.raises(ValueError, match=r"token_batches\[0\]: expected an integer torch tensor"):
        train_pinned(llama, [torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="token_batches: no batches given"):
        train_pinned(llama, [])


# --- KL ------------------------------------------------------------------------------------------


def test_fused_kl_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    target = L.Target.from_logits(torch.randn(5, 11, generator=g, dtype=torch.float64))
    kl = L.fused_kl(z, target.p, target.neg_entropy)
    logp = torch.log(target.p)
    want = F.kl_div(torch.log_softmax(z, -1), logp.expand(3, 5, 11), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(kl, want)
    torch.testing.assert_close(L.kl_to_target(z, target), want)
    # Gradient against autograd of the reference, for a unit and a general upstream gradient
    # (gradcheck cannot be used: the backward is in place and runs once per forward).
    for upstream in (torch.ones(3, 5, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)):
        (got,) = torch.autograd.grad(L.fused_kl(z, target.p, target.neg_entropy), z, upstream)
        (ref,) = torch.autograd.grad(
            F.kl_div(torch.log_softmax(z, -1), logp.expand(3, 5, 11), log_target=True, reduction="none").sum(-1),
            z,
            upstream,
        )
        torch.testing.assert_close(got, ref)
    kl = L.fused_kl(z, target.p, target.neg_entropy).sum()
    kl.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward may run only once"):
        kl.backward()


def test_linear_head_kl_value_and_gradient():
    """Oracle: autograd of KL(p ‖ softmax(W y)) with the full target p (float64)."""
    g = torch.Generator().manual_seed(1)
    y = torch.randn(3, 5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 7, generator=g, dtype=torch.float64)
    target = L.Target.from_logits(torch.randn(5, 11, generator=g, dtype=torch.float64) * 2)
    m = target.p @ w  # the teacher enters only through Wᵀ p and Σ p log p

    def reference(y):
        logq = torch.log_softmax(y @ w.T, -1)
        return F.kl_div(logq, torch.log(target.p).expand(3, 5, 11), log_target=True, reduction="none").sum(-1)

    torch.testing.assert_close(L.linear_head_kl(y, w, m, target.neg_entropy), reference(y))
    assert torch.equal(
        L.linear_head_kl(y, w, m, target.neg_entropy, value=False), torch.zeros(3, 5, dtype=torch.float64)
    )
    for upstream in (torch.ones(3, 5, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)):
        for value in (True, False):
            (got,) = torch.autograd.grad(L.linear_head_kl(y, w, m, target.neg_entropy, value), y, upstream)
            (ref,) = torch.autograd.grad(reference(y), y, upstream)
            torch.testing.assert_close(got, ref)


def test_flash_head_kl_value_and_gradient():
    """Oracle: autograd of KL(p ‖ softmax(W y)) with the full target p, float64 and float32."""
    g = torch.Generator().manual_seed(3)
    for dtype, tol in ((torch.float64, {}), (torch.float32, dict(atol=1e-5, rtol=1e-4))):
        y = (torch.randn(3, 5, 7, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_(True)
        w = torch.randn(11, 7, generator=g, dtype=torch.float64).to(dtype)
        target = L.Target.from_logits(torch.randn(5, 11, generator=g, dtype=torch.float64).to(dtype) * 2)
        m = target.p @ w

        def reference(y, w=w, target=target):
            logq = torch.log_softmax(y @ w.T, -1)
            return F.kl_div(logq, torch.log(target.p).expand(3, 5, 11), log_target=True, reduction="none").sum(-1)

        got = L.flash_head_kl(y, w, m, target.neg_entropy)
        assert got.dtype == dtype
        torch.testing.assert_close(got, reference(y), **tol)
        for upstream in (torch.ones(3, 5, dtype=dtype), torch.randn(3, 5, generator=g, dtype=torch.float64).to(dtype)):
            (grad,) = torch.autograd.grad(L.flash_head_kl(y, w, m, target.neg_entropy), y, upstream)
            (ref,) = torch.autograd.grad(reference(y), y, upstream)
            torch.testing.assert_close(grad, ref, **tol)
    # A planted wrong teacher (m of another p) gives another KL and gradient: the check can fail.
    other = L.Target.from_logits(torch.randn(5, 11, generator=g, dtype=torch.float64) * 2)
    y64, w64 = y.detach().double(), w.double()
    wrong = L.flash_head_kl(y64, w64, other.p @ w64, target.neg_entropy.double())
    assert not torch.allclose(wrong, L.flash_head_kl(y64, w64, target.p.double() @ w64, target.neg_entropy.double()))


def test_flash_kernel_trains_the_lens_of_the_matmul_path(llama, train_data, heldout_data, monkeypatch):
    """The fused kernel (default) and the chunked matmul path, same seed and data: translators
    within float32 rounding, final held-out KL within 1e-3 nats/token; the kernel really ran."""
    kw = dict(steps=40, eval_every=10, tokens_per_step=256, optimizer="adam", lr=3e-3, progress=False)
    ref = train_pinned(llama, train_data, heldout_batches=heldout_data, kl_kernel="matmul", **kw)
    calls = []
    real = LT.flash_head_kl
    monkeypatch.setattr(LT, "flash_head_kl", lambda *a: calls.append(1) or real(*a))
    fast = train_pinned(llama, train_data, heldout_batches=heldout_data, **kw)
    assert len(calls) == 40 and fast.options["kl_kernel"] == "flash"
    first, k_ref = heldout_curve(ref).iloc[0].to_numpy(), heldout_curve(ref).iloc[-1].to_numpy()
    assert (k_ref < 0.8 * first).all()  # it learns, so equal KLs are not both the untrained one
    np.testing.assert_allclose(heldout_curve(fast).iloc[-1].to_numpy(), k_ref, atol=1e-3, rtol=0)
    torch.testing.assert_close(fast.weight, ref.weight, atol=1e-5, rtol=1e-3)
    torch.testing.assert_close(fast.bias, ref.bias, atol=1e-5, rtol=1e-3)


def test_flash_kernel_falls_back_with_one_line(llama, train_data, caplog):
    """Where the fused kernel cannot run (a bfloat16 readout) the matmul path trains, and says why."""
    with caplog.at_level("INFO", logger=LT.__name__):
        lens = train_pinned(llama, train_data[:2], steps=2, readout_dtype="bfloat16", progress=False)
    lines = [r.getMessage() for r in caplog.records if "kl_kernel flash not used" in r.getMessage()]
    assert len(lines) == 1 and "bfloat16" in lines[0], lines
    assert torch.isfinite(lens.weight).all()
    ok, why = L.flash_kl_usable(torch.float32, None)
    assert not ok and "linear head" in why
    assert L.flash_kl_usable(torch.float32, torch.zeros(3, 2)) == (True, "")


def test_linear_head_path_equals_the_full_readout_path(llama, train_data, heldout_data, monkeypatch):
    """The d-sized teacher statistics give the same training as the vocabulary-sized target."""
    kw = dict(steps=12, eval_every=4, tokens_per_step=200, progress=False)
    fast = train_pinned(llama, train_data[:4], heldout_batches=heldout_data, **kw)
    monkeypatch.setattr(LT, "linear_readout_weight", lambda model, dtype: None)  # force _FusedKL
    full = train_pinned(llama, train_data[:4], heldout_batches=heldout_data, **kw)
    torch.testing.assert_close(fast.weight, full.weight, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(fast.bias, full.bias, atol=1e-6, rtol=1e-4)
    np.testing.assert_allclose(fast.curves.kl, full.curves.kl, rtol=1e-4, atol=1e-7)


def test_bfloat16_readout_trains_as_well_as_float32(llama, train_data, heldout_data):
    """bf16 rounds z and q (relative 2⁻⁹), not the teacher: same held-out KL within 1 %."""
    kw = dict(steps=60, eval_every=20, tokens_per_step=256, optimizer="adam", lr=3e-3, progress=False)
    f32 = train_pinned(llama, train_data, heldout_batches=heldout_data, **kw)
    b16 = train_pinned(llama, train_data, heldout_batches=heldout_data, readout_dtype="bfloat16", **kw)
    assert b16.options["readout_dtype"] == "bfloat16"
    k32, k16 = heldout_curve(f32).iloc[-1].to_numpy(), heldout_curve(b16).iloc[-1].to_numpy()
    first = heldout_curve(f32).iloc[0].to_numpy()
    assert (k16 < 0.8 * first).all()  # it learns
    np.testing.assert_allclose(k16, k32, rtol=0.01)
    rel = torch.linalg.norm(b16.weight - f32.weight) / torch.linalg.norm(f32.weight)
    assert rel < 0.05, rel


# --- persistence -----------------------------------------------------------------------------------


def test_save_load_roundtrip_is_exact(llama, llama_lens, tmp_path, heldout_data):
    llama_lens.save(tmp_path / "lens")
    assert sorted(p.name for p in (tmp_path / "lens").iterdir()) == [
        "config.json",
        "curves.tsv",
        "translators.safetensors",
    ]
    cfg = json.loads((tmp_path / "lens" / "config.json").read_text())
    assert (cfg["model_id"], cfg["model_revision"], cfg["model_hash"]) == ("tiny-llama", "r1", "abc")
    assert (cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]) == (D, N_LAYERS, VOCAB)
    assert cfg["training"]["optimizer"] == "sgd_nesterov" and cfg["unembed_hash"] == L.unembed_hash(llama)
    back = L.Lens.load(tmp_path / "lens", llama)
    assert torch.equal(back.weight, llama_lens.weight) and torch.equal(back.bias, llama_lens.bias)
    for layer in range(N_LAYERS + 1):
        np.testing.assert_array_equal(back.translator_matrix(layer), llama_lens.translator_matrix(layer))
    pd.testing.assert_frame_equal(back.curves, llama_lens.curves, check_dtype=False, check_exact=True)
    pd.testing.assert_frame_equal(back.convergence, llama_lens.convergence, check_dtype=False, check_exact=True)
    assert back.options == llama_lens.options and back.meta == llama_lens.meta
    h = structure.residual_states(llama, heldout_data[0])[:, 1]
    assert torch.equal(back.logits(h, 1), llama_lens.logits(h, 1))


def test_lens_shorter_than_the_convergence_window_saves_and_loads(llama, train_data, heldout_data, tmp_path):
    """Fewer evals than patience + 1: rel_change is NaN (no window yet); config.json stores it as
    null (JSON has no NaN) and load gives NaN back — the lens job must not die on it."""
    short = train_pinned(
        llama, train_data, heldout_batches=heldout_data, **{**FAST, "steps": 2, "eval_every": 1, "patience": 3}
    )
    assert short.convergence["rel_change"].isna().all() and not short.convergence["converged"].any()
    short.save(tmp_path / "lens")
    assert all(
        r["rel_change"] is None for r in json.loads((tmp_path / "lens" / "config.json").read_text())["convergence"]
    )
    back = L.Lens.load(tmp_path / "lens", llama)
    pd.testing.assert_frame_equal(back.convergence, short.convergence, check_dtype=False, check_exact=True)


# --- resume ----------------------------------------------------------------------------------------


class _Stop(Exception):
    pass


def test_resume_continues_bit_identically(llama, train_data, heldout_data, tmp_path, monkeypatch):
    # tokens_per_step=100 does not divide the 256-token batches: the stream resumes mid-batch.
    ref = train_pinned(llama, train_data[:6], heldout_batches=heldout_data, **RESUME)
    path = tmp_path / "lens.partial.pt"
    save = LT._Checkpointer.save

    def save_then_stop(self, state):
        save(self, state)
        if state["step"] == 28:
            raise _Stop

    monkeypatch.setattr(LT._Checkpointer, "save", save_then_stop)
    with pytest.raises(_Stop):
        train_pinned(llama, train_data[:6], heldout_batches=heldout_data, checkpoint=path, checkpoint_every=7, **RESUME)
    monkeypatch.setattr(LT._Checkpointer, "save", save)
    assert torch.load(path, weights_only=True)["stream"][1] > 0  # stopped inside a batch
    got = train_pinned(
        llama, train_data[:6], heldout_batches=heldout_data, checkpoint=path, checkpoint_every=7, **RESUME
    )
    assert not path.exists()
    assert torch.equal(got.weight, ref.weight) and torch.equal(got.bias, ref.bias)
    pd.testing.assert_frame_equal(got.curves, ref.curves, check_exact=True)
    pd.testing.assert_frame_equal(got.convergence, ref.convergence, check_exact=True)
    assert got.meta == ref.meta and got.options == ref.options


def test_foreign_checkpoint_is_ignored(llama, train_data, heldout_data, tmp_path, monkeypatch):
    path = tmp_path / "lens.partial.pt"
    save = LT._Checkpointer.save

    def save_then_stop(self, state):
        save(self, state)
        raise _Stop

    monkeypatch.setattr(LT._Checkpointer, "save", save_then_stop)
    with pytest.raises(_Stop):  # a checkpoint of another learning rate
        train_pinned(
            llama,
            train_data[:6],
            heldout_batches=heldout_data,
            checkpoint=path,
            checkpoint_every=10,
            **{**RESUME, "lr": 1e-3},
        )
    monkeypatch.setattr(LT._Checkpointer, "save", save)
    ref = train_pinned(llama, train_data[:6], heldout_batches=heldout_data, **RESUME)
    with pytest.warns(UserWarning, match="ignoring lens checkpoint"):
        got = train_pinned(
            llama, train_data[:6], heldout_batches=heldout_data, checkpoint=path, checkpoint_every=10, **RESUME
        )
    assert torch.equal(got.weight, ref.weight)
    path.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="ignoring lens checkpoint"):
        got = train_pinned(
            llama, train_data[:6], heldout_batches=heldout_data, checkpoint=path, checkpoint_every=10, **RESUME
        )
    assert torch.equal(got.weight, ref.weight) and not path.exists()
    with pytest.raises(ValueError, match="checkpoint_every=0"):
        train_pinned(llama, train_data[:6], checkpoint=path, checkpoint_every=0, **RESUME)


# --- fresh tokens (lens.train_tokens): each training token used once ---------------------------


@pytest.fixture(scope="module")
def fresh_data():
    """30 distinct batches of 256 tokens (7,680 tokens)."""
    return synthetic_batches(30, seed=5)


def test_fresh_tokens_serve_every_batch_once_in_order(llama, fresh_data, heldout_data, monkeypatch):
    """70 steps × 100 tokens take the first ⌈7000 / 256⌉ = 28 batches, each run through the model once,
    in order; tokens_seen counts them. Oracle: until a cycled stream wraps it serves the same tokens,
    so it gives the same bits; and the held-out KL falls at every layer."""
    from resdyn.study_b.lens import stream as S

    served = []
    forward = S.layer_major_states
    monkeypatch.setattr(S, "layer_major_states", lambda model, ids: served.append(ids) or forward(model, ids))
    kw = dict(steps=70, eval_every=10, tokens_per_step=100, progress=False)
    fresh = train_pinned(llama, fresh_data, heldout_batches=heldout_data, fresh_tokens=True, **kw)
    assert len(served) == 28 and all(a is b for a, b in zip(served, fresh_data))
    assert len({tuple(b.flatten().tolist()) for b in served}) == 28  # distinct blocks
    assert (fresh.curves["tokens_seen"] == 100 * fresh.curves["step"]).all()
    cycled = train_pinned(llama, fresh_data, heldout_batches=heldout_data, **kw)
    assert torch.equal(fresh.weight, cycled.weight) and torch.equal(fresh.bias, cycled.bias)
    pd.testing.assert_frame_equal(fresh.curves, cycled.curves, check_exact=True)
    curve = heldout_curve(fresh)
    assert (curve.iloc[-1] < 0.9 * curve.iloc[0]).all(), f"{curve.iloc[0].values} → {curve.iloc[-1].values}"


def test_fresh_tokens_refuse_a_stream_too_short(llama, fresh_data):
    with pytest.raises(
        ValueError,
        match=r"^lens.train_tokens: lens.steps × lens.tokens_per_step = 77 × 100 = "
        r"7,700 tokens, but the fresh-token stream holds 30 batches \(7,680 tokens\)",
    ):
        train_pinned(llama, fresh_data, fresh_tokens=True, steps=77, tokens_per_step=100, progress=False)
    with pytest.raises(ValueError, match=r"31 steps of one batch each need 31 batches, .* holds 30 batches"):
        train_pinned(llama, fresh_data, fresh_tokens=True, steps=31, progress=False)
    train_pinned(llama, fresh_data, fresh_tokens=True, steps=30, progress=False)  # exactly the stream: fine
    stream = L.TokenStream(llama, fresh_data[:2], k=300, cycle=False)
    stream.take()
    with pytest.raises(ValueError, match=r"ran out after its 2 batches \(512 tokens\)"):
        stream.take()


def _stop_at(monkeypatch, step: int) -> None:
    """Make the lens checkpoint saver raise :class:`_Stop` once it has saved the state of ``step``."""
    save = LT._Checkpointer.save

    def save_then_stop(self, state):
        save(self, state)
        if state["step"] == step:
            raise _Stop

    monkeypatch.setattr(LT._Checkpointer, "save", save_then_stop)


def test_fresh_resume_continues_the_stream_bit_identically(llama, fresh_data, heldout_data, tmp_path, monkeypatch):
    kw = dict(heldout_batches=heldout_data, fresh_tokens=True, **RESUME)
    ref = train_pinned(llama, fresh_data[:24], **kw)
    path = tmp_path / "lens.partial.pt"
    with monkeypatch.context() as m:
        _stop_at(m, 28)
        with pytest.raises(_Stop):
            train_pinned(llama, fresh_data[:24], checkpoint=path, checkpoint_every=7, **kw)
    state = torch.load(path, weights_only=True)
    assert state["stream"] == (11, 2800 - 10 * 256) and state["tokens"] == 2800  # inside batch 11
    assert state["stream_source"]["batches"] == 24 and state["stream_source"]["cycle"] is False
    got = train_pinned(llama, fresh_data[:24], checkpoint=path, checkpoint_every=7, **kw)
    assert not path.exists()
    assert torch.equal(got.weight, ref.weight) and torch.equal(got.bias, ref.bias)
    pd.testing.assert_frame_equal(got.curves, ref.curves, check_exact=True)
    pd.testing.assert_frame_equal(got.convergence, ref.convergence, check_exact=True)


def test_resume_on_another_stream_stops_with_one_line(llama, fresh_data, heldout_data, tmp_path, monkeypatch):
    """A checkpoint of one stream, resumed on other tokens or past the end of its stream, stops the
    job with one line naming the key and both streams, and is left in place."""
    kw = dict(heldout_batches=heldout_data, fresh_tokens=True, checkpoint_every=7, **RESUME)
    path = tmp_path / "lens.partial.pt"
    with monkeypatch.context() as m:
        _stop_at(m, 28)
        with pytest.raises(_Stop):
            train_pinned(llama, fresh_data[:24], checkpoint=path, **kw)
    other = synthetic_batches(25, seed=6)
    with pytest.raises(ValueError) as err:
        train_pinned(llama, other, checkpoint=path, **kw)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("lens.train_tokens: the checkpoint "), msg
    assert "stands at batch 11 of a stream of 24 batches (6,144 tokens" in msg, msg
    assert "this job's stream has 25 batches (6,400 tokens" in msg and "delete the checkpoint" in msg, msg
    assert path.exists()
    with pytest.raises(ValueError, match="stream of 24 batches .* this job's stream has 24 batches"):
        train_pinned(llama, fresh_data[:24], checkpoint=path, **{**kw, "fresh_tokens": False})  # cycled: not it
    state = torch.load(path, weights_only=True)  # a position past the end of its own stream
    key = state.pop("key")
    state.pop("format")
    artifacts.LensCheckpoint.save(path, key, {**state, "stream": (25, 0)})
    with pytest.raises(ValueError, match="stands at batch 25 of a stream of 24 batches"):
        train_pinned(llama, fresh_data[:24], checkpoint=path, **kw)


# fresh: 24 batches of 256 tokens hold the 60 steps × 100 tokens, each used once; else 6, cycled
_LENS_RUNNER = sigkill.RUNNER_HEADER + textwrap.dedent("""
    from helpers.lens_models import PINNED_RESUME, build, synthetic_batches
    from resdyn import artifacts
    from resdyn.study_b import lens as L

    if held:
        hold.hold_at_first_save(artifacts.LensCheckpoint, "save", out)
    model = build("llama", pretrain_steps=20)
    fitted = L.train_lens(
        model, synthetic_batches(24 if {fresh} else 6, seed=1), heldout_batches=synthetic_batches(2, seed=2),
        checkpoint=out + "/.lens.partial.pt", checkpoint_every=7, fresh_tokens={fresh}, **PINNED_RESUME,
    )
    fitted.save(out + "/lens")
    """)


@pytest.mark.parametrize("fresh", [False, True], ids=["cycled", "fresh"])
def test_lens_resume_after_sigkill_equals_uninterrupted_run(tmp_path, fresh):
    script = tmp_path / "runner.py"
    script.write_text(_LENS_RUNNER.format(tests=str(Path(__file__).parent), fresh=fresh))
    resumed, reference = tmp_path / "resumed", tmp_path / "reference"
    resumed.mkdir()
    reference.mkdir()
    ref_proc = sigkill.start(script, reference, "free")

    proc = sigkill.start(script, resumed, "held")
    checkpoint = resumed / ".lens.partial.pt"
    sigkill.kill_once_checkpointed(proc, resumed, checkpoint)
    assert not (resumed / "lens").exists(), "killed run left outputs"

    rerun = sigkill.start(script, resumed, "free")
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert "resuming lens training from" in err, err[-3000:]
    assert not checkpoint.exists()
    _, ref_err = ref_proc.communicate(timeout=300)
    assert ref_proc.returncode == 0, ref_err[-3000:]
    for name in ("translators.safetensors", "curves.tsv", "config.json"):
        assert (resumed / "lens" / name).read_bytes() == (reference / "lens" / name).read_bytes(), name


def test_pipeline_helpers(llama_lens, tmp_path):
    llama_lens.save(tmp_path / "lens")
    mats = artifacts.LensFolder.read_translator_matrices(tmp_path / "lens")
    assert len(mats) == N_LAYERS
    for layer, a in enumerate(mats):
        np.testing.assert_array_equal(a, llama_lens.translator_matrix(layer))
    ids = np.arange(7 * 5, dtype=np.int32).reshape(7, 5)
    batches = L.token_batches(ids, 3)
    assert [tuple(b.shape) for b in batches] == [(3, 5), (3, 5), (1, 5)]
    assert all(b.dtype == torch.int64 for b in batches)
    assert torch.equal(torch.cat(batches), torch.as_tensor(ids).long())
    with pytest.raises(ValueError, match="batch_size=0"):
        L.token_batches(ids, 0)


def test_load_with_another_model_raises(llama_lens, tmp_path):
    llama_lens.save(tmp_path / "lens")
    other = build("llama", seed=1, pretrain_steps=0)
    with pytest.raises(ValueError, match="unembed_hash mismatch"):
        L.Lens.load(tmp_path / "lens", other)
    cfg = common_config(LlamaConfig)
    cfg.num_hidden_layers = 5
    with pytest.raises(ValueError, match="lens has n_layers=4 but the model has n_layers=5"):
        L.Lens.load(tmp_path / "lens", LlamaForCausalLM(cfg))
    with pytest.raises(FileNotFoundError, match="no lens config"):
        L.Lens.load(tmp_path / "missing", other)


def test_unembed_hash_covers_norm_and_softcap(llama):
    base = L.unembed_hash(llama)
    assert L.unembed_hash(llama) == base
    norm = structure.final_norm(llama)
    with torch.no_grad():
        norm.weight[0] += 1e-3
    try:
        assert L.unembed_hash(llama) != base
    finally:
        with torch.no_grad():
            norm.weight[0] -= 1e-3
    assert L.unembed_hash(llama) == base


# --- Gemma softcap -----------------------------------------------------------------------------------


def test_gemma_softcap_readout(train_data, heldout_data):
    model = build("gemma2", pretrain_steps=60)
    cap = model.config.final_logit_softcapping
    ids = heldout_data[0]
    with torch.no_grad():
        own = model(input_ids=ids).logits
        states = structure.residual_states(model, ids)
        got = L.logit_lens_logits(model, states[:, N_LAYERS], N_LAYERS)
        uncapped = model.lm_head(structure.final_norm(model)(states[:, N_LAYERS]))
    torch.testing.assert_close(got, own, atol=1e-6, rtol=0)
    assert got.abs().max() < cap < uncapped.abs().max()  # the cap is active on this model
    torch.testing.assert_close(got, cap * torch.tanh(uncapped / cap), atol=1e-6, rtol=0)
    lens = train_pinned(model, train_data, heldout_batches=heldout_data, steps=30, eval_every=10, progress=False)
    curve = heldout_curve(lens)
    assert (curve.iloc[-1] < curve.iloc[0]).all()
    with torch.no_grad():
        assert lens.logits(states[:, 0], 0).abs().max() < cap


# --- tuned-lens export -----------------------------------------------------------------------------


def test_export_tuned_lens_format(llama, llama_lens, tmp_path):
    out = llama_lens.export_tuned_lens(tmp_path / "tl")
    state = torch.load(out / "params.pt", weights_only=True)
    assert list(state) == [f"{i}.{k}" for i in range(N_LAYERS) for k in ("weight", "bias")]
    assert all(state[f"{i}.weight"].shape == (D, D) and state[f"{i}.bias"].shape == (D,) for i in range(N_LAYERS))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == {
        "base_model_name_or_path": "tiny-llama",
        "d_model": D,
        "num_hidden_layers": N_LAYERS,
        "bias": True,
        "base_model_revision": "r1",
        "unembed_hash": L.tuned_lens_unembed_hash(llama),
        "lens_type": "linear_tuned_lens",
    }
    h = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))
    for i in range(N_LAYERS):  # tuned-lens's transform_hidden: h + Linear_i(h)
        theirs = h + F.linear(h, state[f"{i}.weight"], state[f"{i}.bias"])
        torch.testing.assert_close(theirs, llama_lens.transform(h, i), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("family", ["llama", "olmo2", "gemma2"])
def test_export_loads_in_tuned_lens_package(models, train_data, tmp_path, family):
    tl = pytest.importorskip(
        "tuned_lens.nn", reason="the tuned-lens package is optional (needs torchdata 0.9, not a resdyn dependency)"
    )
    model = models[family] if family in models else build(family, pretrain_steps=20)
    ours = train_pinned(model, train_data, steps=10, progress=False)
    ours.export_tuned_lens(tmp_path / "tl")
    # Any family, softcap included: our readout in the shape of tuned-lens's Unembed.
    theirs = tl.TunedLens.from_unembed_and_pretrained(L.TunedLensReadout(model), str(tmp_path / "tl"))
    assert len(theirs) == N_LAYERS and not list(theirs.unembed.parameters())
    h = structure.residual_states(model, train_data[0])
    with torch.no_grad():
        for i in range(N_LAYERS):
            torch.testing.assert_close(
                theirs.transform_hidden(h[:, i], i), ours.transform(h[:, i], i), atol=1e-6, rtol=1e-6
            )
            torch.testing.assert_close(theirs(h[:, i], i), ours.logits(h[:, i], i), atol=1e-5, rtol=1e-5)
    if family == "llama":  # a family tuned-lens resolves itself: its own Unembed, its own hash
        native = tl.TunedLens.from_model_and_pretrained(model, str(tmp_path / "tl"))
        assert native.config.unembed_hash == L.tuned_lens_unembed_hash(model)
        with torch.no_grad():
            torch.testing.assert_close(native(h[:, 1], 1), ours.logits(h[:, 1], 1), atol=1e-5, rtol=1e-5)


# --- metrics -----------------------------------------------------------------------------------------


def test_lens_metrics(llama, llama_lens, heldout_data):
    m = L.lens_metrics(llama, llama_lens, heldout_data)
    assert list(m.columns) == L.METRIC_COLUMNS
    assert len(m) == 2 * (N_LAYERS + 1) and set(m.lens) == {"tuned", "logit"}
    ref = m[m.layer == N_LAYERS]
    assert (ref.kl == 0.0).all() and (ref.hit1 == 1.0).all() and (ref.hit5 == 1.0).all()
    assert ref.ce.nunique() == 1
    tuned = m[(m.lens == "tuned") & (m.layer < N_LAYERS)].set_index("layer")
    logit = m[(m.lens == "logit") & (m.layer < N_LAYERS)].set_index("layer")
    assert (tuned.kl < logit.kl).all()
    # Same held-out tokens as training's curve: tuned = final held-out KL, logit = the step-0 curve.
    np.testing.assert_allclose(tuned.kl, tuned.final_heldout_kl, rtol=1e-5)
    np.testing.assert_allclose(logit.kl, heldout_curve(llama_lens).iloc[0], rtol=1e-5)
    assert tuned.converged.all() and (tuned.steps == llama_lens.meta["steps_trained"]).all()
    assert logit.converged.isna().all()
    assert ((m.hit1 >= 0) & (m.hit1 <= m.hit5) & (m.hit5 <= 1)).all()
    assert (m.n_tokens == sum(b.numel() for b in heldout_data)).all()
    # Token chunks of 37 (the target is computed per chunk): same numbers, reference still 0.
    small = L.lens_metrics(llama, llama_lens, heldout_data, chunk_elements=37 * VOCAB)
    assert (small[small.layer == N_LAYERS].kl == 0.0).all()
    np.testing.assert_allclose(small.kl, m.kl, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(small[["ce", "hit1", "hit5"]], m[["ce", "hit1", "hit5"]], rtol=1e-5)
