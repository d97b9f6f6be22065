"""SmolLM3: the Llama pre-norm layer where some layers use no positions at all (NoPE).

``config.no_rope_layers[L]`` is 1 where layer L rotates q/k and 0 for a NoPE layer (HF's
``attention.use_rope``; by default every 4th layer is NoPE); with ``use_sliding_window`` the
``sliding_attention`` layers see a window of ``sliding_window`` keys.
"""

from __future__ import annotations

from resdyn.lm.sublayers import LayerSublayers


class SmolLM3Sublayers(LayerSublayers):
    """SmolLM3 decoder layer (NoPE handled by :attr:`resdyn.lm.sublayers.LayerSublayers.rotary`)."""
