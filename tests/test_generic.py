"""resdyn.lm.generic: the generic path through HF's modules.

Oracles: the hand-written engines (every family with an adapter except Gemma 4, whose per-layer
inputs and layer scalar fit no template and are refused), and, for families without an adapter,
``torch.autograd.functional.jacobian`` through HF's own decoder layer (as tests/test_jacobian.py).
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from resdyn.lm import decompose, generic, hub, structure
from resdyn.study_a import jacobian

from helpers.tiny_models import (
    _COMMON,
    FAMILIES,
    LENGTH,
    PARALLEL,
    VOCAB,
    WINDOW,
    call_layer,
    capture_layer_calls,
    make_model,
    sample_ids,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py

POSITIONS = [LENGTH - 1, 4]


def _generic_engine(model, layers=None):
    decompose.use_generic(model)
    try:
        return jacobian.JacobianEngine(model, layers)
    finally:
        decompose.use_generic(model, False)


@pytest.mark.parametrize("name", [n for n in [*FAMILIES, PARALLEL] if n != "gemma4"])
def test_generic_matches_hand_written_engine(name):
    """Cross-check: forward mode through HF's modules = the hand-written structured engine."""
    model = make_model(name)
    ids = sample_ids()
    reference = jacobian.sublayer_jacobians(model, ids, positions=POSITIONS)
    engine = _generic_engine(model)
    decompose.use_generic(model)
    try:
        jacs = engine.compute(ids, POSITIONS)
    finally:
        decompose.use_generic(model, False)
    assert sorted(jacs) == sorted(reference)
    for key, jac in reference.items():
        torch.testing.assert_close(jacs[key], jac, atol=1e-5, rtol=0)
    assert all(v < generic.SELF_CHECK_RTOL for errors in engine.self_check_errors.values() for v in errors.values())


def _no_adapter_models() -> dict[str, torch.nn.Module]:
    """Families with no adapter: StarCoder2 (LayerNorm with bias, plain MLP, sliding window) and
    Cohere (parallel attention/MLP reading ONE shared norm)."""
    out = {}
    for name, cls, config in [
        ("starcoder2", tf.Starcoder2ForCausalLM, tf.Starcoder2Config(**_COMMON, sliding_window=WINDOW)),
        ("cohere", tf.CohereForCausalLM, tf.CohereConfig(**_COMMON)),
    ]:
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = cls(config).eval()
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "norm" in param_name or param_name.endswith("bias"):
                    param.add_(0.2 * torch.randn_like(param))
        out[name] = model
    return out


@pytest.mark.parametrize("name", ["starcoder2", "cohere"])
def test_generic_matches_autograd_without_adapter(name):
    """A model type with no adapter: J_attn, J_mlp (or the parallel layer's operator) are the
    diagonal blocks of autograd through HF's decoder layer."""
    model = _no_adapter_models()[name]
    with pytest.raises(ValueError, match="family: generic"):
        decompose.family(model)
    ids = sample_ids()
    engine = _generic_engine(model)
    decompose.use_generic(model)
    try:
        jacs = engine.compute(ids, POSITIONS)
    finally:
        decompose.use_generic(model, False)
    calls = capture_layer_calls(model, ids)
    states = structure.residual_states(model, ids)[0]
    for layer, adapter in enumerate(engine.adapters):
        hf_layer = structure.decoder_layers(model)[layer]
        full = torch.autograd.functional.jacobian(
            lambda x: call_layer(hf_layer, calls[layer], x[None])[0], states[layer], vectorize=True
        )
        for p, t in enumerate(POSITIONS):
            if adapter.parallel:
                got = jacs[(layer, "layer")][p]
            else:
                got = jacs[(layer, "mlp")][p] @ jacs[(layer, "attn")][p]
            torch.testing.assert_close(got, full[t, :, t, :], atol=1e-5, rtol=0)
    assert engine.adapters[0].template.parallel == (name == "cohere")
    if name == "starcoder2":
        assert engine.adapters[0].template.kind == "pre-norm"
        # the attention half alone, through a hook on the module that receives m_L
        hf_layer = structure.decoder_layers(model)[0]

        def attn_half(x):
            box = {}
            handle = hf_layer.post_attention_layernorm.register_forward_pre_hook(
                lambda _m, a: box.__setitem__("m", a[0])
            )
            try:
                call_layer(hf_layer, calls[0], x[None])
            finally:
                handle.remove()
            return box["m"][0]

        oracle = torch.autograd.functional.jacobian(attn_half, states[0], vectorize=True)
        for p, t in enumerate(POSITIONS):
            torch.testing.assert_close(jacs[(0, "attn")][p], oracle[t, :, t, :], atol=1e-5, rtol=0)


def test_no_template_is_refused_in_one_line():
    """Gemma 4 (per-layer inputs) and BLOOM (residual added inside its MLP) match no template."""
    for model, needle in [
        (make_model("gemma4"), "per_layer_input_gate"),
        (tf.BloomForCausalLM(tf.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)), "residual"),
    ]:
        decompose.use_generic(model)
        with pytest.raises(ValueError) as err:
            decompose.sublayers(model)
        message = str(err.value)
        assert "matches no generic template" in message and needle in message and "\n" not in message, message


def test_failing_self_check_reports_the_error_in_numbers():
    """A template that misses Granite's residual multiplier fails the self-check with numbers."""
    model = make_model("granite")
    engine = _generic_engine(model)
    for layer, adapter in engine.fp32.items():
        adapter.template = generic.Template(**{**adapter.template.__dict__, "branch_scale": 1.0})
    decompose.use_generic(model)
    try:
        with pytest.raises(ValueError) as err:
            engine.compute(sample_ids())
    finally:
        decompose.use_generic(model, False)
    message = str(err.value)
    assert "self-check failed on layer 0" in message and "tolerance 1e-04" in message, message
    assert "forward m" in message and "attention uᵀJ" in message and "\n" not in message


def test_generic_at_validation():
    """config.json of a type with no adapter: refused with the generic hint; with family generic
    it validates (MoE and remote code stay refused)."""
    cfg = {
        "model_type": "starcoder2",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "vocab_size": 100,
    }
    with pytest.raises(hub.HubError, match="family: generic"):
        hub.architecture(cfg)
    assert hub.architecture(cfg, generic=True)["family"] == "generic"
    with pytest.raises(hub.HubError, match="mixture-of-experts"):
        hub.architecture({**cfg, "model_type": "mixtral"}, generic=True)
    with pytest.raises(hub.HubError, match="remote code"):
        hub.architecture({**cfg, "auto_map": {"AutoModelForCausalLM": "m.M"}}, generic=True)
