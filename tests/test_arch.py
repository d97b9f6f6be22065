"""resdyn.lm.sublayers: the sublayer split reproduces each family's HF decoder layer.

Oracles are HF's own forward passes: hooks on the decoder layers (h_L, the raw last output) and
on the submodule that receives the pre-MLP state (m_L). Tiny random fp32 models, eager attention
(HF's eager path is the one the split mirrors, so recomposition is exact; the sdpa path is
checked too, to fused-kernel rounding).

The tiny models (builders, configs) and the HF-forward oracles are in tests/helpers/tiny_models.py,
shared with tests/test_jacobian.py and others.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from resdyn.lm import decompose, families, norms, structure, sublayers

from helpers.tiny_models import (
    FAMILIES,
    GPT2_CONFIG,
    LENGTH,
    M_INPUT_MODULE,
    PARALLEL,
    VOCAB,
    WINDOW,
    _configs,
    make_model,
    sample_ids,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


def hf_pre_mlp_states(name: str, model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """m_L of every layer from HF's forward: (n_layers, T, d)."""
    captured = {}
    handles = []
    for i, layer in enumerate(structure.decoder_layers(model)):
        module = getattr(layer, M_INPUT_MODULE[name])
        handles.append(module.register_forward_pre_hook(lambda _m, args, i=i: captured.__setitem__(i, args[0])))
    try:
        with torch.no_grad():
            model(input_ids=input_ids.reshape(1, -1), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([captured[i][0] for i in range(len(captured))])


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5) -> None:
    """max |actual − expected| ≤ rel · max |expected|, per leading index (one boundary each).

    For comparisons between mathematically equal computations done in a different fp32 order
    (batched vs single GEMMs, HF's fused sdpa kernel): in float64 they agree exactly (checked
    when this test was written), in fp32 the rounding grows with depth in proportion to the
    state's scale, so an absolute 1e-5 would be below one ulp of Gemma's larger states.
    """
    err = (actual - expected).abs().flatten(1).amax(1)
    scale = expected.abs().flatten(1).amax(1)
    assert bool((err <= rel * scale).all()), f"errors {err.tolist()} vs scales {scale.tolist()}"


# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, make_model(request.param)


def test_family_detected(family_model):
    name, model = family_model
    assert decompose.family(model) == name
    adapters = decompose.sublayers(model)
    assert [a.index for a in adapters] == list(range(4))


def test_boundary_states_recompose_hf_layers(family_model):
    name, model = family_model
    ids = sample_ids()
    states = decompose.boundary_states(model, ids)
    n = len(structure.decoder_layers(model))
    assert states.shape == (2 * n + 1, LENGTH, 32)
    assert states.dtype == torch.float32
    reference = structure.residual_states(model, ids)[0]  # hooks on HF's layers
    torch.testing.assert_close(states[0::2], reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(states[1::2], hf_pre_mlp_states(name, model, ids), atol=1e-5, rtol=0)


def test_boundary_states_batch(family_model):
    _, model = family_model
    ids = sample_ids(batch=2)
    states = decompose.boundary_states(model, ids)
    assert states.shape[:2] == (2, 9)
    for b in range(2):
        assert_close_to_scale(states[b], decompose.boundary_states(model, ids[b]))


def test_last_state_is_raw_layer_output(family_model):
    """The last boundary is the last layer's output, not HF's hidden_states[-1] (after the norm)."""
    _, model = family_model
    ids = sample_ids()
    last = {}
    handle = structure.decoder_layers(model)[-1].register_forward_hook(
        lambda _m, _a, out: last.__setitem__("h", out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None], use_cache=False, output_hidden_states=True)
    finally:
        handle.remove()
    states = decompose.boundary_states(model, ids)
    torch.testing.assert_close(states[-1], last["h"][0], atol=1e-5, rtol=0)
    assert (states[-1] - out.hidden_states[-1][0]).abs().max() > 1e-2
    # ... and the model's own readout of it gives the model's logits.
    torch.testing.assert_close(structure.unembed_logits(model, states[-1]), out.logits[0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "gemma4", "gpt2", PARALLEL])
def test_boundary_states_match_sdpa_model(name):
    """Default attention (sdpa): equal up to the fused kernel's summation order."""
    model = make_model(name, attn_implementation="sdpa")
    ids = sample_ids()
    assert_close_to_scale(decompose.boundary_states(model, ids)[0::2], structure.residual_states(model, ids)[0])


def test_causal_mask_is_explicit():
    """Changing a later token leaves every earlier state unchanged (eager attention without a
    mask would not be causal)."""
    model = make_model("llama")
    ids = sample_ids()
    changed = ids.clone()
    changed[6] = (ids[6] + 1) % VOCAB
    a, b = decompose.boundary_states(model, ids), decompose.boundary_states(model, changed)
    assert torch.equal(a[:, :6], b[:, :6])
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["mistral", "qwen2", "olmo3", "gemma4"])
def test_sliding_window_applied(name):
    """A sliding layer's m_L at the last position ignores tokens older than the window."""
    model = make_model(name)
    layer = next(a.index for a in decompose.sublayers(model) if a.window == WINDOW)
    ids = sample_ids()
    changed = ids.clone()
    changed[: LENGTH - WINDOW] = (ids[: LENGTH - WINDOW] + 1) % VOCAB
    a, b = decompose.boundary_states(model, ids), decompose.boundary_states(model, changed)
    assert layer == 0 or name == "qwen2"
    if layer == 0:  # h_0 at the window's positions is unchanged, so m_0 there must be too
        torch.testing.assert_close(a[1, -1], b[1, -1], atol=0, rtol=0)
    assert (a[2 * layer, : LENGTH - WINDOW] - b[2 * layer, : LENGTH - WINDOW]).abs().max() > 1e-3


def test_sublayer_metadata():
    windows = {name: [a.window for a in decompose.sublayers(make_model(name))] for name in FAMILIES}
    assert windows["llama"] == [None] * 4
    assert windows["mistral"] == [WINDOW] * 4
    assert windows["qwen2"] == [None, None, WINDOW, WINDOW]
    assert windows["olmo3"] == [WINDOW, WINDOW, WINDOW, None]
    assert windows["gemma4"] == [WINDOW, None, WINDOW, None]
    gemma = decompose.sublayers(make_model("gemma4"))
    assert [a.kv_source for a in gemma] == [0, 1, 0, 1]
    layer = structure.decoder_layers(make_model("gemma4"))[1]
    assert layer.self_attn.v_proj is None and hasattr(layer.self_attn, "v_norm")  # k_eq_v + v-norm
    assert layer.hidden_size_per_layer_input == 8


def test_bf16_boundaries_follow_hf():
    """bf16 weights: the split runs in bf16 like HF (eager); states agree to bf16 rounding."""
    for name in ("llama", "olmo2", "gemma4", "gpt2", PARALLEL):
        model = make_model(name).to(torch.bfloat16)
        ids = sample_ids()
        states = decompose.boundary_states(model, ids)
        assert states.dtype == torch.bfloat16
        reference = structure.residual_states(model, ids)[0]
        torch.testing.assert_close(states[0::2], reference, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------------


def _assert_refused(model, *needles):
    with pytest.raises(ValueError) as err:
        decompose.sublayers(model)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    for fam in families.SUPPORTED_FAMILIES:
        assert fam in message, message


def test_refuses_gptj():
    config = tf.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4)
    _assert_refused(tf.GPTJForCausalLM(config), "gptj", "parallel")


def test_refuses_gemma3n():
    config = tf.Gemma3nTextConfig(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        hidden_size=32,
        hidden_size_per_layer_input=8,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_kv_shared_layers=0,
        layer_types=["sliding_attention", "full_attention"],
        activation_sparsity_pattern=[0.0, 0.0],
        laurel_rank=4,
    )
    _assert_refused(tf.Gemma3nForCausalLM(config), "gemma3n", "AltUp")


def test_refuses_unknown_family():
    config = tf.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    with pytest.raises(ValueError, match="llama, mistral, qwen2, olmo2, olmo3, gemma4, gpt2, gpt_neox"):
        decompose.family(tf.BloomForCausalLM(config))


def test_refuses_gpt2_cross_attention():
    config = tf.GPT2Config(**GPT2_CONFIG, add_cross_attention=True)
    with pytest.raises(ValueError, match="add_cross_attention"):
        decompose.family(tf.GPT2LMHeadModel(config))


def test_refuses_gemma4_moe():
    _, config = _configs()["gemma4"]
    config = tf.Gemma4TextConfig(
        **{
            **config.to_dict(),
            "enable_moe_block": True,
            "num_experts": 2,
            "top_k_experts": 1,
            "moe_intermediate_size": 16,
        }  # fmt: skip
    )
    with pytest.raises(ValueError, match="enable_moe_block"):
        decompose.family(tf.Gemma4ForCausalLM(config))


def test_gemma4_multimodal_wrapper_text_inputs():
    """Gemma4ForConditionalGeneration: the text stack is found and split like Gemma4ForCausalLM;
    multimodal placeholder ids are refused."""
    _, text_config = _configs()["gemma4"]
    config = tf.Gemma4Config(text_config=text_config.to_dict(), vision_config=None, audio_config=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.Gemma4ForConditionalGeneration(config).eval()
    assert decompose.family(model) == "gemma4"
    ids = sample_ids()
    states = decompose.boundary_states(model, ids)
    torch.testing.assert_close(states[0::2], structure.residual_states(model, ids)[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="image_token_id"):
        decompose.boundary_states(model, torch.tensor([5, config.image_token_id, 6]))


# ----------------------------------------------------------------------------------------------
# Parallel residual (GPT-NeoX / Pythia)
# ----------------------------------------------------------------------------------------------


def hf_attention_outputs(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The attention branch output A(ln_in(h_L)) of every GPT-NeoX layer in HF's forward."""
    captured = {}
    handles = [
        layer.attention.register_forward_hook(lambda _m, _a, out, i=i: captured.__setitem__(i, out[0]))
        for i, layer in enumerate(structure.decoder_layers(model))
    ]
    try:
        with torch.no_grad():
            model(input_ids=input_ids.reshape(1, -1), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([captured[i][0] for i in range(len(captured))])


def test_parallel_residual_boundaries():
    """One boundary per layer: h_L equals HF's layer inputs; the pre-MLP slot holds the virtual
    m_L = h_L + A(ln_in(h_L)), so m_L − h_L and h_{L+1} − m_L are the two branch outputs."""
    model = make_model(PARALLEL)
    assert decompose.family(model) == "gpt_neox" and structure.residual_kind(model) == "parallel"
    assert all(a.parallel for a in decompose.sublayers(model))
    assert structure.residual_kind(make_model("gpt_neox")) == "sequential"
    assert not any(a.parallel for a in decompose.sublayers(make_model("gpt_neox")))
    ids = sample_ids()
    states = decompose.boundary_states(model, ids)
    reference = structure.residual_states(model, ids)[0]
    torch.testing.assert_close(states[0::2], reference, atol=0, rtol=0)
    attn = hf_attention_outputs(model, ids)
    torch.testing.assert_close(states[1::2] - states[0:-1:2], attn, atol=1e-5, rtol=0)
    layers = structure.decoder_layers(model)
    with torch.no_grad():
        mlp = torch.stack([layers[i].mlp(layers[i].post_attention_layernorm(reference[i])) for i in range(4)])
    torch.testing.assert_close(states[2::2] - states[1::2], mlp, atol=1e-5, rtol=0)


def test_gpt2_learned_positions_and_partial_rotary():
    """GPT-2's h_0 includes the learned positions; GPT-NeoX rotates only rotary_pct of a head."""
    model = make_model("gpt2")
    ids = sample_ids()
    states = decompose.boundary_states(model, ids)
    stack = structure.text_model(model)
    with torch.no_grad():
        expected = stack.wte(ids) + stack.wpe(torch.arange(LENGTH))
    torch.testing.assert_close(states[0], expected, atol=0, rtol=0)
    neox = decompose.sublayers(make_model(PARALLEL))[0]
    assert neox.head_dim == 8 and neox.attention.rotary_ndims == 4
    x = torch.randn(2, 4, 8)
    cos, sin = torch.cos(torch.ones(2, 4)), torch.sin(torch.ones(2, 4))
    out = sublayers.apply_rope(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:]) and not torch.equal(out[..., :4], x[..., :4])


# ----------------------------------------------------------------------------------------------
# Qwen3, Gemma 2/3, Phi-3, Granite, SmolLM3: features that must be active in the oracle tests, the family table
# ----------------------------------------------------------------------------------------------


def test_new_family_features_are_active():
    """The oracle tests above exercise each family's own feature: Gemma 2 scores reach beyond the
    soft cap (tanh far from linear), SmolLM3 has NoPE layers, Granite's multipliers are ≠ 1,
    Phi-3 rotates half of each head, every sliding family has a window shorter than LENGTH."""
    gemma2 = make_model("gemma2")
    adapter = decompose.sublayers(gemma2)[0]
    ids = sample_ids()
    ctx = decompose.prepare(gemma2, ids[None])
    with torch.no_grad():
        n = adapter.norm("attn_pre")(ctx.embeddings)
        cos, sin = adapter.rope(ctx, n.dtype)
        q = adapter.shape_q(adapter.project_q(n), cos, sin)
        k, _ = adapter.shape_kv(*adapter.project_kv(n), cos, sin)
        scores = torch.einsum("bthd,bshd->bhts", q, k.repeat_interleave(2, dim=2)) * adapter.scaling
    assert adapter.softcap == 1.0 and scores.abs().max() > 2 * adapter.softcap
    smol = decompose.sublayers(make_model("smollm3"))
    assert [a.rotary for a in smol] == [True, False, True, False]
    granite = make_model("granite")
    assert decompose.sublayers(granite)[0].branch_scale == 0.6 and structure.readout_scale(granite) == 2.5
    from resdyn.study_b import lens

    assert lens.linear_readout_weight(granite, torch.float32) is None  # the lens reads out through / 2.5
    with torch.no_grad():
        out = granite(input_ids=ids[None], use_cache=False)
        final = decompose.boundary_states(granite, ids)[-1]
        torch.testing.assert_close(lens.lens_readout(granite, final, None, None), out.logits[0], atol=1e-5, rtol=0)
    assert (
        decompose.sublayers(make_model("phi3"))[0]
        .rope(decompose.prepare(make_model("phi3"), ids[None]), torch.float32)[0]
        .shape[-1]
        == 4
    )  # of head_dim 8
    for name in ("qwen3", "gemma2", "gemma3", "phi3", "smollm3"):
        assert WINDOW in [a.window for a in decompose.sublayers(make_model(name))], name


def test_gemma3_multimodal_checkpoint_text_tower():
    """Gemma3ForConditionalGeneration (model_type gemma3): the text tower is split as gemma3."""
    _, text_config = _configs()["gemma3"]
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = tf.Gemma3Config(text_config=text_config.to_dict(), vision_config=vision, mm_tokens_per_image=1)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.Gemma3ForConditionalGeneration(config).eval()
    assert decompose.family(model) == "gemma3"
    ids = sample_ids()
    torch.testing.assert_close(
        decompose.boundary_states(model, ids)[0::2], structure.residual_states(model, ids)[0], atol=1e-5, rtol=0
    )


def test_family_table_is_the_one_place():
    """Schema enum, hub detection, norms and adapters all come from resdyn.lm.families; the
    docs table has one row per family."""
    from pathlib import Path

    from resdyn.lm import families
    from resdyn.pipeline import config as rc

    schema = rc.load_schema()
    assert schema["$defs"]["model"]["properties"]["family"]["enum"] == [*families.FAMILIES, decompose.GENERIC]
    docs = (Path(__file__).resolve().parents[1] / "docs" / "architectures.md").read_text()
    assert families.docs_table() in docs, "docs/architectures.md: paste resdyn.lm.families.docs_table()"
    for name, fam in families.FAMILIES.items():
        assert issubclass(decompose.adapter_class(name), sublayers.LayerSublayers), name
        for model_type in fam.model_types:
            assert families.family_of_type(model_type) == name
        assert set(fam.rms_norms) <= set(norms.RMS_NORM_CLASSES)


@pytest.mark.parametrize(
    ("cfg", "needles"),
    [
        ({"model_type": "qwen3_moe"}, ["mixture-of-experts", "nearest supported: qwen3"]),
        ({"model_type": "mixtral"}, ["mixture-of-experts", "nearest supported: mistral"]),
        ({"model_type": "t5"}, ["encoder-decoder", "nearest supported"]),
        ({"model_type": "phi"}, ["ONE shared input LayerNorm", "phi3"]),
        ({"model_type": "qwen3", "auto_map": {"AutoModelForCausalLM": "x.Y"}}, ["remote code", "'qwen3'"]),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, ["bidirectional"]),
        (
            {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "use_bidirectional_attention": True}},
            ["bidirectional"],
        ),
        ({"model_type": "bloom"}, ["'bloom' is not supported", "no adapter", "family: generic"]),
    ],
)
def test_refusals_at_validation(cfg, needles):
    """config.json alone (no torch, before any job): one line with the reason, the nearest
    supported family and the supported list."""
    from resdyn.lm import hub

    with pytest.raises(hub.HubError) as err:
        hub.architecture(cfg)
    message = str(err.value)
    assert "\n" not in message and "supported families: llama" in message, message
    for needle in needles:
        assert needle in message, message


def test_refuses_remote_code_model_object():
    """A model object whose config carries auto_map (trust_remote_code) is refused by arch too."""
    model = make_model("llama")
    model.config.auto_map = {"AutoModelForCausalLM": "modeling_x.X"}
    with pytest.raises(ValueError, match="remote code"):
        decompose.family(model)
