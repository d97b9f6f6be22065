"""Residual-stream states at every sublayer boundary, stored per layer in HDF5.

States come from :func:`resdyn.infra.arch.boundary_states` — the same sublayer split the Jacobian
engine differentiates — so activations and Jacobians describe the same boundaries.

Schema of ``activations/layer{L:03d}.h5`` (``resdyn.study_a.activations/1``):

* datasets ``pre_attn`` (N, T', d) = h_L and ``pre_mlp`` (N, T', d) = m_L, T' = T − skip_positions,
  in the configured dtype; the last layer's file also has ``output`` (N, T', d), its raw output
  before the final norm;
* ``sample_ids`` (N,), ``positions`` (T',) token positions kept;
* attrs: ``schema``, ``layer``, ``skip_positions`` and the checkpoint/samples provenance attrs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

import h5py
import numpy as np
import torch
from tqdm import tqdm

from resdyn.infra import arch, io
from resdyn.artifacts import Activations, BoundaryView  # noqa: F401 - BoundaryView re-exported

SCHEMA = Activations.SCHEMA
RESIDUAL_KINDS = ("sequential", "parallel")


def _require_finite(states: torch.Tensor, sample: int, where: str) -> None:
    """Raise FloatingPointError naming ``where``, the first non-finite boundary and the sample."""
    if torch.isfinite(states).all():
        return
    b = int(torch.nonzero(~torch.isfinite(states).flatten(1).all(1))[0])
    layer, kind = (b // 2, ("pre_attn", "pre_mlp")[b % 2]) if b < states.shape[0] - 1 else (b // 2 - 1, "output")
    raise FloatingPointError(
        f"{where}: non-finite residual state (NaN/Inf) at layer {layer} {kind}, sample index {sample} — "
        "the model's weights or inputs hold NaN/Inf; no activations written")


@torch.no_grad()
def collect_boundary_states(model, input_ids: np.ndarray, skip_positions: int, progress: bool = True,
                            where: str = "the model") -> np.ndarray:
    """(N, 2·n_layers + 1, T − skip, d) float32 boundary states of N samples (one forward each).

    A NaN/Inf state raises FloatingPointError naming ``where`` (model and checkpoint), the first
    non-finite boundary (layer, pre_attn/pre_mlp/output) and the sample.
    """
    if not 0 <= skip_positions < input_ids.shape[1]:
        raise ValueError(f"skip_positions={skip_positions} must be in [0, {input_ids.shape[1]}) (sample length)")
    device = next(model.parameters()).device
    out = []
    for i, ids in enumerate(tqdm(input_ids, desc="boundary states", disable=not progress)):
        states = arch.boundary_states(model, torch.as_tensor(ids, device=device))
        _require_finite(states, i, where)
        out.append(states[:, skip_positions:].float().cpu().numpy())
    return np.stack(out)


def write_activation_files(states: np.ndarray, sample_ids: np.ndarray, skip_positions: int, out_dir: str | Path,
                           dtype: str, attrs: Mapping, residual: str = "sequential") -> list[Path]:
    """Write one ``layer{L:03d}.h5`` per layer from :func:`collect_boundary_states` output.

    ``residual`` (:func:`resdyn.infra.arch.residual_kind`) is stored as a file attribute: for
    "parallel" layers ``pre_mlp`` holds the virtual state h_L + A (not a boundary, see
    :mod:`resdyn.infra.arch`) and :func:`boundaries` lists ``pre_attn`` only."""
    if residual not in RESIDUAL_KINDS:
        raise ValueError(f"residual={residual!r}: allowed are {RESIDUAL_KINDS}")
    n_layers = (states.shape[1] - 1) // 2
    positions = np.arange(skip_positions, skip_positions + states.shape[2])
    paths = []
    for layer in range(n_layers):
        path = Path(out_dir) / f"layer{layer:03d}.h5"
        with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("pre_attn", data=states[:, 2 * layer].astype(dtype))
            f.create_dataset("pre_mlp", data=states[:, 2 * layer + 1].astype(dtype))
            if layer == n_layers - 1:
                f.create_dataset("output", data=states[:, -1].astype(dtype))
            _write_layer_index(f, layer, sample_ids, positions, skip_positions, residual, attrs)
        paths.append(path)
    return paths


def _write_layer_index(f: h5py.File, layer: int, sample_ids: np.ndarray, positions: np.ndarray,
                       skip_positions: int, residual: str, attrs: Mapping) -> None:
    """The part of a layer file's schema that is not the states: ids, positions and attributes."""
    f.create_dataset("sample_ids", data=sample_ids)
    f.create_dataset("positions", data=positions)
    f.attrs.update({"schema": SCHEMA, "layer": layer, "skip_positions": skip_positions, "residual": residual})
    for k, v in attrs.items():
        f.attrs[k] = v if isinstance(v, (int, float, str)) else json.dumps(v)


@torch.no_grad()
def stream_activation_files(model, input_ids: np.ndarray, sample_ids: np.ndarray, skip_positions: int,
                            out_dir: str | Path, dtype: str, attrs: Mapping, residual: str = "sequential",
                            progress: bool = True, where: str = "the model") -> list[Path]:
    """:func:`collect_boundary_states` + :func:`write_activation_files` without holding them all.

    Same files, bit for bit, but each sample's states go to the open layer files as soon as
    they are computed: host memory is one sample's (2n+1)·T'·d·4 bytes instead of
    N·(2n+1)·T'·d·4 (plus a copy) — 135 GB at Llama-3.1-8B shapes with N = 1000, T = 128.
    ``residual``: as in :func:`write_activation_files`.
    """
    if residual not in RESIDUAL_KINDS:
        raise ValueError(f"residual={residual!r}: allowed are {RESIDUAL_KINDS}")
    if not 0 <= skip_positions < input_ids.shape[1]:
        raise ValueError(f"skip_positions={skip_positions} must be in [0, {input_ids.shape[1]}) (sample length)")
    n_layers, d = arch.n_layers(model), arch.hidden_size(model)
    n, length = input_ids.shape[0], input_ids.shape[1] - skip_positions
    positions = np.arange(skip_positions, input_ids.shape[1])
    device = next(model.parameters()).device
    paths = [Path(out_dir) / f"layer{layer:03d}.h5" for layer in range(n_layers)]
    with contextlib.ExitStack() as stack:
        files = []
        for layer, path in enumerate(paths):
            f = stack.enter_context(h5py.File(stack.enter_context(io.atomic_path(path)), "w"))
            names = ["pre_attn", "pre_mlp"] + (["output"] if layer == n_layers - 1 else [])
            for name in names:
                f.create_dataset(name, shape=(n, length, d), dtype=dtype)
            _write_layer_index(f, layer, sample_ids, positions, skip_positions, residual, attrs)
            files.append(f)
        for i, ids in enumerate(tqdm(input_ids, desc="boundary states", disable=not progress)):
            states = arch.boundary_states(model, torch.as_tensor(ids, device=device))
            _require_finite(states, i, where)
            x = states[:, skip_positions:].float().cpu().numpy()
            for layer, f in enumerate(files):
                f["pre_attn"][i] = x[2 * layer].astype(dtype)
                f["pre_mlp"][i] = x[2 * layer + 1].astype(dtype)
                if layer == n_layers - 1:
                    f["output"][i] = x[-1].astype(dtype)
    return paths


# The readers are the artifact class's (resdyn.artifacts.Activations), kept here under their old names.
boundaries = Activations.boundaries
read_boundary = Activations.read_boundary
read_all_boundaries = Activations.read_all_boundaries
