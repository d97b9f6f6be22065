"""Training the translators (:func:`train_lens`): the loss step, the optimizer and its schedule,
gradient clipping, the convergence criterion, and the resumable checkpoint."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from resdyn.artifacts import LensCheckpoint
from resdyn.lm import structure
from resdyn.numerics import precision
from resdyn.study_b.lens.kl import (
    blocks,
    default_chunk_elements,
    final_target,
    flash_head_kl,
    flash_kl_usable,
    fused_kl,
    layer_kl,
    linear_head_kl,
    teacher_stats,
)
from resdyn.study_b.lens.options import READOUT_DTYPES, SCHEMA_DEFAULTS, LensOptions, is_int
from resdyn.study_b.lens.readout import (
    apply_translator,
    dtype_of,
    frozen,
    lens_readout,
    linear_readout_weight,
    model_device,
    model_info,
    unembed_hash,
)
from resdyn.study_b.lens.stream import TokenStream, as_batches, layer_major_states, stream_source
from resdyn.study_b.lens.translators import CURVE_COLUMNS, Lens

log = logging.getLogger(__name__)


CHECKPOINT_FORMAT = LensCheckpoint.FORMAT


def _train_step_kl(
    model: nn.Module,
    weight: torch.Tensor,
    bias: torch.Tensor,
    states: torch.Tensor,
    budget: int,
    value: bool = True,
    teacher: tuple[torch.Tensor, torch.Tensor] | None = None,
    head_w: torch.Tensor | None = None,
    flash: bool = False,
) -> torch.Tensor:
    """Accumulate ∇ of Σ_L mean_tokens KL_L into weight/bias grads; return per-layer KL (n,).

    ``value=False``: gradient only, the returned KL is zeros (see :func:`fused_kl`).
    ``teacher``, ``head_w``: the tokens' (Wᵀ p, Σ p log p) and the linear head W; with them
    the loss runs through :func:`resdyn.study_b.lens.kl.linear_head_kl`, otherwise through the model's whole readout
    and :func:`resdyn.study_b.lens.kl.fused_kl` with the target recomputed per chunk (softcapped or biased heads).
    ``flash`` (with ``teacher`` and ``head_w``): all layers and tokens in one
    :func:`resdyn.study_b.lens.kl.flash_head_kl` call instead (its KL is always computed: it costs no
    vocabulary-sized pass).

    The sum over layers has independent per-layer terms, so each parameter block receives
    exactly the gradient of its own layer's mean KL. Backward runs per chunk (bounded memory).
    """
    n, n_tok = weight.shape[0], states.shape[1]
    vocab = model.get_output_embeddings().weight.shape[0]
    kl_sum = torch.zeros(n, dtype=torch.float64, device=weight.device)
    norm = structure.final_norm(model)
    if flash and teacher is not None and head_w is not None:
        kl = flash_head_kl(norm(apply_translator(states[:n], weight, bias)), head_w, teacher[0], teacher[1])
        kl.sum().backward()
        kl_sum += kl.detach().sum(-1).double()
        blocks_left = []
    else:
        blocks_left = blocks(n, n_tok, vocab, budget)
    for ts, groups in blocks_left:
        tgt = final_target(model, states[-1, ts]) if teacher is None or head_w is None else None
        for ls in groups:
            if tgt is None:
                y = norm(apply_translator(states[ls, ts], weight[ls], bias[ls]))
                kl = linear_head_kl(y, head_w, teacher[0][ts], teacher[1][ts], value)
            else:
                z = lens_readout(model, states[ls, ts], weight[ls], bias[ls]).float()
                kl = fused_kl(z, tgt.p, tgt.neg_entropy, value)  # (layers, tokens)
            kl.sum().backward()  # unit upstream gradient: see resdyn.study_b.lens.kl._FusedKL.backward
            kl_sum[ls] += kl.detach().sum(-1).double()
    # ∇ of the token mean = ∇ of the sum / N, applied to the (n, d, d) grads, not (…, V) tensors.
    # Gradients accumulate across steps only through the optimizer, which zeroes them each step.
    weight.grad.div_(n_tok)
    bias.grad.div_(n_tok)
    return kl_sum / n_tok


def _make_optimizer(params: list[nn.Parameter], opt: LensOptions) -> torch.optim.Optimizer:
    lr = opt.effective_lr
    if opt.optimizer == "sgd_nesterov":
        # PyTorch's momentum amplifies the step by 1/(1−β); undo it so lr is the effective step
        # (tuned-lens does the same; its optimum is then lr ≈ 1).
        return torch.optim.SGD(
            params,
            lr=lr * (1 - opt.momentum),
            momentum=opt.momentum,
            nesterov=opt.momentum > 0,
            weight_decay=opt.weight_decay,
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


def train_lens(
    model: nn.Module,
    token_batches: Iterable[torch.Tensor],
    *,
    heldout_batches: Iterable[torch.Tensor] | None = None,
    model_id: str | None = None,
    model_revision: str | None = None,
    model_hash: str | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = SCHEMA_DEFAULTS["checkpoint_every"],
    cache_mb: int = 1024,
    fresh_tokens: bool = False,
    **options: Any,
) -> Lens:
    """Train one affine translator per layer by distillation to the model's own output.

    ``token_batches``: LongTensors (B, T), consumed in the given order (cycled if needed).
    ``heldout_batches``: LongTensors for the held-out KL curve and the convergence criterion
    (their states are cached once); without them training runs all ``steps`` and no layer is
    reported converged. ``model_id/revision/hash``: provenance stored in config.json.
    ``checkpoint``: file for the resumable state, saved every ``checkpoint_every`` steps (see
    :mod:`resdyn.study_b.lens`); None: no checkpoints. ``cache_mb``: the training set's residual states and
    teacher statistics are kept across epochs when they fit in this many MiB (the results do
    not depend on it: a recomputed forward gives the same bits).
    ``fresh_tokens``: each training token is used once, never cycled (``lens.train_tokens``); a
    ValueError up front when ``steps`` steps need more tokens than the batches hold.
    ``options``: see :class:`LensOptions`. Loss per step: Σ_L mean_tokens KL(p_final ‖ p_lens,L),
    all layers from one cached frozen forward.
    """
    opt = LensOptions.from_kwargs(options)
    batches = as_batches(token_batches, "token_batches")
    heldout = None if heldout_batches is None else as_batches(heldout_batches, "heldout_batches")
    if fresh_tokens:
        _check_fresh_budget(batches, opt)
    info = model_info(model)
    n, d = info["n_layers"], info["d_model"]
    device = model_device(model)

    if opt.chunk_elements is None:  # record the resolved value: chunking changes float rounding
        opt = dataclasses.replace(opt, chunk_elements=default_chunk_elements(device))
    meta = {"model_id": model_id, "model_revision": model_revision, "model_hash": model_hash}
    saver = _make_saver(model, batches, heldout, opt, meta, checkpoint, checkpoint_every, fresh_tokens)
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
        teacher = None if head_w is None else (lambda final: teacher_stats(model, head_w, final, opt.chunk_elements))
        stream = TokenStream(model, batches, opt.tokens_per_step, teacher, int(cache_mb) << 20, cycle=not fresh_tokens)
        flash = _use_flash(opt, dtype_of(model), head_w)
        result = _fit(model, weight, bias, optimizer, stream, heldout_states, opt, saver, head_w, flash)
        _require_finite(
            torch.cat([weight.detach(), bias.detach()[:, :, None]], dim=2), where, "translator", result["steps"]
        )
    if saver is not None:
        saver.remove()

    return Lens(
        model,
        weight.detach(),
        bias.detach(),
        options=opt.to_dict(),
        curves=result["curves"],
        convergence=result["convergence"],
        meta={**meta, "steps_trained": result["steps"], "stop_reason": result["stop_reason"]},
    )


def _make_saver(
    model: nn.Module,
    batches: list[torch.Tensor],
    heldout: list[torch.Tensor] | None,
    opt: LensOptions,
    meta: dict[str, Any],
    checkpoint: str | Path | None,
    checkpoint_every: int,
    fresh_tokens: bool = False,
) -> _Checkpointer | None:
    """The resumable-state saver of a run (None without a ``checkpoint`` file), keyed by
    :func:`_fingerprint`, with the training stream's :func:`resdyn.study_b.lens.stream.stream_source`
    and whether it is cycled (not with ``fresh_tokens``); a ValueError when ``checkpoint_every`` is
    not an integer ≥ 1."""
    if not is_int(checkpoint_every) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every={checkpoint_every!r}; must be an integer ≥ 1")
    if checkpoint is None:
        return None
    key = _fingerprint(model, heldout, opt, meta)
    source = {**stream_source(batches), "cycle": not fresh_tokens}
    return _Checkpointer(Path(checkpoint), key, int(checkpoint_every), source)


def _use_flash(opt: LensOptions, states_dtype: torch.dtype, head_w: torch.Tensor | None) -> bool:
    """Whether the training loss runs the fused kernel (``kl_kernel: flash`` where it applies,
    :func:`resdyn.study_b.lens.kl.flash_kl_usable`); logs in one line why when it is asked for
    but cannot run."""
    if opt.kl_kernel != "flash":
        return False
    ok, why = flash_kl_usable(states_dtype, head_w)
    if not ok:
        log.info("lens kl_kernel flash not used (%s): the chunked matmul path runs", why)
    return ok


def _check_fresh_budget(batches: list[torch.Tensor], opt: LensOptions) -> None:
    """ValueError naming ``lens.train_tokens`` when ``opt.steps`` steps of fresh tokens need more
    than the batches hold (tokens_per_step tokens a step, or one batch a step when it is None)."""
    have = sum(b.numel() for b in batches)
    if opt.tokens_per_step is None:
        need, what = opt.steps, f"{opt.steps} steps of one batch each need {opt.steps} batches"
        ok = opt.steps <= len(batches)
    else:
        need = opt.steps * opt.tokens_per_step
        what = f"lens.steps × lens.tokens_per_step = {opt.steps} × {opt.tokens_per_step} = {need:,} tokens"
        ok = need <= have
    if not ok:
        raise ValueError(
            f"lens.train_tokens: {what}, but the fresh-token stream holds {len(batches)} batches ({have:,} "
            "tokens) and uses each token once; raise lens.train_tokens or lower lens.steps"
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
            "states hold NaN/Inf (or training diverged: lower lens.lr); no lens written"
        )


@dataclass
class _Loop:
    """What the training loop carries from step to step, and a checkpoint saves.

    ``rows``: curve rows (step, tokens_seen, layer, split, kl); ``tokens``: training tokens
    served so far; ``history``: held-out KL per eval (n,);
    ``since_converged``: per layer the step since which it has stayed converged (−1: not
    converged); ``train_kl``: the last logged step's training KL, written at the next eval.
    """

    n: int
    step: int = 0
    tokens: int = 0
    rows: list[tuple[int, int, int, str, float]] = field(default_factory=list)
    history: list[np.ndarray] = field(default_factory=list)
    since_converged: np.ndarray | None = None
    train_kl: np.ndarray | None = None
    stop_reason: str = "max_steps"

    def __post_init__(self) -> None:
        if self.since_converged is None:
            self.since_converged = np.full(self.n, -1)


def _restore(
    loop: _Loop,
    state: dict[str, Any],
    weight: nn.Parameter,
    bias: nn.Parameter,
    optimizer: torch.optim.Optimizer,
    stream: TokenStream,
) -> None:
    """Load a checkpoint's state (:func:`_snapshot`) into the translators, optimizer, stream and loop."""
    with torch.no_grad():
        weight.copy_(state["weight"])
        bias.copy_(state["bias"])
    optimizer.load_state_dict(state["optimizer"])
    loop.step, loop.tokens = int(state["step"]), int(state["tokens"])
    loop.rows = [(int(a), int(t), int(b), str(c), float(v)) for a, t, b, c, v in state["rows"]]
    loop.history = list(state["history"].numpy())
    loop.since_converged = state["since_converged"].numpy().copy()
    loop.train_kl = None if state["train_kl"] is None else state["train_kl"].numpy().copy()
    stream.seek(*state["stream"])


def _snapshot(
    loop: _Loop, weight: nn.Parameter, bias: nn.Parameter, optimizer: torch.optim.Optimizer, stream: TokenStream
) -> dict[str, Any]:
    """The loop's whole resumable state (:class:`resdyn.artifacts.LensCheckpoint`'s content)."""
    return {
        "weight": weight.detach().cpu().clone(),
        "bias": bias.detach().cpu().clone(),
        "optimizer": optimizer.state_dict(),
        "step": loop.step,
        "tokens": loop.tokens,
        "rows": list(loop.rows),
        "history": (
            torch.from_numpy(np.stack(loop.history)) if loop.history else torch.zeros(0, loop.n, dtype=torch.float64)
        ),
        "since_converged": torch.from_numpy(np.asarray(loop.since_converged, dtype=np.int64)),
        "train_kl": None if loop.train_kl is None else torch.from_numpy(np.asarray(loop.train_kl)),
        "stream": stream.position(),
    }


def _evaluate(
    loop: _Loop,
    step: int,
    model: nn.Module,
    weight: nn.Parameter,
    bias: nn.Parameter,
    heldout_states: torch.Tensor | None,
    opt: LensOptions,
) -> None:
    """Curve rows at ``step``: the pending training KL, then the held-out KL (kept in the history)."""
    if loop.train_kl is not None:
        loop.rows.extend((step, loop.tokens, L, "train", float(v)) for L, v in enumerate(loop.train_kl))
        loop.train_kl = None
    if heldout_states is None:
        return
    kl = layer_kl(model, weight.detach(), bias.detach(), heldout_states, opt.chunk_elements)
    loop.history.append(kl)
    loop.rows.extend((step, loop.tokens, L, "heldout", float(v)) for L, v in enumerate(kl))


def _window_ok(loop: _Loop, step: int, opt: LensOptions) -> bool:
    """Whether the convergence window is full and its first eval comes after the warmup (else
    the ramp-up reads as a plateau)."""
    return len(loop.history) > opt.patience and step - opt.patience * opt.eval_every >= opt.warmup_steps


def _optimizer_step(
    loop: _Loop,
    model: nn.Module,
    weight: nn.Parameter,
    bias: nn.Parameter,
    optimizer: torch.optim.Optimizer,
    base_lrs: list[float],
    stream: TokenStream,
    opt: LensOptions,
    head_w: torch.Tensor | None,
    flash: bool = False,
) -> None:
    """One step: the next tokens, the scheduled lr, the KL gradient, clipping, the update."""
    step = loop.step
    states, teacher = stream.take()
    factor = lr_factor(step, opt)
    for g, lr in zip(optimizer.param_groups, base_lrs):
        g["lr"] = lr * factor
    # The train curve is the KL of the batch of the step just before each eval; other
    # steps compute the gradient only.
    logged = (step + 1) % opt.eval_every == 0 or step + 1 == opt.steps
    kl = _train_step_kl(
        model, weight, bias, states, opt.chunk_elements, value=logged, teacher=teacher, head_w=head_w, flash=flash
    )
    if logged:
        loop.train_kl = kl.cpu().numpy()
    if opt.clip_grad_norm is not None:
        clip_grads_(weight, bias, opt.clip_grad_norm, opt.clip_scope)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    loop.step, loop.tokens = step + 1, loop.tokens + states.shape[1]


def _all_converged(loop: _Loop, opt: LensOptions) -> tuple[bool, int]:
    """Update the per-layer converged-since steps after an eval; (every layer converged, how many)."""
    _, conv = convergence_window(np.stack(loop.history), opt.patience, opt.tol)
    loop.since_converged = np.where(conv, np.where(loop.since_converged < 0, loop.step, loop.since_converged), -1)
    return bool(conv.all()), int(conv.sum())


def _convergence_table(loop: _Loop, heldout_states: torch.Tensor | None, opt: LensOptions) -> pd.DataFrame:
    """Per-layer convergence at the end of training (:data:`resdyn.study_b.lens.CONVERGENCE_COLUMNS`)."""
    n, step = loop.n, loop.step
    if heldout_states is not None and loop.history:
        rel, conv = convergence_window(np.stack(loop.history), opt.patience, opt.tol)
        if not _window_ok(loop, step, opt):
            conv = np.zeros(n, dtype=bool)
        final = loop.history[-1]
    else:
        rel, conv, final = np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, np.nan)
    return pd.DataFrame(
        {
            "layer": np.arange(n),
            "converged": conv.astype(bool),
            "converged_step": np.where(conv, loop.since_converged, -1).astype(int),
            "steps": np.full(n, step, dtype=int),
            "final_heldout_kl": final.astype(float),
            "rel_change": rel.astype(float),
        }
    )


def _fit(
    model: nn.Module,
    weight: nn.Parameter,
    bias: nn.Parameter,
    optimizer: torch.optim.Optimizer,
    stream: TokenStream,
    heldout_states: torch.Tensor | None,
    opt: LensOptions,
    saver: _Checkpointer | None = None,
    head_w: torch.Tensor | None = None,
    flash: bool = False,
) -> dict[str, Any]:
    """The training loop; returns curves, per-layer convergence, steps run and why it stopped."""
    loop = _Loop(n=weight.shape[0])
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    state = saver.load() if saver is not None else None
    if state is not None:
        saver.check_stream(state)
        _restore(loop, state, weight, bias, optimizer, stream)
        log.info("resuming lens training from %s at step %d of %d", saver.path, loop.step, opt.steps)
    else:
        _evaluate(loop, 0, model, weight, bias, heldout_states, opt)
    bar = tqdm(total=opt.steps, initial=loop.step, desc="lens", disable=not opt.progress, leave=False)
    while loop.step < opt.steps:
        _optimizer_step(loop, model, weight, bias, optimizer, base_lrs, stream, opt, head_w, flash)
        step = loop.step
        bar.update(1)
        if step % opt.eval_every == 0 or step == opt.steps:
            _evaluate(loop, step, model, weight, bias, heldout_states, opt)
            if heldout_states is not None and _window_ok(loop, step, opt):
                done, n_conv = _all_converged(loop, opt)
                bar.set_postfix(kl=f"{loop.history[-1].mean():.4g}", converged=f"{n_conv}/{loop.n}")
                if done:
                    loop.stop_reason = "converged"
                    break
        if saver is not None and step % saver.every == 0 and step < opt.steps:
            saver.save(_snapshot(loop, weight, bias, optimizer, stream))
    bar.close()
    curves = pd.DataFrame(loop.rows, columns=CURVE_COLUMNS)
    return {
        "curves": curves,
        "convergence": _convergence_table(loop, heldout_states, opt),
        "steps": loop.step,
        "stop_reason": loop.stop_reason,
    }


class _Checkpointer:
    """The training loop's resumable state at ``path`` (:class:`resdyn.artifacts.LensCheckpoint`).

    ``key``: fingerprint of everything the trajectory depends on but the training tokens
    (:func:`_fingerprint`); a file with another key or format is ignored with a warning, never
    resumed. ``source``: the training stream (:func:`resdyn.study_b.lens.stream.stream_source`),
    saved with each state and checked on resume (:meth:`check_stream`).
    """

    def __init__(self, path: Path, key: str, every: int, source: dict[str, Any]):
        self.path, self.key, self.every, self.source = path, key, every, source

    def save(self, state: dict[str, Any]) -> None:
        LensCheckpoint.save(self.path, self.key, {**state, "stream_source": self.source})

    def check_stream(self, state: dict[str, Any]) -> None:
        """ValueError naming ``lens.train_tokens`` when a state's stream position does not fit this
        run's training stream: another stream (batches, tokens, ids, cycled or not), or a position
        past the end of a stream that is not cycled.

        Resuming elsewhere in a stream would fit tokens other than the ones the saved translators
        saw, and starting over would drop hours of fitting silently: the person decides."""
        was, (pos, _) = state.get("stream_source") or {}, state["stream"]
        now = self.source
        if was == now and (now["cycle"] or pos <= now["batches"]):
            return
        raise ValueError(
            f"lens.train_tokens: the checkpoint {self.path} stands at batch {pos} of a stream of "
            f"{was.get('batches')} batches ({was.get('tokens', 0):,} tokens, ids {str(was.get('hash'))[:12]}), "
            f"but this job's stream has {now['batches']} batches ({now['tokens']:,} tokens, ids {now['hash'][:12]}); "
            "delete the checkpoint to fit from the start"
        )

    def load(self) -> dict[str, Any] | None:
        return LensCheckpoint.load(self.path, self.key, stacklevel=4)  # the warning points at train_lens's caller

    def remove(self) -> None:
        LensCheckpoint.remove(self.path)


def _fingerprint(
    model: nn.Module,
    heldout: list[torch.Tensor] | None,
    opt: LensOptions,
    meta: dict[str, Any],
) -> str:
    """SHA-256 over the options, provenance, readout hash, the held-out token ids and (without a
    given ``model_hash``) every model parameter: what a resumed trajectory must share with the first,
    with the device's numerics (:func:`resdyn.numerics.precision.resume_key`). The training stream is
    not in it: a checkpoint records its own (:meth:`_Checkpointer.check_stream`)."""
    options = {k: v for k, v in opt.to_dict().items() if k != "progress"}
    numerics = precision.resume_numerics(model_device(model))
    h = hashlib.sha256(
        json.dumps(
            {
                "options": options,
                "meta": meta,
                "format": CHECKPOINT_FORMAT,
                "info": model_info(model),
                "numerics": numerics,
            },
            sort_keys=True,
            default=str,
        ).encode()
    )
    h.update(unembed_hash(model).encode())
    if meta.get("model_hash") is None:
        for name, t in model.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    h.update(b"heldout")
    for b in heldout or []:
        h.update(str(tuple(b.shape)).encode())
        h.update(b.cpu().numpy().astype(np.int64).tobytes())
    return precision.resume_key(h.hexdigest(), numerics)
