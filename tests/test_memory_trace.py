"""The memory accounting on a CPU: live bytes counted by a dispatch mode on storage-free (meta) tensors
(resdyn.numerics.live_bytes, resdyn.beyond.memtrace) against the plan's device memory
(resdyn.cluster.cost) on the real code paths at small shapes, and the Jacobian block size the plan picks."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from resdyn.beyond import memtrace
from resdyn.cluster import cost
from resdyn.numerics.live_bytes import LiveBytes
from resdyn.study_b.lens.stream import TokenStream, token_batches

#: the plan's tolerance on device memory (docs/cost.md, "Memory trace")
TOLERANCE = 0.25


def test_live_bytes_counts_each_storage_once_and_frees_it():
    """Oracle: byte counts of known allocations; views share their base's storage."""
    unit = 256 * 256 * 4
    with LiveBytes() as live:
        a = torch.empty(256, 256, device="meta")
        b = a + 1
        assert live.current["meta"] == 2 * unit
        del b
        assert live.current["meta"] == unit
        view = a.t()[:10]
        assert live.current["meta"] == unit
        # float64 copies of the view (10×256) and of all of a (a.double() comes before the slice),
        # their 10×10 float64 product, then its float32 copy once both copies are gone
        c = (view.double() @ a.double()[:, :10]).float()
        peak = live.peak["meta"]
    assert peak == unit + 10 * 256 * 8 + 2 * unit + 10 * 10 * 8
    assert live.current["meta"] == unit + 10 * 10 * 4  # a and c: the float64 temporaries are gone
    del a, view, c


def test_meta_scalars_read_as_data_that_passes_checks_and_host_copies_are_zeros():
    with LiveBytes():
        x = torch.empty(3, 4, device="meta")
        assert bool(torch.isfinite(x).all()) is True
        assert bool(torch.isnan(x).any()) is False
        host = x.sum(0).cpu()
    assert host.device.type == "cpu" and host.shape == (4,) and not host.any()


def _model_and_shape(d: int, d_ff: int, heads: int, kv: int, layers: int, vocab: int):
    hf = LlamaConfig(
        hidden_size=d,
        intermediate_size=d_ff,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=256,
    )
    return memtrace.meta_model(hf, torch.bfloat16), cost.Shape(layers, d, heads, kv, d_ff, vocab, 2)


SHAPES = [(128, 352, 4, 2, 4, 1024, 32), (256, 704, 4, 2, 4, 4096, 64)]


def _config(length: int, tokens_per_step: int) -> dict:
    return {
        "samples": {"n": 64, "length": length},
        "jacobian": {"positions": "last", "store_first_n": 2, "store_dtype": "float32", "n_groups": 0},
        "lens": {
            "tokens_per_step": tokens_per_step,
            "n_heldout_blocks": length,
            "n_train_blocks": 64,
            "steps": 10,
            "eval_every": 5,
            "readout_dtype": "bfloat16",
            "optimizer": "sgd_nesterov",
        },
    }


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s[0]}")
def test_the_plans_jacobian_memory_is_the_engines_live_bytes(shape):
    """A GPU Jacobian job's block (batch of 16, the deepest two layers): the plan's device memory
    within the tolerance of the engine's traced peak."""
    *dims, length = shape
    model, s = _model_and_shape(*dims)
    traced = memtrace.trace_jacobians(model, [2, 3], length)
    planned = cost.cost_jacobians(_config(length, 16 * length), s, [2, 3], gpu=True).device_bytes
    assert traced > s.weight_bytes
    assert abs(planned / traced - 1) <= TOLERANCE, (planned, traced)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s[0]}")
def test_the_plans_lens_memory_is_the_trainers_live_bytes(shape):
    """Lens training (two steps, held-out evaluation after each): weights plus
    cost.lens_working_bytes within the tolerance of train_lens's traced peak."""
    *dims, length = shape
    model, s = _model_and_shape(*dims)
    cfg = _config(length, 16 * length)
    traced = memtrace.trace_lens(model, length, cfg["lens"])
    planned = s.weight_bytes + cost.lens_working_bytes(cfg, s, gpu=True)
    assert abs(planned / traced - 1) <= TOLERANCE, (planned, traced)
    assert cost.cost_lens(cfg, s, gpu=True).device_bytes == planned


def test_the_token_stream_lets_the_spent_batch_go_before_the_next_forward():
    """A batch's states S are held once, then stacked and copied layer-major at the next fetch (2 S):
    the spent batch must be gone by then, or the peak is 3 S."""
    model, s = _model_and_shape(64, 128, 2, 1, 8, 64)
    batches = token_batches(torch.zeros(64, 16, dtype=torch.long), 32)
    states = 32 * 16 * (s.n_layers + 1) * s.d * 2  # one batch's (n+1, B·T, d) bfloat16 states
    with LiveBytes() as live:
        live.track(model.parameters())
        stream = TokenStream(model, batches, 32 * 16)
        held = stream.take()
        del held
        stream.take()
    extra = live.peak["meta"] - s.weight_bytes
    assert 2 * states <= extra < 2.5 * states, extra / states


def test_the_plan_says_which_memory_figures_are_traced():
    from resdyn.pipeline import plan

    line = plan.memory_line()
    assert all(rule in line for rule in cost.GPU_RULES) and "spectra, bootstrap are formulas only" in line


def test_gemma4_per_layer_input_embeddings_are_priced_as_weights():
    """Oracle: the parameter count of Gemma 4's per-layer input matrices in transformers' own model
    (their norms, d_ple values each, are left out)."""
    from transformers import AutoConfig

    text = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "vocab_size": 512,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 300,
    }
    model = memtrace.meta_model(AutoConfig.for_model(**text), torch.bfloat16)
    names = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_input_gate", "per_layer_projection")
    want = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and any(k in n for k in names))
    entry = {"d_per_layer_input": 16, "vocab_per_layer_input": 300}
    assert cost._per_layer_input_params(entry, 4, 64, 512) == want
