"""GPT-NeoX / Pythia: fused per-head q/k/v, partial rotary, plain MLP; parallel residual
``h' = h + A(ln_in(h)) + F(ln_post_attn(h))`` (one boundary per layer) or sequential."""

from __future__ import annotations

import torch

from resdyn.lm.sublayers import LayerSublayers, SequenceContext, TokenFunction


class GPTNeoXSublayers(LayerSublayers):
    """GPT-NeoX / Pythia: LayerNorms ``input_layernorm`` (attention) and
    ``post_attention_layernorm`` (MLP), fused ``query_key_value`` laid out per head as
    [q | k | v] (HF: ``view(..., H, 3·hd).chunk(3)``), partial rotary, ``dense`` output and a
    plain MLP. With ``use_parallel_residual`` (Pythia) both branches read h_L (module docstring);
    otherwise the layer is sequential like Llama."""

    attention_attr = "attention"

    def __init__(self, layer, index, fam, config) -> None:
        super().__init__(layer, index, fam, config)
        self.parallel = bool(layer.use_parallel_residual)

    def _head_dim(self) -> int:
        return self.attention.head_size

    def _qkv(self, n: torch.Tensor) -> torch.Tensor:
        """(..., H, 3, hd) per-head [q, k, v] of the fused projection."""
        return self.attention.query_key_value(n).unflatten(-1, (-1, 3, self.head_dim))

    def projection_weights(self):
        w = self.attention.query_key_value.weight
        w = w.unflatten(0, (-1, 3, self.head_dim))  # (H, 3, hd, d)
        return tuple(w[:, i].flatten(0, 1) for i in range(3))

    def project_q(self, n):
        return self._qkv(n)[..., 0, :].flatten(-2)

    def project_kv(self, n):
        qkv = self._qkv(n)
        return qkv[..., 1, :].flatten(-2), qkv[..., 2, :].flatten(-2)

    def out_proj(self, o):
        return self.attention.dense(o)

    def out_weight(self):
        return self.attention.dense.weight

    def plain_mlp(self):
        mlp = self.layer.mlp
        return mlp.dense_h_to_4h.weight, mlp.dense_h_to_4h.bias, mlp.dense_4h_to_h.weight, mlp.act

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        """F(ln_post_attn(x)): the MLP branch (without the residual)."""
        return self.layer.mlp(self.layer.post_attention_layernorm(x))

    def layer_forward(self, h, ctx, kv=None):
        if not self.parallel:
            return super().layer_forward(h, ctx, kv)
        h, ctx, kv = self.placed(h, ctx, kv)
        a = self.attn_update(h, ctx, kv)
        return h + a, self.mlp_branch(h) + a + h

    def layer_token_fn(self, h: torch.Tensor, t: int, ctx: SequenceContext) -> TokenFunction:
        """x (d,) -> h_{L+1}[t] = (F(ln_post_attn(x)) + A(ln_in(x))) + x (parallel layers), the
        other positions frozen."""
        attn = self.attn_update_token_fn(h, t, ctx)
        return lambda x: self.mlp_branch(x) + attn(x) + x
