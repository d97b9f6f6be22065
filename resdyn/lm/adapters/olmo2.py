"""OLMo 2 and OLMo 3: post-norm halves ``m = h + n_post_attn(A(h))``, ``h' = m + n_post_ff(F(m))``,
q/k RMSNorm over the full width before the head split."""

from __future__ import annotations

from resdyn.lm.sublayers import LayerSublayers


class PostNormSublayers(LayerSublayers):
    """OLMo 2 / OLMo 3: norms after each block, full-width q/k RMSNorm before the head split."""

    attn_pre = None
    attn_post = "post_attention_layernorm"
    mlp_pre = None
    mlp_post = "post_feedforward_layernorm"
    qk_norm = "full"
