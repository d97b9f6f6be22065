"""A model split into its sublayers: which family it is (or why it is refused), the adapter per
decoder layer, the embedded input and its sequence context, and the states at every boundary."""

from __future__ import annotations

import pkgutil

import torch
from torch import nn

from resdyn.lm.families import FAMILIES, REMOTE_CODE_KEY, SUPPORTED_FAMILIES, refusal
from resdyn.lm.structure import (
    decoder_layers,
    input_device,
    n_layers,
    text_config,
    text_model,
)
from resdyn.lm.sublayers import KV, LayerSublayers, SequenceContext


def supported_list() -> str:
    return ", ".join(SUPPORTED_FAMILIES)


#: The family name of models split by the generic path (:mod:`resdyn.lm.generic`).
GENERIC = "generic"


def use_generic(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Mark ``model`` to be split by the generic path (config ``family: generic``): any decoder
    layer that matches a template, self-checked against autograd before its Jacobians are used."""
    model._resdyn_generic = enabled
    return model


def family(model: nn.Module) -> str:
    """The sublayer family of a causal LM: a key of :data:`resdyn.lm.families.FAMILIES`.

    Raises ValueError naming the model type, why (known unsupported designs: MoE,
    encoder-decoder, parallel residuals without an adapter, refused settings, remote code) with
    the nearest supported family, and listing the supported families, when the model cannot be
    split into attention/MLP halves of a single d-dimensional residual stream.
    """
    config = text_config(model)
    model_type = getattr(config, "model_type", None)
    outer_type = getattr(getattr(model, "config", None), "model_type", None)
    remote = bool(getattr(getattr(model, "config", None), REMOTE_CODE_KEY, None))
    settings = dict(vars(config))
    generic = bool(getattr(model, "_resdyn_generic", False))
    reason = refusal(model_type, outer_type, settings, remote_code=remote, generic=generic)
    if reason:
        raise ValueError(reason)
    if generic:
        return GENERIC
    from resdyn.lm.families import family_of_type

    found = family_of_type(model_type, outer_type)
    expected_layer = FAMILIES[found].layer_class
    layers = decoder_layers(model)
    bad = sorted({type(layer).__name__ for layer in layers} - {expected_layer})
    if bad:
        # Same model type, different code (e.g. trust_remote_code): the split would be a guess.
        raise ValueError(
            f"model type {model_type!r}: decoder layers are {bad}, expected {expected_layer!r} "
            f"(transformers' implementation); supported families: {supported_list()}"
        )
    return found


@torch.no_grad()
def prepare(model: nn.Module, input_ids: torch.Tensor) -> SequenceContext:
    """Embed a (B, T) batch of token ids and build its :class:`SequenceContext`."""
    fam = family(model)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    stack = text_model(model)
    device = input_device(model)
    input_ids = input_ids.to(device)
    # Multimodal wrappers (Gemma 4) splice encoder features in at placeholder tokens; the split
    # here is for text, so refuse those ids rather than embed them as words.
    placeholders = {
        name: getattr(model.config, name)
        for name in ("image_token_id", "video_token_id", "audio_token_id")
        if isinstance(getattr(model.config, name, None), int)
    }
    present = sorted(name for name, tid in placeholders.items() if bool((input_ids == tid).any()))
    if present:
        raise ValueError(
            f"input_ids contain multimodal placeholder tokens ({', '.join(present)}); only text inputs are supported"
        )
    positions = torch.arange(input_ids.shape[1], device=device)[None]
    if fam == GENERIC:  # h_0 and every module's arguments as HF's own forward makes them
        from resdyn.lm import generic

        layers = decoder_layers(model)[: n_layers(model)]
        layer_calls, attn_calls = generic.capture_calls(model, input_ids, list(layers))
        h0 = layer_calls[0][0][0] if layer_calls[0][0] else layer_calls[0][1]["hidden_states"]
        return SequenceContext(fam, stack, positions, h0, None, layer_calls=layer_calls, attn_calls=attn_calls)
    embeddings = model.get_input_embeddings()(input_ids)
    if fam == "gpt2":  # learned absolute positions, added as GPT2Model does
        embeddings = embeddings + stack.wpe(positions)
    embeddings = adapter_class(fam).scale_embeddings(stack, embeddings)
    per_layer = None
    if fam == "gemma4" and getattr(stack, "hidden_size_per_layer_input", 0):
        # Token-identity part plus the projection of the embedding (HF's own two methods).
        per_layer = stack.project_per_layer_inputs(embeddings, stack.get_per_layer_inputs(input_ids, embeddings))
    return SequenceContext(fam, stack, positions, embeddings, per_layer)


def adapter_class(fam: str) -> type[LayerSublayers]:
    """The :class:`LayerSublayers` subclass of a family, imported from the module its
    :data:`resdyn.lm.families.FAMILIES` entry names."""
    return pkgutil.resolve_name(FAMILIES[fam].adapter)


def sublayers(model: nn.Module) -> list[LayerSublayers]:
    """One :class:`LayerSublayers` per decoder layer, in order (sublayer s = 2L attn, 2L+1 mlp);
    :class:`resdyn.lm.generic.GenericSublayers` for a model marked by :func:`use_generic`.

    Raises ValueError for unsupported families (see :func:`family`)."""
    fam = family(model)
    config = text_config(model)
    layers = decoder_layers(model)[: config.num_hidden_layers]
    if fam == GENERIC:
        from resdyn.lm import generic

        probe = (torch.arange(8, device=input_device(model)) % config.vocab_size)[None]
        return generic.generic_sublayers(model, list(layers), probe)
    cls = adapter_class(fam)
    return [cls(layer, i, fam, config) for i, layer in enumerate(layers)]


def forward_boundaries(adapters: list[LayerSublayers], ctx: SequenceContext, upto: int | None = None) -> torch.Tensor:
    """Run the sublayers from h_0 = ``ctx.embeddings`` through layer ``upto`` (inclusive; default
    the last) and return (B, 2·(upto+1)+1, T, d): index 2L = h_L, 2L+1 = m_L, last = raw output
    of layer ``upto``. Keys/values of layers that others reuse (Gemma 4) are kept on the way.
    For parallel-residual layers index 2L+1 holds the virtual m_L = h_L + A (module docstring)."""
    last = len(adapters) - 1 if upto is None else upto
    sources = {a.kv_source for a in adapters if a.kv_source != a.index}
    stored: dict[int, KV] = {}
    h = ctx.embeddings
    states = [h]
    for adapter in adapters[: last + 1]:
        if adapter.index in sources:
            stored[adapter.index] = adapter.kv(h, ctx)
        m, h = adapter.layer_forward(h, ctx, kv=stored.get(adapter.kv_source))
        states += [m, h]
    return torch.stack([x.to(h.device) for x in states], dim=1)  # gathered with the last layer


@torch.no_grad()
def boundary_states(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Residual states at every sublayer boundary, computed through the sublayer split.

    input_ids (T,) -> (2·n_layers + 1, T, d); (B, T) -> (B, 2·n_layers + 1, T, d), in the
    model's dtype. Index 2L = h_L (entering layer L; 0 = embeddings), 2L + 1 = m_L (pre-MLP of
    layer L), last = the last layer's raw output (before the final norm). Update norms follow
    as Δ_attn = m_L − h_L and Δ_mlp = h_{L+1} − m_L. Equals :func:`residual_states` at even
    indices.
    """
    squeeze = input_ids.dim() == 1
    ids = input_ids[None] if squeeze else input_ids
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be (T,) or (B, T), got shape {tuple(input_ids.shape)}")
    ctx = prepare(model, ids)
    states = forward_boundaries(sublayers(model), ctx)
    return states[0] if squeeze else states
