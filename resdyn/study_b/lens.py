"""Tuned lens and logit lens: per-layer affine translators read out through the model's own head.

Definitions (DESIGN.md, "Lens translator"):

- Translator of layer L (L = 0 … n−1, n = number of decoder layers) acts on the raw residual
  stream *entering* layer L (L = 0: the embedding output)::

      T_L(h) = h + W_L h + b_L = A_L h + b_L,        A_L = I + W_L,   W_L, b_L initialised at 0

  The residual parametrisation means weight decay pulls toward the identity, i.e. toward the
  logit lens, not toward the zero map.
- Readout: ``logits = arch.unembed_logits(model, T_L(h))`` = softcap(lm_head(final_norm(·))),
  the model's own head including Gemma's final logit softcap.
- Loss (distillation): ``KL(p_final ‖ p_lens) = Σ_v p_final(v) (log p_final(v) − log p_lens(v))``
  averaged over tokens, where ``p_final = softmax(model logits)``; the model is frozen.
- Index n (the last layer's output) is the identity reference: W = 0, b = 0, so the lens there
  *is* the model's own readout and its KL is exactly 0. The logit lens is the same code path
  with W = 0, b = 0 at every layer (:func:`logit_lens_logits`).

Training (:func:`train_lens`) caches the residual states of a batch once (one frozen forward)
and trains all n translators on them in the same pass: the translators are stacked into one
(n, d, d) weight and one (n, d) bias and applied with a batched matmul, and the readout of
several layers runs as one matmul. Every optimizer used here acts elementwise, so this is
mathematically tuned-lens's per-layer loop (global gradient clipping, its default) or, with
``clip_scope="layer"``, n fully independent trainings.

Convergence: held-out KL is evaluated every ``eval_every`` steps (and at step 0, which is the
logit lens). For layer L with held-out history K_L(e) over evals e, the relative improvement over
the last ``patience`` evals is ``r_L = (K_L(e−patience) − min_{e−patience<j≤e} K_L(j)) /
K_L(e−patience)``; layer L counts as converged while ``r_L < tol``. Training stops at the first
eval where every layer has converged (windows must start after the LR warmup), or at ``steps``.

Resume: with ``checkpoint=PATH``, :func:`train_lens` saves the loop's whole state (translators,
optimizer state, step, curves, held-out history, convergence counters, position in the token
stream) atomically to PATH every ``checkpoint_every`` steps, and a rerun with the same model,
tokens and options continues from it bit-identically (the cached states are recomputed by the
same deterministic forward). A checkpoint written for other inputs is ignored with a warning;
it is removed when training finishes.

Files: :meth:`Lens.save` writes a lens folder (translators, curves, config; format
``resdyn.lens/1``) and the training checkpoint is a file; both formats, their writers and readers
are :class:`resdyn.artifacts.LensFolder` and :class:`resdyn.artifacts.LensCheckpoint`.

:meth:`Lens.export_tuned_lens` writes the EleutherAI ``tuned-lens`` format (params.pt +
config.json) so that ``tuned_lens.nn.TunedLens`` users can load our translators.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from resdyn import artifacts
from resdyn.artifacts import LensCheckpoint, LensFolder
from resdyn.lm import structure

log = logging.getLogger(__name__)

FORMAT = LensFolder.FORMAT
CHECKPOINT_FORMAT = LensCheckpoint.FORMAT
OPTIMIZERS = ("sgd_nesterov", "adam")
LR_SCHEDULES = ("constant", "linear")
CLIP_SCOPES = ("layer", "global")
READOUT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Effective learning rates used when ``lr`` is not given; the tuned-lens defaults
# (SGD: 1.0 after undoing PyTorch's 1/(1−β) momentum gain; Adam: 1e-3).
DEFAULT_LR = {"sgd_nesterov": 1.0, "adam": 1e-3}
CURVE_COLUMNS = LensFolder.CURVE_COLUMNS
CONVERGENCE_COLUMNS = ["layer", "converged", "converged_step", "steps", "final_heldout_kl", "rel_change"]


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LensOptions:
    """Training options of :func:`train_lens` (all keyword arguments of it).

    - steps: maximum optimizer steps.
    - tokens_per_step: tokens per step (None: the tokens of one batch). Steps take consecutive
      slices of the cached token stream, so each batch's frozen forward runs once.
    - optimizer: "sgd_nesterov" or "adam". lr: effective step size (None: 1.0 for SGD, 1e-3
      for Adam); for SGD the torch lr is ``lr·(1−momentum)``, undoing PyTorch's 1/(1−momentum)
      momentum gain (as tuned-lens does). momentum: SGD momentum / Adam β1.
    - weight_decay: decoupled (AdamW) for Adam, L2 for SGD; both pull W, b toward 0, i.e. the
      translator toward the identity (logit lens).
    - warmup_steps: linear warmup, step s < warmup at lr·(s+1)/warmup. lr_schedule: after
      warmup "constant", or "linear" decay to 0 at ``steps`` (tuned-lens's trainer).
    - clip_grad_norm: gradient-norm clip (None: off). clip_scope "global" (default): one clip
      over all translators, tuned-lens's recipe, so our lenses match tuned-lens-trained ones
      (measured 1–2 % lower held-out KL than per-layer clipping on a small Llama at equal
      budget); "layer": one clip per layer, the layers become fully independent problems.
    - eval_every, patience, tol: the convergence criterion (module docstring).
    - seed: torch seed for the run (forked RNG; the global state is left as it was).
    - chunk_elements: max logits elements (layers × tokens × vocab) per forward/backward chunk,
      bounding memory on large vocabularies; None: :func:`default_chunk_elements`.
    - readout_dtype: dtype of the training readout's two vocabulary-sized matmuls and softmax
      ("float32", or "bfloat16" as tuned-lens's trainer autocasts; see :class:`_LinearHeadKL`).
      Held-out evaluation, the convergence criterion and :func:`lens_metrics` always run in
      float32 through the model's own readout.
    - progress: tqdm bar (stderr, i.e. the rule's log).
    """

    steps: int = 250
    tokens_per_step: int | None = None
    optimizer: str = "sgd_nesterov"
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 1e-3
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    clip_grad_norm: float | None = 1.0
    clip_scope: str = "global"
    eval_every: int = 10
    patience: int = 5
    tol: float = 1e-3
    seed: int = 0
    chunk_elements: int | None = None
    readout_dtype: str = "float32"
    progress: bool = True

    def __post_init__(self) -> None:
        _check(self.optimizer in OPTIMIZERS, f"optimizer={self.optimizer!r}; allowed: {OPTIMIZERS}")
        _check(self.lr_schedule in LR_SCHEDULES, f"lr_schedule={self.lr_schedule!r}; allowed: {LR_SCHEDULES}")
        _check(self.clip_scope in CLIP_SCOPES, f"clip_scope={self.clip_scope!r}; allowed: {CLIP_SCOPES}")
        _check(self.readout_dtype in READOUT_DTYPES, f"readout_dtype={self.readout_dtype!r}; allowed: {tuple(READOUT_DTYPES)}")
        _check(_is_int(self.steps) and self.steps >= 1, f"steps={self.steps!r}; must be an integer ≥ 1")
        _check(
            self.tokens_per_step is None or (_is_int(self.tokens_per_step) and self.tokens_per_step >= 1),
            f"tokens_per_step={self.tokens_per_step!r}; must be None or an integer ≥ 1",
        )
        _check(self.lr is None or self.lr > 0, f"lr={self.lr!r}; must be None or > 0")
        _check(0 <= self.momentum < 1, f"momentum={self.momentum!r}; must be in [0, 1)")
        _check(self.weight_decay >= 0, f"weight_decay={self.weight_decay!r}; must be ≥ 0")
        _check(_is_int(self.warmup_steps) and self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps!r}; must be an integer ≥ 0")
        _check(
            self.clip_grad_norm is None or self.clip_grad_norm > 0,
            f"clip_grad_norm={self.clip_grad_norm!r}; must be None or > 0",
        )
        _check(_is_int(self.eval_every) and self.eval_every >= 1, f"eval_every={self.eval_every!r}; must be an integer ≥ 1")
        _check(_is_int(self.patience) and self.patience >= 1, f"patience={self.patience!r}; must be an integer ≥ 1")
        _check(self.tol >= 0, f"tol={self.tol!r}; must be ≥ 0")
        _check(
            self.chunk_elements is None or (_is_int(self.chunk_elements) and self.chunk_elements >= 1),
            f"chunk_elements={self.chunk_elements!r}; must be None or an integer ≥ 1",
        )

    @property
    def effective_lr(self) -> float:
        """The step size actually used: ``lr`` or the optimizer's default."""
        return float(self.lr) if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the options (for config.json), with the effective lr filled in."""
        d = dataclasses.asdict(self)
        d["lr"] = self.effective_lr
        return d

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> LensOptions:
        """Build from keyword arguments, naming unknown keys and the allowed ones."""
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(f"unknown lens option(s) {unknown}; allowed: {sorted(allowed)}")
        return cls(**options)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# ----------------------------------------------------------------------------------------------
# The translator and the readout: one code path for tuned lens, logit lens and the reference
# ----------------------------------------------------------------------------------------------


def apply_translator(hidden: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``T(h) = h + W h + b`` on the last axis, computed in float32, returned in h's dtype.

    Shapes: a single translator ``weight (d, d)``, ``bias (d,)`` acts on ``hidden (..., d)``;
    stacked translators ``weight (L, d, d)``, ``bias (L, d)`` act on ``hidden (L, N, d)``
    (layer-major). ``weight = bias = None`` is the identity translator (logit lens, index n):
    ``h`` is returned untouched, so that readout is bit-for-bit the model's own.
    """
    if weight is None and bias is None:
        return hidden
    x = hidden.float()
    out = x
    if weight is not None:
        out = out + torch.matmul(x, weight.mT)
    if bias is not None:
        out = out + (bias.unsqueeze(-2) if bias.dim() == 2 else bias)
    # Cast back: the readout's norm and head run in the model's dtype (bf16 heads reject fp32).
    return out.to(hidden.dtype)


def lens_readout(model: nn.Module, hidden: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Lens logits ``unembed_logits(model, T(h))`` (..., V); W = b = None gives the logit lens."""
    return structure.unembed_logits(model, apply_translator(hidden, weight, bias))


def logit_lens_logits(model: nn.Module, hidden: torch.Tensor, layer: int) -> torch.Tensor:
    """Logit-lens logits of the stream ``hidden (..., d)`` at index ``layer`` ∈ [0, n].

    The identity translator (W = 0, b = 0) read out through the model's own head; the same code
    path as the tuned lens (:func:`lens_readout`). At ``layer = n`` it equals the model's logits.
    """
    _check_layer(layer, len(structure.decoder_layers(model)), allow_reference=True)
    return lens_readout(model, hidden, None, None)


def _check_layer(layer: int, n_layers: int, allow_reference: bool) -> None:
    top = n_layers if allow_reference else n_layers - 1
    if not _is_int(layer) or not 0 <= layer <= top:
        raise ValueError(f"layer={layer!r}; allowed: integers 0..{top} (n_layers = {n_layers})")


# ----------------------------------------------------------------------------------------------
# KL divergence to the model's final distribution
# ----------------------------------------------------------------------------------------------


@dataclass
class _Target:
    """The model's final distribution for N tokens: p (N, V), Σ p log p (N,), top-1 token (N,).

    log p itself is not kept (a second N×V tensor); :func:`kl_to_target` recovers the KL from
    p and Σ p log p.
    """

    p: torch.Tensor
    neg_entropy: torch.Tensor
    top1: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> _Target:
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


def fused_kl(z: torch.Tensor, target_p: torch.Tensor, target_neg_entropy: torch.Tensor, value: bool = True) -> torch.Tensor:
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
    then computed from the same rounded W in float32 (:func:`_teacher_stats`), so that
    ``Wᵀ q − m`` cancels exactly where q = p, and only the rounding of z and q remains.
    Shapes: y (..., N, d), w (V, d), m (N, d), neg_entropy (N,) → (..., N) float32 (float64 for float64 y).
    """

    @staticmethod
    def forward(ctx, y: torch.Tensor, w: torch.Tensor, m: torch.Tensor, neg_entropy: torch.Tensor, value: bool = True) -> torch.Tensor:
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


def linear_head_kl(y: torch.Tensor, w: torch.Tensor, m: torch.Tensor, neg_entropy: torch.Tensor, value: bool = True) -> torch.Tensor:
    """Differentiable (in y) per-token KL(p ‖ softmax(W y)); see :class:`_LinearHeadKL`."""
    return _LinearHeadKL.apply(y, w, m, neg_entropy, value)


def kl_to_target(z: torch.Tensor, target: _Target) -> torch.Tensor:
    """Per-token ``Σ p log p − Σ p log softmax(z)`` (no-grad evaluation form), shape z.shape[:-1].

    When z is bit-identical to the logits the target came from, both sums are computed by the
    same operations on the same numbers, so the KL is exactly 0 (the reference row at index n).
    """
    return _kl_from_logq(torch.log_softmax(z.to(torch.promote_types(z.dtype, torch.float32)), dim=-1), target)


def _kl_from_logq(logq: torch.Tensor, target: _Target) -> torch.Tensor:
    return target.neg_entropy - (target.p * logq).sum(-1)


# ----------------------------------------------------------------------------------------------
# Model handling
# ----------------------------------------------------------------------------------------------


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's output embedding (where the readout runs)."""
    return model.get_output_embeddings().weight.device


def n_layers_of(model: nn.Module) -> int:
    """Number of decoder layers n (translators 0..n−1, reference index n)."""
    return len(structure.decoder_layers(model))


@contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and ``requires_grad=False`` on every model parameter, restored afterwards.

    Gradients must flow *through* the final norm and head to the translators but never into
    the model (that would waste a V×d weight-gradient matmul per chunk and touch ``.grad``).
    """
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


def _readout_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    head = model.get_output_embeddings()
    named = [(f"lm_head.{k}", v) for k, v in head.named_parameters()]
    named += [(f"final_norm.{k}", v) for k, v in structure.final_norm(model).named_parameters()]
    named += [(f"final_norm.{k}", v) for k, v in structure.final_norm(model).named_buffers()]
    return named


def _softcap(model: nn.Module) -> float | None:
    cfg = getattr(model, "config", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap is None and cfg is not None and hasattr(cfg, "get_text_config"):
        cap = getattr(cfg.get_text_config(), "final_logit_softcapping", None)
    return float(cap) if cap else None


def unembed_hash(model: nn.Module) -> str:
    """Hex SHA-256 identifying the readout a lens was trained through.

    Hashes (name, shape, float32 bytes) of the head's parameters and the final norm's
    parameters and buffers, then the softcap value: stricter than tuned-lens's hash of the
    unembedding alone, since our lens reads out through all three. float32 bytes make the hash
    independent of loading a bf16 checkpoint in bf16 or fp32. Streamed in row blocks (a 150k×5k
    head would otherwise need a 3 GB float32 copy), which is why io.sha256_array is not used.
    """
    h = hashlib.sha256()
    for name, t in _readout_tensors(model):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        flat = t.detach().reshape(t.shape[0], -1) if t.dim() > 1 else t.detach().reshape(1, -1)
        for start in range(0, flat.shape[0], 4096):
            h.update(flat[start : start + 4096].to("cpu", torch.float32).contiguous().numpy().tobytes())
    h.update(f"softcap={_softcap(model)!r}".encode())
    if structure.readout_scale(model) is not None:  # Granite (absent elsewhere: earlier hashes unchanged)
        h.update(f"logits_scaling={arch.readout_scale(model)!r}".encode())
    return h.hexdigest()


def tuned_lens_unembed_hash(model: nn.Module) -> str:
    """The hash tuned-lens 0.2.0 stores as ``unembed_hash`` (``Unembed.unembedding_hash``).

    Its formula: SHA-256 of ``np.array_str(W, precision=1)`` of the float32 unembedding matrix
    (a printed summary, so robust to dtype). It depends on numpy's print format, so tuned-lens
    only warns on a mismatch; written so that the warning does not fire for our exports.
    """
    w = model.get_output_embeddings().weight.detach().cpu().float().numpy()
    return hashlib.sha256(str.encode(np.array_str(w, precision=1))).hexdigest()


class TunedLensReadout(nn.Module):
    """The model's own readout in the shape of tuned-lens's ``Unembed``, for any family.

    tuned-lens 0.2.0 resolves the final norm only for the families it lists (not OLMo 2,
    Gemma 2/3/4, …) and applies no final-logit softcap. Passing this object instead,
    ``TunedLens.from_unembed_and_pretrained(TunedLensReadout(model), <exported dir>)``, gives
    tuned-lens users exactly our readout: ``forward(h) = arch.unembed_logits(model, h)``.
    It exposes what TunedLens reads (``unembedding`` with ``.weight``, ``final_norm``,
    ``unembedding_hash()``). The model's modules are held as plain attributes, not submodules,
    so ``lens.parameters()`` never includes (and an optimizer never trains) the model's head.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "unembedding", model.get_output_embeddings())
        object.__setattr__(self, "final_norm", structure.final_norm(model))

    def unembedding_hash(self) -> str:
        """tuned-lens's hash of the unembedding matrix (:func:`tuned_lens_unembed_hash`)."""
        return tuned_lens_unembed_hash(self.model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``softcap(lm_head(final_norm(h)))`` — the model's own readout."""
        return structure.unembed_logits(self.model, h)


def model_info(model: nn.Module) -> dict[str, Any]:
    """The shapes a lens is fitted against: ``d_model``, ``vocab_size`` (of the unembedding), ``n_layers``."""
    head = model.get_output_embeddings()
    return {
        "d_model": int(head.weight.shape[1]),
        "vocab_size": int(head.weight.shape[0]),
        "n_layers": n_layers_of(model),
    }


# ----------------------------------------------------------------------------------------------
# Cached residual states, as a token stream
# ----------------------------------------------------------------------------------------------


def _as_batches(token_batches: Iterable[torch.Tensor], name: str) -> list[torch.Tensor]:
    batches = []
    for i, b in enumerate(token_batches):
        if not isinstance(b, torch.Tensor) or b.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name}[{i}]: expected an integer torch tensor (B, T), got {type(b).__name__} {getattr(b, 'dtype', '')}")
        if b.dim() == 1:
            b = b[None]
        if b.dim() != 2 or b.numel() == 0:
            raise ValueError(f"{name}[{i}]: expected shape (B, T) with B, T ≥ 1, got {tuple(b.shape)}")
        batches.append(b.long())
    if not batches:
        raise ValueError(f"{name}: no batches given")
    return batches


def default_chunk_elements(device: torch.device) -> int:
    """Logits elements per chunk: 2^22 (16 MB fp32) on a CPU, 2^27 (512 MB) on an accelerator.

    On a CPU the elementwise softmax/KL passes run faster when a chunk stays near the caches
    (measured: 2^22 beats 2^26 by ~15 % on a d=128, V=2048 Llama); on a GPU larger chunks mean
    fewer, fuller kernels, bounded so logits + softmax + gradient fit next to a large model.
    """
    return 1 << 22 if torch.device(device).type == "cpu" else 1 << 27


def _decoder_only(model: nn.Module) -> nn.Module:
    """The decoder without the LM head when the model exposes it, else the model itself.

    States need only the decoder; running the whole CausalLM would also compute the full
    (B·T × V) logits, one head matmul per batch that the lens recomputes anyway. Used only if
    it holds the very same layer list, so the captured states are the same tensors.
    """
    getter = getattr(model, "get_decoder", None)
    try:
        decoder = getter() if callable(getter) else None
        if decoder is not None and structure.decoder_layers(decoder) is structure.decoder_layers(model):
            return decoder
    except (AttributeError, ValueError, NotImplementedError):
        pass
    return model


def token_batches(input_ids: np.ndarray | torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Consecutive row batches of a (N, T) token array as LongTensors (B ≤ batch_size, T).

    The order is the array's (deterministic); the last batch may be smaller.
    """
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; must be an integer ≥ 1")
    ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64)) if not isinstance(input_ids, torch.Tensor) else input_ids.long()
    if ids.dim() != 2 or ids.shape[0] == 0:
        raise ValueError(f"input_ids: expected shape (N, T) with N ≥ 1, got {tuple(ids.shape)}")
    return [ids[i : i + batch_size] for i in range(0, ids.shape[0], batch_size)]


def layer_major_states(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Residual states of a batch as a token stream: (n+1, B·T, d), layer-major.

    Row L < n is the stream entering layer L, row n the last layer's raw output
    (:func:`arch.residual_states`). Layer-major so that a chunk of layers is contiguous.
    """
    states = structure.residual_states(_decoder_only(model), input_ids.to(model_device(model)))  # (B, n+1, T, d)
    b, l1, t, d = states.shape
    return states.permute(1, 0, 2, 3).reshape(l1, b * t, d)


class _TokenStream:
    """Consecutive slices of exactly ``k`` tokens from the cycled batches' cached states.

    Each batch's frozen forward runs once; its tokens are served to as many steps as they fill.
    The batch order is the given one (deterministic), cycled when the steps outrun the data.
    ``take()`` returns the states (n+1, k, d) and the teacher statistics of those tokens
    (``teacher(final_states)``: a tuple of token-major tensors, or None). When every batch's
    states and statistics fit in ``cache_bytes`` they are kept, so later epochs run no forward
    (the teacher's distribution does not change across steps). ``position()``/``seek()`` save and
    restore where the stream stands (for resume); a recomputed batch has the same bits.
    """

    def __init__(
        self,
        model: nn.Module,
        batches: Sequence[torch.Tensor],
        k: int | None,
        teacher: Any = None,
        cache_bytes: int = 0,
    ):
        self.model, self.batches, self.k, self.teacher = model, batches, k, teacher
        self.next_batch = 0
        self.buffer: tuple[torch.Tensor, tuple[torch.Tensor, ...] | None] | None = None
        self.offset = 0  # tokens of the current buffer's batch already served
        info = model_info(model)
        per_token = (info["n_layers"] + 1) * info["d_model"] * _dtype_of(model).itemsize + (info["d_model"] + 1) * 4
        total = sum(b.numel() for b in batches) * per_token
        self.cache: dict[int, Any] | None = {} if total <= cache_bytes else None

    def _fetch(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        i = self.next_batch % len(self.batches)
        self.next_batch += 1
        self.offset = 0
        if self.cache is not None and i in self.cache:
            return self.cache[i]
        states = layer_major_states(self.model, self.batches[i])
        item = (states, None if self.teacher is None else self.teacher(states[-1]))
        if self.cache is not None:
            self.cache[i] = item
        return item

    @staticmethod
    def _slice(item, sl: slice):
        states, stats = item
        return states[:, sl], None if stats is None else tuple(t[sl] for t in stats)

    def take(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        if self.k is None:
            return self._fetch()
        parts, have = [], 0
        while have < self.k:
            if self.buffer is None or self.buffer[0].shape[1] == 0:
                self.buffer = self._fetch()
            part = self._slice(self.buffer, slice(0, self.k - have))
            n_part = part[0].shape[1]
            self.buffer = self._slice(self.buffer, slice(n_part, None))
            self.offset += n_part
            parts.append(part)
            have += n_part
        if len(parts) == 1:
            return parts[0]
        states = torch.cat([p[0] for p in parts], dim=1)
        stats = None if parts[0][1] is None else tuple(torch.cat(ts, dim=0) for ts in zip(*(p[1] for p in parts)))
        return states, stats

    def position(self) -> tuple[int, int]:
        """(batches fetched so far, tokens of the last fetched batch served; 0 if it is used up)."""
        left = 0 if self.buffer is None else self.buffer[0].shape[1]
        return self.next_batch, (self.offset if left else 0)

    def seek(self, next_batch: int, offset: int) -> None:
        """Restore a :meth:`position`: refetch the partly served batch (same forward, same bits)."""
        self.buffer, self.offset = None, 0
        self.next_batch = next_batch
        if offset:
            self.next_batch -= 1
            item = self._fetch()
            self.buffer, self.offset = self._slice(item, slice(offset, None)), offset


def _dtype_of(model: nn.Module) -> torch.dtype:
    return model.get_output_embeddings().weight.dtype


def linear_readout_weight(model: nn.Module, dtype: torch.dtype) -> torch.Tensor | None:
    """The head's weight W (V, d) in ``dtype`` when the readout is ``W · final_norm(h)`` (no head
    bias, no softcap, no logit scaling) so that :class:`_LinearHeadKL` applies; None otherwise
    (Gemma's softcap, Granite's logits_scaling)."""
    head = model.get_output_embeddings()
    if (not isinstance(head, nn.Linear) or head.bias is not None or _softcap(model) is not None
            or structure.readout_scale(model) is not None):
        return None
    return head.weight.detach().to(dtype)


@torch.no_grad()
def _teacher_stats(model: nn.Module, w: torch.Tensor, final_states: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token teacher statistics ``(m = Wᵀ p (N, d) float32, Σ p log p (N,))`` of the model's
    final distribution p, from the last layer's raw output (N, d); W as used by the training
    readout (its bf16 rounding included, so the KL gradient cancels exactly at q = p)."""
    wf = w.float()
    ms, negs = [], []
    for ts, _ in _blocks(1, final_states.shape[0], w.shape[0], budget):
        tgt = _final_target(model, final_states[ts])
        ms.append(tgt.p.float() @ wf)
        negs.append(tgt.neg_entropy.float())
    return torch.cat(ms), torch.cat(negs)


def _blocks(n_layers: int, n_tokens: int, vocab: int, budget: int) -> Iterator[tuple[slice, list[slice]]]:
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
def _final_target(model: nn.Module, final_states: torch.Tensor) -> _Target:
    """Target distribution of the last layer's raw output ``final_states (N, d)`` (row n).

    Read out through the identity translator — the very call the reference row n makes on
    the same token chunk, so that row reproduces it bit for bit (KL exactly 0 there).
    """
    return _Target.from_logits(lens_readout(model, final_states, None, None))


# ----------------------------------------------------------------------------------------------
# Loss, evaluation, optimisation
# ----------------------------------------------------------------------------------------------


def _train_step_kl(
    model: nn.Module,
    weight: torch.Tensor,
    bias: torch.Tensor,
    states: torch.Tensor,
    budget: int,
    value: bool = True,
    teacher: tuple[torch.Tensor, torch.Tensor] | None = None,
    head_w: torch.Tensor | None = None,
) -> torch.Tensor:
    """Accumulate ∇ of Σ_L mean_tokens KL_L into weight/bias grads; return per-layer KL (n,).

    ``value=False``: gradient only, the returned KL is zeros (see :func:`fused_kl`).
    ``teacher``, ``head_w``: the tokens' (Wᵀ p, Σ p log p) and the linear head W; with them
    the loss runs through :class:`_LinearHeadKL`, otherwise through the model's whole readout
    and :class:`_FusedKL` with the target recomputed per chunk (softcapped or biased heads).

    The sum over layers has independent per-layer terms, so each parameter block receives
    exactly the gradient of its own layer's mean KL. Backward runs per chunk (bounded memory).
    """
    n, n_tok = weight.shape[0], states.shape[1]
    vocab = model.get_output_embeddings().weight.shape[0]
    kl_sum = torch.zeros(n, dtype=torch.float64, device=weight.device)
    norm = structure.final_norm(model)
    for ts, groups in _blocks(n, n_tok, vocab, budget):
        tgt = _final_target(model, states[-1, ts]) if teacher is None or head_w is None else None
        for ls in groups:
            if tgt is None:
                y = norm(apply_translator(states[ls, ts], weight[ls], bias[ls]))
                kl = linear_head_kl(y, head_w, teacher[0][ts], teacher[1][ts], value)
            else:
                z = lens_readout(model, states[ls, ts], weight[ls], bias[ls]).float()
                kl = fused_kl(z, tgt.p, tgt.neg_entropy, value)  # (layers, tokens)
            kl.sum().backward()  # unit upstream gradient: see _FusedKL.backward
            kl_sum[ls] += kl.detach().sum(-1).double()
    # ∇ of the token mean = ∇ of the sum / N, applied to the (n, d, d) grads, not (…, V) tensors.
    # Gradients accumulate across steps only through the optimizer, which zeroes them each step.
    weight.grad.div_(n_tok)
    bias.grad.div_(n_tok)
    return kl_sum / n_tok


@torch.no_grad()
def layer_kl(model: nn.Module, weight: torch.Tensor | None, bias: torch.Tensor | None, states: torch.Tensor, budget: int) -> np.ndarray:
    """Mean KL(p_final ‖ p_lens) per translator layer over the tokens of ``states``; (n,) float64.

    ``weight = bias = None`` evaluates the logit lens.
    """
    n, n_tok = states.shape[0] - 1, states.shape[1]
    vocab = model.get_output_embeddings().weight.shape[0]
    kl_sum = torch.zeros(n, dtype=torch.float64)
    for ts, groups in _blocks(n, n_tok, vocab, budget):
        tgt = _final_target(model, states[-1, ts])
        for ls in groups:
            w = None if weight is None else weight[ls]
            b = None if bias is None else bias[ls]
            z = lens_readout(model, states[ls, ts], w, b)
            kl_sum[ls] += kl_to_target(z, tgt).sum(-1).double().cpu()
    return (kl_sum / n_tok).numpy()


def _make_optimizer(params: list[nn.Parameter], opt: LensOptions) -> torch.optim.Optimizer:
    lr = opt.effective_lr
    if opt.optimizer == "sgd_nesterov":
        # PyTorch's momentum amplifies the step by 1/(1−β); undo it so lr is the effective step
        # (tuned-lens does the same; its optimum is then lr ≈ 1).
        return torch.optim.SGD(
            params, lr=lr * (1 - opt.momentum), momentum=opt.momentum, nesterov=opt.momentum > 0, weight_decay=opt.weight_decay
        )
    # Decoupled decay: pulls W, b toward 0 (= identity translator) at rate lr·wd regardless of the
    # gradient scale, where Adam's L2 form would be rescaled by the second-moment estimate.
    return torch.optim.AdamW(params, lr=lr, betas=(opt.momentum, 0.999), weight_decay=opt.weight_decay)


def lr_factor(step: int, opt: LensOptions) -> float:
    """LR multiplier at 0-based ``step``: linear warmup ``(step+1)/warmup``, then 1 or linear decay."""
    if step < opt.warmup_steps:
        return (step + 1) / opt.warmup_steps
    if opt.lr_schedule == "linear":
        return max(0.0, (opt.steps - step) / max(1, opt.steps - opt.warmup_steps))
    return 1.0


def clip_grads_(weight: torch.Tensor, bias: torch.Tensor, max_norm: float, scope: str = "layer") -> torch.Tensor:
    """Clip the translators' gradients in place; return the per-layer norms (n,) before clipping.

    scope "layer": each (W_L, b_L) gradient scaled to norm ≤ max_norm. scope "global": all of
    them scaled by one factor so the concatenated norm is ≤ max_norm (torch's
    clip_grad_norm_ over the whole lens, as tuned-lens's trainer does).
    """
    norms = torch.sqrt(weight.grad.pow(2).sum((1, 2)) + bias.grad.pow(2).sum(1))
    total = norms if scope == "layer" else torch.linalg.vector_norm(norms).expand_as(norms)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    weight.grad.mul_(scale[:, None, None])
    bias.grad.mul_(scale[:, None])
    return norms


def convergence_window(history: np.ndarray, patience: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Relative held-out improvement over the last ``patience`` evals, and converged flags.

    ``history (E, n)``: held-out KL per eval and layer. With ref = history[E−1−patience] and
    best = min(history[E−patience:]): ``r = (ref − best) / ref`` (0 where ref = 0), converged
    where ``r < tol``. Fewer than patience+1 evals: r = NaN, not converged.
    """
    history = np.asarray(history, dtype=np.float64)
    n = history.shape[1]
    if history.shape[0] <= patience:
        return np.full(n, np.nan), np.zeros(n, dtype=bool)
    ref = history[-1 - patience]
    best = history[-patience:].min(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(ref > 0, (ref - best) / np.where(ref > 0, ref, 1.0), 0.0)
    return rel, rel < tol


# ----------------------------------------------------------------------------------------------
# The Lens object
# ----------------------------------------------------------------------------------------------


class Lens:
    """Trained (or loaded) translators bound to the model whose readout they use.

    ``weight (n, d, d)``, ``bias (n, d)``: float32 W_L, b_L on the model's device.
    ``curves``: DataFrame(step, layer, split ∈ {train, heldout}, kl); train KL is that of the
    step's own training batch (before its update), held-out KL that of the held-out set after it. ``convergence``: DataFrame(layer, converged,
    converged_step, steps, final_heldout_kl, rel_change) — see the module docstring.
    """

    def __init__(
        self,
        model: nn.Module,
        weight: torch.Tensor,
        bias: torch.Tensor,
        *,
        options: dict[str, Any] | None = None,
        curves: pd.DataFrame | None = None,
        convergence: pd.DataFrame | None = None,
        meta: dict[str, Any] | None = None,
    ):
        info = model_info(model)
        n, d = info["n_layers"], info["d_model"]
        if tuple(weight.shape) != (n, d, d) or tuple(bias.shape) != (n, d):
            raise ValueError(f"translator shapes {tuple(weight.shape)}, {tuple(bias.shape)} do not fit the model: expected ({n}, {d}, {d}), ({n}, {d})")
        device = model_device(model)
        self.model = model
        self.weight = weight.detach().to(device, torch.float32)
        self.bias = bias.detach().to(device, torch.float32)
        self.n_layers, self.d_model, self.vocab_size = n, d, info["vocab_size"]
        self.options = dict(options or {})
        self.curves = curves if curves is not None else pd.DataFrame(columns=CURVE_COLUMNS)
        self.convergence = convergence if convergence is not None else pd.DataFrame(columns=CONVERGENCE_COLUMNS)
        self.meta = dict(meta or {})

    # --- the translators -------------------------------------------------------------------

    def _params(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        _check_layer(layer, self.n_layers, allow_reference=True)
        if layer == self.n_layers:  # reference: the model's own output, identity translator
            return None, None
        return self.weight[layer], self.bias[layer]

    def translator_matrix(self, layer: int) -> np.ndarray:
        """``A_L = I + W_L`` as float64 (d, d); the identity at the reference index n."""
        w, _ = self._params(layer)
        eye = np.eye(self.d_model)
        return eye if w is None else eye + w.detach().cpu().double().numpy()

    def translator_bias(self, layer: int) -> np.ndarray:
        """``b_L`` as float64 (d,); zeros at the reference index n."""
        _, b = self._params(layer)
        return np.zeros(self.d_model) if b is None else b.detach().cpu().double().numpy()

    def transform(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """``T_L(h) = h + W_L h + b_L`` of ``hidden (..., d)``, the stream entering layer L."""
        return apply_translator(hidden, *self._params(layer))

    def logits(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """Tuned-lens logits (..., V): the translator, then the model's own readout."""
        return lens_readout(self.model, hidden, *self._params(layer))

    # --- persistence -----------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The content of config.json."""
        return {
            "format": FORMAT,
            "model_id": self.meta.get("model_id"),
            "model_revision": self.meta.get("model_revision"),
            "model_hash": self.meta.get("model_hash"),
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "vocab_size": self.vocab_size,
            "unembed_hash": unembed_hash(self.model),
            "softcap": _softcap(self.model),
            "translator": "T_L(h) = h + W_L h + b_L for L in 0..n_layers-1; index n_layers is the identity",
            "training": self.options,
            "steps_trained": self.meta.get("steps_trained"),
            "stop_reason": self.meta.get("stop_reason"),
            # NaN (too few evals for the convergence window) as JSON null; load reads it back as NaN
            "convergence": self.convergence.astype(object).where(self.convergence.notna(), None).to_dict(orient="records"),
        }

    def save(self, directory: str | Path) -> Path:
        """Write the lens folder (:class:`resdyn.artifacts.LensFolder`): translators.safetensors,
        curves.tsv and (last) config.json, each atomically."""
        return LensFolder.write(directory, self.weight.detach().cpu().contiguous().numpy(),
                                self.bias.detach().cpu().contiguous().numpy(), self.curves, self.config())

    @classmethod
    def load(cls, directory: str | Path, model: nn.Module) -> Lens:
        """Load a saved lens (validated by :meth:`resdyn.artifacts.LensFolder.read`) and bind it to ``model``.

        Raises ValueError when the model's readout hash (:func:`unembed_hash`), layer count or
        width differ from those the lens was trained with.
        """
        cfg_path = Path(directory) / LensFolder.CONFIG_FILE
        cfg = LensFolder.read_config(directory)  # first: a lens of another model fails before its translators load
        info = model_info(model)
        for key in ("n_layers", "d_model", "vocab_size"):
            if cfg[key] != info[key]:
                raise ValueError(f"{cfg_path}: lens has {key}={cfg[key]} but the model has {key}={info[key]}")
        got = unembed_hash(model)
        if cfg["unembed_hash"] != got:
            raise ValueError(
                f"{cfg_path}: unembed_hash mismatch — the lens was trained through a readout with hash "
                f"{cfg['unembed_hash'][:16]}…, this model's readout (head, final norm, softcap) hashes to "
                f"{got[:16]}…; load it with the model it was trained on (model_id={cfg.get('model_id')!r})"
            )
        files = LensFolder.read(directory)
        convergence = pd.DataFrame(cfg.get("convergence") or [], columns=CONVERGENCE_COLUMNS)
        # null (NaN when saved: no held-out batches, or fewer evals than the window) back to NaN
        convergence[["final_heldout_kl", "rel_change"]] = convergence[["final_heldout_kl", "rel_change"]].astype(float)
        meta = {k: cfg.get(k) for k in ("model_id", "model_revision", "model_hash", "steps_trained", "stop_reason")}
        return cls(model, torch.from_numpy(files.weight.copy()), torch.from_numpy(files.bias.copy()),
                   options=cfg.get("training"), curves=files.curves, convergence=convergence, meta=meta)

    def export_tuned_lens(self, directory: str | Path) -> Path:
        """Write the lens in EleutherAI tuned-lens's format: ``params.pt`` + ``config.json``.

        Matches tuned-lens 0.2.0 (PyPI) and its GitHub head (commit b26b0c3, same format):
        ``TunedLens.save`` stores ``layer_translators.state_dict()`` — a ModuleList of
        ``nn.Linear(d, d)`` — so the keys are ``"{i}.weight"`` (d, d) and ``"{i}.bias"`` (d,)
        for i = 0..n−1 (no ``layer_translators.`` prefix; ``from_unembed_and_pretrained`` loads
        them with ``layer_translators.load_state_dict``), and ``transform_hidden`` computes
        ``h + Linear_i(h) = h + W_i h + b_i`` — our translator exactly. config.json holds the
        ``TunedLensConfig`` fields only (unknown keys are dropped with a warning there).

        Loading: ``TunedLens.from_model_and_pretrained(model, <dir>)`` works for the families
        tuned-lens knows (Llama, GPT-NeoX, …). For any family (OLMo 2, Gemma, …) and to keep
        Gemma's final softcap, which tuned-lens's own ``Unembed`` omits, use
        ``TunedLens.from_unembed_and_pretrained(TunedLensReadout(model), <dir>)``.
        """
        state: OrderedDict[str, torch.Tensor] = OrderedDict()
        for i in range(self.n_layers):
            state[f"{i}.weight"] = self.weight[i].detach().cpu().clone()
            state[f"{i}.bias"] = self.bias[i].detach().cpu().clone()
        config = {
            "base_model_name_or_path": self.meta.get("model_id") or getattr(self.model.config, "name_or_path", "") or "",
            "d_model": self.d_model,
            "num_hidden_layers": self.n_layers,
            "bias": True,
            "base_model_revision": self.meta.get("model_revision"),
            "unembed_hash": tuned_lens_unembed_hash(self.model),
            "lens_type": "linear_tuned_lens",
        }
        return LensFolder.write_tuned_lens(directory, state, config)


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def train_lens(
    model: nn.Module,
    token_batches: Iterable[torch.Tensor],
    *,
    heldout_batches: Iterable[torch.Tensor] | None = None,
    model_id: str | None = None,
    model_revision: str | None = None,
    model_hash: str | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 50,
    cache_mb: int = 1024,
    **options: Any,
) -> Lens:
    """Train one affine translator per layer by distillation to the model's own output.

    ``token_batches``: LongTensors (B, T), consumed in the given order (cycled if needed).
    ``heldout_batches``: LongTensors for the held-out KL curve and the convergence criterion
    (their states are cached once); without them training runs all ``steps`` and no layer is
    reported converged. ``model_id/revision/hash``: provenance stored in config.json.
    ``checkpoint``: file for the resumable state, saved every ``checkpoint_every`` steps (module
    docstring); None: no checkpoints. ``cache_mb``: the training set's residual states and
    teacher statistics are kept across epochs when they fit in this many MiB (the results do
    not depend on it: a recomputed forward gives the same bits).
    ``options``: see :class:`LensOptions`. Loss per step: Σ_L mean_tokens KL(p_final ‖ p_lens,L),
    all layers from one cached frozen forward.
    """
    opt = LensOptions.from_kwargs(options)
    batches = _as_batches(token_batches, "token_batches")
    heldout = None if heldout_batches is None else _as_batches(heldout_batches, "heldout_batches")
    info = model_info(model)
    n, d = info["n_layers"], info["d_model"]
    device = model_device(model)

    if opt.chunk_elements is None:  # record the resolved value: chunking changes float rounding
        opt = dataclasses.replace(opt, chunk_elements=default_chunk_elements(device))
    if not _is_int(checkpoint_every) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every={checkpoint_every!r}; must be an integer ≥ 1")
    saver = None
    if checkpoint is not None:
        key = _fingerprint(model, batches, heldout, opt, {"model_id": model_id, "model_revision": model_revision, "model_hash": model_hash})
        saver = _Checkpointer(Path(checkpoint), key, int(checkpoint_every))
    with frozen(model), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(opt.seed)
        weight = nn.Parameter(torch.zeros(n, d, d, device=device))
        bias = nn.Parameter(torch.zeros(n, d, device=device))
        optimizer = _make_optimizer([weight, bias], opt)
        heldout_states = None
        where = f"lens of model {model_id!r} checkpoint {model_revision!r}"
        if heldout is not None:
            heldout_states = torch.cat([layer_major_states(model, b) for b in heldout], dim=1)
            _require_finite(heldout_states, where, "held-out residual state", 0)
        head_w = linear_readout_weight(model, READOUT_DTYPES[opt.readout_dtype])
        teacher = None if head_w is None else (lambda final: _teacher_stats(model, head_w, final, opt.chunk_elements))
        stream = _TokenStream(model, batches, opt.tokens_per_step, teacher, int(cache_mb) << 20)
        result = _fit(model, weight, bias, optimizer, stream, heldout_states, opt, saver, head_w)
        _require_finite(torch.cat([weight.detach(), bias.detach()[:, :, None]], dim=2), where, "translator",
                        result["steps"])
    if saver is not None:
        saver.remove()

    return Lens(
        model,
        weight.detach(),
        bias.detach(),
        options=opt.to_dict(),
        curves=result["curves"],
        convergence=result["convergence"],
        meta={
            "model_id": model_id,
            "model_revision": model_revision,
            "model_hash": model_hash,
            "steps_trained": result["steps"],
            "stop_reason": result["stop_reason"],
        },
    )


def _require_finite(x: torch.Tensor, where: str, what: str, step: int) -> None:
    """Raise FloatingPointError naming the first layer (dim 0 of ``x``) that holds NaN/Inf.

    A NaN in the model's weights makes every translator NaN; refusing here keeps a lens of NaN
    translators (and an empty KL column) from being written.
    """
    bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
    if bad.any():
        layer = int(torch.nonzero(bad)[0])
        raise FloatingPointError(
            f"{where}: non-finite {what} (NaN/Inf) at layer {layer}, lens step {step} — the model's weights or "
            "states hold NaN/Inf (or training diverged: lower lens.lr); no lens written")


def _fit(
    model: nn.Module,
    weight: nn.Parameter,
    bias: nn.Parameter,
    optimizer: torch.optim.Optimizer,
    stream: _TokenStream,
    heldout_states: torch.Tensor | None,
    opt: LensOptions,
    saver: _Checkpointer | None = None,
    head_w: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The training loop; returns curves, per-layer convergence, steps run and why it stopped."""
    n = weight.shape[0]
    rows: list[tuple[int, int, str, float]] = []
    history: list[np.ndarray] = []
    since_converged = np.full(n, -1)
    train_kl: np.ndarray | None = None
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    stop_reason = "max_steps"
    step = 0
    state = saver.load() if saver is not None else None
    if state is not None:
        with torch.no_grad():
            weight.copy_(state["weight"])
            bias.copy_(state["bias"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        rows = [(int(a), int(b), str(c), float(v)) for a, b, c, v in state["rows"]]
        history = list(state["history"].numpy())
        since_converged = state["since_converged"].numpy().copy()
        train_kl = None if state["train_kl"] is None else state["train_kl"].numpy().copy()
        stream.seek(*state["stream"])
        log.info("resuming lens training from %s at step %d of %d", saver.path, step, opt.steps)

    def snapshot() -> dict[str, Any]:
        return {
            "weight": weight.detach().cpu().clone(),
            "bias": bias.detach().cpu().clone(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "rows": list(rows),
            "history": torch.from_numpy(np.stack(history)) if history else torch.zeros(0, n, dtype=torch.float64),
            "since_converged": torch.from_numpy(np.asarray(since_converged, dtype=np.int64)),
            "train_kl": None if train_kl is None else torch.from_numpy(np.asarray(train_kl)),
            "stream": stream.position(),
        }

    def evaluate(step: int) -> None:
        nonlocal train_kl
        if train_kl is not None:
            rows.extend((step, L, "train", float(v)) for L, v in enumerate(train_kl))
            train_kl = None
        if heldout_states is None:
            return
        kl = layer_kl(model, weight.detach(), bias.detach(), heldout_states, opt.chunk_elements)
        history.append(kl)
        rows.extend((step, L, "heldout", float(v)) for L, v in enumerate(kl))

    def window_ok(step: int) -> bool:
        # The window's first eval must come after warmup, or the ramp-up reads as a plateau.
        return len(history) > opt.patience and step - opt.patience * opt.eval_every >= opt.warmup_steps

    if state is None:
        evaluate(0)
    bar = tqdm(total=opt.steps, initial=step, desc="lens", disable=not opt.progress, leave=False)
    while step < opt.steps:
        states, teacher = stream.take()
        factor = lr_factor(step, opt)
        for g, lr in zip(optimizer.param_groups, base_lrs):
            g["lr"] = lr * factor
        # The train curve is the KL of the batch of the step just before each eval; other
        # steps compute the gradient only.
        logged = (step + 1) % opt.eval_every == 0 or step + 1 == opt.steps
        kl = _train_step_kl(model, weight, bias, states, opt.chunk_elements, value=logged, teacher=teacher, head_w=head_w)
        if logged:
            train_kl = kl.cpu().numpy()
        if opt.clip_grad_norm is not None:
            clip_grads_(weight, bias, opt.clip_grad_norm, opt.clip_scope)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        step += 1
        bar.update(1)
        if step % opt.eval_every == 0 or step == opt.steps:
            evaluate(step)
            if heldout_states is not None and window_ok(step):
                _, conv = convergence_window(np.stack(history), opt.patience, opt.tol)
                since_converged = np.where(conv, np.where(since_converged < 0, step, since_converged), -1)
                bar.set_postfix(kl=f"{history[-1].mean():.4g}", converged=f"{int(conv.sum())}/{n}")
                if conv.all():
                    stop_reason = "converged"
                    break
        if saver is not None and step % saver.every == 0 and step < opt.steps:
            saver.save(snapshot())
    bar.close()

    if heldout_states is not None and history:
        rel, conv = convergence_window(np.stack(history), opt.patience, opt.tol)
        if not window_ok(step):
            conv = np.zeros(n, dtype=bool)
        final = history[-1]
    else:
        rel, conv, final = np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, np.nan)
    convergence = pd.DataFrame(
        {
            "layer": np.arange(n),
            "converged": conv.astype(bool),
            "converged_step": np.where(conv, since_converged, -1).astype(int),
            "steps": np.full(n, step, dtype=int),
            "final_heldout_kl": final.astype(float),
            "rel_change": rel.astype(float),
        }
    )
    curves = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    return {"curves": curves, "convergence": convergence, "steps": step, "stop_reason": stop_reason}


class _Checkpointer:
    """The training loop's resumable state at ``path`` (:class:`resdyn.artifacts.LensCheckpoint`).

    ``key``: fingerprint of everything the trajectory depends on (:func:`_fingerprint`); a file
    with another key or format is ignored with a warning, never resumed.
    """

    def __init__(self, path: Path, key: str, every: int):
        self.path, self.key, self.every = path, key, every

    def save(self, state: dict[str, Any]) -> None:
        LensCheckpoint.save(self.path, self.key, state)

    def load(self) -> dict[str, Any] | None:
        return LensCheckpoint.load(self.path, self.key, stacklevel=4)  # the warning points at train_lens's caller

    def remove(self) -> None:
        LensCheckpoint.remove(self.path)


def _fingerprint(model: nn.Module, batches: list[torch.Tensor], heldout: list[torch.Tensor] | None, opt: LensOptions, meta: dict[str, Any]) -> str:
    """SHA-256 over the options, provenance, readout hash, the token ids and (without a given
    ``model_hash``) every model parameter: what a resumed trajectory must share with the first."""
    options = {k: v for k, v in opt.to_dict().items() if k != "progress"}
    h = hashlib.sha256(json.dumps({"options": options, "meta": meta, "format": CHECKPOINT_FORMAT, "info": model_info(model)}, sort_keys=True, default=str).encode())
    h.update(unembed_hash(model).encode())
    if meta.get("model_hash") is None:
        for name, t in model.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    for group, items in (("train", batches), ("heldout", heldout or [])):
        h.update(group.encode())
        for b in items:
            h.update(str(tuple(b.shape)).encode())
            h.update(b.cpu().numpy().astype(np.int64).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------

METRIC_COLUMNS = artifacts.LENS_METRIC_COLUMNS  # defined by resdyn.artifacts.LensMetrics


@torch.no_grad()
def lens_metrics(model: nn.Module, lens: Lens, token_batches: Iterable[torch.Tensor], chunk_elements: int | None = None) -> pd.DataFrame:
    """Per-layer readout quality of the tuned and the logit lens on held-out token batches.

    For layer L ∈ 0..n (n: the model's own output, identity translator, KL = 0 exactly):
    ``kl`` = mean KL(p_final ‖ p_lens) over all tokens; ``ce`` = mean −log p_lens(x_{t+1}) over
    positions t < T−1; ``hit1`` = share of tokens whose lens top-1 equals the model's final top-1;
    ``hit5`` = share whose model top-1 is in the lens top-5. Columns ``converged``, ``steps``,
    ``converged_step``, ``final_heldout_kl`` come from training (tuned rows, layers < n; missing
    elsewhere). One row per (lens ∈ {tuned, logit}, layer).
    """
    batches = _as_batches(token_batches, "token_batches")
    n = lens.n_layers
    budget = chunk_elements or default_chunk_elements(model_device(model))
    vocab = lens.vocab_size
    sums = {name: np.zeros((n + 1, 4)) for name in ("tuned", "logit")}  # kl, ce, hit1, hit5
    n_tok = n_ce = 0
    with frozen(model):
        for ids in batches:
            states = layer_major_states(model, ids)  # (n+1, B·T, d)
            bsz, t = ids.shape
            nxt = torch.full((bsz, t), -1, dtype=torch.long)
            nxt[:, :-1] = ids[:, 1:]
            nxt = nxt.reshape(-1).to(states.device)  # next token per position; −1: none
            for ts, _ in _blocks(1, bsz * t, vocab, budget):
                tgt = _final_target(model, states[-1, ts])
                for name in ("tuned", "logit"):
                    for layer in range(n + 1):
                        w, b = lens._params(layer) if name == "tuned" else (None, None)
                        z = lens_readout(model, states[layer, ts], w, b)
                        sums[name][layer] += _readout_stats(z, tgt, nxt[ts])
            n_tok += bsz * t
            n_ce += int((nxt >= 0).sum())
    rows = []
    conv = lens.convergence.set_index("layer") if len(lens.convergence) else None
    for name in ("tuned", "logit"):
        for layer in range(n + 1):
            kl, ce, h1, h5 = sums[name][layer]
            row = {"lens": name, "layer": layer, "kl": kl / n_tok, "ce": ce / max(n_ce, 1), "hit1": h1 / n_tok, "hit5": h5 / n_tok, "n_tokens": n_tok}
            if name == "tuned" and conv is not None and layer in conv.index:
                c = conv.loc[layer]
                row.update(converged=bool(c["converged"]), steps=int(c["steps"]), converged_step=int(c["converged_step"]), final_heldout_kl=float(c["final_heldout_kl"]))
                row["reason"] = "" if np.isfinite(row["final_heldout_kl"]) else "no held-out batches: no held-out KL"
            else:  # why the training columns are empty
                row["reason"] = ("logit lens: nothing trained" if name == "logit" else
                                 "last layer's output: read as is, no translator trained")
            rows.append(row)
    return pd.DataFrame(rows, columns=METRIC_COLUMNS)


def _readout_stats(z: torch.Tensor, target: _Target, nxt: torch.Tensor) -> np.ndarray:
    """Sums over a token chunk of (KL, next-token CE, hit@1, hit@5) for lens logits z (N, V).

    ``nxt (N,)``: the next token at each position, −1 where there is none (excluded from CE).
    """
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    logq = torch.log_softmax(z, dim=-1)
    kl = _kl_from_logq(logq, target)  # as kl_to_target: exactly 0 at index n
    has = nxt >= 0
    ce = -logq[has].gather(-1, nxt[has, None]).sum() if bool(has.any()) else z.new_zeros(())
    hit1 = (z.argmax(-1) == target.top1).sum()
    k = min(5, z.shape[-1])
    hit5 = (z.topk(k, dim=-1).indices == target.top1[:, None]).any(-1).sum()
    return np.array([float(kl.double().sum()), float(ce.double()), float(hit1), float(hit5)])
