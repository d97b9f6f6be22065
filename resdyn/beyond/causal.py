"""Causal test of readout subspaces: remove or swap S_L^(k) in the stream and rerun the model.

Study B says the tuned-lens translator A_L "reads" the top-k right singular subspace
S_L^(k) (:func:`resdyn.study_b.readout.readout_subspace`, basis V, d × k, orthonormal) of the stream
h_L entering layer L. If that subspace carries what later layers and the readout use, removing
it should change the model's output more than removing a random k-subspace does.

Interventions on the stream h_L (B, T, d), applied at every position of every sequence, after
which layers L … n−1 run on the modified stream (the model's own sublayers,
:func:`resdyn.lm.decompose.sublayers`, exactly as :func:`resdyn.lm.decompose.forward_boundaries` runs them) and
the final raw state is read out by the model's own head (:func:`resdyn.lm.structure.unembed_logits`):

- **project**: ``h ← h − (h V) Vᵀ`` — the component in S is removed;
- **patch**: ``h ← h + ((h' − h) V) Vᵀ`` (= h − VVᵀh + VVᵀh'), h' the same layer's stream of a
  *different* held-out sample at the same positions (sample i takes its donor from sample
  (i + 1) mod B) — the component in S is swapped, the rest kept.

Written this way both are the identity *bit for bit* when V has no columns (k = 0) or h' = h,
so "nothing removed" gives KL exactly 0, not rounding noise.

Effect, over all B·T tokens: with p = softmax(original logits), q = softmax(modified logits),

    kl        = mean_t KL(p_t ‖ q_t) = mean_t Σ_v p_t(v) (log p_t(v) − log q_t(v))   (float64)
    flip_rate = mean_t [argmax p_t ≠ argmax q_t].

"Original" is the same continuation from layer L run on the unmodified stream, so the two
runs differ only by the intervention.

Null: ``n_random`` Haar-random k-subspaces (seeded per layer, ``default_rng([seed, L])``),
same intervention. Reported: their KL mean and sd (ddof 1), flip mean and sd, ``kl_z =
(kl − mean)/sd`` and the empirical ``kl_p`` = share of random draws with KL ≥ observed
(0 means < 1/n_random).

Known answers (tests): k = 0 and self-patching give KL = 0 and no flips exactly; a direction
the stream never occupies (a Llama whose embedding, o_proj and down_proj have a zero row for
that coordinate) changes nothing at any layer; at index n (the final raw state) of a model
whose final norm is the identity, removing a subspace of the unembedding's null space
changes the logits only by rounding; the continuation equals the Hugging Face forward, and an
intervention equals the same edit made by a forward pre-hook on layer L.

Layers: L = 0 … n−1 are streams entering layer L (L = 0: the embedding output); L = n, the
last layer's raw output, is allowed in :meth:`Continuation.effect` (nothing runs after it but
the final norm and head).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from resdyn import artifacts
from resdyn.beyond.bridge import haar_subspace
from resdyn.lm import decompose, structure
from resdyn.numerics.checks import check_int, is_int
from resdyn.study_b import phases as ph
from resdyn.study_b.readout import readout_subspace

__all__ = [
    "INTERVENTIONS",
    "CAUSAL_COLUMNS",
    "project_off",
    "patch_component",
    "kl_and_flips",
    "default_chunk_elements",
    "Reference",
    "Continuation",
    "causal_table",
]

INTERVENTIONS: tuple[str, ...] = ("project", "patch")
CAUSAL_COLUMNS = artifacts.CAUSAL_COLUMNS  # defined by resdyn.artifacts.CausalTable


# --------------------------------------------------------------------------------------------
# the interventions


def _basis(V: Any, h: torch.Tensor) -> torch.Tensor:
    Vt = torch.as_tensor(V)
    if Vt.dim() != 2 or Vt.shape[0] != h.shape[-1]:
        raise ValueError(f"V must be (d, k) with d = {h.shape[-1]} (the stream width), got shape {tuple(Vt.shape)}")
    return Vt.to(device=h.device, dtype=torch.promote_types(h.dtype, torch.float32))


def project_off(h: torch.Tensor, V: Any) -> torch.Tensor:
    """``h − (h V) Vᵀ`` on the last axis: remove the component in span(V).

    h (..., d); V (d, k) orthonormal (k = 0 allowed: returns h unchanged, bit for bit).
    Computed in at least float32, returned in h's dtype.

    Example:
        >>> project_off(torch.tensor([[1.0, 2.0, 3.0]]), torch.eye(3)[:, :1]).tolist()
        [[0.0, 2.0, 3.0]]
    """
    Vt = _basis(V, h)
    x = h.to(Vt.dtype)
    return (x - (x @ Vt) @ Vt.T).to(h.dtype)


def patch_component(h: torch.Tensor, donor: torch.Tensor, V: Any) -> torch.Tensor:
    """``h + ((h' − h) V) Vᵀ`` = h − VVᵀh + VVᵀh': take the span(V) component from ``donor``.

    h, donor (..., d) of equal shape; V (d, k) orthonormal. ``donor = h`` or k = 0 returns h
    unchanged, bit for bit.

    Example:
        >>> patch_component(torch.tensor([1.0, 2.0]), torch.tensor([5.0, 7.0]), torch.eye(2)[:, :1]).tolist()
        [5.0, 2.0]
    """
    if donor.shape != h.shape:
        raise ValueError(f"donor has shape {tuple(donor.shape)}, h has {tuple(h.shape)}; they must match")
    Vt = _basis(V, h)
    x = h.to(Vt.dtype)
    return (x + ((donor.to(Vt.dtype) - x) @ Vt) @ Vt.T).to(h.dtype)


def kl_and_flips(logits_ref: torch.Tensor, logits_mod: torch.Tensor) -> tuple[float, float, int]:
    """Summed KL(p_ref ‖ p_mod) and summed top-1 flips over tokens, and the token count.

    logits (..., V); KL in float64 from log-softmax: Σ_v p (log p − log q). Identical logits
    give exactly 0.

    Example:
        >>> z = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
        >>> kl_and_flips(z, z)
        (0.0, 0.0, 2)
    """
    if logits_ref.shape != logits_mod.shape:
        raise ValueError(f"logits shapes differ: {tuple(logits_ref.shape)} vs {tuple(logits_mod.shape)}")
    kl, flips = _token_kl_and_flips(_ReferenceChunk.of(logits_ref), logits_mod)
    return float(kl.sum()), float(flips.sum()), int(kl.numel())


class _ReferenceChunk:
    """The reference side of :func:`kl_and_flips` for one chunk of tokens.

    Holds log p (float64), p and the top-1 ids.
    """

    __slots__ = ("log_p", "p", "top1")

    def __init__(self, log_p: torch.Tensor, p: torch.Tensor, top1: torch.Tensor):
        self.log_p, self.p, self.top1 = log_p, p, top1

    @classmethod
    def of(cls, logits_ref: torch.Tensor) -> _ReferenceChunk:
        a = torch.log_softmax(logits_ref.double(), dim=-1)
        return cls(a, a.exp(), logits_ref.argmax(-1))


def _token_kl_and_flips(ref: _ReferenceChunk, logits_mod: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: KL(p_ref ‖ p_mod) (float64) and the top-1 flip (0/1, float64)."""
    b = torch.log_softmax(logits_mod.double(), dim=-1)
    kl = (ref.p * (ref.log_p - b)).sum(-1)
    return kl, (ref.top1 != logits_mod.argmax(-1)).double()


def default_chunk_elements(device: torch.device | str) -> int:
    """Logits elements per readout chunk: 2^18 on a CPU, 2^24 on an accelerator.

    On a CPU the float64 softmax/KL passes over a chunk (2 MB per array at 2^18) stay in the
    caches; at 2^21 (V = 2048, 1024 tokens) they run at memory speed, 2× slower (measured). On a
    GPU larger chunks mean fewer, fuller kernels. KL and flips are kept per token and summed once
    over all tokens, so the chunk size changes at most the float32 rounding of the head's logits
    (a gemm may pick another kernel for another row count; on the default zoo, 128-token and
    1024-token chunks give the same bits).
    """
    return 1 << 18 if torch.device(device).type == "cpu" else 1 << 24


#: Most bytes of a reference readout (log p and p in float64: 16 bytes per logit) kept for the
#: comparisons of one layer; above it the reference is read out again for each comparison
#: (same numbers, more time).
REFERENCE_CACHE_BYTES = 1 << 28


class Reference:
    """The readout of an unmodified final raw state, for many :meth:`Continuation.compare` calls.

    All comparisons of a layer (the observed subspace and every random one, both interventions)
    share one reference, so its log-softmax, probabilities and top-1 are computed once per
    chunk of tokens and kept when they fit in :data:`REFERENCE_CACHE_BYTES`, else recomputed
    per comparison (the same operations either way, so the numbers are the same bit for bit).
    """

    def __init__(self, cont: Continuation, final_ref: torch.Tensor):
        self._cont = cont
        self.final = final_ref.reshape(-1, cont.d)
        vocab = cont.vocab
        self._chunks: list[_ReferenceChunk] | None = None
        if 16 * self.final.shape[0] * vocab <= REFERENCE_CACHE_BYTES:
            self._chunks = [self._chunk(i) for i in cont.chunk_starts(self.final.shape[0])]

    def _chunk(self, start: int) -> _ReferenceChunk:
        rows = self.final[start : start + self._cont.chunk_tokens]
        return _ReferenceChunk.of(structure.unembed_logits(self._cont.model, rows))

    def chunks(self):
        """(start row, reference chunk) over the tokens."""
        for j, i in enumerate(self._cont.chunk_starts(self.final.shape[0])):
            yield i, (self._chunks[j] if self._chunks is not None else self._chunk(i))


# --------------------------------------------------------------------------------------------
# running the model from a layer


class Continuation:
    """One batch of sequences, its residual streams, and the model run from any layer on.

    ``Continuation(model, input_ids)`` runs the model's sublayers once (no grad, the same
    calls as :func:`resdyn.lm.decompose.forward_boundaries`) and keeps the streams h_0 … h_n
    (B, T, d each; the pre-MLP states are not kept). :meth:`run` continues from layer L with a
    given stream; Gemma 4 KV-shared layers whose source layer lies before L attend over the
    source's original keys/values (the intervention happened after them).
    """

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, chunk_elements: int | None = None):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be a (B, T) tensor, got {type(input_ids).__name__} "
                f"{tuple(getattr(input_ids, 'shape', ()))}"
            )
        self.model = model
        self.adapters = decompose.sublayers(model)
        self.n_layers = len(self.adapters)
        if chunk_elements is None:
            chunk_elements = default_chunk_elements(structure.input_device(model))
        self.chunk_elements = int(chunk_elements)
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        #: tokens per readout chunk
        self.chunk_tokens = max(1, self.chunk_elements // max(1, self.vocab))
        self._sources = {a.kv_source for a in self.adapters if a.kv_source != a.index}
        with torch.no_grad():
            self.ctx = decompose.prepare(model, input_ids)
            self._streams = [self.ctx.embeddings]
            self._run(self.ctx.embeddings, 0, {}, self._streams)
        self.batch, self.length, self.d = self._streams[0].shape

    def _check_layer(self, layer: int) -> int:
        if not is_int(layer) or not 0 <= layer <= self.n_layers:
            raise ValueError(f"layer={layer!r}; allowed: integers 0..{self.n_layers} (n_layers = {self.n_layers})")
        return int(layer)

    def stream(self, layer: int) -> torch.Tensor:
        """h_L (B, T, d): entering layer L (L = n: the last layer's raw output)."""
        return self._streams[self._check_layer(layer)]

    @torch.no_grad()
    def run(self, h: torch.Tensor, start: int) -> torch.Tensor:
        """Run layers ``start`` … n−1 on the stream h (B, T, d); returns the raw final state."""
        start = self._check_layer(start)
        if h.shape != self._streams[0].shape:
            raise ValueError(f"h has shape {tuple(h.shape)}; expected {tuple(self._streams[0].shape)}")
        stored = {s: self.adapters[s].kv(self._streams[s], self.ctx) for s in self._sources if s < start}
        return self._run(h, start, stored)

    def _run(self, h: torch.Tensor, start: int, stored: dict, keep: list | None = None) -> torch.Tensor:
        for adapter in self.adapters[start:]:
            if adapter.index in self._sources:
                stored[adapter.index] = adapter.kv(h, self.ctx)
            _, h = adapter.layer_forward(h, self.ctx, kv=stored.get(adapter.kv_source))
            if keep is not None:
                keep.append(h)
        return h

    def chunk_starts(self, n_tokens: int) -> range:
        return range(0, n_tokens, self.chunk_tokens)

    @torch.no_grad()
    def reference(self, final_ref: torch.Tensor) -> Reference:
        """The readout of an unmodified final raw state, prepared for many :meth:`compare` calls."""
        return Reference(self, final_ref)

    @torch.no_grad()
    def compare(self, final_ref: torch.Tensor | Reference, final_mod: torch.Tensor) -> tuple[float, float, int]:
        """(summed KL, summed flips, tokens) between the readouts of two final raw states.

        ``final_ref`` may be given as its :meth:`reference`; per-token values are summed once.
        """
        ref = final_ref if isinstance(final_ref, Reference) else self.reference(final_ref)
        mod = final_mod.reshape(-1, self.d)
        if mod.shape != ref.final.shape:
            raise ValueError(f"final states differ in shape: {tuple(ref.final.shape)} vs {tuple(mod.shape)}")
        kl, flips = [], []
        for i, chunk in ref.chunks():
            k_, f_ = _token_kl_and_flips(chunk, structure.unembed_logits(self.model, mod[i : i + self.chunk_tokens]))
            kl.append(k_)
            flips.append(f_)
        kl_all = torch.cat(kl)
        return float(kl_all.sum()), float(torch.cat(flips).sum()), int(kl_all.numel())

    def donor(self, layer: int) -> torch.Tensor:
        """The patch donors at layer L: sample i gets sample (i + 1) mod B's stream."""
        if self.batch < 2:
            raise ValueError("patching needs at least 2 samples (a donor must be a different sample); got 1")
        perm = torch.roll(torch.arange(self.batch, device=self.stream(layer).device), -1)
        return self.stream(layer)[perm]

    @torch.no_grad()
    def effect(
        self, layer: int, V: Any, intervention: str = "project", reference: torch.Tensor | Reference | None = None
    ) -> tuple[float, float, int]:
        """(mean KL, flip rate, tokens) of one intervention at layer L with basis V (d, k).

        ``reference``: the unmodified continuation's final state (``run(stream(L), L)``) or its
        :meth:`reference` readout, computed here when not given.
        """
        if intervention not in INTERVENTIONS:
            raise ValueError(f"intervention={intervention!r}; allowed: {INTERVENTIONS}")
        h = self.stream(layer)
        ref = self.run(h, layer) if reference is None else reference
        if intervention == "project":
            mod_h = project_off(h, V)
        else:
            mod_h = patch_component(h, self.donor(layer), V)
        kl, flips, n = self.compare(ref, self.run(mod_h, layer))
        return kl / n, flips / n, n


# --------------------------------------------------------------------------------------------
# the pipeline's table


def _phase_labels(phases: Mapping[str, Any] | None, n_layers: int) -> dict[int, int]:
    if not phases:
        return {}
    m = n_layers - 1
    labels = ph.phase_of_layer(m, int(phases["b1"]), int(phases["b2"]))
    return {L: int(labels[L]) for L in range(m)}


def _check_causal_args(
    model: nn.Module,
    ids: torch.Tensor,
    translators: Sequence[Any],
    k: int,
    n_random: int,
    seed: int,
    layers: Sequence[int] | None,
    interventions: Sequence[str],
) -> list[int]:
    """The layers :func:`causal_table` intervenes on (default 0 … n−1), after checking its arguments.

    Each bad argument is one ValueError naming it and the allowed values: ``ids`` a (B, T)
    integer tensor with B ≥ 2 for ``patch``; ``interventions`` a non-empty subset of
    :data:`INTERVENTIONS`; ``n_random`` ≥ 2; ``seed`` ≥ 0; one translator per layer;
    1 ≤ ``k`` ≤ d; every layer in 0 … n−1.
    """
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be a (B, T) integer array, got {ids.dtype} {tuple(ids.shape)}")
    bad = [i for i in interventions if i not in INTERVENTIONS]
    if bad or not interventions:
        raise ValueError(f"interventions={list(interventions)!r}; allowed: non-empty subset of {INTERVENTIONS}")
    if "patch" in interventions and ids.shape[0] < 2:
        raise ValueError(f"patching needs at least 2 samples (a donor must be a different sample); got {ids.shape[0]}")
    check_int(n_random, "n_random", 2, why="for a mean and sd")
    check_int(seed, "seed", 0)
    n = structure.n_layers(model)
    if len(translators) != n:
        raise ValueError(f"got {len(translators)} translators; the model has {n} layers (A_0 … A_{n - 1})")
    d = structure.hidden_size(model)
    check_int(k, "k", 1, d, why="d = hidden size")
    layers = list(range(n)) if layers is None else [int(L) for L in layers]
    out_of_range = [L for L in layers if not 0 <= L < n]
    if out_of_range:
        raise ValueError(f"layers {out_of_range} out of range; allowed 0..{n - 1} (streams with a translator)")
    return layers


def _against_null(kl: float, flip: float, null: np.ndarray) -> dict[str, float]:
    """The observed effect beside its null: the columns kl … kl_p of one :data:`CAUSAL_COLUMNS` row.

    ``null`` (n_random, 2) holds (KL, flip rate) of each random subspace. ``kl_z`` =
    (kl − mean)/sd (sd with ddof 1; ±inf or 0 when sd = 0), ``kl_p`` = share of random
    draws with KL ≥ kl.
    """
    mean_kl, sd_kl = float(null[:, 0].mean()), float(null[:, 0].std(ddof=1))
    return {
        "kl": kl,
        "flip_rate": flip,
        "random_kl_mean": mean_kl,
        "random_kl_sd": sd_kl,
        "random_flip_mean": float(null[:, 1].mean()),
        "random_flip_sd": float(null[:, 1].std(ddof=1)),
        "kl_z": (kl - mean_kl) / sd_kl
        if sd_kl > 0
        else (0.0 if kl == mean_kl else math.copysign(math.inf, kl - mean_kl)),
        "kl_p": float(np.mean(null[:, 0] >= kl)),
    }


def causal_table(
    model: nn.Module,
    input_ids: torch.Tensor | np.ndarray,
    translators: Sequence[Any],
    k: int,
    n_random: int = 20,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    phases: Mapping[str, Any] | None = None,
    interventions: Sequence[str] = INTERVENTIONS,
) -> pd.DataFrame:
    """``causal.tsv``: effect of removing / swapping each readout subspace vs random subspaces.

    Args:
        model: a causal LM of a supported family (eval mode, on its device).
        input_ids: (B, T) held-out token ids, B ≥ 2 for ``patch``.
        translators: A_0 … A_{n−1} (d, d) tuned-lens translator matrices (A_L reads h_L).
        k: subspace dimension, 1 ≤ k ≤ d.
        n_random: random k-subspaces per layer and intervention (≥ 2).
        seed: layer L draws from ``np.random.default_rng([seed, L])``; the same draws serve
            both interventions.
        layers: streams to intervene on (default all, 0 … n−1).
        phases: content of phases.json (b1, b2) to label each layer's phase (the phase of RSS
            point L, layer L's update); None or L = n−1: empty.
        interventions: subset of ("project", "patch").
    Returns:
        DataFrame with :data:`CAUSAL_COLUMNS`, one row per (layer, intervention).
    """
    ids = torch.as_tensor(np.asarray(input_ids) if not isinstance(input_ids, torch.Tensor) else input_ids)
    layers = _check_causal_args(model, ids, translators, k, n_random, seed, layers, interventions)
    d = structure.hidden_size(model)
    device = structure.input_device(model)
    cont = Continuation(model, ids.to(device=device, dtype=torch.long))
    labels = _phase_labels(phases, structure.n_layers(model))
    rows = []
    for L in layers:
        V = readout_subspace(np.asarray(translators[L], dtype=np.float64), int(k))
        rng = np.random.default_rng([int(seed), L])
        randoms = [haar_subspace(d, int(k), rng) for _ in range(n_random)]
        ref = cont.reference(cont.run(cont.stream(L), L))
        for intervention in interventions:
            kl, flip, n_tok = cont.effect(L, V, intervention, reference=ref)
            null = np.array([cont.effect(L, R, intervention, reference=ref)[:2] for R in randoms])
            rows.append(
                {
                    "layer": L,
                    "intervention": intervention,
                    "k": int(k),
                    "d": d,
                    **_against_null(kl, flip, null),
                    "n_random": n_random,
                    "n_samples": cont.batch,
                    "n_tokens": n_tok,
                    "phase": labels.get(L),
                }
            )
    table = pd.DataFrame(rows, columns=CAUSAL_COLUMNS)
    table["phase"] = table["phase"].astype("Int64")
    return table
