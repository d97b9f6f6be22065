"""The generic path: split any standard decoder layer by a detected template and differentiate
it through the HF modules themselves (forward mode), self-checked against reverse mode.

Template (detected from one forward of the HF layer, with hooks on its direct children): which
child is the self-attention (called with ``position_embeddings`` or named ``*Attention``), which
the MLP (``*MLP``/``*FeedForward``/``mlp``), and which norms sit where, from the data flow (a
norm whose output IS the attention's input is ``attn_pre``; one whose input IS the attention's
output is ``attn_post``; likewise ``mlp_pre``/``mlp_post``)::

    pre-norm   m = h + r·A(n1(h))          h' = m + r·F(n2(m))
    post-norm  m = h + r·n1(A(h))          h' = m + r·n2(F(m))
    sandwich   m = h + r·n1b(A(n1a(h)))    h' = m + r·n2b(F(n2a(m)))
    parallel   h' = h + A(n1(h)) + F(n2(h))   (n2 reads the layer input itself)

(r: a ``residual_multiplier`` attribute of the layer, 1 if absent.) Per token t, with every
other position frozen exactly as in the hand-written engines, the attention half is the HF
attention module called on the single position t: its query, key and value come from x, and a
frozen cache object hands it the keys/values HF's own module computed for the positions t sees
(read off HF's mask row t), so RoPE, q/k norms, soft-capping, GQA and the scale are whatever HF's
module does. The MLP half is per token already. Jacobians: ``torch.func.jvp`` batched over the d
input directions with ``vmap`` (:func:`resdyn.study_a.jacobian.forward_jacobian`).

Before use, :func:`self_check` compares, on one position, the template's forward with HF's layer
(m_L and h_{L+1}) and ``uᵀ J`` of the forward-mode Jacobians with reverse-mode autograd through
HF's own decoder layer for a few random u (the attention half and the whole layer); a miss is
one ValueError with the error in numbers. A layer that matches no template is refused the same way.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from resdyn.lm.sublayers import LayerSublayers

#: Relative tolerance of the self-check (fp32 arithmetic on both sides, different op order).
SELF_CHECK_RTOL = 1e-4
#: Random probe vectors u of the reverse-mode self-check (uᵀ J rows).
SELF_CHECK_PROBES = 4
#: Keyword under which HF attention modules take a KV cache, by transformers version/family.
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


@dataclass(frozen=True)
class Template:
    """Names of a decoder layer's children per role (None: absent) and its residual layout."""

    attention: str
    mlp: str
    attn_pre: str | None
    attn_post: str | None
    mlp_pre: str | None
    mlp_post: str | None
    parallel: bool
    branch_scale: float = 1.0

    @property
    def kind(self) -> str:
        if self.parallel:
            return "parallel"
        if self.attn_pre and self.attn_post:
            return "sandwich"
        return "pre-norm" if self.attn_pre else "post-norm"


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def _is_attention(name: str, module: nn.Module) -> bool:
    return "attention" in type(module).__name__.lower() or name in ("self_attn", "attn", "attention")


def _is_mlp(name: str, module: nn.Module) -> bool:
    cls = type(module).__name__.lower()
    return "mlp" in cls or "feedforward" in cls or name in ("mlp", "feed_forward", "ffn")


def detect_template(layer: nn.Module, call: tuple) -> Template:
    """The layer's :class:`Template` from one HF forward of it.

    ``call`` is the (args, kwargs) HF's model passed the layer, as captured by
    :func:`capture_calls`. The roles come from the children's names and classes, the norms'
    slots from the data flow of that forward. ValueError (one line) when no template fits.
    """
    children = dict(layer.named_children())
    log, h = _record_children(layer, call, children)
    where = f"decoder layer {type(layer).__name__}"
    attn_name, mlp_name = _find_roles(where, children, log)
    _check_hidden_states_only(where, children, [mlp_name, *(n for n, _, _ in log if _is_norm(children[n]))])
    calls = {n: (x, out[0] if isinstance(out, tuple) else out) for n, x, out in log}
    norms = [n for n, _, _ in log if _is_norm(children[n])]
    slot = _norm_slots(where, calls, norms, attn_name, mlp_name)
    mlp_reads = calls[slot["mlp_pre"]][0] if slot["mlp_pre"] else calls[mlp_name][0]
    scale = getattr(layer, "residual_multiplier", 1.0)
    return Template(
        attn_name,
        mlp_name,
        slot["attn_pre"],
        slot["attn_post"],
        slot["mlp_pre"],
        slot["mlp_post"],
        parallel=mlp_reads is h,
        branch_scale=float(scale),
    )


def _record_children(
    layer: nn.Module, call: tuple, children: dict[str, nn.Module]
) -> tuple[list[tuple[str, object, object]], torch.Tensor]:
    """(log, h): one no-grad forward of ``layer`` on ``call`` with a hook on every direct child.

    ``log`` holds (child name, its first input, its output) in call order; ``h`` is the layer's
    input hidden states (the tensor a parallel layer's MLP norm reads itself).
    """
    log: list[tuple[str, object, object]] = []

    def first_input(args: tuple, kwargs: dict):
        if args:
            return args[0]
        return kwargs.get("hidden_states", next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None))

    handles = [
        module.register_forward_hook(
            lambda _m, args, kwargs, out, name=name: log.append((name, first_input(args, kwargs), out)),
            with_kwargs=True,
        )
        for name, module in children.items()
    ]
    h = call[0][0] if call[0] else call[1]["hidden_states"]
    try:
        with torch.no_grad():
            _call_layer(layer, call, h)
    finally:
        for handle in handles:
            handle.remove()
    return log, h


def _find_roles(where: str, children: dict[str, nn.Module], log: list[tuple[str, object, object]]) -> tuple[str, str]:
    """(attention, MLP) child names among the children called; ValueError unless there is one of each.

    Every other child called must be a norm or a dropout.
    """
    attn = [n for n, _, _ in log if _is_attention(n, children[n])]
    mlp = [n for n, _, _ in log if _is_mlp(n, children[n]) and n not in attn]
    unknown = sorted(
        {
            n
            for n, _, _ in log
            if n not in attn + mlp and not _is_norm(children[n]) and not isinstance(children[n], nn.Dropout)
        }
    )
    if len(set(attn)) != 1 or len(set(mlp)) != 1 or unknown:
        raise ValueError(
            f"{where} matches no generic template (pre-norm, post-norm, sandwich, parallel): found attention "
            f"{sorted(set(attn))}, MLP {sorted(set(mlp))}, other sublayers {unknown} (one attention and one MLP "
            "module plus norms expected)"
        )
    return attn[0], mlp[0]


def _check_hidden_states_only(where: str, children: dict[str, nn.Module], names: list[str]) -> None:
    """ValueError when a child in ``names`` needs a positional argument besides the hidden states.

    Such a module (e.g. one that adds the residual inside) cannot be differentiated as one half
    of the template.
    """
    for name in names:
        required = [
            p.name
            for p in list(inspect.signature(children[name].forward).parameters.values())[1:]
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if required:
            raise ValueError(
                f"{where} matches no generic template: {name} ({type(children[name]).__name__}) takes "
                f"more than the hidden states (also {required}), e.g. a residual added inside"
            )


def _norm_slots(
    where: str, calls: dict[str, tuple[object, object]], norms: list[str], attn_name: str, mlp_name: str
) -> dict[str, str | None]:
    """{slot: norm name or None} for attn_pre, attn_post, mlp_pre and mlp_post, from the data flow.

    ``calls`` maps each child to (input, output) of the recorded forward. A norm whose output IS
    a sublayer's input sits before it; one whose input IS a sublayer's output sits after it. A
    norm in neither place is one ValueError.
    """
    attn_in, attn_out = calls[attn_name]
    mlp_in, mlp_out = calls[mlp_name]
    slot = {
        "attn_pre": next((n for n in norms if calls[n][1] is attn_in), None),
        "attn_post": next((n for n in norms if calls[n][0] is attn_out), None),
        "mlp_pre": next((n for n in norms if calls[n][1] is mlp_in), None),
        "mlp_post": next((n for n in norms if calls[n][0] is mlp_out), None),
    }
    extra = sorted(set(norms) - {v for v in slot.values() if v})
    if extra:
        raise ValueError(
            f"{where} matches no generic template: norms {extra} are neither before nor after the "
            f"attention ({attn_name}) or the MLP ({mlp_name})"
        )
    return slot


def _call_layer(layer: nn.Module, call: tuple, h: torch.Tensor):
    args, kwargs = call
    out = layer(h, *args[1:], **kwargs) if args else layer(**{**kwargs, "hidden_states": h})
    return out[0] if isinstance(out, tuple) else out


def capture_calls(model: nn.Module, input_ids: torch.Tensor, layers: list[nn.Module]) -> tuple[dict, dict]:
    """(layer calls, attention-module calls): the (args, kwargs) HF's forward passes each decoder
    layer and each layer's attention module (use_cache=False), keyed by layer index."""
    layer_calls: dict[int, tuple] = {}
    attn_calls: dict[int, tuple] = {}
    handles = []
    for i, layer in enumerate(layers):
        handles.append(
            layer.register_forward_pre_hook(
                lambda _m, a, k, i=i: layer_calls.__setitem__(i, (a, dict(k))), with_kwargs=True
            )
        )
        for name, child in layer.named_children():
            if _is_attention(name, child):
                handles.append(
                    child.register_forward_pre_hook(
                        lambda _m, a, k, i=i: attn_calls.__setitem__(i, (a, dict(k))), with_kwargs=True
                    )
                )
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return layer_calls, attn_calls


class _FrozenKV:
    """A cache stand-in: ``update`` returns the frozen keys/values followed by the new ones
    (keys (1, Hkv, S, hd)); ``record`` mode returns its input and keeps a copy."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        self.keys, self.values = keys, values

    def update(self, key_states, value_states, *_args, **_kwargs):
        if self.keys is None:  # recording
            self.recorded = (key_states, value_states)
            return key_states, value_states
        return torch.cat((self.keys, key_states), dim=-2), torch.cat((self.values, value_states), dim=-2)

    def get_seq_length(self, *_args) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]


def cast_call(call: tuple, dtype: torch.dtype, device: torch.device | None = None) -> tuple:
    """A captured (args, kwargs) call with its floating tensors (cos/sin, masks) in ``dtype``
    (the engine differentiates fp32 copies of bf16 layers) and, given ``device``, every tensor
    there (a model placed by layer across GPUs: HF captured the call on the previous layer's
    device); the hidden states (args[0]) dropped from neither: callers pass their own."""

    def cast(v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.to(device=device, dtype=dtype)
        if isinstance(v, torch.Tensor):
            return v if device is None else v.to(device)
        return tuple(cast(x) for x in v) if isinstance(v, tuple) else v

    args, kwargs = call
    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _slice_positions(value, t: int, length: int):
    """Position-indexed tensors of an attention call cut to position t (cos/sin, position ids)."""
    if isinstance(value, torch.Tensor) and value.dim() >= 3 and value.shape[-2] == length:
        return value[..., t : t + 1, :]  # cos/sin (B, T, r)
    if isinstance(value, torch.Tensor) and value.dim() in (1, 2) and value.shape[-1] == length:
        return value[..., t : t + 1]  # position ids (B, T), cache positions (T,)
    if isinstance(value, tuple):
        return tuple(_slice_positions(v, t, length) for v in value)
    return value


class GenericSublayers:
    """The two halves of one decoder layer, through its HF modules (:class:`Template`).

    Same interface as :class:`resdyn.lm.sublayers.LayerSublayers` where the engines use it
    (``layer_forward``, ``attn_token_fn``, ``mlp_token_fn``, ``attn_update_token_fn``,
    ``layer_token_fn``, ``to_float32``); it has no explicit projections, so the Jacobian engine
    differentiates it by forward mode through the whole per-token function.
    """

    generic = True
    shares_kv = False
    window = None

    def __init__(self, layer: nn.Module, index: int, template: Template) -> None:
        self.layer = layer
        self.index = index
        self.kv_source = index
        self.template = template
        self.parallel = template.parallel
        self.family = "generic"
        attention = getattr(layer, template.attention)
        params = inspect.signature(attention.forward).parameters
        found = [k for k in _CACHE_KWARGS if k in params]
        if not found:
            raise ValueError(
                f"generic path: {type(attention).__name__}.forward takes no KV cache argument "
                f"({', '.join(_CACHE_KWARGS)}), so other positions' keys/values cannot be frozen"
            )
        self.cache_kwarg = found[0]

    def __repr__(self) -> str:
        return f"GenericSublayers(index={self.index}, template={self.template})"

    @property
    def n_heads(self) -> int:
        attention = getattr(self.layer, self.template.attention)
        config = getattr(attention, "config", None)
        return int(getattr(config, "num_attention_heads", 1))

    def to_float32(self) -> GenericSublayers:
        tensors = [*self.layer.parameters(), *(b for b in self.layer.buffers() if b.is_floating_point())]
        if all(x.dtype == torch.float32 for x in tensors):
            return self
        return GenericSublayers(copy.deepcopy(self.layer).float(), self.index, self.template)

    # -- pieces ----------------------------------------------------------------------------

    def _apply(self, slot: str, x: torch.Tensor) -> torch.Tensor:
        name = getattr(self.template, slot)
        return x if name is None else getattr(self.layer, name)(x)

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        r = self.template.branch_scale
        return x if r == 1.0 else x * r

    def _attention(self, n: torch.Tensor, call: tuple, **overrides) -> torch.Tensor:
        args, kwargs = call
        kwargs = {**kwargs, **overrides}
        kwargs.pop("hidden_states", None)
        kwargs[self.cache_kwarg] = overrides.get(self.cache_kwarg)
        out = getattr(self.layer, self.template.attention)(n, *args[1:], **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        """r · n_post(F(n_pre(x))): the MLP branch without the residual."""
        return self._scale(self._apply("mlp_post", getattr(self.layer, self.template.mlp)(self._apply("mlp_pre", x))))

    def _attn_call(self, ctx, like: torch.Tensor) -> tuple:
        """HF's captured attention call of this layer in the dtype and on the device of ``like``."""
        return cast_call(ctx.attn_calls[self.index], like.dtype, like.device)

    # -- full sequence ---------------------------------------------------------------------

    #: where the layer's weights are, and (h, ctx, kv) moved there: the hand-written adapters' own
    device = LayerSublayers.device
    placed = LayerSublayers.placed

    def attn_update(self, h: torch.Tensor, ctx, kv=None) -> torch.Tensor:
        """r · n_post(A(n_pre(h))) (B, T, d), HF's attention module on the whole sequence."""
        return self._scale(
            self._apply("attn_post", self._attention(self._apply("attn_pre", h), self._attn_call(ctx, h)))
        )

    def layer_forward(self, h: torch.Tensor, ctx, kv=None):
        """h_L (B, T, d) -> (m_L, h_{L+1}) on this layer's device (:meth:`placed`); parallel layers:
        the virtual m_L = h + A."""
        h, ctx, _ = self.placed(h, ctx)
        a = self.attn_update(h, ctx)
        if self.parallel:
            return h + a, self.mlp_branch(h) + a + h
        m = h + a
        return m, m + self.mlp_branch(m)

    # -- one position, the rest frozen -----------------------------------------------------

    def _frozen(self, h: torch.Tensor, t: int, ctx) -> tuple[_FrozenKV, dict]:
        """The frozen keys/values position t attends to besides itself, and the call overrides."""
        length = h.shape[0]
        if not 0 <= t < length:
            raise ValueError(f"position {t} outside the sequence (length {length})")
        args, kwargs = self._attn_call(ctx, h)
        recorder = _FrozenKV()
        with torch.no_grad():
            self._attention(self._apply("attn_pre", h[None]), (args, kwargs), **{self.cache_kwarg: recorder})
        keys, values = recorder.recorded  # (1, Hkv, T, hd)
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            row = mask[0, 0, t, :length]
            seen = (row > torch.finfo(row.dtype).min / 2) if row.is_floating_point() else row.bool()
        else:  # no mask given: HF's module is causal by itself
            seen = torch.arange(length, device=h.device) <= t
        seen = seen.clone()
        seen[t] = False
        index = seen.nonzero().flatten()
        frozen = _FrozenKV(keys[:, :, index].detach(), values[:, :, index].detach())
        overrides = {
            key: _slice_positions(value, t, length)
            for key, value in kwargs.items()
            if key not in ("attention_mask", self.cache_kwarg)
        }
        overrides["attention_mask"] = torch.zeros(1, 1, 1, len(index) + 1, dtype=h.dtype, device=h.device)
        overrides[self.cache_kwarg] = frozen
        return frozen, overrides

    def attn_update_token_fn(self, h: torch.Tensor, t: int, ctx, kv=None):
        """x (d,) -> r · n_post(A(n_pre(x)))[t] with the other positions' keys/values frozen."""
        frozen, overrides = self._frozen(h, t, ctx)
        args = self._attn_call(ctx, h)[0]

        def fn(x: torch.Tensor) -> torch.Tensor:
            n = self._apply("attn_pre", x)[None, None]
            frozen_call = {**overrides, self.cache_kwarg: _FrozenKV(frozen.keys, frozen.values)}
            out = self._attention(n, (args, {}), **frozen_call)[0, 0]
            return self._scale(self._apply("attn_post", out))

        return fn

    def attn_token_fn(self, h: torch.Tensor, t: int, ctx, kv=None):
        update = self.attn_update_token_fn(h, t, ctx)
        return lambda x: x + update(x)

    def mlp_token_fn(self, m: torch.Tensor, t: int, ctx):
        return lambda x: x + self.mlp_branch(x)

    def layer_token_fn(self, h: torch.Tensor, t: int, ctx):
        attn = self.attn_update_token_fn(h, t, ctx)
        return lambda x: self.mlp_branch(x) + attn(x) + x


def generic_sublayers(model: nn.Module, layers: list[nn.Module], input_ids: torch.Tensor) -> list[GenericSublayers]:
    """One :class:`GenericSublayers` per layer, templates detected on ``input_ids`` (1, T)."""
    layer_calls, _ = capture_calls(model, input_ids, layers)
    return [GenericSublayers(layer, i, detect_template(layer, layer_calls[i])) for i, layer in enumerate(layers)]


def _hf_m_and_out(adapter: GenericSublayers, call: tuple, h: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(m_L, h_{L+1}) of HF's own layer on h (1, T, d): m read at the input of the MLP-side module."""
    template = adapter.template
    receiver = getattr(adapter.layer, template.mlp_pre or template.mlp)
    box = {}
    handle = receiver.register_forward_pre_hook(lambda _m, args: box.__setitem__("m", args[0]))
    try:
        out = _call_layer(adapter.layer, call, h)
    finally:
        handle.remove()
    return (None if template.parallel else box["m"]), out


def self_check(
    adapter: GenericSublayers,
    h: torch.Tensor,
    t: int,
    ctx,
    call: tuple,
    jac_attn: torch.Tensor,
    jac_layer: torch.Tensor,
    seed: int = 0,
) -> dict[str, float]:
    """Relative errors of the template against HF's layer at position t (raises ValueError above
    :data:`SELF_CHECK_RTOL`): forward m_L and h_{L+1} over the sequence, and ``uᵀ J`` of the
    attention half (sequential layers) and of the whole layer by reverse-mode autograd through
    HF's decoder layer, u random (:data:`SELF_CHECK_PROBES` of them)."""
    errors = {}
    with torch.no_grad():
        m_gen, out_gen = adapter.layer_forward(h[None], ctx)
        m_hf, out_hf = _hf_m_and_out(adapter, call, h[None])
    errors["forward h'"] = float((out_gen - out_hf).abs().max() / out_hf.abs().max().clamp_min(1e-30))
    if m_hf is not None:
        errors["forward m"] = float((m_gen - m_hf).abs().max() / m_hf.abs().max().clamp_min(1e-30))
    gen = torch.Generator().manual_seed(seed)
    probes = torch.randn(SELF_CHECK_PROBES, h.shape[-1], generator=gen).to(h)

    def rows(read_m: bool) -> torch.Tensor:
        out = []
        for u in probes:
            x = h.detach().clone().requires_grad_(True)
            with torch.enable_grad():
                m, y = _hf_m_and_out(adapter, call, x[None])
                target = (m if read_m else y)[0, t]
                (grad,) = torch.autograd.grad(target @ u, x)
            out.append(grad[t])
        return torch.stack(out)

    checks = [("layer uᵀJ", False, jac_layer)]
    if not adapter.parallel:
        checks.insert(0, ("attention uᵀJ", True, jac_attn))
    for name, read_m, jac in checks:
        reference = rows(read_m)
        errors[name] = float((probes @ jac - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
    bad = {k: v for k, v in errors.items() if not v <= SELF_CHECK_RTOL}
    if bad:
        shown = ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
        raise ValueError(
            f"generic path self-check failed on layer {adapter.index} ({type(adapter.layer).__name__}, template "
            f"{adapter.template.kind}) at position {t}: relative errors {shown} (tolerance {SELF_CHECK_RTOL:.0e}); "
            "the layer does not follow the detected template, write an adapter (docs/architectures.md)"
        )
    return errors
