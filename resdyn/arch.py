"""Architecture adapters: where a decoder's layers, final norm and unembedding live.

(Stub written by the lead so that other modules can rely on these names; the sublayer split
per family is added alongside.)
"""

from __future__ import annotations

import torch
from torch import nn


def text_model(model: nn.Module) -> nn.Module:
    """The decoder stack (the module holding ``layers``, ``norm`` and ``embed_tokens``)."""
    inner = getattr(model, "model", model)
    # Multimodal wrappers (e.g. Gemma 4 ConditionalGeneration) nest the text stack one deeper.
    if not hasattr(inner, "layers") and hasattr(inner, "language_model"):
        inner = inner.language_model
    if not hasattr(inner, "layers"):
        raise ValueError(f"{type(model).__name__}: cannot find the decoder layers (no .model.layers)")
    return inner


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ordered decoder layers of a causal LM."""
    return text_model(model).layers


def final_norm(model: nn.Module) -> nn.Module:
    """The final normalisation applied before the unembedding."""
    return text_model(model).norm


def unembed_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits from a raw residual state: ``softcap(lm_head(final_norm(h)))``.

    ``softcap(z) = c · tanh(z / c)`` with ``c = config.final_logit_softcapping`` where the family
    has one (Gemma), identity otherwise. This is exactly the model's own readout, so the logit
    lens at the last layer reproduces the model's logits.
    """
    logits = model.get_output_embeddings()(final_norm(model)(hidden))
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
    return torch.stack(captured, dim=1)
