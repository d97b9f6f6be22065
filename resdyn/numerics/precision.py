"""fp32 numerics pinned at a job's start, and the record of what they were.

Every GPU job (Jacobians, activations, lens, lens metrics, causal test) calls :func:`pin_ieee` first:
it sets fp32 matmuls and convolutions to full IEEE precision with torch's current API
(``torch.backends.fp32_precision`` and its per-backend children: cuBLAS matmul, cuDNN conv and RNN,
oneDNN), never with the legacy ``allow_tf32`` / ``set_float32_matmul_precision`` calls (mixing the
two makes torch raise), and returns the record that provenance and the resume checkpoints keep:
the precision settings, the TF32 override variables, the GPU model(s), and the torch, CUDA, cuDNN
and cuBLAS versions. On CPU the record says device ``cpu``.

``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`` set to anything but ``0`` makes cuBLAS run fp32 matmuls in
TF32 whatever the settings say, so a CUDA job with it set stops. ``NVIDIA_TF32_OVERRIDE=0`` turns
TF32 off in NVIDIA's libraries (it never turns it on): recorded, allowed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from collections.abc import Iterator
from typing import Any

import torch

TF32_OVERRIDES = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")
#: torch.backends attribute paths that hold an ``fp32_precision`` setting ("" is the global one)
BACKENDS = ("", "cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")
#: what must agree between a checkpoint and the job that would resume it
RESUME_FIELDS = ("device", "gpus", "torch", "cuda", "cudnn", "cublas", "fp32_precision", "tf32_overrides")


def _backend(path: str):
    obj = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def fp32_precision() -> dict[str, str]:
    """The current ``fp32_precision`` of every backend in :data:`BACKENDS` ("global" for the top one)."""
    return {path or "global": _backend(path).fp32_precision for path in BACKENDS}


def set_fp32_precision(values: dict[str, str]) -> None:
    """Set ``fp32_precision`` per backend (keys as :func:`fp32_precision` returns them), the global
    one first (setting it resets the children)."""
    for key in sorted(values, key=lambda k: k != "global"):
        _backend("" if key == "global" else key).fp32_precision = values[key]


@contextlib.contextmanager
def ieee_fp32() -> Iterator[None]:
    """Within the block every fp32 matmul/conv runs in IEEE precision; the previous settings after."""
    previous = fp32_precision()
    set_fp32_precision({"global": "ieee", **{path: "ieee" for path in BACKENDS if path}})
    try:
        yield
    finally:
        set_fp32_precision(previous)


def _cublas_version() -> str | None:
    """The cuBLAS of torch's CUDA wheels (the ``nvidia-cublas*`` distribution), None when absent."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-cublas"):
            return dist.version
    return None


def _device_type(device: str | torch.device) -> str:
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    return dev.type


def numerics_record(device: str | torch.device) -> dict[str, Any]:
    """What decides fp32 rounding for a job on ``device``, as it is now (reads, changes nothing).

    Keys: device ("cpu" or "cuda"), gpus (the model name of every visible GPU; [] on CPU),
    capability (of the first), torch, cuda (``torch.version.cuda``), cudnn
    (``torch.backends.cudnn.version()``), cublas (:func:`_cublas_version`), fp32_precision
    (:func:`fp32_precision`), tf32_overrides (the :data:`TF32_OVERRIDES` variables, None when unset).
    """
    kind = _device_type(device)
    on_gpu = kind == "cuda" and torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if on_gpu else []
    return {
        "device": kind,
        "gpus": gpus,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if on_gpu else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if on_gpu else None,
        "cublas": _cublas_version() if on_gpu else None,
        "fp32_precision": fp32_precision(),
        "tf32_overrides": {name: os.environ.get(name) for name in TF32_OVERRIDES},
    }


def pin_ieee(device: str | torch.device) -> dict[str, Any]:
    """Set fp32 matmuls/convs to IEEE for the rest of the job (module docstring); return
    :func:`numerics_record`. A CUDA job with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE on stops (ValueError)."""
    kind = _device_type(device)
    forced = os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
    if kind == "cuda" and forced not in (None, "", "0"):
        raise ValueError(
            f"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE={forced!r} forces TF32 fp32 matmuls in cuBLAS: unset it "
            "(or set it to 0) for resdyn's GPU jobs, which run fp32 in IEEE precision"
        )
    set_fp32_precision({"global": "ieee", **{path: "ieee" for path in BACKENDS if path}})
    record = numerics_record(device)
    off = {k: v for k, v in record["fp32_precision"].items() if v != "ieee"}
    if off:
        raise RuntimeError(f"fp32 precision not IEEE after setting it: {off}")
    return record


def resume_numerics(device: str | torch.device) -> dict[str, Any]:
    """The part of :func:`numerics_record` a checkpoint must share with the job that resumes it
    (:data:`RESUME_FIELDS`): the same GPU model(s), library versions and precision settings."""
    record = numerics_record(device)
    return {key: record[key] for key in RESUME_FIELDS}


def resume_key(digest: str, numerics: dict[str, Any]) -> str:
    """A checkpoint's key: the SHA-256 ``digest`` of its inputs and options with the
    :func:`resume_numerics` it was computed under, as sorted JSON ``{"numerics": ..., "sha256": ...}``
    (:func:`resdyn.io.resume_mismatch` reads it back to name both setups)."""
    return json.dumps({"numerics": numerics, "sha256": digest}, sort_keys=True, default=str)
