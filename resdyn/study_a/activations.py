"""Residual-stream states at every sublayer boundary of a model, streamed into per-layer files.

States come from :func:`resdyn.lm.decompose.boundary_states` — the same sublayer split the Jacobian
engine differentiates — so activations and Jacobians describe the same boundaries. The files
(``activations/layer{L:03d}.h5``, schema ``resdyn.activations/1``), their writers and readers
are :class:`resdyn.artifacts.Activations`; this module runs the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from resdyn.artifacts import Activations
from resdyn.lm import decompose, structure


def _require_finite(states: torch.Tensor, sample: int, where: str) -> None:
    """Raise FloatingPointError naming ``where``, the first non-finite boundary and the sample."""
    if torch.isfinite(states).all():
        return
    b = int(torch.nonzero(~torch.isfinite(states).flatten(1).all(1))[0])
    layer, kind = (b // 2, ("pre_attn", "pre_mlp")[b % 2]) if b < states.shape[0] - 1 else (b // 2 - 1, "output")
    raise FloatingPointError(
        f"{where}: non-finite residual state (NaN/Inf) at layer {layer} {kind}, sample index {sample} — "
        "the model's weights or inputs hold NaN/Inf; no activations written"
    )


@torch.no_grad()
def collect_boundary_states(
    model, input_ids: np.ndarray, skip_positions: int, progress: bool = True, where: str = "the model"
) -> np.ndarray:
    """(N, 2·n_layers + 1, T − skip, d) float32 boundary states of N samples (one forward each).

    A NaN/Inf state raises FloatingPointError naming ``where`` (model and checkpoint), the first
    non-finite boundary (layer, pre_attn/pre_mlp/output) and the sample.
    """
    if not 0 <= skip_positions < input_ids.shape[1]:
        raise ValueError(f"skip_positions={skip_positions} must be in [0, {input_ids.shape[1]}) (sample length)")
    device = next(model.parameters()).device
    out = []
    for i, ids in enumerate(tqdm(input_ids, desc="boundary states", disable=not progress)):
        states = decompose.boundary_states(model, torch.as_tensor(ids, device=device))
        _require_finite(states, i, where)
        out.append(states[:, skip_positions:].float().cpu().numpy())
    return np.stack(out)


@torch.no_grad()
def stream_activation_files(
    model,
    input_ids: np.ndarray,
    sample_ids: np.ndarray,
    skip_positions: int,
    out_dir: str | Path,
    dtype: str,
    attrs: Mapping,
    residual: str = "sequential",
    progress: bool = True,
    where: str = "the model",
) -> list[Path]:
    """:func:`collect_boundary_states` + :meth:`resdyn.artifacts.Activations.write` without holding them all.

    Same files, bit for bit, but each sample's states go to the open layer files as soon as
    they are computed: host memory is one sample's (2n+1)·T'·d·4 bytes instead of
    N·(2n+1)·T'·d·4 (plus a copy) — 135 GB at Llama-3.1-8B shapes with N = 1000, T = 128.
    ``residual``: as in :meth:`resdyn.artifacts.Activations.write`.
    """
    if not 0 <= skip_positions < input_ids.shape[1]:
        raise ValueError(f"skip_positions={skip_positions} must be in [0, {input_ids.shape[1]}) (sample length)")
    n_layers, d = structure.n_layers(model), structure.hidden_size(model)
    n, length = input_ids.shape[0], input_ids.shape[1] - skip_positions
    device = next(model.parameters()).device
    with Activations.stream(out_dir, n_layers, n, length, d, dtype, sample_ids, skip_positions, attrs, residual) as put:
        for i, ids in enumerate(tqdm(input_ids, desc="boundary states", disable=not progress)):
            states = decompose.boundary_states(model, torch.as_tensor(ids, device=device))
            _require_finite(states, i, where)
            put(i, states[:, skip_positions:].float().cpu().numpy())
    return [Activations.layer_file(out_dir, layer) for layer in range(n_layers)]
