"""Training options of the tuned lens (:class:`LensOptions`) and the checks they share.

The defaults of the options the config schema also has (``lens`` in
resdyn/schemas/config.schema.yaml) are the schema's (:data:`SCHEMA_DEFAULTS`), so that
:func:`resdyn.study_b.lens.train_lens` called from Python trains the lens the pipeline trains.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from resdyn import io

OPTIMIZERS = ("sgd_nesterov", "adam")
LR_SCHEDULES = ("constant", "linear")
CLIP_SCOPES = ("layer", "global")
READOUT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KL_KERNELS = ("flash", "matmul")
# Effective learning rates used when ``lr`` is None; the tuned-lens defaults
# (SGD: 1.0 after undoing PyTorch's 1/(1−β) momentum gain; Adam: 1e-3).
DEFAULT_LR = {"sgd_nesterov": 1.0, "adam": 1e-3}

#: The config schema's ``lens`` defaults, keyed as in the schema (``warmup``, ``checkpoint_every``,
#: ``n_train_blocks``, …): the one source of the defaults the pipeline and :class:`LensOptions` share.
SCHEMA_DEFAULTS: dict[str, Any] = io.schema_defaults("lens")
#: Schema key → :class:`LensOptions` field, where the two names differ.
SCHEMA_NAMES = {"warmup": "warmup_steps"}


@dataclass(frozen=True)
class LensOptions:
    """Training options of :func:`resdyn.study_b.lens.train_lens` (all keyword arguments of it).

    Defaults: an option the config schema's ``lens`` section also has (steps, tokens_per_step,
    optimizer, lr, weight_decay, warmup_steps as ``warmup``, lr_schedule, eval_every, patience,
    tol, readout_dtype) defaults to the schema's value (:data:`SCHEMA_DEFAULTS`); the others
    (momentum, clip_grad_norm, clip_scope, seed, chunk_elements, progress) are defined here.

    - steps: maximum optimizer steps.
    - tokens_per_step: tokens per step (None: the tokens of one batch). Steps take consecutive
      slices of the cached token stream, so each batch's frozen forward runs once.
    - optimizer: "sgd_nesterov" or "adam". lr: effective step size (None: :data:`DEFAULT_LR`, 1.0 for SGD,
      1e-3 for Adam); for SGD the torch lr is ``lr·(1−momentum)``, undoing PyTorch's 1/(1−momentum)
      momentum gain (as tuned-lens does). momentum: SGD momentum / Adam β1.
    - weight_decay: decoupled (AdamW) for Adam, L2 for SGD; both pull W, b toward 0, i.e. the
      translator toward the identity (logit lens).
    - warmup_steps: linear warmup, step s < warmup at lr·(s+1)/warmup. lr_schedule: after
      warmup "constant", or "linear" decay to 0 at ``steps`` (tuned-lens's trainer).
    - clip_grad_norm: gradient-norm clip (None: off). clip_scope "global" (default): one clip
      over all translators, tuned-lens's recipe, so our lenses match tuned-lens-trained ones
      (measured 1–2 % lower held-out KL than per-layer clipping on a small Llama at equal
      budget); "layer": one clip per layer, the layers become fully independent problems.
    - eval_every, patience, tol: the convergence criterion (:mod:`resdyn.study_b.lens`).
    - seed: torch seed for the run (forked RNG; the global state is left as it was).
    - chunk_elements: max logits elements (layers × tokens × vocab) per forward/backward chunk,
      bounding memory on large vocabularies; None: :func:`resdyn.study_b.lens.kl.default_chunk_elements`.
    - readout_dtype: dtype of the training readout's two vocabulary-sized matmuls and softmax
      ("float32", or "bfloat16" as tuned-lens's trainer autocasts; see :func:`resdyn.study_b.lens.kl.linear_head_kl`).
      Held-out evaluation, the convergence criterion and :func:`lens_metrics` always run in
      float32 through the model's own readout.
    - kl_kernel: how the training loss meets the vocabulary. "flash" (default): one fused
      attention kernel per step (:func:`resdyn.study_b.lens.kl.flash_head_kl`; the logits never
      reach memory), where it applies (a linear head on the CPU in the states' dtype; elsewhere
      "matmul" runs and the log says why in one line). "matmul": chunked logits, softmax and two
      matmuls (:func:`resdyn.study_b.lens.kl.linear_head_kl`), the reference path.
    - progress: tqdm bar (stderr, i.e. the rule's log).
    """

    steps: int = SCHEMA_DEFAULTS["steps"]
    tokens_per_step: int | None = SCHEMA_DEFAULTS["tokens_per_step"]
    optimizer: str = SCHEMA_DEFAULTS["optimizer"]
    lr: float | None = SCHEMA_DEFAULTS["lr"]
    momentum: float = 0.9
    weight_decay: float = SCHEMA_DEFAULTS["weight_decay"]
    warmup_steps: int = SCHEMA_DEFAULTS["warmup"]
    lr_schedule: str = SCHEMA_DEFAULTS["lr_schedule"]
    clip_grad_norm: float | None = 1.0
    clip_scope: str = "global"
    eval_every: int = SCHEMA_DEFAULTS["eval_every"]
    patience: int = SCHEMA_DEFAULTS["patience"]
    tol: float = SCHEMA_DEFAULTS["tol"]
    seed: int = 0
    chunk_elements: int | None = None
    readout_dtype: str = SCHEMA_DEFAULTS["readout_dtype"]
    kl_kernel: str = "flash"
    progress: bool = True

    def __post_init__(self) -> None:
        _check(self.optimizer in OPTIMIZERS, f"optimizer={self.optimizer!r}; allowed: {OPTIMIZERS}")
        _check(self.lr_schedule in LR_SCHEDULES, f"lr_schedule={self.lr_schedule!r}; allowed: {LR_SCHEDULES}")
        _check(self.clip_scope in CLIP_SCOPES, f"clip_scope={self.clip_scope!r}; allowed: {CLIP_SCOPES}")
        _check(
            self.readout_dtype in READOUT_DTYPES,
            f"readout_dtype={self.readout_dtype!r}; allowed: {tuple(READOUT_DTYPES)}",
        )
        _check(self.kl_kernel in KL_KERNELS, f"kl_kernel={self.kl_kernel!r}; allowed: {KL_KERNELS}")
        _check(is_int(self.steps) and self.steps >= 1, f"steps={self.steps!r}; must be an integer ≥ 1")
        _check(
            self.tokens_per_step is None or (is_int(self.tokens_per_step) and self.tokens_per_step >= 1),
            f"tokens_per_step={self.tokens_per_step!r}; must be None or an integer ≥ 1",
        )
        _check(self.lr is None or self.lr > 0, f"lr={self.lr!r}; must be None or > 0")
        _check(0 <= self.momentum < 1, f"momentum={self.momentum!r}; must be in [0, 1)")
        _check(self.weight_decay >= 0, f"weight_decay={self.weight_decay!r}; must be ≥ 0")
        _check(
            is_int(self.warmup_steps) and self.warmup_steps >= 0,
            f"warmup_steps={self.warmup_steps!r}; must be an integer ≥ 0",
        )
        _check(
            self.clip_grad_norm is None or self.clip_grad_norm > 0,
            f"clip_grad_norm={self.clip_grad_norm!r}; must be None or > 0",
        )
        _check(
            is_int(self.eval_every) and self.eval_every >= 1, f"eval_every={self.eval_every!r}; must be an integer ≥ 1"
        )
        _check(is_int(self.patience) and self.patience >= 1, f"patience={self.patience!r}; must be an integer ≥ 1")
        _check(self.tol >= 0, f"tol={self.tol!r}; must be ≥ 0")
        _check(
            self.chunk_elements is None or (is_int(self.chunk_elements) and self.chunk_elements >= 1),
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


def is_int(x: Any) -> bool:
    """True for a Python or numpy integer that is not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
