"""Granite (3.x dense): the Llama pre-norm layer with multipliers.

    m  = h + r · A(n_in(h))            r = residual_multiplier
    h' = m + r · F(n_post_attn(m))

Attention scores are scaled by ``attention_multiplier`` (HF's ``attention.scaling``) instead of
hd^-1/2; h_0 = ``embedding_multiplier`` · embedding; logits = lm_head(·) / ``logits_scaling``
(:func:`resdyn.lm.structure.unembed_logits`).
"""

from __future__ import annotations

import torch
from torch import nn

from resdyn.lm.sublayers import LayerSublayers


class GraniteSublayers(LayerSublayers):
    """Granite decoder layer (see the module docstring)."""

    def __init__(self, layer, index, fam, config) -> None:
        super().__init__(layer, index, fam, config)
        self.branch_scale = float(layer.residual_multiplier)

    @classmethod
    def scale_embeddings(cls, stack: nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings * stack.embedding_multiplier
