"""Gemma 2: sandwich norms, attention-logit soft-capping, alternating sliding/global layers.

    m  = h + n_post_attn(A(n_in(h)))
    h' = m + n_post_ff(F(n_pre_ff(m)))

RMSNorms scale by ``1 + w`` (offset 1 in the family table); scores are ``q·k`` times
``query_pre_attn_scalar^-1/2`` then soft-capped ``c · tanh(s / c)`` with c =
``attn_logit_softcapping`` (both read from HF's attention module); the token embedding is scaled
by sqrt(d) inside HF's embedding module and the logits are soft-capped by
``final_logit_softcapping`` (:func:`resdyn.lm.structure.unembed_logits`).
"""

from __future__ import annotations

from resdyn.lm.sublayers import LayerSublayers


class Gemma2Sublayers(LayerSublayers):
    """Gemma 2 decoder layer (see the module docstring)."""

    attn_pre = "input_layernorm"
    attn_post = "post_attention_layernorm"
    mlp_pre = "pre_feedforward_layernorm"
    mlp_post = "post_feedforward_layernorm"
