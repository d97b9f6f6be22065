"""GPT-2: LayerNorm with bias, learned positions, fused Conv1D q/k/v (weights stored transposed)
and a plain MLP ``F(x) = W_2 act(W_1 x + b_1) + b_2``."""

from __future__ import annotations

import torch

from resdyn.lm.sublayers import LayerSublayers


class GPT2Sublayers(LayerSublayers):
    """GPT-2: LayerNorms ``ln_1``/``ln_2`` before each half, fused Conv1D ``c_attn`` (q | k | v
    along the output), Conv1D output projection and MLP (Conv1D stores W transposed:
    ``y = x W + b``), no rotary (learned positions are added in :func:`prepare`)."""

    attn_pre = "ln_1"
    mlp_pre = "ln_2"
    attention_attr = "attn"

    def _split(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return raw.split(self.attention.split_size, dim=-1)

    def projection_weights(self):
        wq, wk, wv = self.attention.c_attn.weight.split(self.attention.split_size, dim=1)
        return wq.t(), wk.t(), wv.t()

    def project_q(self, n):
        return self._split(self.attention.c_attn(n))[0]

    def project_kv(self, n):
        _, k, v = self._split(self.attention.c_attn(n))
        return k, v

    def out_proj(self, o):
        return self.attention.c_proj(o)

    def out_weight(self):
        return self.attention.c_proj.weight.t()

    def plain_mlp(self):
        mlp = self.layer.mlp
        return mlp.c_fc.weight.t(), mlp.c_fc.bias, mlp.c_proj.weight.t(), mlp.act
