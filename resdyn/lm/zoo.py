"""The embedded model zoo: tiny decoder-only LMs trained on CPU with transformers' own classes.

Families: ``llama`` (pre-norm, ``LlamaForCausalLM``) and ``olmo2`` (post-norm with full-width
q/k norms, ``Olmo2ForCausalLM``). Checkpoints are saved in HF format (weights + tokenizer) at
the configured steps; step 0 is the untrained initialisation — the architecture-only null of
study A, mirroring OLMo's step-0 / middle / final comparison.

Training: AdamW with linear warmup and cosine decay, next-token cross-entropy on random
windows of the train token stream (seeded), held-out loss on fixed held-out windows every
``eval_every`` steps, compared with the unigram baseline (cross-entropy of the train-split
token frequencies, add-one smoothed, on the held-out windows).
Resume: a training state (weights, optimiser, RNG, step, curve) is saved atomically every
``state_every`` steps; a killed job restarts from it and produces the same checkpoints.

Speed (CPU, measured in docs/speed.md): ``precision: bfloat16`` runs the decoder's linear
layers under bfloat16 autocast (native bfloat16 instructions raise the matmul rate) while attention, norms,
the residual stream, the logits and the cross-entropy stay float32; the unembedding and the
loss are one chunked, fused function (:func:`linear_cross_entropy`) that never materialises the
full (tokens × vocabulary) logits; AdamW is the fused kernel. Held-out losses are always float32.
"""

from __future__ import annotations

import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from resdyn import io

log = logging.getLogger(__name__)

FAMILIES = ("llama", "olmo2")
PRECISIONS = ("float32", "bfloat16")
TRAIN_ATTENTION = "resdyn_sdpa_float32"


@dataclass(frozen=True)
class Architecture:
    """Shape of a zoo model."""

    family: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_position: int


def build_model(arch: Architecture, vocab_size: int, seed: int, eos_token_id: int | None = None):
    """A randomly initialised causal LM of the given family (initialisation seeded).

    Embeddings are untied so the unembedding is a separate matrix, as in the study's models.
    """
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=arch.d_model,
        intermediate_size=arch.d_ff,
        num_hidden_layers=arch.n_layers,
        num_attention_heads=arch.n_heads,
        num_key_value_heads=arch.n_kv_heads,
        max_position_embeddings=arch.max_position,
        tie_word_embeddings=False,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        # Training only: PyTorch's fused attention is ~10 % faster per step on a CPU than the
        # eager softmax(QKᵀ)V (measured on the zoo shapes), and stays float32 under bfloat16
        # autocast (see _sdpa_float32). Analyses reload with eager attention.
        attn_implementation=_training_attention(),
    )
    if arch.family == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif arch.family == "olmo2":
        config = transformers.Olmo2Config(**common)
        cls = transformers.Olmo2ForCausalLM
    else:
        raise ValueError(f"zoo family {arch.family!r} unknown; allowed: {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    return cls(config)


def _sdpa_float32(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention run in float32 whatever the autocast dtype.

    Under bfloat16 autocast q, k, v arrive in bfloat16, where PyTorch's CPU flash kernel is
    4× slower than in float32 (head_dim 16) and the softmax loses precision; upcasting costs
    little (attention has no weights). Without autocast this is plain SDPA, bit for bit.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(query.dtype), weights


def _training_attention() -> str:
    """Register :func:`_sdpa_float32` with transformers (idempotent) and return its name."""
    import transformers

    transformers.AttentionInterface.register(TRAIN_ATTENTION, _sdpa_float32)
    return TRAIN_ATTENTION


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean next-token cross-entropy of a linear head, with its gradient computed in the forward.

    For hidden states h (N, d), head W (V, d), labels y (N,) and logits z_i = W h_i:
    ``L = (1/N) Σ_i [logsumexp(z_i) − z_{i,y_i}]``, ``∂L/∂h_i = Wᵀ g_i / N`` and
    ``∂L/∂W = Σ_i g_i h_iᵀ / N`` with ``g_i = softmax(z_i) − e_{y_i}``.
    Tokens are processed in chunks, so the (N × V) logits never exist at once (they would be
    16 MB at the zoo's 2048 × 2048, streamed through memory four times by a plain
    log_softmax + nll_loss); the loss is a scalar, so both gradients are computed in the same
    pass and the backward only scales them. z and the softmax are float32 (float64 for float64
    input); the two gradient matmuls (Wᵀg, g hᵀ) run in ``mm_dtype`` (bfloat16: g, h, W rounded).
    """

    @staticmethod
    @torch.autocast("cpu", enabled=False)
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, mm_dtype: torch.dtype, chunk: int):
        acc = torch.promote_types(h.dtype, torch.float32)
        h, w = h.to(acc), w.to(acc)
        h_mm, w_mm = h.to(mm_dtype), w.to(mm_dtype)
        n = h.shape[0]
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(w)
        total = torch.zeros((), dtype=acc)
        for s in range(0, n, chunk):
            y = labels[s : s + chunk]
            z = h[s : s + chunk] @ w.T
            g = torch.softmax(z, dim=-1)
            # logsumexp(z) = z_v − log softmax(z)_v at v = argmax z (one softmax pass, no exp).
            lse = z.amax(dim=-1) - g.amax(dim=-1).log()
            total += (lse - z.gather(1, y[:, None]).squeeze(1)).sum()
            g[torch.arange(len(y)), y] -= 1
            g = g.to(mm_dtype)
            grad_h[s : s + chunk] = g @ w_mm
            grad_w += g.T @ h_mm[s : s + chunk]
        ctx.save_for_backward(grad_h.div_(n), grad_w.div_(n))
        return total / n

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad, grad_w * grad, None, None, None


def linear_cross_entropy(
    h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, mm_dtype: torch.dtype | None = None, chunk: int = 256
) -> torch.Tensor:
    """Differentiable mean cross-entropy of ``softmax(h Wᵀ)`` against ``labels``; see
    :class:`_LinearCrossEntropy`. h (N, d), w (V, d), labels (N,) int64 in [0, V)."""
    if h.ndim != 2 or w.ndim != 2 or h.shape[1] != w.shape[1] or labels.shape != h.shape[:1]:
        raise ValueError(
            f"linear_cross_entropy: shapes h {tuple(h.shape)}, w {tuple(w.shape)}, labels "
            f"{tuple(labels.shape)}; expected (N, d), (V, d), (N,)"
        )
    mm_dtype = mm_dtype or torch.promote_types(h.dtype, torch.float32)
    return _LinearCrossEntropy.apply(h, w, labels, mm_dtype, chunk)


def next_token_loss(model, batch: torch.Tensor, precision: str = "float32") -> torch.Tensor:
    """Training loss of a causal LM on token windows (B, T): mean over the B·(T−1) next-token
    predictions, as transformers' ``labels=`` loss, but fused (:func:`linear_cross_entropy`).

    ``precision="bfloat16"``: the decoder's matmuls run under bfloat16 autocast (attention,
    norms and the residual stream stay float32; :func:`_sdpa_float32`), and so do the head's two
    gradient matmuls; the logits and softmax stay float32.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision {precision!r} unknown; allowed: {', '.join(PRECISIONS)}")
    low = precision == "bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
        hidden = model.model(input_ids=batch, use_cache=False).last_hidden_state
    d = hidden.shape[-1]
    return linear_cross_entropy(
        hidden[:, :-1].reshape(-1, d), model.lm_head.weight, batch[:, 1:].reshape(-1), torch.bfloat16 if low else None
    )


def lr_at(step: int, base_lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warmup to ``base_lr`` over ``warmup`` steps, then cosine decay to ``min_ratio·base_lr``."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def unigram_cross_entropy(train_stream: np.ndarray, heldout_ids: np.ndarray, vocab_size: int) -> float:
    """Held-out cross-entropy (nats/token) of the add-one-smoothed train unigram distribution."""
    counts = np.bincount(train_stream, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[heldout_ids.reshape(-1)].mean())


@torch.no_grad()
def heldout_loss(model, heldout_ids: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats/token) on fixed held-out windows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(heldout_ids), batch_size):
        batch = heldout_ids[i : i + batch_size]
        out = model(input_ids=batch, labels=batch, use_cache=False)
        n = batch.numel() - len(batch)
        total += float(out.loss) * n
        count += n
    model.train()
    return total / count


def _save_checkpoint(model, tokenizer_dir: Path, out_dir: Path) -> None:
    """Save weights + tokenizer as an HF folder, atomically (temp folder, then rename)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in Path(tokenizer_dir).iterdir():
        if f.is_file():
            shutil.copy2(f, tmp / f.name)
    io.publish_modes(tmp)  # save_pretrained writes its safetensors file 0600
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def load_training_state(path: Path) -> dict:
    """A resume state written by :func:`train_zoo_model`, loaded with ``weights_only=True``: tensors,
    numbers, strings and containers only, so a planted file cannot run code. Anything else (a
    pickled object, a corrupt file) raises ValueError naming the file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for objects, RuntimeError/EOFError for corrupt files
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path}: not a training state resdyn wrote ({first}); delete it to train from step 0"
        ) from err
    if not isinstance(state, dict):
        raise ValueError(
            f"{path}: not a training state resdyn wrote (a {type(state).__name__}); delete it to train from step 0"
        )
    return state


def train_zoo_model(
    arch: Architecture,
    train_stream: np.ndarray,
    heldout_stream: np.ndarray,
    tokenizer_dir: str | Path,
    checkpoint_dirs: dict[int, str | Path],
    *,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    eval_every: int,
    n_eval_windows: int,
    seed: int,
    state_path: str | Path,
    state_every: int = 100,
    precision: str = "float32",
    progress: bool = True,
) -> pd.DataFrame:
    """Train one zoo model and save HF checkpoints at the requested steps.

    ``checkpoint_dirs`` maps a step (0 = initialisation, ≤ ``steps``) to its output folder.
    Returns the loss curve: step, lr, train_loss (mean over the steps since the last eval),
    heldout_loss, unigram_loss. ``precision`` is the training-step precision
    (:func:`next_token_loss`); held-out losses are always float32.
    """
    from transformers import AutoTokenizer

    _check_train_options(precision, checkpoint_dirs, steps)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = build_model(arch, len(tok), seed, tok.eos_token_id)
    model.train()
    # The fused (one-kernel) AdamW: fewer passes over the parameters than the per-tensor loop.
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95), fused=True)

    eval_ids = _eval_windows(heldout_stream, seq_len, n_eval_windows, seed)
    unigram = unigram_cross_entropy(train_stream, eval_ids.numpy()[:, 1:], len(tok))
    hparams = (steps, batch_size, seq_len, lr, warmup, weight_decay, eval_every, n_eval_windows, seed, precision)
    device = next(model.parameters()).device
    fingerprint = _training_fingerprint(arch, train_stream, heldout_stream, checkpoint_dirs, hparams, device)
    state_path = Path(state_path)
    start, rows, running = _resume(state_path, fingerprint, model, opt)

    if start == 0 and 0 in checkpoint_dirs:
        _save_checkpoint(model, Path(tokenizer_dir), Path(checkpoint_dirs[0]))
        row = _loss_row(0, 0.0, float("nan"), heldout_loss(model, eval_ids, batch_size), unigram)
        rows.append({**row, "reason": "step 0: no training batch yet"})

    bar = tqdm(
        range(start, steps),
        desc=f"train {arch.family}-{arch.n_layers}L",
        disable=not progress,
        initial=start,
        total=steps,
    )
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr, warmup, steps)
        batch = _batch_at(train_stream, seed, step, batch_size, seq_len)
        running.append(_train_step(model, opt, batch, precision, step))
        done = step + 1
        if done % eval_every == 0 or done == steps or done in checkpoint_dirs:
            held = heldout_loss(model, eval_ids, batch_size)
            rows.append(_loss_row(done, lr_at(step, lr, warmup, steps), float(np.mean(running)), held, unigram))
            running = []
            bar.set_postfix(heldout=f"{rows[-1]['heldout_loss']:.3f}")
        if done in checkpoint_dirs:
            _save_checkpoint(model, Path(tokenizer_dir), Path(checkpoint_dirs[done]))
        if done % state_every == 0 and done < steps:
            _save_training_state(state_path, model, opt, done, rows, running, fingerprint)
    state_path.unlink(missing_ok=True)
    table = pd.DataFrame(rows)
    table["reason"] = table["reason"].fillna("") if "reason" in table else ""
    return table


def _check_train_options(precision: str, checkpoint_dirs: dict[int, str | Path], steps: int) -> None:
    """A known ``precision`` and every checkpoint step in [0, ``steps``]."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision {precision!r} unknown; allowed: {', '.join(PRECISIONS)}")
    bad = [s for s in checkpoint_dirs if not 0 <= s <= steps]
    if bad:
        raise ValueError(f"checkpoint steps {bad} outside [0, {steps}] (train.steps)")


def _loss_row(step: int, lr: float, train_loss: float, heldout: float, unigram: float) -> dict[str, Any]:
    """One row of the loss curve."""
    return dict(step=step, lr=lr, train_loss=train_loss, heldout_loss=heldout, unigram_loss=unigram)


def _eval_windows(heldout_stream: np.ndarray, seq_len: int, n_eval_windows: int, seed: int) -> torch.Tensor:
    """(min(n_eval_windows, N), seq_len) held-out windows at sorted distinct offsets k·seq_len, drawn
    with numpy's default_rng(seed + 1) from the N = len(heldout_stream) // seq_len whole windows."""
    rng_eval = np.random.default_rng(seed + 1)
    n_win = len(heldout_stream) // seq_len
    eval_starts = np.sort(rng_eval.choice(n_win, size=min(n_eval_windows, n_win), replace=False)) * seq_len
    return torch.as_tensor(np.stack([heldout_stream[s : s + seq_len] for s in eval_starts]), dtype=torch.long)


def _batch_at(train_stream: np.ndarray, seed: int, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
    """(batch_size, seq_len) training windows of ``step``: starts from default_rng([seed, step]) in
    [0, len − seq_len − 1), a pure function of (seed, step) so a resumed run draws the same data."""
    max_start = len(train_stream) - seq_len - 1
    starts = np.random.default_rng([seed, step]).integers(0, max_start, size=batch_size)
    return torch.as_tensor(np.stack([train_stream[s : s + seq_len] for s in starts]), dtype=torch.long)


def _training_fingerprint(
    arch: Architecture,
    train_stream: np.ndarray,
    heldout_stream: np.ndarray,
    checkpoint_dirs: dict[int, str | Path],
    hparams: tuple[Any, ...],
    device: torch.device | str = "cpu",
) -> str:
    """The training setup a saved state belongs to, as a :func:`resdyn.numerics.precision.resume_key`:
    sha256 of the two token streams and of the repr of the architecture, checkpoint steps and
    hyperparameters, with the numerics of the device it trains on (a state is only resumed under
    exactly this setup)."""
    from resdyn.numerics import precision

    setup = repr((arch, sorted(checkpoint_dirs), *hparams))
    digest = io.sha256_array(train_stream, heldout_stream, np.frombuffer(setup.encode(), dtype=np.uint8))
    return precision.resume_key(digest, precision.resume_numerics(device))


def _resume(
    state_path: Path, fingerprint: str, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> tuple[int, list[dict[str, Any]], list[float]]:
    """(start step, loss rows, running train losses): those of the state at ``state_path``, loaded into
    ``model`` and ``opt``, when it exists and has ``fingerprint``; else (0, [], [])."""
    start, rows, running = 0, [], []
    if state_path.exists():
        state = load_training_state(state_path)
        if state.get("fingerprint") == fingerprint:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            start, rows, running = state["step"], state["rows"], state["running"]
            log.info("resuming training from step %d (%s)", start, state_path)
        else:
            why = io.resume_mismatch(state.get("fingerprint"), fingerprint, "made by a different training setup")
            log.warning("ignoring %s: %s", state_path, why)
    return start, rows, running


def _train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor, precision: str, step: int
) -> float:
    """One optimiser step on ``batch`` (gradient norm clipped to 1); returns the batch loss."""
    loss = next_token_loss(model, batch, precision)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training loss is {float(loss)} at step {step + 1}; lower train.lr")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def _save_training_state(
    state_path: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    done: int,
    rows: list[dict[str, Any]],
    running: list[float],
    fingerprint: str,
) -> None:
    """Write the resumable state after ``done`` steps atomically to ``state_path``."""
    with io.atomic_path(state_path) as tmp:
        torch.save(
            dict(
                model=model.state_dict(),
                optimizer=opt.state_dict(),
                step=done,
                rows=rows,
                running=running,
                fingerprint=fingerprint,
            ),
            tmp,
        )
