"""Phi-3 (and Phi-4-mini): the Llama pre-norm layer with fused projections.

``qkv_proj`` stacks [W_q; W_k; W_v] along its output (H·hd, Hkv·hd, Hkv·hd rows), ``gate_up_proj``
stacks [W_gate; W_up] (d_ff rows each) and the MLP is ``down(up ⊙ act(gate))``. RoPE may rotate
only the first ``partial_rotary_factor`` of each head; a config ``sliding_window`` applies to
every layer (as Mistral).
"""

from __future__ import annotations

from torch import nn

from resdyn.lm.sublayers import LayerSublayers


class Phi3Sublayers(LayerSublayers):
    """Phi-3 decoder layer (see the module docstring)."""

    def _window(self) -> int | None:
        return getattr(self.config, "sliding_window", None)

    def _qkv_sizes(self) -> list[int]:
        q = self.config.num_attention_heads * self.head_dim
        kv = self.config.num_key_value_heads * self.head_dim
        return [q, kv, kv]

    def projection_weights(self):
        return tuple(self.attention.qkv_proj.weight.split(self._qkv_sizes(), dim=0))

    def project_q(self, n):
        return self.attention.qkv_proj(n).split(self._qkv_sizes(), dim=-1)[0]

    def project_kv(self, n):
        _, k, v = self.attention.qkv_proj(n).split(self._qkv_sizes(), dim=-1)
        return k, v

    def gated_mlp(self) -> tuple[nn.Module, None, nn.Module, nn.Module, int]:
        mlp = self.layer.mlp
        return mlp.gate_up_proj, None, mlp.down_proj, mlp.activation_fn, self.config.intermediate_size
