"""resdyn.beyond.causal: subspace projection / patching and the model run from a layer.

Oracles: the Hugging Face forward (continuation without intervention; the same edit made by a
forward pre-hook on layer L). Known answers: empty subspace and self-patching give KL = 0
exactly; a coordinate the stream never occupies changes nothing at any layer; at the final raw
state of a model whose final norm is the identity, removing part of the unembedding's null space
changes nothing beyond rounding.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import torch
import transformers as tf
from torch import nn

from resdyn.beyond import causal
from resdyn.beyond.bridge import haar_subspace
from resdyn.lm import decompose, structure

VOCAB, D, LAYERS, T, B = 64, 32, 3, 10, 4


def _common(vocab: int = VOCAB) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def make(family: str = "llama", vocab: int = VOCAB, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if family == "llama":
        cfg = tf.LlamaConfig(**_common(vocab))
        cls = tf.LlamaForCausalLM
    elif family == "olmo2":
        cfg = tf.Olmo2Config(**_common(vocab))
        cls = tf.Olmo2ForCausalLM
    elif family == "gemma4":
        common = _common(vocab)
        common["num_hidden_layers"] = 4
        cfg = tf.Gemma4TextConfig(
            **common,
            head_dim=8,
            global_head_dim=16,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            sliding_window=3,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=vocab,
            num_kv_shared_layers=2,
            final_logit_softcapping=30.0,
        )
        cls = tf.Gemma4ForCausalLM
    else:
        raise ValueError(family)
    cfg._attn_implementation = "eager"
    return cls(cfg).eval()


def ids(seed: int = 1, batch: int = B, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, T), generator=torch.Generator().manual_seed(seed))


def hf_logits(model: nn.Module, input_ids: torch.Tensor, layer: int | None = None, edit=None) -> torch.Tensor:
    """HF forward; with ``edit``, a pre-hook on decoder layer ``layer`` replaces its input h."""
    handle = None
    if edit is not None:

        def hook(_mod, args, kwargs):
            return (edit(args[0]), *args[1:]), kwargs

        handle = structure.decoder_layers(model)[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            return model(input_ids=input_ids, use_cache=False).logits
    finally:
        if handle is not None:
            handle.remove()


def _assert_logits_close(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.detach(), b.detach()
    scale = float(b.abs().max())
    assert float((a - b).abs().max()) <= 2e-5 * max(1.0, scale)


# ---------------------------------------------------------------- the interventions


def test_project_and_patch_formulas():
    rng = np.random.default_rng(0)
    h = torch.tensor(rng.standard_normal((2, 3, 6)), dtype=torch.float64)
    g = torch.tensor(rng.standard_normal((2, 3, 6)), dtype=torch.float64)
    V = torch.tensor(haar_subspace(6, 2, rng))
    P = V @ V.T
    torch.testing.assert_close(causal.project_off(h, V), h - h @ P, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(causal.patch_component(h, g, V), h - h @ P + g @ P, rtol=1e-13, atol=1e-13)
    # removing the component leaves nothing in span(V); patching puts g's component there
    assert float((causal.project_off(h, V) @ V).abs().max()) < 1e-13
    torch.testing.assert_close(causal.patch_component(h, g, V) @ V, g @ V, rtol=1e-13, atol=1e-13)


def test_identity_interventions_are_bit_exact():
    h = torch.randn(2, 5, 8)
    empty = torch.zeros(8, 0)
    assert torch.equal(causal.project_off(h, empty), h)
    assert torch.equal(causal.patch_component(h, torch.randn(2, 5, 8), empty), h)
    V = torch.tensor(haar_subspace(8, 3, np.random.default_rng(1)), dtype=torch.float32)
    assert torch.equal(causal.patch_component(h, h, V), h)


def test_kl_and_flips_known_answer():
    p = torch.tensor([[0.0, 0.0]])  # uniform
    q = torch.tensor([[np.log(3.0), 0.0]])  # (3/4, 1/4)
    kl, flips, n = causal.kl_and_flips(p, q)
    expected = 0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25)
    assert kl == pytest.approx(expected, rel=1e-12) and n == 1
    assert causal.kl_and_flips(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]))[1] == 1.0


def test_readout_chunks_and_reference_cache_change_no_number(monkeypatch):
    """KL and flips per comparison against scipy on the full logits, whatever the readout chunk
    size; the same bits whether the reference readout is kept or recomputed."""
    import scipy.special

    model = make()
    x = ids()
    whole = causal.Continuation(model, x, chunk_elements=10**9)
    small = causal.Continuation(model, x, chunk_elements=3 * VOCAB)  # 3 tokens per chunk, a partial last
    assert small.chunk_tokens == 3 and (B * T) % 3 != 0
    rng = np.random.default_rng(4)
    for L in range(LAYERS):
        final = whole.run(whole.stream(L), L)
        ref_whole, ref_small = whole.reference(final), small.reference(final)
        for V in (haar_subspace(D, 4, rng), haar_subspace(D, 9, rng)):
            mod = whole.run(causal.project_off(whole.stream(L), V), L)
            got = whole.compare(ref_whole, mod)
            assert whole.compare(final, mod) == got  # a kept reference is the recomputed one, bit for bit
            chunked = small.compare(ref_small, mod)  # the head's gemm may round rows differently by count
            assert chunked[0] == pytest.approx(got[0], rel=1e-6) and chunked[1:] == got[1:]
            a = scipy.special.log_softmax(structure.unembed_logits(model, final).detach().double().numpy(), axis=-1)
            zb = structure.unembed_logits(model, mod).detach().double().numpy()
            b = scipy.special.log_softmax(zb, axis=-1)
            assert got[0] == pytest.approx(float(np.sum(np.exp(a) * (a - b))), rel=1e-10)
            assert got[1] == float(np.sum(a.argmax(-1) != zb.argmax(-1))) and got[2] == B * T
    t1 = causal.causal_table(model, x, _translators(), k=4, n_random=3, seed=5)
    monkeypatch.setattr(causal, "REFERENCE_CACHE_BYTES", 0)  # recompute the reference each time
    assert causal.causal_table(model, x, _translators(), k=4, n_random=3, seed=5).equals(t1)


# ---------------------------------------------------------------- continuation vs HF


@pytest.mark.parametrize("family", ["llama", "olmo2", "gemma4"])
def test_continuation_matches_hf_forward(family):
    model = make(family)
    x = ids()
    cont = causal.Continuation(model, x)
    ref = hf_logits(model, x)
    boundaries = decompose.boundary_states(model, x)
    for L in range(cont.n_layers + 1):
        assert torch.equal(cont.stream(L), boundaries[:, 2 * L])  # the same sublayer calls
        final = cont.run(cont.stream(L), L)
        _assert_logits_close(structure.unembed_logits(model, final), ref)


@pytest.mark.parametrize("family", ["llama", "gemma4"])
def test_intervention_matches_hf_pre_hook(family):
    model = make(family)
    x = ids()
    cont = causal.Continuation(model, x)
    V = torch.tensor(haar_subspace(D, 5, np.random.default_rng(3)), dtype=torch.float32)
    for L in range(cont.n_layers):
        mine = structure.unembed_logits(model, cont.run(causal.project_off(cont.stream(L), V), L))
        _assert_logits_close(mine, hf_logits(model, x, L, lambda h: causal.project_off(h, V)))
        donor = cont.donor(L)
        mine = structure.unembed_logits(model, cont.run(causal.patch_component(cont.stream(L), donor, V), L))
        _assert_logits_close(mine, hf_logits(model, x, L, lambda h: causal.patch_component(h, donor, V)))


def test_donor_is_a_different_sample():
    cont = causal.Continuation(make(), ids())
    h, donor = cont.stream(1), cont.donor(1)
    for i in range(B):
        assert torch.equal(donor[i], h[(i + 1) % B])
    one = causal.Continuation(make(), ids(batch=1))
    with pytest.raises(ValueError, match="at least 2 samples"):
        one.donor(0)


# ---------------------------------------------------------------- known answers


def test_empty_subspace_and_self_patch_give_exactly_zero():
    model = make()
    cont = causal.Continuation(model, ids())
    for L in range(LAYERS + 1):
        assert cont.effect(L, np.zeros((D, 0)), "project")[:2] == (0.0, 0.0)
        assert cont.effect(L, np.zeros((D, 0)), "patch")[:2] == (0.0, 0.0)


def _dead_coordinates_model(dead: list[int]) -> nn.Module:
    """A Llama whose stream never has a component on the ``dead`` coordinates: the embedding
    has zero columns there and every attention o_proj / MLP down_proj zero rows (no biases)."""
    model = make("llama")
    with torch.no_grad():
        structure.text_model(model).embed_tokens.weight[:, dead] = 0.0
        for layer in structure.decoder_layers(model):
            layer.self_attn.o_proj.weight[dead, :] = 0.0
            layer.mlp.down_proj.weight[dead, :] = 0.0
    return model


def test_unoccupied_subspace_changes_nothing_at_any_layer():
    dead = [3, 17, 29]
    model = _dead_coordinates_model(dead)
    cont = causal.Continuation(model, ids())
    for L in range(LAYERS + 1):
        assert float(cont.stream(L)[..., dead].abs().max()) == 0.0
    # any orthonormal basis of span(e_3, e_17, e_29), not just the axes
    R = scipy.linalg.qr(np.random.default_rng(0).standard_normal((3, 3)))[0]
    V = np.zeros((D, 3))
    V[dead] = R
    for L in range(LAYERS + 1):
        for intervention in causal.INTERVENTIONS:
            kl, flips, n = cont.effect(L, V, intervention)
            assert (kl, flips, n) == (0.0, 0.0, B * T)
    # the contrast: a live coordinate does change the output
    live = np.zeros((D, 1))
    live[0, 0] = 1.0
    assert cont.effect(1, live, "project")[0] > 1e-6


def test_readout_null_space_changes_nothing_at_the_final_state():
    """Norm-free readout stub (final norm = identity, so logits = W_U h): at index n, removing
    a subspace of null(W_U) changes the logits by W_U V Vᵀ h = 0, up to float32 rounding."""
    vocab = 16  # < d, so W_U (16 × 32) has a 16-dimensional null space
    model = make("llama", vocab=vocab)
    structure.text_model(model).norm = nn.Identity()
    cont = causal.Continuation(model, ids(vocab=vocab))
    W = model.get_output_embeddings().weight.detach().double().numpy()
    null = scipy.linalg.null_space(W)
    assert null.shape == (D, D - vocab)
    kl, flips, _ = cont.effect(LAYERS, null[:, :6], "project")
    assert kl < 1e-10 and flips == 0.0
    kl, flips, _ = cont.effect(LAYERS, null[:, :6], "patch")
    assert kl < 1e-10 and flips == 0.0
    # removing part of the row space of W_U does change the readout
    row = scipy.linalg.orth(W.T)
    assert cont.effect(LAYERS, row[:, :6], "project")[0] > 1e-3


# ---------------------------------------------------------------- the table


def _translators(seed: int = 0, n: int = LAYERS) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.eye(D) + 0.5 * rng.standard_normal((D, D)) for _ in range(n)]


def test_causal_table_rows_match_direct_effects_and_are_deterministic():
    from resdyn.study_b.readout import readout_subspace

    model = make()
    x = ids()
    tr = _translators()
    phases = {"b1": 0, "b2": 1}
    t1 = causal.causal_table(model, x, tr, k=4, n_random=3, seed=5, phases=phases)
    t2 = causal.causal_table(model, x, tr, k=4, n_random=3, seed=5, phases=phases)
    assert list(t1.columns) == causal.CAUSAL_COLUMNS
    assert t1.equals(t2)
    assert len(t1) == 2 * LAYERS and set(t1["intervention"]) == set(causal.INTERVENTIONS)
    cont = causal.Continuation(model, x)
    for L in range(LAYERS):
        V = readout_subspace(tr[L], 4)
        row = t1[(t1["layer"] == L) & (t1["intervention"] == "project")].iloc[0]
        kl, flip, n = cont.effect(L, V, "project")
        assert row["kl"] == pytest.approx(kl, rel=1e-12) and row["flip_rate"] == flip and row["n_tokens"] == n
        # the random null is the same draws as default_rng([seed, L])
        rng = np.random.default_rng([5, L])
        null = [cont.effect(L, haar_subspace(D, 4, rng), "project")[0] for _ in range(3)]
        assert row["random_kl_mean"] == pytest.approx(np.mean(null), rel=1e-12)
        assert row["kl_p"] == np.mean(np.array(null) >= kl)
    phase = t1["phase"].tolist()
    assert phase[:4] == [1, 1, 2, 2] and all(v is pd.NA for v in phase[4:])
    t3 = causal.causal_table(model, x, tr, k=4, n_random=3, seed=6, layers=[1])
    assert not np.isclose(t3["random_kl_mean"].iloc[0], t1[t1["layer"] == 1]["random_kl_mean"].iloc[0])


def test_random_baseline_kl_grows_with_k():
    model = make()
    x = ids()
    tr = _translators()
    means = [
        causal.causal_table(model, x, tr, k=k, n_random=20, seed=0, layers=[1], interventions=("project",))[
            "random_kl_mean"
        ].iloc[0]
        for k in (1, 8, 24)
    ]
    assert means[0] < means[1] < means[2]


def test_causal_table_validation():
    model = make()
    x = ids()
    tr = _translators()
    with pytest.raises(ValueError, match="k must be an integer in \\[1, 32\\]"):
        causal.causal_table(model, x, tr, k=33)
    with pytest.raises(ValueError, match="n_random must be an integer ≥ 2"):
        causal.causal_table(model, x, tr, k=2, n_random=1)
    with pytest.raises(ValueError, match="at least 2 samples"):
        causal.causal_table(model, x[:1], tr, k=2)
    with pytest.raises(ValueError, match="layers \\[3\\] out of range"):
        causal.causal_table(model, x, tr, k=2, layers=[3])
    with pytest.raises(ValueError, match="2 translators; the model has 3 layers"):
        causal.causal_table(model, x, tr[:2], k=2)
    with pytest.raises(ValueError, match="interventions"):
        causal.causal_table(model, x, tr, k=2, interventions=("ablate",))
