"""Exact per-sample sublayer Jacobians and their HDF5 accumulation (with resume).

Definition (docs/design.md, "Sublayers and boundaries"). For layer L, token position t and
sublayer kind ``attn`` (h_L -> m_L) or ``mlp`` (m_L -> h_{L+1}),

    J = ∂ out[t] / ∂ in[t]        (d × d, fp32; J[i, j] = ∂ out_i / ∂ in_j)

with every other position of ``in`` held fixed: their keys/values are frozen, the position's
own query, key and value depend on ``in[t]`` (for Gemma 4 KV-shared layers only the query
does: their keys/values are the source layer's). The (T·d)² Jacobian of the full sequence is
never formed. Two methods, equal to rounding (tests check both against autograd through HF's
layer):

* "structured" (default): the linear maps are applied explicitly and forward mode is used only
  where it is cheap. Attention: ``J = I + J_post W_o J_core (W_qkv J_pre)`` — the pre-norm
  Jacobian is diagonal plus rank one, so ``W J_pre`` costs O(size of W); the core (q/k/v norms,
  RoPE, softmax over the frozen context) is differentiated by ``torch.func.jvp`` batched over
  the d input directions with ``vmap``; W_o is one GEMM. MLP: closed form
  ``W_down (diag(act'(g) ⊙ up) W_gate + diag(act(g)) W_up)``, one GEMM instead of three.
* "jvp": forward mode through the whole per-token function
  (:meth:`resdyn.lm.sublayers.LayerSublayers.attn_token_fn` / ``mlp_token_fn``), the simple reference.

The differentiated sublayer runs in fp32 (bf16 weights are upcast on a copy of the layer, TF32
is disabled); the boundary states come from one forward pass per sample in the model's dtype
(:func:`resdyn.lm.decompose.forward_boundaries`).

Files: the per-layer HDF5 schema (``layer{L:03d}.h5``, "resdyn.jacobian/1") and its reader are
:class:`resdyn.artifacts.JacobianBlocks`; this module only computes. Parallel-residual layers
(GPT-NeoX ``use_parallel_residual``, Pythia; see :mod:`resdyn.lm.sublayers`) have one boundary, h_L, and
store the operator J_L = ∂h_{L+1}[t]/∂h_L[t] = I + J_A + J_F as kind ``layer`` beside the branch
Jacobians ``attn_branch`` (J_A = ∂A(ln_in(h))[t]/∂h[t]) and ``mlp_branch`` (J_F =
∂F(ln_post_attn(h))[t]/∂h[t]); downstream the operator (L, 'layer') takes the depth slot
s = 2L + 1 (:func:`resdyn.study_a.spectral.sublayer_index`).

Resume: every ``checkpoint_every`` samples the float64 sums, the per-sample arrays and the
next sample index are saved atomically (:class:`resdyn.artifacts.JacobianSums`) next to the
first output; a rerun with the same inputs (samples, ids, layers, positions, options, attrs)
continues from them, an inconsistent file is ignored with a warning; it is removed on success.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from resdyn.artifacts import JacobianBlocks, JacobianSums
from resdyn.io import sha256_array
from resdyn.lm import decompose, norms, structure, sublayers
from resdyn.numerics import precision
from resdyn.numerics.checks import is_int
from resdyn.numerics.sizes import (
    EXACT_SPECTRAL_MAX_D,
    JACOBIAN_GPU_BATCH,
    POWER_ITERATIONS,
    attention_tangent_bytes,
    tangent_chunk,
)

# The file layout's group names, defined by the artifact class (see its docstring).
KINDS = JacobianBlocks.KINDS
PARALLEL_KINDS = JacobianBlocks.PARALLEL_KINDS
OPERATOR_KINDS = JacobianBlocks.OPERATOR_KINDS


def layer_kinds(adapter: sublayers.LayerSublayers) -> tuple[str, ...]:
    """The Jacobian kinds stored for a layer: :data:`KINDS` or :data:`PARALLEL_KINDS`."""
    return PARALLEL_KINDS if adapter.parallel else KINDS


SCHEMA = JacobianBlocks.SCHEMA

PositionsArg = None | int | str | Sequence[int]


# ----------------------------------------------------------------------------------------------
# Positions
# ----------------------------------------------------------------------------------------------


def resolve_positions(positions: PositionsArg, length: int) -> list[int]:
    """Token positions as non-negative ints, in the order given.

    ``None`` or ``"last"`` -> [T − 1]; ``"all"`` -> [0, …, T − 1]; an int or a list of ints
    (negative counts from the end, as in Python). Raises ValueError for anything else, for
    duplicates and for positions outside [−T, T).
    """
    if positions is None or positions == "last":
        return [length - 1]
    if positions == "all":
        return list(range(length))
    if isinstance(positions, str):
        raise ValueError(f"positions={positions!r}: allowed are None, 'last', 'all', an int or a list of ints")
    items = [positions] if isinstance(positions, (int, np.integer)) else list(positions)
    if not items:
        raise ValueError("positions is an empty list: give at least one position")
    out = []
    for p in items:
        if not is_int(p):
            raise ValueError(f"position {p!r} is not an int (positions={positions!r})")
        if not -length <= p < length:
            raise ValueError(f"position {p} outside a sequence of length {length} (allowed {-length}..{length - 1})")
        out.append(int(p) % length)
    if len(set(out)) != len(out):
        raise ValueError(f"positions {items} name the same token twice")
    return out


# ----------------------------------------------------------------------------------------------
# Engine
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """IEEE fp32 matmuls and convs (no TF32) while Jacobians are computed.

    With torch's current precision API only (:func:`resdyn.numerics.precision.ieee_fp32`; the
    legacy calls must not be mixed with it). Also silences the DeprecationWarning torch's
    forward-mode decompositions emit on first use (they call torch.jit.script internally; nothing
    for us to change)."""
    with precision.ieee_fp32(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=DeprecationWarning)
        yield


def forward_jacobian(fn, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Dense Jacobian J (d_out, d_in) of ``fn`` at x (d_in,) by forward mode.

    One JVP per basis direction e_j gives column J[:, j]; ``vmap`` batches them, ``chunk_size``
    directions at a time (None: all at once). Cost: d_in JVPs, i.e. the matmuls of ``fn`` with
    a (chunk, ·) batch in place of a vector.
    """
    # A fresh copy: JVP tangents are allocated with the primal's storage layout, and x is often a
    # view into the (2n+1, T, d) boundary states (that would make every tangent T·(2n+1) times too big).
    x = x.detach().clone()
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)

    def column(direction: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(fn, (x,), (direction,))[1]

    columns = torch.func.vmap(column, chunk_size=chunk_size)(eye)  # row j = J[:, j]
    return columns.transpose(0, 1).contiguous()


# -- closed-form pieces ------------------------------------------------------------------------


def rms_right(a: torch.Tensor, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``a @ J_N(x)`` for an RMSNorm N(x) = w ⊙ x / r, r = sqrt(mean(x²) + eps), without forming J_N.

    ``J_N(x) = diag(w)/r − (w ⊙ x) xᵀ / (d r³)`` (diagonal plus rank one), so for a (k, d):
    ``a J_N = (a ⊙ w/r) − (a (w ⊙ x)) xᵀ / (d r³)`` in O(k·d).
    """
    weight, eps = norms.rms_norm_params(norm)
    d = x.shape[-1]
    inv_r = torch.rsqrt(x.pow(2).mean() + eps)
    w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
    out = a * (w * inv_r)
    # 1/(d r³) stays a device tensor (a Python float would sync the host once per norm)
    return out.sub_(torch.outer(a @ (w * x), x * (inv_r.pow(3) / d)))


def rms_left(z: torch.Tensor, a: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``J_N(z) @ a`` for an RMSNorm at z (d,) and a (d, k): ``(w/r) ⊙ a − (w ⊙ z)(zᵀ a) / (d r³)``."""
    weight, eps = norms.rms_norm_params(norm)
    d = z.shape[-1]
    inv_r = torch.rsqrt(z.pow(2).mean() + eps)
    w = torch.ones_like(z) if weight is None else weight.to(z.dtype)
    out = a * (w * inv_r)[:, None]
    return out.sub_(torch.outer(w * z * (inv_r.pow(3) / d), z @ a))


def _layer_norm_stats(x: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(w/σ, x̂) of a LayerNorm at x (d,): σ = sqrt(var(x) + eps) (biased var), x̂ = (x − μ)/σ."""
    weight, _, eps = norms.layer_norm_params(norm)
    centred = x - x.mean()
    inv_s = torch.rsqrt(centred.pow(2).mean() + eps)
    w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
    return w * inv_s, centred * inv_s


def layer_norm_right(a: torch.Tensor, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``a @ J_N(x)`` for a LayerNorm N(x) = w ⊙ x̂ + b (see :func:`_layer_norm_stats`).

    ``J_N = diag(w/σ) (I − 11ᵀ/d − x̂ x̂ᵀ/d)``, so with ``c = a ⊙ (w/σ)`` (k, d):
    ``a J_N = c − (c 1/d) 1ᵀ − (c x̂/d) x̂ᵀ`` in O(k·d).
    """
    scale, xhat = _layer_norm_stats(x, norm)
    d = x.shape[-1]
    c = a * scale
    out = c - c.mean(-1, keepdim=True)
    return out.sub_(torch.outer(c @ xhat, xhat), alpha=1.0 / d)


def layer_norm_left(z: torch.Tensor, a: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``J_N(z) @ a`` for a LayerNorm at z (d,) and a (d, k).

    ``J_N(z) @ a = (w/σ) ⊙ (a − 1 (1ᵀa)/d − x̂ (x̂ᵀ a)/d)``.
    """
    scale, xhat = _layer_norm_stats(z, norm)
    d = z.shape[-1]
    out = a - a.mean(0, keepdim=True)
    out.sub_(torch.outer(xhat, xhat @ a), alpha=1.0 / d)
    return out * scale[:, None]


def norm_right(a: torch.Tensor, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``a @ J_N(x)`` for an RMSNorm (:func:`rms_right`) or a LayerNorm (:func:`layer_norm_right`)."""
    return layer_norm_right(a, x, norm) if isinstance(norm, nn.LayerNorm) else rms_right(a, x, norm)


def norm_left(z: torch.Tensor, a: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``J_N(z) @ a`` for an RMSNorm (:func:`rms_left`) or a LayerNorm (:func:`layer_norm_left`)."""
    return layer_norm_left(z, a, norm) if isinstance(norm, nn.LayerNorm) else rms_left(z, a, norm)


def _elementwise_derivative(act: nn.Module, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(g), act'(g)) for an elementwise activation (one JVP with an all-ones tangent)."""
    return torch.func.jvp(act, (g,), (torch.ones_like(g),))


def gated_mlp_jacobian(mlp: nn.Module | sublayers.LayerSublayers, u: torch.Tensor) -> torch.Tensor:
    """∂F/∂u (d_out, d_in) of ``F(u) = W_d (act(W_g u + b_g) ⊙ (W_u u + b_u)) + b_d`` at u (d,).

    ``= W_d M`` with ``M = diag(act'(g) ⊙ up) W_g + diag(act(g)) W_u`` (d_ff, d): one GEMM of
    2·d_out·d_ff·d FLOPs (forward mode through F would cost three such GEMMs). The projections
    come from :meth:`resdyn.lm.sublayers.LayerSublayers.gated_mlp` (separate or fused gate|up) when
    ``mlp`` is an adapter; a bare module must have ``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``.
    """
    parts = mlp.gated_mlp() if isinstance(mlp, sublayers.LayerSublayers) else sublayers.gated_mlp_parts(mlp)
    gate, up_proj, down, act_fn, fused = parts
    if fused:
        g, up = gate(u).split(fused, dim=-1)
        w_g, w_u = gate.weight.split(fused, dim=0)
    else:
        g, up = gate(u), up_proj(u)
        w_g, w_u = gate.weight, up_proj.weight
    act, dact = _elementwise_derivative(act_fn, g)
    m = w_g * (dact * up)[:, None]
    m.addcmul_(w_u, act[:, None])
    return down.weight @ m


def plain_mlp_jacobian(
    w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, act: nn.Module, u: torch.Tensor
) -> torch.Tensor:
    """∂F/∂u (d_out, d_in) of a non-gated MLP ``F(u) = W_2 act(W_1 u + b_1) + b_2`` at u (d,).

    ∂F/∂u = ``W_2 diag(act'(g)) W_1`` with g = W_1 u + b_1 (one GEMM).
    """
    g = nn.functional.linear(u, w1, b1)
    _, dact = _elementwise_derivative(act, g)
    return w2 @ (w1 * dact[:, None])


def mlp_branch_jacobian(adapter: sublayers.LayerSublayers, u: torch.Tensor) -> torch.Tensor:
    """∂F/∂u of the layer's MLP (gated or plain, see :meth:`resdyn.lm.sublayers.LayerSublayers.plain_mlp`)."""
    plain = adapter.plain_mlp()
    if plain is None:
        return gated_mlp_jacobian(adapter, u)
    return plain_mlp_jacobian(*plain, u)


def _input_tangents(weight: torch.Tensor, x: torch.Tensor, pre: nn.Module | None) -> torch.Tensor:
    """Rows j = ∂(W n(x))/∂x_j, i.e. (W J_pre)ᵀ as a contiguous (d, out) matrix."""
    jac = weight if pre is None else norm_right(weight, x, pre)
    return jac.transpose(0, 1).contiguous()


def attn_jacobian(
    adapter: sublayers.LayerSublayers,
    h: torch.Tensor,
    t: int,
    ctx: sublayers.SequenceContext,
    kv: sublayers.KV | None = None,
    chunk_size: int | None = None,
    residual: bool = True,
) -> torch.Tensor:
    """J = ∂m[t]/∂h[t] (d, d) of the attention half, other positions frozen.

    ``residual=False``: the attention branch alone, J − I (parallel-residual layers).

    ``J = I + J_post(a) W_o J_core (W_qkv J_pre(x))`` with x = h[t], a the o_proj output. The
    projections of the tangents are explicit (``W J_pre`` is W rescaled plus a rank-one term),
    the small nonlinear core (q/k/v norms, RoPE, softmax over the frozen context) is
    differentiated by forward mode, batched over the d input directions (``chunk_size`` at a
    time), and W_o is applied once to the result: 2·d·(H·hd)·d FLOPs for W_o plus
    O(d·(T·H·hd)) for the core.
    """
    x = h[t].detach().clone()
    pre, post = adapter.norm("attn_pre"), adapter.norm("attn_post")
    core = adapter.attention_core(h, t, ctx, kv)
    n = x if pre is None else pre(x)
    w_q, w_k, w_v = adapter.projection_weights()
    primals = [adapter.project_q(n)]
    tangents = [_input_tangents(w_q, x, pre)]
    if not adapter.shares_kv:
        primals += list(adapter.project_kv(n))
        tk = _input_tangents(w_k, x, pre)
        tangents += [tk, tk if w_v is None else _input_tangents(w_v, x, pre)]
    primals = tuple(primals)

    def column(*directions: torch.Tensor) -> torch.Tensor:
        return core.jvp(primals, directions)[1]  # constants as zero-tangent primals (arch.AttentionCore)

    chunk = chunk_size or _attn_chunk(adapter, h.shape[0], x.shape[-1], x.is_cuda)
    heads = torch.func.vmap(column, chunk_size=chunk)(*tangents)  # (d, H·hd): row j = ∂o/∂x_j
    jac = nn.functional.linear(heads, adapter.out_weight()).transpose(0, 1)  # W_o ∂o/∂x
    if post is not None:
        jac = norm_left(adapter.out_proj(core(*primals)), jac, post)
    else:
        jac = jac.contiguous()
    if adapter.branch_scale != 1.0:
        jac.mul_(adapter.branch_scale)
    if residual:
        jac.diagonal().add_(1.0)
    return jac


def mlp_jacobian(
    adapter: sublayers.LayerSublayers, m: torch.Tensor, t: int, ctx: sublayers.SequenceContext, residual: bool = True
) -> torch.Tensor:
    """J = ∂h_{L+1}[t]/∂m[t] (d, d) of the MLP half, in closed form.

    ``residual=False``: the MLP branch alone, J − I (parallel-residual layers, where m is h_L).
    Gated (``W_d M``, :func:`gated_mlp_jacobian`) or plain (:func:`plain_mlp_jacobian`) MLPs;
    RMSNorm or LayerNorm (:func:`norm_right`, :func:`norm_left`).

    ``J_y = I + J_post(z) (W_d M) J_pre(x)`` (see :func:`gated_mlp_jacobian`), x = m[t],
    z the MLP output; for Gemma 4 then ``J = s (I + A B) J_y`` with the per-layer-input block
    ``A = J_norm W_proj`` (d, p), ``B = diag(act'(G y) ⊙ e) W_gate`` (p, d) (rank p, applied as
    ``J_y + A (B J_y)``) and s = ``layer_scalar``.
    """
    x = m[t].detach().clone()
    layer = adapter.layer
    pre, post = adapter.norm("mlp_pre"), adapter.norm("mlp_post")
    u = x if pre is None else pre(x)
    jac = mlp_branch_jacobian(adapter, u)
    if pre is not None:
        jac = norm_right(jac, x, pre)
    if post is not None:
        jac = norm_left(layer.mlp(u), jac, post)
    if adapter.branch_scale != 1.0:
        jac.mul_(adapter.branch_scale)
    if not residual:
        return jac
    jac.diagonal().add_(1.0)
    if adapter.family == "gemma4":
        if adapter.has_per_layer_input:
            pli = ctx.per_layer_input(adapter.index, x.dtype)[0, t]
            y = adapter.mlp_core(x)
            g = layer.per_layer_input_gate(y)
            act, dact = _elementwise_derivative(layer.act_fn, g)
            projected = layer.per_layer_projection(act * pli)
            a = rms_left(projected, layer.per_layer_projection.weight, layer.post_per_layer_input_norm)
            b = layer.per_layer_input_gate.weight * (dact * pli)[:, None]
            jac = jac + a @ (b @ jac)
        jac = jac * layer.layer_scalar.to(jac.dtype)
    return jac


def _attn_chunk(adapter: sublayers.LayerSublayers, length: int, d: int, gpu: bool) -> int:
    """Tangent chunk for the attention core: :func:`resdyn.numerics.sizes.tangent_chunk` of the
    per-direction bound :func:`resdyn.numerics.sizes.attention_tangent_bytes` (one pass over d
    where the budget of the device holds it)."""
    return tangent_chunk(d, attention_tangent_bytes(adapter.n_heads, adapter.head_dim, length), gpu)


def _jvp_chunk(adapter: sublayers.LayerSublayers, length: int, d: int, gpu: bool) -> int:
    """Tangent chunk for the reference forward-mode path (:func:`resdyn.numerics.sizes.tangent_chunk`).

    Per tangent ≈ 4 bytes × (8·d_ff + 8·d + 8·H·(T+1)).
    """
    d_ff = max(max(p.shape) for p in adapter.layer.parameters() if p.dim() == 2)
    heads = adapter.n_heads
    return tangent_chunk(d, 4 * (8 * d_ff + 8 * d + 8 * heads * (length + 1)), gpu)


METHODS = ("structured", "jvp")


def _sample_context(ctx: sublayers.SequenceContext, b: int) -> sublayers.SequenceContext:
    """Sample b of a batch's context (its embeddings and per-layer inputs; rotary tables shared)."""
    per = ctx.per_layer_inputs
    batch = ctx.embeddings.shape[0]

    def calls(table: dict | None) -> dict | None:  # generic path: HF's call arguments of sample b
        if table is None:
            return None

        def cut(v):
            if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch:
                return v[b : b + 1]
            return tuple(cut(x) for x in v) if isinstance(v, tuple) else v

        return {i: (tuple(cut(a) for a in args), {k: cut(v) for k, v in kw.items()}) for i, (args, kw) in table.items()}

    return dataclasses.replace(
        ctx,
        embeddings=ctx.embeddings[b : b + 1],
        per_layer_inputs=None if per is None else per[b : b + 1],
        _rope=ctx._rope,
        layer_calls=calls(ctx.layer_calls),
        attn_calls=calls(ctx.attn_calls),
    )


def default_batch_size(device: torch.device | str, d: int) -> int:
    """Samples per batched forward of the Jacobian engine on ``device``.

    1 on a CPU (no gain there; results bit-equal to the unbatched engine), on a GPU
    :data:`JACOBIAN_GPU_BATCH` (≤ 16·(2L+3)·T·d·4 bytes of states, ~1 GiB at d = 4096).
    """
    return 1 if torch.device(device).type != "cuda" else JACOBIAN_GPU_BATCH


class JacobianEngine:
    """Sublayer Jacobians of a model, one sample at a time.

    Holds the model's sublayer adapters and fp32 adapters for the layers to differentiate
    (and the layers whose keys/values they reuse). ``compute`` runs one forward pass through
    the sublayers (to layer max(layers)) and returns every requested Jacobian.

    ``method``: "structured" (default; :func:`attn_jacobian`, :func:`mlp_jacobian`: explicit
    projections, forward mode only through the attention core) or "jvp" (forward mode through
    the whole per-token function, :func:`forward_jacobian`; the simple reference, ~2.5–3× the
    FLOPs).
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[int] | None = None,
        chunk_size: int | None = None,
        method: str = "structured",
    ):
        if method not in METHODS:
            raise ValueError(f"method={method!r}: allowed are {METHODS}")
        self.model = model
        self.method = method
        self.adapters = decompose.sublayers(model)
        n = len(self.adapters)
        self.layers = list(range(n)) if layers is None else [int(x) for x in layers]
        bad = [x for x in self.layers if not 0 <= x < n]
        if bad:
            raise ValueError(f"layers {bad} outside the model's {n} layers (allowed 0..{n - 1})")
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layers {self.layers}: give distinct layers, at least one")
        needed = set(self.layers) | {self.adapters[x].kv_source for x in self.layers}
        self.fp32 = {x: self.adapters[x].to_float32() for x in sorted(needed)}
        self.chunk_size = chunk_size
        self.d = structure.hidden_size(model)
        #: generic path: forward mode through HF's modules, self-checked on the first sample
        self.generic = bool(getattr(self.adapters[0], "generic", False))
        self.self_check_errors: dict[int, dict[str, float]] | None = None

    def compute(self, input_ids: torch.Tensor, positions: PositionsArg = None) -> dict[tuple[int, str], torch.Tensor]:
        """{(layer, kind): (P, d, d) fp32} for one sample ``input_ids`` (T,).

        Kinds per layer as :meth:`kinds` (attn, mlp; or layer, attn_branch, mlp_branch for
        parallel layers).
        """
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must be one sample (T,), got shape {tuple(input_ids.shape)}")
        return self.compute_batch(input_ids[None], positions)[0]

    def compute_batch(
        self, input_ids: torch.Tensor, positions: PositionsArg = None
    ) -> list[dict[tuple[int, str], torch.Tensor]]:
        """:meth:`compute` for a batch (B, T) of samples: the list of :meth:`iter_batch`."""
        return list(self.iter_batch(input_ids, positions))

    def iter_batch(
        self, input_ids: torch.Tensor, positions: PositionsArg = None
    ) -> Iterator[dict[tuple[int, str], torch.Tensor]]:
        """:meth:`compute` for a batch (B, T) of samples, one sample's Jacobians at a time.

        One batched forward for the boundary states of all B samples, then each sample's Jacobians,
        yielded before the next sample's are computed: a consumer that drops them (moves them to
        the host) keeps one sample's Jacobians on the device, not B.

        Cost: the context forward 2·T·P_layer·(max(layers)+1) per sample runs as (B·T)-row GEMMs
        instead of T-row ones (on a GPU T = 128 rows leave most of it idle; B·T = 2048 do not);
        the Jacobian GEMMs (2·d·H·hd·d + 2·d·d_ff·d per layer) are already full-size per sample.
        Equal to B calls of :meth:`compute` up to the rounding of the batched forward (bit-equal
        for B = 1).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a batch (B, T), got shape {tuple(input_ids.shape)}")
        pos = resolve_positions(positions, input_ids.shape[1])
        with torch.no_grad():
            ctx = decompose.prepare(self.model, input_ids.long())
            states = decompose.forward_boundaries(self.adapters, ctx, upto=max(self.layers)).float()
        for b in range(input_ids.shape[0]):
            one = ctx if input_ids.shape[0] == 1 else _sample_context(ctx, b)
            out: dict[tuple[int, str], torch.Tensor] = {}
            with full_fp32_matmul(), torch.no_grad():
                for layer in self.layers:
                    out.update(self._layer(layer, states[b], one, pos))
            if self.generic and self.self_check_errors is None:
                self._self_check(states[b], one, pos[-1], out)
            yield out
            del out

    def _self_check(self, states: torch.Tensor, ctx: sublayers.SequenceContext, t: int, jacs: dict) -> None:
        """Generic path: check every layer's Jacobians at position t against reverse mode.

        Reverse-mode autograd runs through HF's decoder layer (:func:`resdyn.lm.generic.self_check`).
        """
        from resdyn.lm import generic

        errors = {}
        with full_fp32_matmul():
            for layer in self.layers:
                adapter = self.fp32[layer]
                p = -1  # position t is the last of the requested positions
                if adapter.parallel:
                    j_attn, j_layer = None, jacs[(layer, "layer")][p]
                else:
                    j_attn = jacs[(layer, "attn")][p]
                    j_layer = jacs[(layer, "mlp")][p] @ j_attn
                call = generic.cast_call(ctx.layer_calls[layer], torch.float32)
                errors[layer] = generic.self_check(adapter, states[2 * layer], t, ctx, call, j_attn, j_layer)
        self.self_check_errors = errors

    def kinds(self, layer: int) -> tuple[str, ...]:
        """Kinds :meth:`compute` returns for ``layer`` (:func:`layer_kinds`)."""
        return layer_kinds(self.adapters[layer])

    def _parallel_layer(self, layer: int, states: torch.Tensor, ctx: sublayers.SequenceContext, pos: list[int]):
        """Parallel residual: J_A, J_F at h_L[t] and the operator I + J_A + J_F."""
        adapter = self.fp32[layer]
        h = states[2 * layer]
        if self.method == "structured" and not self.generic:
            attn = [attn_jacobian(adapter, h, t, ctx, None, self.chunk_size, residual=False) for t in pos]
            mlp = [mlp_jacobian(adapter, h, t, ctx, residual=False) for t in pos]
            ja, jm = torch.stack(attn), torch.stack(mlp)
            full = ja + jm
            full.diagonal(dim1=-2, dim2=-1).add_(1.0)
        else:
            chunk = self.chunk_size or _jvp_chunk(adapter, h.shape[0], self.d, h.is_cuda)
            ja = torch.stack([forward_jacobian(adapter.attn_update_token_fn(h, t, ctx), h[t], chunk) for t in pos])
            jm = torch.stack([forward_jacobian(adapter.mlp_branch, h[t], chunk) for t in pos])
            full = torch.stack([forward_jacobian(adapter.layer_token_fn(h, t, ctx), h[t], chunk) for t in pos])
        return {(layer, "layer"): full, (layer, "attn_branch"): ja, (layer, "mlp_branch"): jm}

    def _layer(self, layer: int, states: torch.Tensor, ctx: sublayers.SequenceContext, pos: list[int]):
        adapter = self.fp32[layer]
        if adapter.parallel:
            return self._parallel_layer(layer, states, ctx, pos)
        if self.generic:  # no explicit projections: forward mode through HF's modules
            chunk = self.chunk_size or _jvp_chunk(adapter, states.shape[1], self.d, states.is_cuda)
            h, m = states[2 * layer], states[2 * layer + 1]
            attn = [forward_jacobian(adapter.attn_token_fn(h, t, ctx), h[t], chunk) for t in pos]
            mlp = [forward_jacobian(adapter.mlp_token_fn(m, t, ctx), m[t], chunk) for t in pos]
            return {(layer, "attn"): torch.stack(attn), (layer, "mlp"): torch.stack(mlp)}
        kv = None
        if adapter.shares_kv:
            k, v = self.fp32[adapter.kv_source].kv(states[2 * adapter.kv_source][None], ctx)
            kv = (k[0], v[0])
        h, m = states[2 * layer], states[2 * layer + 1]
        if self.method == "structured":
            attn = [attn_jacobian(adapter, h, t, ctx, kv, self.chunk_size) for t in pos]
            mlp = [mlp_jacobian(adapter, m, t, ctx) for t in pos]
        else:
            chunk = self.chunk_size or _jvp_chunk(adapter, h.shape[0], self.d, h.is_cuda)
            attn = [forward_jacobian(adapter.attn_token_fn(h, t, ctx, kv=kv), h[t], chunk) for t in pos]
            mlp = [forward_jacobian(adapter.mlp_token_fn(m, t, ctx), m[t], chunk) for t in pos]
        return {(layer, "attn"): torch.stack(attn), (layer, "mlp"): torch.stack(mlp)}


def sublayer_jacobians(
    model: nn.Module,
    input_ids: torch.Tensor,
    positions: PositionsArg = None,
    *,
    layers: Sequence[int] | None = None,
    chunk_size: int | None = None,
    method: str = "structured",
) -> dict[tuple[int, str], torch.Tensor]:
    """Exact per-sample Jacobians of every sublayer at the given token positions.

    input_ids: one sample, (T,) LongTensor. positions: None (last token), 'last', 'all', an int
    or a list of ints. Returns {(layer, kind): J} with kind in {"attn", "mlp"} (parallel-residual
    layers: {"layer", "attn_branch", "mlp_branch"}, see :data:`PARALLEL_KINDS`) and J of shape
    (P, d, d), fp32, ``J[p] = ∂ out[t_p] / ∂ in[t_p]`` with the other positions frozen (see the
    module docstring). ``layers`` restricts the layers (default all); ``chunk_size`` is the
    number of tangent directions per vmap batch (default: :func:`resdyn.numerics.sizes.tangent_chunk`);
    ``method`` "structured" (default) or "jvp" (see :class:`JacobianEngine`).
    """
    return JacobianEngine(model, layers, chunk_size, method).compute(input_ids, positions)


# ----------------------------------------------------------------------------------------------
# Per-sample summaries
# ----------------------------------------------------------------------------------------------


def spectral_norm(jac: torch.Tensor) -> torch.Tensor:
    """σ_max of each (d, d) matrix in a (P, d, d) batch, float64.

    Exact (SVD) for d ≤ :data:`EXACT_SPECTRAL_MAX_D`; otherwise :data:`POWER_ITERATIONS` steps of
    power iteration on JᵀJ from a fixed seeded start (deterministic; converges from below). NaN for
    a matrix with a non-finite entry (decided on the device: no host read).
    """
    j = jac.double()
    d = j.shape[-1]
    if d <= EXACT_SPECTRAL_MAX_D:  # the SVD refuses non-finite input: NaN there instead
        finite = torch.isfinite(j).all(-1).all(-1)
        return torch.linalg.matrix_norm(j.nan_to_num(0.0, 0.0, 0.0), ord=2).where(finite, torch.nan)
    gen = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn(j.shape[0], d, 1, generator=gen, dtype=torch.float64).to(j.device)
    v = v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
    for _ in range(POWER_ITERATIONS):
        w = j.transpose(1, 2) @ (j @ v)
        v = w / torch.linalg.vector_norm(w, dim=1, keepdim=True).clamp_min(1e-300)
    return torch.linalg.vector_norm(j @ v, dim=(1, 2))


def spectral_norm_method(d: int) -> str:
    """Human-readable description of how :func:`spectral_norm` computes σ_max for this d."""
    if d <= EXACT_SPECTRAL_MAX_D:
        return "exact (singular value decomposition, float64)"
    return f"power iteration on J^T J, {POWER_ITERATIONS} steps, fixed seed 0, float64 (lower bound)"


def summary_tensor(jac: torch.Tensor) -> torch.Tensor:
    """Per-position scalars of a (P, d, d) batch as one float64 (3, P) tensor on J's device.

    Rows in the order of :attr:`resdyn.artifacts.JacobianBlocks.SUMMARIES`: ‖J − I‖_F, tr J, σ_max
    (:func:`spectral_norm`). Nothing is read back to the host.
    """
    j = jac.double()
    eye = torch.eye(j.shape[-1], dtype=torch.float64, device=j.device)
    return torch.stack(
        (torch.linalg.matrix_norm(j - eye), torch.diagonal(j, dim1=-2, dim2=-1).sum(-1), spectral_norm(j))
    )


def summaries(jac: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-position scalars of a (P, d, d) batch: ‖J − I‖_F, tr J, σ_max (float64 arrays (P,);
    :func:`summary_tensor` on the host)."""
    return dict(zip(JacobianBlocks.SUMMARIES, summary_tensor(jac).cpu().numpy()))


# ----------------------------------------------------------------------------------------------
# Block writer with checkpoint/resume
# ----------------------------------------------------------------------------------------------


def _describe_model(attrs: dict[str, Any]) -> str:
    """'model <id> (checkpoint <c>, revision <r>)' from the caller's attrs (see models.model_attrs)."""
    model_id = attrs.get("model_id", attrs.get("model", "?"))
    where = [f"{key} {attrs[key]!r}" for key in ("checkpoint", "revision") if key in attrs]
    return f"model {model_id!r} ({', '.join(where) or 'checkpoint/revision unknown'})"


def _fingerprint(
    samples: np.ndarray,
    sample_ids: np.ndarray,
    layers: list[int],
    positions: list[int],
    store_dtype: str,
    store_first_n: int,
    attrs: dict[str, Any],
    engine: dict[str, Any],
) -> str:
    """What a checkpoint must agree on to be resumed: inputs, options (the engine's too: its
    method and chunking decide the rounding), the caller's attrs and the numerics of the device
    (:func:`resdyn.numerics.precision.resume_key`: GPU model, torch/CUDA/cuDNN/cuBLAS, fp32 precision)."""
    numerics = precision.resume_numerics(engine.get("device", "cpu"))
    meta = json.dumps(
        {
            "numerics": numerics,
            "layers": layers,
            "positions": positions,
            "store_dtype": store_dtype,
            "store_first_n": store_first_n,
            "attrs": attrs,
            "engine": engine,
            "schema": SCHEMA,
        },
        sort_keys=True,
        default=str,
    )
    h = hashlib.sha256(meta.encode())
    h.update(sha256_array(samples, sample_ids.astype(str)).encode())
    return precision.resume_key(h.hexdigest(), numerics)


def _check_finite(jac: torch.Tensor, attrs: dict, layer: int, kind: str, sample_id: Any) -> None:
    """FloatingPointError naming the model, sublayer and sample when ``jac`` has a NaN or Inf entry."""
    if not bool(torch.isfinite(jac).all()):
        n_nan = int(torch.isnan(jac).sum())
        n_inf = int(torch.isinf(jac).sum())
        raise FloatingPointError(
            f"{_describe_model(attrs)}: layer {layer} sublayer {kind!r} sample id {sample_id!r}: the Jacobian has "
            f"{n_nan} NaN and {n_inf} Inf entries (allowed: finite values only)"
        )


def _sample_scalars(jacs: dict[tuple[int, str], torch.Tensor]) -> np.ndarray:
    """(K, 4, P) float64 on the host for a sample's K sublayers, in one device-to-host copy: per
    sublayer a finiteness flag (1.0: every entry finite, repeated over P) and :func:`summary_tensor`."""
    rows = []
    for jac in jacs.values():
        finite = torch.isfinite(jac).all().double().expand(1, jac.shape[0])
        rows.append(torch.cat((finite, summary_tensor(jac))))
    return torch.stack(rows).cpu().numpy()


def write_layer_block(
    model: nn.Module,
    samples: np.ndarray,
    sample_ids: Sequence | np.ndarray,
    layers: Sequence[int],
    out_paths: dict[int, os.PathLike | str],
    positions: PositionsArg = None,
    store_dtype: str = "float32",
    store_first_n: int = 0,
    checkpoint_every: int = 50,
    attrs: dict[str, Any] | None = None,
    progress: bool = True,
    chunk_size: int | None = None,
    method: str = "structured",
    batch_size: int | None = None,
    n_groups: int = 0,
    group_dtype: str | None = None,
) -> None:
    """Accumulate the sublayer Jacobians of a block of layers over N samples into HDF5 files.

    samples (N, T) int token ids; sample_ids (N,) ints or strings; ``layers`` the block;
    ``out_paths[L]`` the file of layer L (schema: :class:`resdyn.artifacts.JacobianBlocks`). Per sample: one
    forward pass for the boundary states, then each sublayer's Jacobian at ``positions``
    (see :func:`resolve_positions`); sums in float64, ``mean`` stored as ``store_dtype``
    ("float32" or "float64"); the first ``store_first_n`` samples' Jacobians kept whole.
    Checkpoints every ``checkpoint_every`` samples and resumes from a consistent checkpoint
    (module docstring). A NaN/Inf Jacobian raises FloatingPointError naming the model
    (``attrs['model_id']``, ``attrs['revision']``), layer, sublayer and sample id; no output
    file is written then. ``attrs`` must be deterministic (no timestamps): they are part of the
    checkpoint fingerprint. The model is used as given (already on its device, eval mode).
    ``chunk_size``/``method``: see :class:`JacobianEngine`. ``batch_size``: samples per batched
    forward (:meth:`JacobianEngine.compute_batch`; default :func:`default_batch_size`).
    ``n_groups`` B > 0 also keeps the mean of each of B equal groups of consecutive samples
    (:class:`resdyn.artifacts.JacobianSums`; B must divide N), for intervals from all samples;
    ``group_dtype`` (default ``store_dtype``) is how they are stored (``float16``: as deviations
    from the mean, :meth:`resdyn.artifacts.JacobianBlocks.write_layer`).
    """
    attrs = dict(attrs or {})
    samples, ids, layers = _check_block_args(
        samples, sample_ids, layers, out_paths, store_dtype, store_first_n, checkpoint_every, n_groups
    )
    n_samples, length = samples.shape
    pos = resolve_positions(positions, length)
    engine = JacobianEngine(model, layers, chunk_size, method)
    device = structure.input_device(model)
    d = engine.d
    batch = int(batch_size or default_batch_size(device, d))
    if batch < 1:
        raise ValueError(f"batch_size={batch_size}: must be ≥ 1")
    options = {"method": method, "chunk_size": chunk_size, "device": str(device)}
    if batch != 1:  # the batched forward rounds differently: a checkpoint must match it
        options["batch_size"] = batch
    if n_groups:
        options["n_groups"] = int(n_groups)
    fingerprint = _fingerprint(samples, ids, layers, pos, store_dtype, int(store_first_n), attrs, options)
    ckpt = JacobianSums.path(out_paths, layers)
    kinds = {layer: engine.kinds(layer) for layer in layers}
    fresh = functools.partial(JacobianSums, layers, n_samples, len(pos), d, int(store_first_n), kinds, int(n_groups))
    acc = JacobianSums.resume(ckpt, fresh, fingerprint, n_samples)

    bar = _progress(n_samples, acc.next_index, progress, f"jacobians L{layers[0]}-{layers[-1]}")
    try:
        start = acc.next_index
        while start < n_samples:
            # batches end at checkpoint multiples, so checkpoints fall where the unbatched run's do
            stop = min(n_samples, start + batch, (start // checkpoint_every + 1) * checkpoint_every)
            batch_ids = torch.as_tensor(samples[start:stop], dtype=torch.long, device=device)
            jacobians = engine.iter_batch(batch_ids, pos)
            _accumulate_batch(acc, start, jacobians, ids, attrs, store_first_n, bar)
            start = stop
            if acc.next_index % checkpoint_every == 0 and acc.next_index < n_samples:
                acc.save(ckpt, fingerprint)
    finally:
        bar.close()
    fam = decompose.family(model)
    for layer in layers:
        JacobianBlocks.write_layer(
            out_paths[layer], layer, acc, ids, pos, store_dtype, attrs, fam, spectral_norm_method(d), group_dtype
        )
    JacobianSums.remove(ckpt)


def _check_block_args(
    samples: np.ndarray,
    sample_ids: Sequence | np.ndarray,
    layers: Sequence[int],
    out_paths: dict[int, os.PathLike | str],
    store_dtype: str,
    store_first_n: int,
    checkpoint_every: int,
    n_groups: int = 0,
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(samples, sample ids, layers) of :func:`write_layer_block` as arrays and ints, checked.

    Each bad argument is one ValueError naming it and what is allowed: samples a non-empty
    (N, T) integer array, N unique ids, a non-empty block of layers each with a file in
    ``out_paths``, ``store_dtype`` float32 or float64, 0 ≤ ``store_first_n`` ≤ N and
    ``checkpoint_every`` ≥ 1, ``n_groups`` 0 or a divisor of N.
    """
    samples = np.asarray(samples)
    if samples.ndim != 2 or samples.dtype.kind not in "iu":
        raise ValueError(f"samples must be an (N, T) integer array, got {samples.dtype}{samples.shape}")
    n_samples = samples.shape[0]
    if n_samples == 0:
        raise ValueError("samples is empty: give at least one sample")
    ids = np.asarray(sample_ids)
    if ids.shape != (n_samples,):
        raise ValueError(f"sample_ids has shape {ids.shape}, expected ({n_samples},) to match samples")
    if len(set(ids.tolist())) != n_samples:
        raise ValueError("sample_ids are not unique")
    layers = [int(x) for x in layers]
    if not layers:
        raise ValueError("layers is empty: give at least one layer")
    missing = [x for x in layers if x not in out_paths]
    if missing:
        raise ValueError(f"out_paths has no file for layers {missing}")
    if store_dtype not in ("float32", "float64"):
        raise ValueError(f"store_dtype={store_dtype!r}: allowed are 'float32' and 'float64'")
    if not 0 <= int(store_first_n) <= n_samples:
        raise ValueError(f"store_first_n={store_first_n}: allowed 0..{n_samples} (the number of samples)")
    if int(checkpoint_every) < 1:
        raise ValueError(f"checkpoint_every={checkpoint_every}: must be ≥ 1")
    if int(n_groups) < 0 or (n_groups and n_samples % int(n_groups)):
        raise ValueError(f"n_groups={n_groups}: must be 0 or divide the {n_samples} samples into equal groups")
    return samples, ids, layers


def _accumulate_batch(
    acc: JacobianSums,
    start: int,
    jacobians: Iterable[dict[tuple[int, str], torch.Tensor]],
    ids: np.ndarray,
    attrs: dict[str, Any],
    store_first_n: int,
    bar: Any,
) -> None:
    """Add each sample's sublayer Jacobians to the running sums ``acc``, in sample order.

    ``jacobians`` yields {(layer, kind): (P, d, d) Jacobian} for samples ``start``, ``start`` + 1, …;
    it is iterated directly (no ``zip``/``enumerate``, whose cached result tuple would keep the
    previous sample's Jacobians alive while the next one is computed). Per sample the
    finiteness flags and per-position summaries of every sublayer come to the host in one copy
    (:func:`_sample_scalars`; a non-finite sublayer raises FloatingPointError naming the sample id
    before anything is added); then per sublayer the float64 sum over positions (one d × d copy)
    and the whole Jacobian when i < ``store_first_n``. After each sample ``acc.next_index`` = i + 1
    and ``bar`` advances by one.
    """
    i = start - 1
    for jacs in jacobians:
        i += 1
        scalars = _sample_scalars(jacs)  # the sample's one host sync before its data is copied
        for ((layer, kind), jac), flag in zip(jacs.items(), scalars[:, 0, 0]):
            if flag != 1.0:
                _check_finite(jac, attrs, layer, kind, ids[i].item())
        for ((layer, kind), jac), values in zip(jacs.items(), scalars[:, 1:]):
            acc.sums[(layer, kind)] += jac.double().sum(0).cpu().numpy()
            for s, row in zip(JacobianBlocks.SUMMARIES, values):
                acc.per[(layer, kind, s)][i] = row
            if i < store_first_n:
                acc.first[(layer, kind)][i] = jac.cpu().numpy()
        jacs = jac = None  # the device copies go before the next sample's Jacobians are computed
        acc.next_index = i + 1
        acc.close_group()
        bar.update(1)


def _progress(total: int, initial: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, file=sys.stderr, unit="sample")
