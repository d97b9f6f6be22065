"""Size a run before submitting it: jobs per rule, FLOPs, GPU-hours, memory and disk from shapes.

Estimates are analytic counts from the model shapes in the config (``n_layers``, ``d_model``,
``d_ff``, heads); where a shape is missing a stated default is used. They size a SLURM
allocation; they are not measurements (``benchmarks/`` measures).

Per sample and layer, the Jacobian engine evaluates the per-token sublayer function on d tangent
directions (forward mode, vmapped), so

    FLOP_jac ≈ d · [ 2d(2d + 2d_kv) + 4·T·d + 6·d·d_ff ]

(attention projections of one token, its scores and values over T frozen keys, the gated MLP)
plus one forward pass of the context, 2·T·P_layer. The lens costs per step
3 · tokens · n_layers · (2d² + 2dV) (forward and backward of the translators and the readout).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from resdyn import config as rc

DEFAULT_VOCAB = 128_256
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class Shape:
    """The shape quantities the estimates use."""

    n_layers: int
    d: int
    d_kv: int
    d_ff: int
    vocab: int

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections and a gated MLP."""
        return self.d * (2 * self.d + 2 * self.d_kv) + 3 * self.d * self.d_ff

    @property
    def params(self) -> int:
        return self.n_layers * self.layer_params + 2 * self.vocab * self.d


def model_shape(m: dict, vocab_default: int = DEFAULT_VOCAB) -> Shape:
    """Shape of a config model entry; missing sizes default to d = 4096, d_ff = 3.5·d."""
    d = m.get("d_model") or 4096
    heads = m.get("n_heads") or max(1, d // 128)
    kv = m.get("n_kv_heads") or heads
    return Shape(m["n_layers"], d, d * kv // heads, m.get("d_ff") or int(3.5 * d), vocab_default)


def jacobian_flops(shape: Shape, length: int, n_positions: int = 1) -> float:
    """FLOPs of both sublayer Jacobians of one layer for one sample (see module docstring)."""
    d = shape.d
    per_token = 2 * d * (2 * d + 2 * shape.d_kv) + 4 * length * d + 6 * d * shape.d_ff
    return n_positions * d * per_token + 2 * length * shape.layer_params


def estimate(config: dict, gpu_tflops: float = 60.0, efficiency: float = 0.3) -> pd.DataFrame:
    """Per (model, rule): jobs, TFLOP, GPU-hours at ``efficiency`` of ``gpu_tflops``, memory, disk.

    ``gpu_tflops``: the device's dense fp32 rate (H100/H200 ≈ 60 without TF32).
    """
    rows = []
    n, length = config["samples"]["n"], config["samples"]["length"]
    pos = config["jacobian"]["positions"]
    n_pos = length if pos == "all" else (1 if pos == "last" else len(pos))
    rate = gpu_tflops * 1e12 * efficiency
    for name, m in config["models"].items():
        shape = model_shape(m, config["tokenizer"]["vocab_size"] if m["source"] == "train" else DEFAULT_VOCAB)
        ckpts = rc.checkpoints(config, name)
        blocks = rc.layer_blocks(config, name)
        w_bytes = shape.params * DTYPE_BYTES[m["dtype"]]
        jac = jacobian_flops(shape, length, n_pos) * n * shape.n_layers * len(ckpts)
        store = DTYPE_BYTES[config["jacobian"]["store_dtype"]]
        jac_disk = len(ckpts) * shape.n_layers * 2 * shape.d ** 2 * store * (1 + config["jacobian"]["store_first_n"])
        per_layer = 2 * shape.d ** 2 * 8 * len(rc.block_layers(blocks[0]))
        act = DTYPE_BYTES[config["activations"]["dtype"]]
        act_disk = len(ckpts) * n * length * shape.d * (2 * shape.n_layers + 1) * act
        lens_cfg = config["lens"]
        lens_ckpts = rc.lens_checkpoints(config, name)
        lens = 3 * lens_cfg["tokens_per_step"] * lens_cfg["steps"] * shape.n_layers * (
            2 * shape.d ** 2 + 2 * shape.d * shape.vocab) * len(lens_ckpts)
        rows += [
            dict(model=name, rule="jacobians", jobs=len(ckpts) * len(blocks), tflop=jac / 1e12,
                 gpu_hours=jac / rate / 3600, mem_gb=(w_bytes + per_layer) / 1e9, disk_gb=jac_disk / 1e9),
            dict(model=name, rule="activations", jobs=len(ckpts), tflop=2 * shape.params * n * length * len(ckpts) / 1e12,
                 gpu_hours=2 * shape.params * n * length * len(ckpts) / rate / 3600, mem_gb=w_bytes / 1e9,
                 disk_gb=act_disk / 1e9),
            dict(model=name, rule="lens", jobs=len(lens_ckpts), tflop=lens / 1e12, gpu_hours=lens / rate / 3600,
                 mem_gb=(w_bytes + shape.n_layers * shape.d ** 2 * 16) / 1e9,
                 disk_gb=len(lens_ckpts) * shape.n_layers * shape.d ** 2 * 4 / 1e9),
            dict(model=name, rule="spectra+schur", jobs=2 * len(ckpts), tflop=len(ckpts) * 2 * shape.n_layers * 60 * shape.d ** 3 / 1e12,
                 gpu_hours=0.0, mem_gb=(8 + len(config["schur"]["alphas"])) * shape.d ** 2 * 16 / 1e9, disk_gb=0.0),
        ]
    return pd.DataFrame(rows)
