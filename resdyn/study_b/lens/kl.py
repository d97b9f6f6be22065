"""KL divergence to the model's final distribution: the target, the two autograd Functions
(whole readout, linear head), chunking of the vocabulary-sized work, and held-out evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from resdyn.study_b.lens.readout import lens_readout


@dataclass
class Target:
    """The model's final distribution for N tokens: p (N, V), Σ p log p (N,), top-1 token (N,).

    log p itself is not kept (a second N×V tensor); :func:`kl_to_target` recovers the KL from
    p and Σ p log p.
    """

    p: torch.Tensor
    neg_entropy: torch.Tensor
    top1: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> Target:
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        p = logp.exp()
        return cls(p, (p * logp).sum(-1), logits.argmax(-1))


class _FusedKL(torch.autograd.Function):
    """Per-token ``KL(p ‖ softmax(z)) = logsumexp(z) − Σ p z + Σ p log p`` with a fused backward.

    ``∂KL/∂z = softmax(z) − p``. The forward computes softmax(z) once (one fused exp pass) and
    saves it instead of z, so the backward needs no second exp and the chunk's memory stays at
    one vocab-sized tensor (autograd's log_softmax path keeps several and exponentiates twice).
    Shapes: z (..., N, V), p (N, V), neg_entropy (N,) → (..., N).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, p: torch.Tensor, neg_entropy: torch.Tensor, value: bool = True) -> torch.Tensor:
        q = torch.softmax(z, dim=-1)  # one fused pass (a manual max/exp/sum is ~3× slower)
        ctx.save_for_backward(q, p)
        ctx.used = False
        if not value:
            # Only the gradient is wanted (steps whose loss is not logged): skip the three
            # vocab-sized passes below, ~10 % of a CPU step. The zeros only carry the backward.
            return z.new_zeros(z.shape[:-1])
        # logsumexp(z) = z_v − log q_v for any v. Take v = argmax (q_v ≥ 1/V: no underflow);
        # softmax is monotone, so max q and max z sit at the same v and two index-free amax
        # passes give it (max-with-indices + gather costs twice as much).
        lse = z.amax(dim=-1) - q.amax(dim=-1).log()
        cross = torch.linalg.vecdot(z, p.expand_as(z))
        return lse - cross + neg_entropy

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # In place on the saved softmax: no second vocab-sized allocation per chunk. A second
        # backward through the same graph (retain_graph=True) would read the overwritten q.
        if ctx.used:
            raise RuntimeError("fused_kl: backward may run only once per forward (retain_graph is not supported)")
        ctx.used = True
        q, p = ctx.saved_tensors
        q.sub_(p)
        # Training backpropagates kl.sum() (unit upstream gradient; the 1/N is applied to the
        # small parameter gradients instead), which on a CPU saves a vocab-sized multiply. On
        # an accelerator the multiply is cheaper than the host sync the check would force.
        if q.device.type != "cpu" or not bool((grad == 1).all()):
            q.mul_(grad.unsqueeze(-1))
        return q, None, None, None


def fused_kl(
    z: torch.Tensor, target_p: torch.Tensor, target_neg_entropy: torch.Tensor, value: bool = True
) -> torch.Tensor:
    """Differentiable per-token KL(p ‖ softmax(z)); see :class:`_FusedKL`.

    ``value=False`` returns zeros whose backward is still ∂KL/∂z (gradient-only steps).
    """
    return _FusedKL.apply(z, target_p, target_neg_entropy, value)


class _LinearHeadKL(torch.autograd.Function):
    """Per-token KL(p ‖ softmax(W y)) for a linear head W (V, d), from d-sized teacher statistics.

    With ``z = W y``: ``KL = logsumexp(z) − yᵀ m + Σ p log p`` and ``∂KL/∂y = Wᵀ softmax(z) − m``,
    where ``m = Wᵀ p``. The teacher enters only through m (d numbers per token) and Σ p log p,
    so the vocabulary-sized target p is never stored nor read during training: one matmul, one
    softmax and one matmul per chunk. W and the softmax may run in bfloat16 (``w.dtype``); m is
    then computed from the same rounded W in float32 (:func:`teacher_stats`), so that
    ``Wᵀ q − m`` cancels exactly where q = p, and only the rounding of z and q remains.
    Shapes: y (..., N, d), w (V, d), m (N, d), neg_entropy (N,) → (..., N) float32 (float64 for float64 y).
    """

    @staticmethod
    def forward(
        ctx, y: torch.Tensor, w: torch.Tensor, m: torch.Tensor, neg_entropy: torch.Tensor, value: bool = True
    ) -> torch.Tensor:
        acc = torch.promote_types(y.dtype, torch.float32)  # float32 (float64 in the tests)
        z = torch.matmul(y.to(w.dtype), w.mT)
        q = torch.softmax(z, dim=-1)
        ctx.save_for_backward(q, w, m)
        ctx.y_dtype, ctx.acc = y.dtype, acc
        if not value:
            return y.new_zeros(y.shape[:-1], dtype=acc)
        # logsumexp(z) = z_v − log q_v at v = argmax (see _FusedKL.forward).
        lse = z.amax(dim=-1).to(acc) - q.amax(dim=-1).to(acc).log()
        return lse - torch.linalg.vecdot(y.to(acc), m.to(acc).expand(*y.shape[:-2], *m.shape)) + neg_entropy

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, w, m = ctx.saved_tensors
        g = torch.matmul(q, w).to(ctx.acc).sub_(m)
        if g.device.type != "cpu" or not bool((grad == 1).all()):
            g.mul_(grad.unsqueeze(-1))
        return g.to(ctx.y_dtype), None, None, None, None


def linear_head_kl(
    y: torch.Tensor, w: torch.Tensor, m: torch.Tensor, neg_entropy: torch.Tensor, value: bool = True
) -> torch.Tensor:
    """Differentiable (in y) per-token KL(p ‖ softmax(W y)); see :class:`_LinearHeadKL`."""
    return _LinearHeadKL.apply(y, w, m, neg_entropy, value)


class _FlashHeadKL(torch.autograd.Function):
    """Per-token KL(p ‖ softmax(W y)) for a linear head W (V, d), by one fused attention kernel.

    The same quantity as :class:`_LinearHeadKL`: ``KL = logsumexp(z) − yᵀ m + Σ p log p`` and
    ``∂KL/∂y = Wᵀ softmax(z) − m`` with ``z = W y``, ``m = Wᵀ p``. Both vocabulary-sized terms
    are what attention computes with queries y, keys W, values W and scale 1: the output
    ``softmax(y Wᵀ) W`` and the logsumexp of the scores. PyTorch's CPU flash-attention kernel
    computes them in tiles (online softmax, float32 accumulation), so the (tokens × V) logits
    never reach memory (``benchmarks/lens.py`` times it against matmul + softmax + matmul,
    docs/speed.md). The gradient is computed in the forward (the
    loss is summed per token) and the backward only scales it.
    Shapes: y (..., N, d), w (V, d) of y's dtype, m (N, d), neg_entropy (N,) → (..., N) in y's dtype.
    """

    @staticmethod
    def forward(ctx, y: torch.Tensor, w: torch.Tensor, m: torch.Tensor, neg_entropy: torch.Tensor) -> torch.Tensor:
        d = y.shape[-1]
        kv = w[None, None]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            y.reshape(1, 1, -1, d).contiguous(), kv, kv, 0.0, False, scale=1.0
        )[:2]
        m = m.to(y.dtype).expand(y.shape)
        ctx.save_for_backward(out.reshape(y.shape).sub_(m))
        return lse.reshape(y.shape[:-1]) - torch.linalg.vecdot(y, m) + neg_entropy.to(y.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (g,) = ctx.saved_tensors
        return g * grad.unsqueeze(-1), None, None, None


def flash_head_kl(y: torch.Tensor, w: torch.Tensor, m: torch.Tensor, neg_entropy: torch.Tensor) -> torch.Tensor:
    """Differentiable (in y) per-token KL(p ‖ softmax(W y)) on a CPU; see :class:`_FlashHeadKL`.

    Needs y and w on the CPU in one floating dtype; :func:`flash_kl_usable` says when.
    """
    return _FlashHeadKL.apply(y, w, m, neg_entropy)


def flash_kl_usable(y_dtype: torch.dtype, w: torch.Tensor | None) -> tuple[bool, str]:
    """(whether :func:`flash_head_kl` can run, why not): a linear head on the CPU in y's dtype."""
    if w is None:
        return False, "the readout is not a plain linear head (bias or softcap)"
    if w.device.type != "cpu":
        return False, f"the fused kernel is the CPU one (model on {w.device.type})"
    if w.dtype != y_dtype:
        return False, f"readout dtype {w.dtype} differs from the states' {y_dtype}"
    return True, ""


def kl_to_target(z: torch.Tensor, target: Target) -> torch.Tensor:
    """Per-token ``Σ p log p − Σ p log softmax(z)`` (no-grad evaluation form), shape z.shape[:-1].

    When z is bit-identical to the logits the target came from, both sums are computed by the
    same operations on the same numbers, so the KL is exactly 0 (the reference row at index n).
    """
    return kl_from_logq(torch.log_softmax(z.to(torch.promote_types(z.dtype, torch.float32)), dim=-1), target)


def kl_from_logq(logq: torch.Tensor, target: Target) -> torch.Tensor:
    """Per-token ``Σ p log p − Σ p log q`` from lens log-probabilities ``logq`` (..., N, V)."""
    return target.neg_entropy - (target.p * logq).sum(-1)


def default_chunk_elements(device: torch.device) -> int:
    """Logits elements per chunk: 2^22 (16 MB fp32) on a CPU, 2^27 (512 MB) on an accelerator.

    On a CPU the elementwise softmax/KL passes run faster when a chunk stays near the caches
    (measured: 2^22 beats 2^26 by ~15 % on a d=128, V=2048 Llama); on a GPU larger chunks mean
    fewer, fuller kernels, bounded so logits + softmax + gradient fit next to a large model.
    """
    return 1 << 22 if torch.device(device).type == "cpu" else 1 << 27


@torch.no_grad()
def teacher_stats(
    model: nn.Module, w: torch.Tensor, final_states: torch.Tensor, budget: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token teacher statistics ``(m = Wᵀ p (N, d) float32, Σ p log p (N,))`` of the model's
    final distribution p, from the last layer's raw output (N, d); W as used by the training
    readout (its bf16 rounding included, so the KL gradient cancels exactly at q = p)."""
    wf = w.float()
    ms, negs = [], []
    for ts, _ in blocks(1, final_states.shape[0], w.shape[0], budget):
        tgt = final_target(model, final_states[ts])
        ms.append(tgt.p.float() @ wf)
        negs.append(tgt.neg_entropy.float())
    return torch.cat(ms), torch.cat(negs)


def blocks(n_layers: int, n_tokens: int, vocab: int, budget: int) -> Iterator[tuple[slice, list[slice]]]:
    """Token chunks (outer) and, within each, layer groups whose logits have ≤ budget elements.

    A token chunk holds ``min(N, budget // V)`` tokens (≥ 1), a layer group as many layers as
    then fit. The target distribution is computed once per token chunk, so its memory is
    bounded by the budget too (a whole held-out set × 150k vocabulary would not fit).
    """
    tc = max(1, min(n_tokens, budget // vocab))
    lg = max(1, budget // (tc * vocab))
    for t0 in range(0, n_tokens, tc):
        ts = slice(t0, min(n_tokens, t0 + tc))
        yield ts, [slice(l0, min(n_layers, l0 + lg)) for l0 in range(0, n_layers, lg)]


@torch.no_grad()
def final_target(model: nn.Module, final_states: torch.Tensor) -> Target:
    """Target distribution of the last layer's raw output ``final_states (N, d)`` (row n).

    Read out through the identity translator — the very call the reference row n makes on
    the same token chunk, so that row reproduces it bit for bit (KL exactly 0 there).
    """
    return Target.from_logits(lens_readout(model, final_states, None, None))


@torch.no_grad()
def layer_kl(
    model: nn.Module, weight: torch.Tensor | None, bias: torch.Tensor | None, states: torch.Tensor, budget: int
) -> np.ndarray:
    """Mean KL(p_final ‖ p_lens) per translator layer over the tokens of ``states``; (n,) float64.

    ``weight = bias = None`` evaluates the logit lens.
    """
    n, n_tok = states.shape[0] - 1, states.shape[1]
    vocab = model.get_output_embeddings().weight.shape[0]
    kl_sum = torch.zeros(n, dtype=torch.float64)
    for ts, groups in blocks(n, n_tok, vocab, budget):
        tgt = final_target(model, states[-1, ts])
        for ls in groups:
            w = None if weight is None else weight[ls]
            b = None if bias is None else bias[ls]
            z = lens_readout(model, states[ls, ts], w, b)
            kl_sum[ls] += kl_to_target(z, tgt).sum(-1).double().cpu()
    return (kl_sum / n_tok).numpy()
