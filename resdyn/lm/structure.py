"""Where a decoder's parts live: its layer stack, final norm and unembedding, and the raw
residual states a forward pass leaves between its layers."""

from __future__ import annotations

import torch
from torch import nn

#: Attribute names of (decoder stack, layer list, final norm) per HF layout: Llama-style
#: ``model.layers``/``norm``, GPT-NeoX ``gpt_neox.layers``/``final_layer_norm``, GPT-2
#: ``transformer.h``/``ln_f``.
_STACK_ATTRS = ("model", "gpt_neox", "transformer")


_LAYERS_ATTRS = ("layers", "h")


_NORM_ATTRS = ("norm", "final_layer_norm", "ln_f")


def text_model(model: nn.Module) -> nn.Module:
    """The decoder stack (the module holding the layers, the final norm and the embedding)."""
    inner = next((getattr(model, a) for a in _STACK_ATTRS if isinstance(getattr(model, a, None), nn.Module)), model)
    # Multimodal wrappers (e.g. Gemma 4 ConditionalGeneration) nest the text stack one deeper.
    if not any(hasattr(inner, a) for a in _LAYERS_ATTRS) and hasattr(inner, "language_model"):
        inner = inner.language_model
    if not any(isinstance(getattr(inner, a, None), nn.ModuleList) for a in _LAYERS_ATTRS):
        raise ValueError(f"{type(model).__name__}: cannot find the decoder layers (no .model.layers)")
    return inner


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ordered decoder layers of a causal LM."""
    stack = text_model(model)
    return next(getattr(stack, a) for a in _LAYERS_ATTRS if isinstance(getattr(stack, a, None), nn.ModuleList))


def final_norm(model: nn.Module) -> nn.Module:
    """The final normalisation applied before the unembedding."""
    stack = text_model(model)
    return next(getattr(stack, a) for a in _NORM_ATTRS if isinstance(getattr(stack, a, None), nn.Module))


def input_device(model: nn.Module) -> torch.device:
    """Device of the token embedding (where input ids must live)."""
    return model.get_input_embeddings().weight.device


def residual_kind(model: nn.Module) -> str:
    """ "parallel" for GPT-NeoX layers with ``use_parallel_residual`` (one boundary per layer),
    "sequential" otherwise (two boundaries per layer, h_L and m_L)."""
    config = text_config(model)
    return "parallel" if _is_parallel(config) else "sequential"


def _is_parallel(config) -> bool:
    return getattr(config, "model_type", None) == "gpt_neox" and bool(getattr(config, "use_parallel_residual", True))


def readout_scale(model: nn.Module) -> float | None:
    """Granite's ``logits_scaling`` s (logits = lm_head(·) / s), None for the families without one."""
    scale = getattr(text_config(model), "logits_scaling", None)
    return None if scale in (None, 1, 1.0) else float(scale)


def unembed_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits from a raw residual state: ``softcap(lm_head(final_norm(h)) / s)``.

    ``s`` is Granite's ``logits_scaling`` (:func:`readout_scale`; 1 elsewhere).

    ``softcap(z) = c · tanh(z / c)`` with ``c = config.final_logit_softcapping`` where the family
    has one (Gemma), identity otherwise. This is exactly the model's own readout, so the logit
    lens at the last layer reproduces the model's logits.
    """
    logits = model.get_output_embeddings()(final_norm(model)(hidden))
    scale = readout_scale(model)
    if scale is not None:  # Granite: logits / logits_scaling
        logits = logits / scale
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if cap is None and hasattr(model.config, "get_text_config"):
        cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@torch.no_grad()
def residual_states(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Raw residual stream entering every layer, plus the last layer's raw output.

    Returns a tensor of shape (B, n_layers + 1, T, d): index L < n_layers is the state entering
    layer L (L = 0: embedding output), index n_layers is the last layer's output *before* the
    final norm (HF's ``hidden_states[-1]`` is after the final norm, so it is not used).
    Hook-based (runs HF's own forward); :func:`boundary_states` is the sublayer-split version.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    layers = decoder_layers(model)
    captured: list[torch.Tensor | None] = [None] * (len(layers) + 1)
    handles = []

    def pre_hook(index: int):
        def hook(_module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            captured[index] = h.detach()

        return hook

    def post_hook(_module, _args, output):
        out = output[0] if isinstance(output, tuple) else output
        captured[-1] = out.detach()

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre_hook(i), with_kwargs=True))
    handles.append(layers[-1].register_forward_hook(post_hook))
    try:
        model(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    # a model placed across GPUs leaves each state on its layer's GPU: gathered where the ids are
    return torch.stack([x.to(input_ids.device) for x in captured], dim=1)


def text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def n_layers(model: nn.Module) -> int:
    """Number of decoder layers that run (``config.num_hidden_layers``)."""
    return text_config(model).num_hidden_layers


def hidden_size(model: nn.Module) -> int:
    """Residual width d."""
    return text_config(model).hidden_size
