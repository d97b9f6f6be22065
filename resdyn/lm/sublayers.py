"""Architecture adapters: where a decoder's layers, final norm and unembedding live, and how
each decoder layer splits into two ordered sublayers.

Boundaries (docs/design.md, "Sublayers and boundaries"). Layer L reads ``h_L`` (pre-attention
boundary) and its attention half writes ``m_L`` (pre-MLP boundary); the MLP half maps
``m_L -> h_{L+1}``. Per family (``n(.)`` an RMSNorm module of the layer, ``A`` self-attention
on the whole sequence, ``F`` the gated MLP ``down(act(gate(x)) * up(x))``):

=========================  =====================================  ==========================================
family                     attention half  h -> m                 MLP half  m -> h'
=========================  =====================================  ==========================================
llama, mistral, qwen2      m = h + A(n_in(h))                     h' = m + F(n_post_attn(m))
olmo2, olmo3 (post-norm)   m = h + n_post_attn(A(h))              h' = m + n_post_ff(F(m))
gemma4 (sandwich)          m = h + n_post_attn(A(n_in(h)))        y = m + n_post_ff(F(n_pre_ff(m)));
                                                                  y = y + n_ple(P(act(G(y)) * e_L));
                                                                  h' = layer_scalar * y
gpt2                       m = h + A(ln_1(h))                     h' = m + F(ln_2(m))
gpt_neox (sequential)      m = h + A(ln_in(h))                    h' = m + F(ln_post_attn(m))
=========================  =====================================  ==========================================

GPT-2 and GPT-NeoX use LayerNorm with bias and a plain MLP ``F(x) = W_2 act(W_1 x + b_1) + b_2``;
GPT-2's projections are Conv1D (weights stored transposed), GPT-NeoX's fused ``query_key_value``
interleaves q/k/v per head and rotates only the first ``partial_rotary_factor`` (Pythia's
``rotary_pct``) of each head; GPT-2's positions are learned and added to the token embedding.

Parallel residual (GPT-NeoX with ``use_parallel_residual=True``, i.e. Pythia; docs/design.md,
"Parallel-residual layers"): ``h' = h + A(ln_in(h)) + F(ln_post_attn(h))``. Both branches read
h_L, so the layer has ONE boundary, h_L, and one operator, the layer Jacobian
``J_L = I + J_A + J_F`` (``J_A = ∂A(ln_in(h))/∂h``, ``J_F = ∂F(ln_post_attn(h))/∂h``, the branch
Jacobians). In the boundary-state array the pre-MLP slot of a parallel layer holds the virtual
state ``m_L = h_L + A(ln_in(h_L))``: not a boundary (no sublayer reads it), but it makes the
update vectors Δ_attn = m_L − h_L and Δ_mlp = h_{L+1} − m_L the two branch outputs, so update
norms and ratios keep their meaning. :func:`resdyn.lm.structure.residual_kind` tells the two designs apart.

(``e_L``: Gemma 4's per-layer input of layer L, a function of the token ids and the embedding
only, hence a constant of the MLP half; ``G``/``P`` its gate and projection.) Attention details
per family: Qwen2 q/k/v biases (carried by the projection modules); OLMo 2/3 RMSNorm over the
full q and k width before the head split; Gemma 4 per-head q/k RMSNorm, an unscaled per-head
v-norm, attention scale 1, optional ``attention_k_eq_v`` (v from the raw k projection) and
KV-shared layers that attend over the keys/values of the last non-shared layer of the same
layer type. Sliding-window layers (Mistral, Qwen2 and OLMo 3 ``sliding_attention`` layers, Gemma
4 sliding layers) let query ``t`` see keys ``s`` with ``t - window < s <= t``; full layers see
``s <= t``. Masks are always built here, explicitly (HF's eager attention is not causal when it
is given ``attention_mask=None``).

The sublayers are built from the layer's own HF submodules (norms, projections, MLP, rotary
tables); only the attention core (scores, mask, softmax in fp32 then cast back, weighted values,
as HF's eager path does) is written here, so the composition reproduces HF's eager forward bit
for bit in fp32 and bf16, and its sdpa forward to that kernel's rounding. Families whose
residual is not a single d-vector (Gemma 3n AltUp), whose halves run in parallel without an
adapter (GPT-J, Phi-1/2, Falcon; GPT-NeoX has one), MoE blocks, encoder-decoders, remote code
and unknown families are refused with a one-line ValueError (:func:`resdyn.lm.families.refusal`).

This module holds the attention core and :class:`LayerSublayers`, the split of a Llama-style
layer, which Llama, Mistral and Qwen2 use as it is. The family table
:data:`resdyn.lm.families.FAMILIES` names each family's adapter class; the others subclass this
one in ``resdyn/lm/adapters/<module>.py``. :mod:`resdyn.lm.decompose` picks the adapter of a model;
a model marked by :func:`resdyn.lm.decompose.use_generic` is split by :mod:`resdyn.lm.generic`
instead (any standard layer).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class SequenceContext:
    """What a layer needs besides its input state, for one batch of token sequences.

    ``embeddings`` (B, T, d) is h_0 in the model's dtype. ``per_layer_inputs`` (B, T, n_layers,
    p) is Gemma 4's per-layer input (None for other families). Rotary tables are computed on
    demand per (layer type, dtype) by the model's own rotary module, as (cos, sin) of shape
    (1, T, head_dim).
    """

    family: str
    stack: nn.Module
    position_ids: torch.Tensor
    embeddings: torch.Tensor
    per_layer_inputs: torch.Tensor | None
    _rope: dict = field(default_factory=dict)
    #: generic path: the (args, kwargs) HF passed each layer and each attention module, by layer
    layer_calls: dict | None = None
    attn_calls: dict | None = None
    _views: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.position_ids.shape[-1]

    def rope(self, layer_type: str | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (1, T, head_dim), as the model's rotary module returns them for
        activations of ``dtype`` (Llama-style modules cast to it, OLMo keeps fp32)."""
        key = (layer_type, dtype)
        if key not in self._rope and self.family == "gpt2":  # learned positions: no rotation
            empty = torch.zeros(1, self.length, 0, dtype=dtype, device=self.position_ids.device)
            self._rope[key] = (empty, empty)
        if key not in self._rope:
            dummy = torch.empty(0, dtype=dtype, device=self.position_ids.device)
            rotary = self.stack.rotary_emb
            if "layer_type" in inspect.signature(rotary.forward).parameters:  # per-layer-type tables
                cos, sin = rotary(dummy, self.position_ids, layer_type)
            else:
                cos, sin = rotary(dummy, self.position_ids)
            # a model placed across GPUs runs its rotary module on the first one
            self._rope[key] = (cos.to(self.position_ids.device), sin.to(self.position_ids.device))
        return self._rope[key]

    def on(self, device: torch.device) -> SequenceContext:
        """This context for a layer on ``device`` (a model placed by layer across GPUs,
        :func:`resdyn.lm.models.load_model`): position ids and per-layer inputs moved there
        once and cached, with their own rotary tables; itself when already there."""
        if self.position_ids.device == device:
            return self
        if device not in self._views:
            per_layer = None if self.per_layer_inputs is None else self.per_layer_inputs.to(device)
            self._views[device] = SequenceContext(
                self.family,
                self.stack,
                self.position_ids.to(device),
                self.embeddings,
                per_layer,
                layer_calls=self.layer_calls,
                attn_calls=self.attn_calls,
            )
        return self._views[device]

    def per_layer_input(self, layer: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Gemma 4's per-layer input of ``layer``, (B, T, p) in ``dtype``; None elsewhere."""
        if self.per_layer_inputs is None:
            return None
        return self.per_layer_inputs[:, :, layer, :].to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension split in halves (HF's RoPE convention)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` over heads: x (..., H, hd), cos/sin (..., r); result in
    x's dtype (OLMo's fp32 tables promote, then cast back, exactly as HF does). Partial rotary
    (GPT-NeoX, r < hd): only the first r dims of each head rotate, the rest pass; r = 0: none."""
    rot = cos.shape[-1]
    if rot == 0:
        return x
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def allowed_keys(length: int, window: int | None, device: torch.device | None = None) -> torch.Tensor:
    """Boolean (T, T) mask, True where query t may attend to key s: ``s <= t`` and, with a
    sliding window w, ``t - s < w`` (HF's ``sliding_window_overlay``)."""
    t = torch.arange(length, device=device)
    allowed = t[None, :] <= t[:, None]
    if window is not None:
        allowed &= (t[:, None] - t[None, :]) < window
    return allowed


def window_start(t: int, window: int | None) -> int:
    """First key position visible from query position t."""
    return 0 if window is None else max(0, t - window + 1)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scaling: float,
    window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Masked softmax attention as HF's eager path computes it.

    q (B, T, H, hd), k/v (B, T, Hkv, hd) with H a multiple of Hkv (query head j uses kv head
    j // (H/Hkv)); scores ``q·k * scaling`` (Gemma 2 soft-capping: ``c · tanh(scores / c)``)
    masked by :func:`allowed_keys`, softmax in fp32 then cast to q's dtype, weighted sum of v.
    Returns (B, T, H·hd).
    """
    batch, length, heads, hd = q.shape
    groups = heads // k.shape[2]
    q = q.transpose(1, 2)
    k = k.transpose(1, 2).repeat_interleave(groups, dim=1)
    v = v.transpose(1, 2).repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    mask = allowed_keys(length, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v)
    return out.transpose(1, 2).reshape(batch, length, heads * v.shape[-1])


KV = tuple[torch.Tensor, torch.Tensor]


TokenFunction = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class AttentionCore:
    """Attention of one position from its raw projections, the other positions frozen.

    ``core(q_raw, k_raw, v_raw) -> o`` (H·hd,) (``core(q_raw)`` for KV-shared layers) evaluates
    ``apply(constants, *raw)``. ``constants`` are the position's rotary tables and the score
    scale: forward mode (``torch.func.jvp``) differentiates the core fastest when they enter as
    primals with zero tangents, because a dual tensor combined with a plain tensor or a Python
    number takes PyTorch's zero-tangent path, which under ``vmap`` runs a Python decomposition
    per op (about 5x slower per op, measured). The value is the same either way.
    """

    apply: Callable[..., torch.Tensor]
    constants: tuple[torch.Tensor, ...]

    def __call__(self, *raw: torch.Tensor) -> torch.Tensor:
        return self.apply(self.constants, *raw)

    def jvp(
        self, primals: tuple[torch.Tensor, ...], tangents: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``torch.func.jvp`` of the core at the raw projections ``primals`` along ``tangents``:
        (o, ∂o), the constants entering as primals with zero tangents."""
        k = len(self.constants)
        zeros = tuple(torch.zeros_like(c) for c in self.constants)
        return torch.func.jvp(
            lambda *args: self.apply(args[:k], *args[k:]), self.constants + tuple(primals), zeros + tuple(tangents)
        )


def gated_mlp_parts(mlp: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module, int]:
    """(gate, up, down, act, 0) of a Llama-style gated MLP (see :meth:`LayerSublayers.gated_mlp`)."""
    for name in ("gate_proj", "up_proj", "down_proj", "act_fn"):
        if not hasattr(mlp, name):
            raise ValueError(f"{type(mlp).__name__} has no {name!r}: not a gated MLP down(act(gate(x)) * up(x))")
    return mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn, 0


class LayerSublayers:
    """The two sublayers of one decoder layer.

    Attributes: ``index`` (layer number), ``family``, ``layer_type`` ("full_attention" or
    "sliding_attention"), ``window`` (sliding window or None), ``kv_source`` (index of the
    layer whose keys/values this layer attends over: itself, or an earlier layer for Gemma 4
    KV-shared layers). Methods run each half on a full sequence (``attn``, ``mlp``) or give the
    per-token function of one position's state with every other position frozen
    (``attn_token_fn``, ``mlp_token_fn``), the function whose Jacobian is the sublayer Jacobian.

    The layer's structure is declared by class attributes naming its modules (None: absent):
    ``attn_pre``/``attn_post`` norms around self-attention, ``mlp_pre``/``mlp_post`` norms around
    the MLP, ``qk_norm`` ("full": RMSNorm over the whole q/k width before the head split;
    "head": per-head q/k norms and an unscaled per-head v-norm). The base class is the pre-norm
    Llama/Mistral/Qwen2 layer.
    """

    attn_pre: str | None = "input_layernorm"
    attn_post: str | None = None
    mlp_pre: str | None = "post_attention_layernorm"
    mlp_post: str | None = None
    qk_norm: str | None = None
    #: True for a parallel-residual layer (one boundary: both branches read h_L).
    parallel: bool = False
    #: attribute of the layer holding self-attention
    attention_attr: str = "self_attn"
    #: factor on each branch before its residual add (Granite's ``residual_multiplier``)
    branch_scale: float = 1.0

    def __init__(self, layer: nn.Module, index: int, fam: str, config) -> None:
        self.layer = layer
        self.index = index
        self.family = fam
        self.config = config
        self.attention = getattr(layer, self.attention_attr)
        self.head_dim: int = self._head_dim()
        self.scaling: float = float(self.attention.scaling)
        layer_types = getattr(config, "layer_types", None)
        self.layer_type: str = layer_types[index] if layer_types else "full_attention"
        self.window: int | None = self._window()
        self.kv_source: int = index
        cap = getattr(self.attention, "attn_logit_softcapping", None)
        #: attention logit soft-capping c (Gemma 2): scores -> c · tanh(scores / c); None: off
        self.softcap: float | None = None if cap is None else float(cap)
        #: False for layers without rotary positions (SmolLM3's NoPE layers)
        self.rotary: bool = bool(getattr(self.attention, "use_rope", True))

    def _head_dim(self) -> int:
        return self.attention.head_dim

    @classmethod
    def scale_embeddings(cls, stack: nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
        """h_0 from the token embeddings (B, T, d) as the family's model forward makes it (identity;
        Granite multiplies by ``embedding_multiplier``)."""
        return embeddings

    def rope(self, ctx: SequenceContext, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's (cos, sin) tables (1, T, r); r = 0 (no rotation) for NoPE layers."""
        if not self.rotary:
            empty = torch.zeros(1, ctx.length, 0, dtype=dtype, device=ctx.position_ids.device)
            return empty, empty
        return ctx.rope(self.layer_type, dtype)

    def _window(self) -> int | None:
        if self.family in ("gpt2", "gpt_neox"):
            return None
        if self.family == "mistral":
            return getattr(self.config, "sliding_window", None)
        if self.family in ("llama", "olmo2"):
            return None
        return getattr(self.config, "sliding_window", None) if self.layer_type == "sliding_attention" else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(index={self.index}, family={self.family!r}, layer_type={self.layer_type!r}, "
            f"window={self.window}, kv_source={self.kv_source})"
        )

    @property
    def shares_kv(self) -> bool:
        """True if keys/values come from an earlier layer (Gemma 4 KV sharing)."""
        return self.kv_source != self.index

    # -- dtype ------------------------------------------------------------------------------

    def to_float32(self) -> LayerSublayers:
        """This adapter over an fp32 copy of the layer (itself if the layer is already fp32).

        Jacobians are taken in fp32 even for bf16 weights (docs/design.md, Conventions)."""
        tensors = [*self.layer.parameters(), *(b for b in self.layer.buffers() if b.is_floating_point())]
        if all(x.dtype == torch.float32 for x in tensors):
            return self
        clone = copy.copy(self)
        clone.layer = copy.deepcopy(self.layer).float()
        clone.attention = getattr(clone.layer, self.attention_attr)
        return clone

    # -- building blocks --------------------------------------------------------------------

    def norm(self, slot: str) -> nn.Module | None:
        """The norm module in ``slot`` ("attn_pre", "attn_post", "mlp_pre", "mlp_post") or None."""
        name = getattr(self, slot)
        return None if name is None else getattr(self.layer, name)

    def _apply_norm(self, slot: str, x: torch.Tensor) -> torch.Tensor:
        module = self.norm(slot)
        return x if module is None else module(x)

    @property
    def n_heads(self) -> int:
        """Number of query heads H."""
        return self.projection_weights()[0].shape[0] // self.head_dim

    def projection_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(W_q, W_k, W_v) as (out, d) matrices with ``raw = W n + b`` (W_v None: v = raw k; W_k and
        W_v None for KV-shared layers, which project queries only)."""
        k_proj, v_proj = getattr(self.attention, "k_proj", None), getattr(self.attention, "v_proj", None)
        return (
            self.attention.q_proj.weight,
            None if k_proj is None else k_proj.weight,
            None if v_proj is None else v_proj.weight,
        )

    def out_proj(self, o: torch.Tensor) -> torch.Tensor:
        """The attention output projection of the concatenated heads o (..., H·hd)."""
        return self.attention.o_proj(o)

    def out_weight(self) -> torch.Tensor:
        """W_o (d, H·hd) of :meth:`out_proj` (``out_proj(o) = W_o o + b``)."""
        return self.attention.o_proj.weight

    def plain_mlp(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, nn.Module] | None:
        """(W_1 (d_ff, d), b_1, W_2 (d, d_ff), act) of a non-gated MLP ``W_2 act(W_1 u + b_1) + b_2``;
        None for the gated MLP ``down(act(gate(u)) ⊙ up(u))`` of the Llama-style families."""
        return None

    def project_q(self, n: torch.Tensor) -> torch.Tensor:
        """Raw query projection (..., H·hd) of the attention input n (..., d)."""
        return self.attention.q_proj(n)

    def project_kv(self, n: torch.Tensor) -> KV:
        """Raw key and value projections (..., Hkv·hd); Gemma 4's ``attention_k_eq_v`` layers
        (no v_proj) use the raw key as the value."""
        k = self.attention.k_proj(n)
        v_proj = getattr(self.attention, "v_proj", None)
        return k, (k if v_proj is None else v_proj(n))

    def shape_q(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Raw queries -> per-head normed (if any) and rotated queries (..., H, hd)."""
        if self.qk_norm == "full":
            q = self.attention.q_norm(q)
        q = q.unflatten(-1, (-1, self.head_dim))
        if self.qk_norm == "head":
            q = self.attention.q_norm(q)
        return apply_rope(q, cos, sin)

    def shape_kv(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """Raw keys/values -> rotated keys and values, each (..., Hkv, hd)."""
        if self.qk_norm == "full":
            k = self.attention.k_norm(k)
        k = k.unflatten(-1, (-1, self.head_dim))
        v = v.unflatten(-1, (-1, self.head_dim))
        if self.qk_norm == "head":
            k = self.attention.k_norm(k)
            v_norm = getattr(self.attention, "v_norm", None)  # Gemma 4 only
            v = v if v_norm is None else v_norm(v)
        return apply_rope(k, cos, sin), v

    def gated_mlp(self) -> tuple[nn.Module, nn.Module | None, nn.Module, nn.Module, int]:
        """The gated MLP ``down(act(gate(u)) ⊙ up(u))`` as (gate_up, None, down, act, 0) or, for a
        fused projection (Phi-3), (gate_up, None, down, act, d_ff): gate = rows [0, d_ff) of
        its output, up = rows [d_ff, 2 d_ff). Separate projections: (gate, up, down, act, 0)."""
        return gated_mlp_parts(self.layer.mlp)

    def mlp_core(self, x: torch.Tensor, per_layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """``x + s · n_post(F(n_pre(x)))`` (the whole MLP half except Gemma 4's extras; s the
        branch scale, 1 except Granite)."""
        out = self._apply_norm("mlp_post", self.layer.mlp(self._apply_norm("mlp_pre", x)))
        return x + (out if self.branch_scale == 1.0 else out * self.branch_scale)

    def mlp_fn(self, m: torch.Tensor, per_layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """MLP half on states m (..., d); ``per_layer_input`` (..., p) only for Gemma 4."""
        return self.mlp_core(m, per_layer_input)

    # -- full sequence -----------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the layer's weights are (one GPU of several when the model is placed by layer)."""
        return next(self.layer.parameters()).device

    def placed(self, h: torch.Tensor, ctx: SequenceContext, kv: KV | None = None) -> tuple:
        """(h, ctx, kv) moved to this layer's device: the activations follow the layers across
        GPUs; unchanged (no copy) on one device."""
        dev = self.device
        if h.device == dev:
            return h, ctx, kv
        return h.to(dev), ctx.on(dev), None if kv is None else tuple(x.to(dev) for x in kv)

    def kv(self, h: torch.Tensor, ctx: SequenceContext) -> KV:
        """Keys and values (B, T, Hkv, hd) this layer computes from its input h (B, T, d)."""
        h, ctx, _ = self.placed(h, ctx)
        cos, sin = self.rope(ctx, h.dtype)
        return self.shape_kv(*self.project_kv(self._apply_norm("attn_pre", h)), cos, sin)

    def attn(self, h: torch.Tensor, ctx: SequenceContext, kv: KV | None = None) -> torch.Tensor:
        """Attention half on a full sequence: h (B, T, d) -> m (B, T, d).

        ``kv`` is required for KV-shared layers (the source layer's keys/values, see ``kv``);
        otherwise keys/values come from h."""
        return h + self.attn_update(h, ctx, kv)

    def attn_update(self, h: torch.Tensor, ctx: SequenceContext, kv: KV | None = None) -> torch.Tensor:
        """The attention branch's output ``n_post(A(n_pre(h)))`` (B, T, d), added to h."""
        n = self._apply_norm("attn_pre", h)
        cos, sin = self.rope(ctx, h.dtype)
        q = self.shape_q(self.project_q(n), cos, sin)
        if self.shares_kv:
            if kv is None:
                raise ValueError(f"layer {self.index} attends over layer {self.kv_source}'s keys/values: pass kv=")
            k, v = kv
        else:
            k, v = self.shape_kv(*self.project_kv(n), cos, sin)
        out = causal_attention(q, k, v, self.scaling, self.window, self.softcap)
        return self._scale_branch(self._apply_norm("attn_post", self.out_proj(out)))

    def _scale_branch(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.branch_scale == 1.0 else out * self.branch_scale

    def mlp(self, m: torch.Tensor, ctx: SequenceContext) -> torch.Tensor:
        """MLP half on a full sequence: m (B, T, d) -> h_{L+1} (B, T, d)."""
        return self.mlp_fn(m, ctx.per_layer_input(self.index, m.dtype))

    def layer_forward(self, h: torch.Tensor, ctx: SequenceContext, kv: KV | None = None) -> KV:
        """The whole layer on a full sequence: h_L (B, T, d) -> (m_L, h_{L+1}).

        Sequential: ``m = attn(h)``, ``h' = mlp(m)``. Parallel residual: m is the virtual state
        ``h + A`` (module docstring) and ``h' = (F + A) + h`` in HF's order of additions."""
        h, ctx, kv = self.placed(h, ctx, kv)
        m = self.attn(h, ctx, kv)
        return m, self.mlp(m, ctx)

    # -- one position, the rest frozen ------------------------------------------------------

    def attention_core(self, h: torch.Tensor, t: int, ctx: SequenceContext, kv: KV | None = None) -> AttentionCore:
        """The attention of position t from its raw projections, the other positions frozen.

        h (T, d) is one sample's layer input. Returns the :class:`AttentionCore`
        ``core(q_raw, k_raw, v_raw) -> o`` (H·hd,) (``core(q_raw)`` for KV-shared layers), o being
        the concatenated head outputs before o_proj. The keys/values of the other visible
        positions (``t - window < s < t``) are computed from h (or taken from ``kv``, the source
        layer's (T, Hkv, hd) pair, for KV-shared layers, which then include position t) and frozen.
        """
        length = h.shape[0]
        if not 0 <= t < length:
            raise ValueError(f"position {t} outside the sequence (length {length})")
        cos, sin = self.rope(ctx, h.dtype)
        cos_t, sin_t = cos[0, t], sin[0, t]
        lo = window_start(t, self.window)
        shared = self.shares_kv
        with torch.no_grad():
            if shared:
                if kv is None:
                    raise ValueError(f"layer {self.index} attends over layer {self.kv_source}'s keys/values: pass kv=")
                keys, values = kv[0][lo : t + 1], kv[1][lo : t + 1]
            else:
                n_ctx = self._apply_norm("attn_pre", h[lo:t])
                keys, values = self.shape_kv(*self.project_kv(n_ctx), cos[0, lo:t], sin[0, lo:t])
        # Per kv head: keys (S, hd) and values transposed (hd, S), contiguous, so that under vmap
        # each score/value product is one GEMM with the tangent batch folded into its rows
        # (an einsum over a broadcast context would copy the context once per tangent).
        n_kv = keys.shape[1]
        keys_h = [keys[:, k].detach().contiguous() for k in range(n_kv)]
        values_t = [values[:, k].detach().transpose(0, 1).contiguous() for k in range(n_kv)]
        n_ctx = keys.shape[0]
        # The score scale as a 0-d float64 CPU tensor: PyTorch treats it as a scalar on every device
        # (a 0-d CUDA tensor would be cast to bf16 first), so x * it equals x * float in every dtype.
        constants = (cos_t, sin_t, torch.tensor(self.scaling, dtype=torch.float64))
        if self.softcap is not None:  # likewise a 0-d float64 CPU tensor
            constants += (torch.tensor(self.softcap, dtype=torch.float64),)

        def capped(scores: torch.Tensor, cap: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return torch.tanh(scores / cap[0]) * cap[0] if cap else scores

        def core(
            constants: tuple[torch.Tensor, ...],
            q_raw: torch.Tensor,
            k_raw: torch.Tensor | None = None,
            v_raw: torch.Tensor | None = None,
        ) -> torch.Tensor:
            cos_t, sin_t, scaling, *cap = constants
            q = self.shape_q(q_raw, cos_t, sin_t).unflatten(0, (n_kv, -1))  # (Hkv, G, hd)
            if not shared:
                k_t, v_t = self.shape_kv(k_raw, v_raw, cos_t, sin_t)  # (Hkv, hd) each
            heads = []
            for k in range(n_kv):
                scores = capped(nn.functional.linear(q[k], keys_h[k]) * scaling, cap)  # (G, S)
                if not shared:
                    own = capped((q[k] * k_t[k]).sum(-1, keepdim=True) * scaling, cap)
                    scores = torch.cat((scores, own), dim=-1)
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
                out = nn.functional.linear(probs[:, :n_ctx], values_t[k])  # (G, hd)
                if not shared:
                    out = out + probs[:, n_ctx:] * v_t[k]
                heads.append(out)
            return torch.cat(heads, dim=0).reshape(-1)

        return AttentionCore(core, constants)

    def attn_token_fn(self, h: torch.Tensor, t: int, ctx: SequenceContext, kv: KV | None = None) -> TokenFunction:
        """x (d,) -> m[t] (d,): the attention half at position t as a function of h[t] alone.

        The other positions are frozen (see :meth:`attention_core`); the position's own query,
        key and value are functions of x (only the query for KV-shared layers). At x = h[t] it
        returns ``attn(h)[t]``. Dtype: that of h and of the layer (see :meth:`to_float32`).
        """
        update = self.attn_update_token_fn(h, t, ctx, kv)
        return lambda x: x + update(x)

    def attn_update_token_fn(
        self, h: torch.Tensor, t: int, ctx: SequenceContext, kv: KV | None = None
    ) -> TokenFunction:
        """x (d,) -> the attention branch's output at position t (:meth:`attn_token_fn` minus x)."""
        core = self.attention_core(h, t, ctx, kv)

        def fn(x: torch.Tensor) -> torch.Tensor:
            n = self._apply_norm("attn_pre", x)
            q = self.project_q(n)
            out = core(q) if self.shares_kv else core(q, *self.project_kv(n))
            return self._scale_branch(self._apply_norm("attn_post", self.out_proj(out)))

        return fn

    def mlp_token_fn(self, m: torch.Tensor, t: int, ctx: SequenceContext) -> TokenFunction:
        """x (d,) -> h_{L+1}[t]: the MLP half at position t (per-token already; m (T, d) is only
        used for its length, Gemma 4's per-layer input of position t is a constant)."""
        length = m.shape[0]
        if not 0 <= t < length:
            raise ValueError(f"position {t} outside the sequence (length {length})")
        pli = ctx.per_layer_input(self.index, m.dtype)
        pli_t = None if pli is None else pli[0, t]
        return lambda x: self.mlp_fn(x, pli_t)
