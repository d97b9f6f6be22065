"""Peak device memory of each GPU rule's own compute path, traced on storage-free tensors.

Each ``trace_*`` function runs the code a rule's script runs — the Jacobian engine of a block,
the boundary-state stream, lens training, lens metrics, the causal continuation — on a model
built on the meta device (:func:`meta_model`: the real shapes and dtypes, no data), under
:class:`resdyn.numerics.live_bytes.LiveBytes`, and returns the peak live bytes on the device the
model lives on (the model's weights included). ``benchmarks/memory_trace.py`` prints them beside
the plan's ``device_bytes`` (:mod:`resdyn.cluster.cost`); ``tests/test_memory_trace.py`` holds the
two together at small shapes.

Where the code picks a size by device type (``cuda`` vs ``cpu``), the GPU's choice is passed
explicitly (the Jacobian batch :data:`resdyn.numerics.sizes.JACOBIAN_GPU_BATCH`); the lens and
causal chunks already take their accelerator sizes on any non-CPU device, the meta device included.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from resdyn.beyond import causal
from resdyn.lm import structure
from resdyn.numerics.live_bytes import LiveBytes
from resdyn.numerics.sizes import JACOBIAN_GPU_BATCH
from resdyn.study_a import activations, jacobian
from resdyn.study_b import lens as lens_api
from resdyn.study_b.lens.options import SCHEMA_NAMES

DEVICE = "meta"


def meta_model(hf_config: Any, dtype: torch.dtype) -> nn.Module:
    """A causal LM of ``hf_config`` (a transformers config object) on the meta device, as
    :func:`resdyn.lm.models.load_model` leaves a model: ``dtype``, eager attention, eval mode,
    no parameter requiring a gradient."""
    from transformers import AutoModelForCausalLM

    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation="eager")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def peak_bytes(model: nn.Module, run: Callable[[], Any]) -> dict[str, int]:
    """Peak live bytes per device while ``run()`` runs, the model's parameters and buffers counted
    from the start."""
    with LiveBytes() as live:
        live.track([*model.parameters(), *model.buffers()])
        run()
    return dict(live.peak)


def _vocab(model: nn.Module) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _ids(n: int, length: int, vocab: int) -> np.ndarray:
    """Token ids (n, T): any valid ids do, the meta device never reads them."""
    return np.arange(n * length, dtype=np.int64).reshape(n, length) % vocab


def trace_jacobians(
    model: nn.Module,
    layers: Sequence[int],
    length: int,
    positions: Any = "last",
    batch: int = JACOBIAN_GPU_BATCH,
    samples: int = 2,
) -> int:
    """Device peak of one Jacobian job's block: the engine's batched forward and each sample's
    Jacobians with the device-side part of :func:`resdyn.study_a.jacobian._accumulate_batch` (the
    float64 sum over positions and :func:`resdyn.study_a.jacobian.summaries`), for the first
    ``samples`` samples of a batch, taken one at a time as
    :func:`resdyn.study_a.jacobian.write_layer_block` takes them (the second sample is the steady
    state of the job; later samples repeat it)."""
    vocab = _vocab(model)

    def run() -> None:
        engine = jacobian.JacobianEngine(model, layers)
        ids = torch.as_tensor(_ids(batch, length, vocab), device=DEVICE)
        for jacs in itertools.islice(engine.iter_batch(ids, positions), samples):
            for jac in jacs.values():
                jac.double().sum(0).cpu()
                jacobian.summaries(jac)
            del jacs

    return peak_bytes(model, run)[DEVICE]


def trace_activations(model: nn.Module, length: int, skip_positions: int, dtype: str) -> int:
    """Device peak of ``activations``: :func:`resdyn.study_a.activations.stream_activation_files`
    on two samples, writing its files to a temporary folder."""
    ids = _ids(2, length, _vocab(model))
    with tempfile.TemporaryDirectory() as out:

        def run() -> None:
            activations.stream_activation_files(
                model, ids, np.arange(2), skip_positions, out, dtype, {}, structure.residual_kind(model), progress=False
            )

        return peak_bytes(model, run)[DEVICE]


def lens_options(section: dict[str, Any]) -> dict[str, Any]:
    """The :class:`resdyn.study_b.lens.LensOptions` keyword arguments in a config's ``lens`` section
    (schema names mapped to the option names, keys that are not options left out)."""
    names = {f.name for f in dataclasses.fields(lens_api.LensOptions)}
    renamed = {SCHEMA_NAMES.get(k, k): v for k, v in section.items()}
    return {k: v for k, v in renamed.items() if k in names}


def trace_lens(model: nn.Module, length: int, section: dict[str, Any]) -> int:
    """Device peak of lens training: :func:`resdyn.study_b.lens.train_lens` as the ``lens`` script
    calls it with the config's ``lens`` ``section`` (batches of ``tokens_per_step // T``
    sequences, ``n_heldout_blocks`` held-out sequences), two steps with an evaluation after each,
    so the second batch's fetch and the held-out pass both run."""
    opts = {**lens_options(section), "steps": 2, "eval_every": 1, "warmup_steps": 0, "progress": False}
    batch = max(1, opts["tokens_per_step"] // length)
    vocab = _vocab(model)

    def run() -> None:
        lens_api.train_lens(
            model,
            lens_api.token_batches(_ids(2 * batch, length, vocab), batch),
            heldout_batches=lens_api.token_batches(_ids(section["n_heldout_blocks"], length, vocab), batch),
            cache_mb=0,
            **opts,
        )

    return peak_bytes(model, run)[DEVICE]


def trace_lens_metrics(model: nn.Module, length: int, batch: int = 16) -> int:
    """Device peak of ``lens_metrics``: :func:`resdyn.study_b.lens.lens_metrics` on one batch of
    ``batch`` sequences (the script's 16) with zero translators on the device."""
    n, d = structure.n_layers(model), structure.hidden_size(model)
    vocab = _vocab(model)

    def run() -> None:
        fitted = lens_api.Lens(model, torch.zeros(n, d, d, device=DEVICE), torch.zeros(n, d, device=DEVICE))
        lens_api.lens_metrics(model, fitted, lens_api.token_batches(_ids(batch, length, vocab), batch))

    return peak_bytes(model, run)[DEVICE]


def trace_causal(model: nn.Module, length: int, n_samples: int, k: int) -> int:
    """Device peak of ``causal``: :func:`resdyn.beyond.causal.causal_table` at stream 0 (the
    longest continuation, through all n layers) with two random subspaces (the fewest it takes). The host-side readout
    SVD of the translator is replaced by the first k unit vectors (it holds no device memory and
    would cost the CPU minutes at d = 5120)."""
    n, d = structure.n_layers(model), structure.hidden_size(model)
    ids = _ids(n_samples, length, _vocab(model))
    translators = [np.zeros((1, 1))] * n
    translators[0] = np.eye(d)
    original = causal.readout_subspace
    causal.readout_subspace = lambda a, kk: np.eye(a.shape[0], kk)
    try:
        return peak_bytes(model, lambda: causal.causal_table(model, ids, translators, k, n_random=2, layers=[0]))[
            DEVICE
        ]
    finally:
        causal.readout_subspace = original
