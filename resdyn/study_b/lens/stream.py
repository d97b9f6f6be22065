"""Cached residual states as a token stream: token batches, layer-major states of a batch, and
:class:`TokenStream` (consecutive fixed-size slices, resumable; cycled, or each token used once)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from resdyn.lm import structure
from resdyn.study_b.lens.options import is_int
from resdyn.study_b.lens.readout import dtype_of, model_device, model_info


def as_batches(token_batches: Iterable[torch.Tensor], name: str) -> list[torch.Tensor]:
    """The token batches as a list of LongTensors (B, T) (a 1-D batch becomes one row); a
    ValueError naming ``name`` and the batch otherwise."""
    batches = []
    for i, b in enumerate(token_batches):
        if not isinstance(b, torch.Tensor) or b.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"{name}[{i}]: expected an integer torch tensor (B, T), got {type(b).__name__} "
                f"{getattr(b, 'dtype', '')}"
            )
        if b.dim() == 1:
            b = b[None]
        if b.dim() != 2 or b.numel() == 0:
            raise ValueError(f"{name}[{i}]: expected shape (B, T) with B, T ≥ 1, got {tuple(b.shape)}")
        batches.append(b.long())
    if not batches:
        raise ValueError(f"{name}: no batches given")
    return batches


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
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; must be an integer ≥ 1")
    ids = (
        torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        if not isinstance(input_ids, torch.Tensor)
        else input_ids.long()
    )
    if ids.dim() != 2 or ids.shape[0] == 0:
        raise ValueError(f"input_ids: expected shape (N, T) with N ≥ 1, got {tuple(ids.shape)}")
    return [ids[i : i + batch_size] for i in range(0, ids.shape[0], batch_size)]


def shuffled_rows(input_ids: np.ndarray, seed: int) -> np.ndarray:
    """The rows of a (N, T) token array in a seeded random order: ``input_ids[π]``, π the
    permutation ``np.random.default_rng(seed).permutation(N)`` (fresh blocks are drawn in
    ascending stream order; a step of consecutive windows would fit a few documents at a time)."""
    return np.asarray(input_ids)[np.random.default_rng(seed).permutation(len(input_ids))]


def stream_source(batches: Sequence[torch.Tensor]) -> dict[str, Any]:
    """What a training stream is, for a resumed position to be checked against: the number of
    batches, their tokens, and the SHA-256 of their shapes and ids in order."""
    h = hashlib.sha256()
    for b in batches:
        h.update(str(tuple(b.shape)).encode())
        h.update(b.cpu().numpy().astype(np.int64).tobytes())
    return {"batches": len(batches), "tokens": int(sum(b.numel() for b in batches)), "hash": h.hexdigest()}


def layer_major_states(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Residual states of a batch as a token stream: (n+1, B·T, d), layer-major.

    Row L < n is the stream entering layer L, row n the last layer's raw output
    (:func:`resdyn.lm.structure.residual_states`). Layer-major so that a chunk of layers is contiguous.
    """
    states = structure.residual_states(_decoder_only(model), input_ids.to(model_device(model)))  # (B, n+1, T, d)
    b, l1, t, d = states.shape
    return states.permute(1, 0, 2, 3).reshape(l1, b * t, d)


class TokenStream:
    """Consecutive slices of exactly ``k`` tokens from the cycled batches' cached states.

    Each batch's frozen forward runs once; its tokens are served to as many steps as they fill.
    The batch order is the given one (deterministic), cycled when the steps outrun the data; with
    ``cycle=False`` (fresh tokens) each batch is served once and running out raises ValueError.
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
        cycle: bool = True,
    ):
        self.model, self.batches, self.k, self.teacher, self.cycle = model, batches, k, teacher, cycle
        self.next_batch = 0
        self.buffer: tuple[torch.Tensor, tuple[torch.Tensor, ...] | None] | None = None
        self.offset = 0  # tokens of the current buffer's batch already served
        info = model_info(model)
        per_token = (info["n_layers"] + 1) * info["d_model"] * dtype_of(model).itemsize + (info["d_model"] + 1) * 4
        total = sum(b.numel() for b in batches) * per_token
        # a batch used once is never served again: nothing to keep
        self.cache: dict[int, Any] | None = {} if cycle and total <= cache_bytes else None

    def _fetch(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        if not self.cycle and self.next_batch >= len(self.batches):
            tokens = sum(b.numel() for b in self.batches)
            raise ValueError(
                f"lens.train_tokens: the fresh-token stream ran out after its {len(self.batches)} batches "
                f"({tokens:,} tokens); each token is used once"
            )
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
                # an empty slice still holds the whole spent batch: let it go before the next forward
                self.buffer = None
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
