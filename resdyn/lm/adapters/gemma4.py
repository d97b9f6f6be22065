"""Gemma 4 (dense): sandwich norms, per-layer inputs and the layer scalar in the MLP half
``y = m + n_post_ff(F(n_pre_ff(m)))``, ``y += n_ple(P(act(G(y)) ⊙ e_L))``, ``h' = layer_scalar · y``."""

from __future__ import annotations

from resdyn.lm.sublayers import LayerSublayers


class Gemma4Sublayers(LayerSublayers):
    """Gemma 4 text: sandwich norms, per-head q/k norms and v-norm, KV sharing, and the
    per-layer-input block and ``layer_scalar`` at the end of the MLP half."""

    attn_pre = "input_layernorm"
    attn_post = "post_attention_layernorm"
    mlp_pre = "pre_feedforward_layernorm"
    mlp_post = "post_feedforward_layernorm"
    qk_norm = "head"

    def __init__(self, layer, index, fam, config) -> None:
        super().__init__(layer, index, fam, config)
        modes = config.kv_sharing_modes
        if modes[index] == "reuse":
            sources = [j for j in range(index) if modes[j] == "store" and config.layer_types[j] == self.layer_type]
            if not sources:
                raise ValueError(
                    f"gemma4 layer {index} ({self.layer_type}) reuses keys/values but no earlier layer of that "
                    f"type stores them (num_kv_shared_layers={config.num_kv_shared_layers})"
                )
            self.kv_source = sources[-1]

    @property
    def has_per_layer_input(self) -> bool:
        return bool(self.layer.hidden_size_per_layer_input)

    def mlp_fn(self, m, per_layer_input=None):
        """``y = m + n_post(F(n_pre(m)))``; ``y += n_ple(P(act(G(y)) ⊙ e))``; ``h' = s · y``."""
        layer = self.layer
        y = self.mlp_core(m)
        if self.has_per_layer_input:
            gate = layer.act_fn(layer.per_layer_input_gate(y)) * per_layer_input
            y = y + layer.post_per_layer_input_norm(layer.per_layer_projection(gate))
        return y * layer.layer_scalar
