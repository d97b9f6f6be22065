"""Qwen3: the Llama/Qwen2 pre-norm layer with per-head RMSNorm on queries and keys (before RoPE,
no value norm) and no q/k/v bias; ``sliding_attention`` layers when ``use_sliding_window``.

    m = h + A(n_in(h)),  A: q = rope(n_q(W_q n)), k = rope(n_k(W_k n)) per head
    h' = m + F(n_post_attn(m))
"""

from __future__ import annotations

from resdyn.lm.sublayers import LayerSublayers


class Qwen3Sublayers(LayerSublayers):
    """Qwen3 decoder layer (see the module docstring)."""

    qk_norm = "head"
