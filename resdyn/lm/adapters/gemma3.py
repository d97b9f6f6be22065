"""Gemma 3 (``gemma3_text``, and the text tower of ``gemma3`` multimodal checkpoints): Gemma 2's
sandwich layer plus per-head q/k RMSNorm (``1 + w``) before RoPE, and RoPE tables per layer type
(local base frequency on sliding layers). Soft-capping is applied when the config sets it.
Bidirectional attention (``use_bidirectional_attention``) is refused in the family table.
"""

from __future__ import annotations

from resdyn.lm.adapters.gemma2 import Gemma2Sublayers


class Gemma3Sublayers(Gemma2Sublayers):
    """Gemma 3 decoder layer (see the module docstring)."""

    qk_norm = "head"
