"""The normalisations the sublayers use, as (weight, eps) pairs the Jacobian engines differentiate
in closed form: RMSNorm ``(c + w) ⊙ x / sqrt(mean(x²) + eps)`` with the family's offset c, and
LayerNorm with bias."""

from __future__ import annotations

import torch
from torch import nn

from resdyn.lm.families import FAMILIES

#: RMSNorm classes whose math is ``(c + w) ⊙ x / sqrt(mean(x²) + eps)`` (w absent: no scale), class
#: name -> offset c (Gemma 2/3: 1), from the family table. The closed-form Jacobians in
#: resdyn.study_a.jacobian rely on this; any other norm class is refused there.
RMS_NORM_CLASSES: dict[str, float] = {name: c for fam in FAMILIES.values() for name, c in fam.rms_norms.items()}


def rms_norm_params(norm: nn.Module) -> tuple[torch.Tensor | None, float]:
    """(effective scale c + w or None, eps) of an RMSNorm ``(c + w) ⊙ x / sqrt(mean(x²) + eps)``.

    Raises ValueError for a norm class not in :data:`RMS_NORM_CLASSES` (its math is unknown)."""
    name = type(norm).__name__
    if name not in RMS_NORM_CLASSES:
        raise ValueError(f"norm {name!r} is not a known RMSNorm; known: {sorted(RMS_NORM_CLASSES)}")
    eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
    weight = norm.weight if getattr(norm, "with_scale", True) else None
    offset = RMS_NORM_CLASSES[name]
    if weight is not None and offset:
        weight = weight + offset
    return weight, float(eps)


def layer_norm_params(norm: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
    """(weight or None, bias or None, eps) of a LayerNorm ``w ⊙ (x − μ)/sqrt(var + eps) + b``
    over the last dimension (torch's ``nn.LayerNorm``); ValueError for any other module."""
    if not isinstance(norm, nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise ValueError(f"norm {type(norm).__name__!r} is not a 1-d torch.nn.LayerNorm")
    return norm.weight, norm.bias, float(norm.eps)
