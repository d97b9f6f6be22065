"""Tiny random fp32 models of every supported family, and HF-forward oracles of their sublayers.

The builders (:func:`make_model`, :func:`sample_ids`, the config tables) and the oracles (HF's own
decoder-layer calls, read out by hooks) used by tests/test_arch.py, tests/test_jacobian.py,
tests/test_generic.py, tests/test_parallel.py and others. ``NEW_FAMILY_CONFIGS`` holds the tiny
configs of Qwen3, Gemma 2/3, Phi-3, Granite and SmolLM3, each with the feature its adapter exists
for switched on (docs/architectures.md, "Adding a family").
"""

from __future__ import annotations

import torch
import transformers as tf

from resdyn.lm import structure

VOCAB = 100
LENGTH = 9
WINDOW = 3  # < LENGTH, so sliding windows matter

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _configs() -> dict[str, tuple[type, object]]:
    gemma4 = dict(_COMMON)
    gemma4.update(
        head_dim=8,
        global_head_dim=16,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,  # full layers: v from the raw k projection
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=WINDOW,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=2,  # layers 2, 3 reuse the K/V of layers 0, 1
        final_logit_softcapping=30.0,
    )
    return {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**_COMMON, attention_bias=True, mlp_bias=True)),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**_COMMON, sliding_window=WINDOW)),
        "qwen2": (
            tf.Qwen2ForCausalLM,
            tf.Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2),
        ),
        "olmo2": (tf.Olmo2ForCausalLM, tf.Olmo2Config(**_COMMON)),
        "olmo3": (tf.Olmo3ForCausalLM, tf.Olmo3Config(**_COMMON, sliding_window=WINDOW)),
        "gemma4": (tf.Gemma4ForCausalLM, tf.Gemma4TextConfig(**gemma4)),
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(**GPT2_CONFIG)),
        "gpt_neox": (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(**NEOX_CONFIG, use_parallel_residual=False)),
        PARALLEL: (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(**NEOX_CONFIG, use_parallel_residual=True)),
        **NEW_FAMILY_CONFIGS(),
    }


def NEW_FAMILY_CONFIGS() -> dict[str, tuple[type, object]]:  # noqa: N802  (a table, like _configs)
    """Tiny configs of Qwen3, Gemma 2/3, Phi-3, Granite and SmolLM3, each family's own features switched on.

    Qwen3 sliding layers; Gemma 2 soft-capping (scores of the random model reach ~±3, so a cap
    of 1 is far from linear) and sliding layers; Gemma 3 per-type RoPE and sliding layers;
    Phi-3 partial rotary and a window; Granite multipliers ≠ 1; SmolLM3 NoPE layers and a window."""
    alternate = ["sliding_attention", "full_attention"] * 2
    return {
        "qwen3": (
            tf.Qwen3ForCausalLM,
            tf.Qwen3Config(**_COMMON, head_dim=8, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2),
        ),
        "gemma2": (
            tf.Gemma2ForCausalLM,
            tf.Gemma2Config(
                **_COMMON,
                head_dim=8,
                query_pre_attn_scalar=12,
                sliding_window=WINDOW,
                layer_types=alternate,
                attn_logit_softcapping=1.0,
                final_logit_softcapping=5.0,
            ),
        ),
        "gemma3": (
            tf.Gemma3ForCausalLM,
            tf.Gemma3TextConfig(
                **_COMMON,
                head_dim=8,
                query_pre_attn_scalar=12,
                sliding_window=WINDOW,
                layer_types=alternate,
                final_logit_softcapping=None,
            ),
        ),
        "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config(**_COMMON, partial_rotary_factor=0.5, sliding_window=WINDOW)),
        "granite": (
            tf.GraniteForCausalLM,
            tf.GraniteConfig(
                **_COMMON,
                residual_multiplier=0.6,
                attention_multiplier=0.3,
                embedding_multiplier=3.0,
                logits_scaling=2.5,
            ),
        ),
        "smollm3": (
            tf.SmolLM3ForCausalLM,
            tf.SmolLM3Config(**_COMMON, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=WINDOW),
        ),
    }


#: GPT-NeoX with the parallel residual (Pythia): one boundary per layer, tested on its own.
PARALLEL = "gpt_neox_parallel"
GPT2_CONFIG = dict(
    vocab_size=VOCAB,
    n_embd=32,
    n_inner=64,
    n_layer=4,
    n_head=4,
    n_positions=64,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
)
NEOX_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=64,
    initializer_range=0.2,
    rotary_pct=0.5,
    bos_token_id=1,
    eos_token_id=2,
)
FAMILIES = [name for name in _configs() if name != PARALLEL]
#: The family of each test config name.
FAMILY_OF = {**{name: name for name in FAMILIES}, PARALLEL: "gpt_neox"}


def make_model(name: str, seed: int = 0, attn_implementation: str = "eager") -> torch.nn.Module:
    """A tiny random fp32 model of a family, in eval mode.

    Norm scales are randomised around 1 and Gemma 4's layer_scalar set ≠ 1, so that a misplaced
    norm or scalar cannot go unnoticed.
    """
    cls, config = _configs()[name]
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for mod_name, param in model.named_parameters():
            if "norm" in mod_name or mod_name.split(".")[-2].startswith("ln_"):
                param.add_(0.2 * torch.randn_like(param))
            elif FAMILY_OF[name] in ("gpt2", "gpt_neox") and mod_name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))  # HF initialises them to 0
        for i, layer in enumerate(structure.decoder_layers(model)):
            if hasattr(layer, "layer_scalar"):
                layer.layer_scalar.fill_(0.7 + 0.1 * i)
    return model


def sample_ids(seed: int = 1, length: int = LENGTH, batch: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (length,) if batch is None else (batch, length)
    return torch.randint(3, VOCAB, shape, generator=gen)


# Where HF's layer holds m_L: the module whose *input* is m_L, and the module whose output is
# added to h_L to form m_L (for substituting a given m_L, see mlp_half_oracle).
M_INPUT_MODULE = {
    "llama": "post_attention_layernorm",
    "mistral": "post_attention_layernorm",
    "qwen2": "post_attention_layernorm",
    "olmo2": "mlp",
    "olmo3": "mlp",
    "gemma4": "pre_feedforward_layernorm",
    "gpt2": "ln_2",
    "gpt_neox": "post_attention_layernorm",
    "qwen3": "post_attention_layernorm",
    "gemma2": "pre_feedforward_layernorm",
    "gemma3": "pre_feedforward_layernorm",
    "phi3": "post_attention_layernorm",
    "granite": "post_attention_layernorm",
    "smollm3": "post_attention_layernorm",
}
ATTN_OUTPUT_MODULE = {
    "llama": "self_attn",
    "mistral": "self_attn",
    "qwen2": "self_attn",
    "olmo2": "post_attention_layernorm",
    "olmo3": "post_attention_layernorm",
    "gemma4": "post_attention_layernorm",
    "gpt2": "attn",
    "gpt_neox": "attention",
    "qwen3": "self_attn",
    "gemma2": "post_attention_layernorm",
    "gemma3": "post_attention_layernorm",
    "phi3": "self_attn",
    "granite": "self_attn",
    "smollm3": "self_attn",
}


def capture_layer_calls(model: torch.nn.Module, input_ids: torch.Tensor) -> dict[int, tuple]:
    """(args, kwargs) each decoder layer is called with in HF's forward (use_cache=False)."""
    calls: dict[int, tuple] = {}
    handles = []
    for i, layer in enumerate(structure.decoder_layers(model)):

        def hook(_mod, args, kwargs, i=i):
            calls[i] = (args, dict(kwargs))

        handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=input_ids.reshape(1, -1), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return calls


def call_layer(layer: torch.nn.Module, call: tuple, h: torch.Tensor) -> torch.Tensor:
    """Run an HF decoder layer on h (1, T, d) with the arguments HF gave it."""
    args, kwargs = call
    kwargs = dict(kwargs)
    if "shared_kv_states" in kwargs:  # Gemma 4: a copy, so a storing layer cannot overwrite it
        kwargs["shared_kv_states"] = type(kwargs["shared_kv_states"])(dict(kwargs["shared_kv_states"]))
    out = layer(h, *args[1:], **kwargs)
    return out[0] if isinstance(out, tuple) else out


def attn_half_oracle(name: str, layer: torch.nn.Module, call: tuple):
    """h (T, d) -> m (T, d) through HF's layer, m read by a hook on the module that receives it."""

    def fn(h: torch.Tensor) -> torch.Tensor:
        box = {}
        module = getattr(layer, M_INPUT_MODULE[name])
        handle = module.register_forward_pre_hook(lambda _m, args: box.__setitem__("m", args[0]))
        try:
            call_layer(layer, call, h[None])
        finally:
            handle.remove()
        return box["m"][0]

    return fn


def mlp_half_oracle(name: str, layer: torch.nn.Module, call: tuple, h: torch.Tensor):
    """m (T, d) -> h_{L+1} (T, d) through HF's layer.

    A forward hook replaces the attention branch output by (m − h) / r, so HF's own residual add
    ``h + r · branch`` yields m and the rest of the layer runs (r = Granite's
    residual_multiplier, 1 elsewhere).
    """
    scale = getattr(layer, "residual_multiplier", 1.0)

    def fn(m: torch.Tensor) -> torch.Tensor:
        def replace(_mod, _args, output):
            delta = (m[None] - h[None]) / scale
            return (delta, *output[1:]) if isinstance(output, tuple) else delta

        handle = getattr(layer, ATTN_OUTPUT_MODULE[name]).register_forward_hook(replace)
        try:
            return call_layer(layer, call, h[None])[0]
        finally:
            handle.remove()

    return fn
