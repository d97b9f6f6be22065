"""One cost model for every heavy rule: FLOPs, memory, disk -> SLURM resources and ``resdyn plan``.

Each rule's job is priced by one function (:data:`RULES`) from the model shape
(:class:`Shape`), the sample counts and the rule's config section. A price (:class:`Cost`) is

* ``work``: amounts per *op class* (:data:`OPS`): FLOPs of fp32 / low-precision / fp64 dense
  matmuls, nominal FLOPs of each LAPACK decomposition (Golub & Van Loan counts, below), bytes of
  memory-bound streaming, FLOPs of the forward-mode attention core, bytes decompressed/read,
  ``calls``: Python-level steps (one optimiser step and layer, one continuation layer, one
  boundary) whose interpreter overhead dominates small shapes; ``graph``: edges × resolutions
  of the signed Leiden runs (igraph/leidenalg, single-threaded; random-like graphs are its slow
  case, which is what the benchmark uses); ``kl64``: logit pairs compared by the float64
  KL/flip readout of :func:`resdyn.beyond.causal.kl_and_flips` (per logit: two float64 casts, two
  log-softmaxes, an exp, four element-wise passes and two argmaxes — about 3 transcendental
  evaluations and 170 bytes of memory traffic, far more than the 12 bytes of a plain fp32
  softmax; unmodelled it left the causal test 25-40 % under-predicted at small d);
* ``host_bytes`` / ``device_bytes``: the peak resident memory of the job on the host and on the
  GPU; ``disk_bytes``: what it writes;
* ``gpu``: whether the rule runs on a GPU on the cluster (``config["device"]`` = cuda/auto).

Time is ``Σ_op work[op] / rate[device][op] / parallel(threads, op) + fixed seconds`` with the
rates of a device kind (:data:`DEVICES`). The CPU rates were *measured* on this project's
CI-class machine (one thread) by ``benchmarks/plan.py`` and are stored in
:data:`CPU_CALIBRATION`; the GPU rates are documented assumptions for the H100/H200 class
(``benchmarks/gpu_check.sh`` measures them on a real GPU). :func:`resdyn.pipeline.dag.resources` turns a price into
Snakemake resources (``mem_mb``, ``runtime`` in minutes, ``threads``), growing with ``attempt``;
the rules call it through callables, and ``resdyn plan`` (:mod:`resdyn.pipeline.plan`) sums the same
prices over every job, so the cluster request and the plan cannot disagree.

Nominal decomposition counts for a d×d matrix (GVL, *Matrix Computations*, 4th ed., §7.5.6,
§8.6.3): eigenvalues only (Hessenberg + QR) 10 d³; real Schur factor T only 10 d³; T and Z
25 d³; SVD with U and V 22 d³ (R-SVD class); singular values only 8/3 d³. The effective rate of
each decomposition class is fitted (LAPACK runs them far below the matmul rate), so the counts
only fix the d³ scaling and the rates carry the constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from resdyn.cluster.gpu_kinds import (
    DEVICES,
    DTYPE_BYTES,
    GB,
    HOST_OPS,
    OPS,
    STARTUP_S,
    THREAD_EFFICIENCY,
    MiB,
    gpu_kind,
    host_linalg,
    measured_factor,
)
from resdyn.lm import families
from resdyn.lm.corpus import lens_train_blocks
from resdyn.numerics.linalg import k_from_fraction
from resdyn.numerics.sizes import EXACT_SPECTRAL_MAX_D, JACOBIAN_GPU_BATCH, attention_tangent_bytes, tangent_chunk

WEIGHT_READ_BPS = 1.0e9

#: Tokens per second :func:`resdyn.lm.corpus.token_stream` encodes on one thread (measured: the
#: embedded KJV, 1.0M tokens of a zoo BPE tokenizer, in 2.8 s on the loaded CI machine).
TOKENIZE_TPS = 3.5e5


#: Resident memory of a Python process with torch, numpy, scipy, h5py imported (the process baseline
#: ``benchmarks/plan.py`` prints; docs/cost.md).
BASE_HOST_BYTES = 0.6 * GB


def linalg_device(config: dict, kind: str | None = None) -> str:
    """The ``device`` the spectra and bootstrap jobs get.

    ``cpu`` on a GPU kind whose FP64 is weak (:func:`host_linalg`), else the config's ``device``.
    """
    return "cpu" if host_linalg(kind or config.get("gpu_kind") or gpu_kind()) else config.get("device", "auto")


@dataclass(frozen=True)
class Shape:
    """Shape quantities of a decoder-only model (Llama/Qwen/OLMo/Gemma layout)."""

    n_layers: int
    d: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int
    dtype_bytes: int = 2
    head_dim: int | None = None
    #: MLP weight matrices: 3 (gated: gate, up, down) or 2 (plain: GPT-2, GPT-NeoX)
    mlp_mats: int = 3
    #: parallel residual (GPT-NeoX/Pythia): one operator per layer, three Jacobian groups stored
    parallel: bool = False
    #: Jacobian work factor (family ``generic``: families.GENERIC_SLOWDOWN, else 1)
    jacobian_slowdown: float = 1.0
    #: weights outside the decoder layers and the two embeddings (Gemma 4's per-layer inputs)
    extra_params: int = 0

    @property
    def jacobian_groups(self) -> int:
        """Jacobians stored per layer: attn, mlp; or layer, attn_branch, mlp_branch (parallel)."""
        return 3 if self.parallel else 2

    @property
    def hd(self) -> int:
        return self.head_dim or self.d // self.n_heads

    @property
    def d_q(self) -> int:
        """Width of the query/attention output (H·hd)."""
        return self.n_heads * self.hd

    @property
    def d_kv(self) -> int:
        return self.n_kv_heads * self.hd

    @property
    def layer_params(self) -> int:
        """Weights of one layer.

        q, o (d·H·hd each), k, v (d·KV·hd each), MLP (3·d·d_ff gated, 2·d·d_ff plain).
        """
        return 2 * self.d * self.d_q + 2 * self.d * self.d_kv + self.mlp_mats * self.d * self.d_ff

    @property
    def params(self) -> int:
        """Decoder layers plus embedding and unembedding (counted twice even when tied) and
        :attr:`extra_params`."""
        return self.n_layers * self.layer_params + 2 * self.vocab * self.d + self.extra_params

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes


#: families whose MLP is W_2 act(W_1 x) (two matrices), from the family table
PLAIN_MLP_FAMILIES = tuple(name for name, fam in families.FAMILIES.items() if fam.mlp_matrices == 2)


class ShapeError(ValueError):
    """A shape the cost model needs is neither in the config nor in a cached config.json."""


def model_shape(config: dict, model: str) -> Shape:
    """Shape of ``config["models"][model]`` from its keys.

    The keys are ``n_layers``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``d_ff``, ``vocab_size``:
    for hub/local models config validation fills them from the model's ``config.json``
    (:mod:`resdyn.lm.hub`), for the zoo ``vocab_size`` is the tokenizer's vocabulary. Nothing is
    guessed: a missing key raises :class:`ShapeError` naming it. GPT-NeoX is parallel residual
    when ``parallel_residual`` (config.json's ``use_parallel_residual``) is true or absent —
    transformers' default, as :func:`resdyn.lm.structure.residual_kind` decides — and sequential
    (two sublayers) otherwise.
    """
    m = config["models"][model]
    vocab = config["tokenizer"]["vocab_size"] if m["source"] == "train" else m.get("vocab_size")
    heads = m.get("n_heads")
    values = {
        "n_layers": m.get("n_layers"),
        "d_model": m.get("d_model"),
        "n_heads": heads,
        "d_ff": m.get("d_ff"),
        "vocab_size": vocab,
    }
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise ShapeError(
            f"config key 'models.{model}': the cost model needs {', '.join(missing)}; validate the config "
            "(resdyn.pipeline.config.validate_config reads them from the model's config.json) or set them"
        )
    d_ff = m["d_ff"]
    if isinstance(d_ff, list):  # per-layer widths: the mean prices the sum
        d_ff = int(round(sum(d_ff) / len(d_ff)))
    head_dim = m.get("head_dim")
    family = m.get("family")
    return Shape(
        int(m["n_layers"]),
        int(m["d_model"]),
        int(heads),
        int(m.get("n_kv_heads") or heads),
        int(d_ff),
        int(vocab),
        DTYPE_BYTES[m.get("dtype", "float32")],
        int(head_dim) if head_dim else None,
        mlp_mats=families.mlp_matrices(family),
        parallel=families.is_parallel(family, {"use_parallel_residual": m.get("parallel_residual", True)}),
        jacobian_slowdown=families.GENERIC_SLOWDOWN if family == "generic" else 1.0,
        extra_params=_per_layer_input_params(m, int(m["n_layers"]), int(m["d_model"]), int(vocab)),
    )


def _per_layer_input_params(m: dict, n: int, d: int, vocab: int) -> int:
    """Gemma 4's per-layer input weights: the embedding table (V_ple × n·d_ple), its projection from
    the residual stream (d × n·d_ple) and each layer's gate and projection (2·d·d_ple); 0 without
    ``d_per_layer_input``."""
    ple = int(m.get("d_per_layer_input") or 0)
    return n * ple * (int(m.get("vocab_per_layer_input") or vocab) + 3 * d)


@dataclass
class Cost:
    """Price of one job (see the module docstring)."""

    work: dict[str, float] = field(default_factory=dict)
    host_bytes: float = BASE_HOST_BYTES
    device_bytes: float = 0.0
    disk_bytes: float = 0.0
    gpu: bool = False
    fixed_s: float = STARTUP_S
    host_ops: tuple[str, ...] = ()  # ops this GPU job runs on its host CPU besides HOST_OPS

    def add(self, op: str, amount: float) -> Cost:
        if op not in OPS:
            raise KeyError(f"unknown op class {op!r}; allowed {OPS}")
        self.work[op] = self.work.get(op, 0.0) + float(amount)
        return self

    @property
    def flops(self) -> float:
        """Total FLOPs (the byte-counted classes excluded)."""
        return sum(v for k, v in self.work.items() if k not in ("stream", "gunzip", "calls", "graph", "kl64"))


def decomposition_flops(kind: str, d: int) -> float:
    """Nominal FLOPs of one d×d decomposition (module docstring).

    eig 10 d³, schur 10 d³, schurv 25 d³, svd 22 d³, svdvals 8/3 d³.
    """
    return {"eig": 10.0, "schur": 10.0, "schurv": 25.0, "svd": 22.0, "svdvals": 8.0 / 3.0}[kind] * float(d) ** 3


def _mm(cost_dtype: str) -> str:
    return "gemm32" if cost_dtype == "float32" else ("gemm64" if cost_dtype == "float64" else "gemm16")


def _n_positions(config: dict) -> int:
    pos, T = config["jacobian"]["positions"], config["samples"]["length"]
    return T if pos == "all" else (1 if pos in (None, "last") or isinstance(pos, int) else len(pos))


def _forward_flops(s: Shape, tokens: float, layers: float, T: int) -> float:
    """FLOPs of a forward pass of ``layers`` decoder layers on ``tokens`` tokens of length-T sequences.

    2·tokens·P_layer for the weights plus 4·tokens·T·H·hd/2 for causal attention scores/values.
    """
    return tokens * layers * (2.0 * s.layer_params + 2.0 * T * s.d_q)


def cost_jacobians(config: dict, s: Shape, layers: list[int], gpu: bool) -> Cost:
    """One block of layers, N samples, P positions (structured engine, :mod:`resdyn.study_a.jacobian`).

    Per sample: one forward of the context through layers 0..max(block) in the model dtype;
    per layer and position, fp32 (TF32 off):
      attention  W_o·(∂o/∂x): 2·d·(H·hd)·d FLOPs (gemm32) + the forward-mode core batched over
                 the d input directions: d·(4·T·H·hd + 12·H·T) FLOPs (``jvp``); the projected
                 tangents W·J_pre cost O(size W), streamed;
      MLP        W_down·M: 2·d·d_ff·d (gemm32); M = diag(·)W_gate + diag(·)W_up streams 3·d·d_ff
                 fp32 values;
      summaries  σ_max by 64 power-iteration steps on a float64 d×d (two mat-vecs each: 128·8·d²
                 bytes streamed; exact singular values for d ≤ 512), ‖J−I‖_F and the float64 sum into the accumulator
                 (3·8·d²).
    Host: one shard of the weights (device_map loading; all of them on a CPU), float64 sums 2·8·d² and the first
    ``store_first_n`` per-sample Jacobians 2·n·P·4·d² per layer, with ``n_groups`` B > 0 the group
    means 2·B·4·d² and each group's start 2·8·d² per layer. Working memory (host on a CPU,
    device on a GPU): fp32 copies of the block's layers (only for non-fp32 weights,
    :meth:`resdyn.lm.sublayers.LayerSublayers.to_float32`), then the larger of the two stages — MLP:
    the d_ff × d matrices diag(·)W_gate and diag(·)W_up (2·4·d·d_ff) and the two d × d
    results; attention: the forward-mode tangents of one chunk of c input directions, about
    three H × T score-sized fp32 arrays each (12·H·T·c bytes; c = the engine's chunk,
    ≤ d) and J_attn — plus the float64 copy of each position's J for the summaries (8·d²·P), the
    batch's boundary states through the block's last layer (batch·(2·(max L + 1) + 1)·T·d in the
    model dtype and as fp32) and one sample's Jacobians of the block (L·kinds·P·4·d²: the engine
    yields a sample's Jacobians and the job moves them to the host and lets them go before the next
    sample's are computed; the memory trace, docs/cost.md, measures it).
    The benchmark measured 41-46 MiB of working memory at d = 1024 (T = 64-256) against 44 by
    this formula; the engine's own chunk budget (≈ 4·(8·H·(T+1) + 8·H·hd) per direction) is a
    bound, not the resident size. Disk per layer:
    2 kinds × (the mean d² in ``store_dtype`` + B group means d² in ``group_dtype`` + per-sample
    n·P·d²·4, gzip ≈ incompressible).
    """
    jc, N, T = config["jacobian"], config["samples"]["n"], config["samples"]["length"]
    P, n_first = _n_positions(config), jc["store_first_n"]
    d, L = s.d, len(layers)
    mm_model = "gemm16" if (gpu and s.dtype_bytes == 2) else "gemm32"
    c = Cost(gpu=gpu, fixed_s=STARTUP_S + s.weight_bytes / WEIGHT_READ_BPS)
    c.add(mm_model, N * _forward_flops(s, T, max(layers) + 1, T))
    per = 2.0 * d * s.d_q * d + 2.0 * d * s.d_ff * d
    c.add("gemm32", N * L * P * per * s.jacobian_slowdown)
    c.add("jvp", N * L * P * d * (4.0 * T * s.d_q + 12.0 * s.n_heads * T) * s.jacobian_slowdown)
    stream = 3 * 4.0 * d * s.d_ff + 4 * 4.0 * d * s.d_q + 2 * 3 * 8.0 * d * d
    if d <= EXACT_SPECTRAL_MAX_D:  # σ_max exact: singular values of each J (resdyn.study_a.jacobian)
        c.add("svdvals", N * L * P * 2 * decomposition_flops("svdvals", d))
    else:
        stream += 2 * 128 * 8.0 * d * d
    c.add("stream", N * L * P * stream)
    batch = JACOBIAN_GPU_BATCH if gpu else 1  # resdyn.study_a.jacobian.default_batch_size: one forward per batch
    c.add("calls", N * L * P * 4 + N / batch * (max(layers) + 1))
    B = jc.get("n_groups", 0)
    # float64 sums; the first n whole Jacobians; B group means (float32) and the current group's start
    acc = L * s.jacobian_groups * (8.0 * d * d + n_first * P * 4.0 * d * d + (B * 4.0 + 8.0) * d * d * (B > 0))
    # the tangent chunk the engine runs (resdyn.study_a.jacobian._attn_chunk)
    chunk = tangent_chunk(d, attention_tangent_bytes(s.n_heads, s.hd, T), gpu)
    copies = 4.0 * s.layer_params * L if s.dtype_bytes != 4 else 0.0
    stage = max(8.0 * d * s.d_ff + 8.0 * d * d, 12.0 * s.n_heads * T * chunk + 4.0 * d * d)
    # the batch's boundary states through the block (model dtype, then the fp32 copy) and one
    # sample's Jacobians of the block (JacobianEngine.iter_batch yields them sample by sample)
    boundaries = batch * (2 * (max(layers) + 1) + 1) * T * d * (4.0 + s.dtype_bytes)
    one_sample = L * s.jacobian_groups * P * 4.0 * d * d
    work = copies + stage + 8.0 * d * d * P + boundaries + one_sample
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu) + acc + (0.0 if gpu else work)
    c.device_bytes = s.weight_bytes + work if gpu else 0.0
    group_bytes = DTYPE_BYTES[jc.get("group_dtype") or jc["store_dtype"]]  # float16: the deviations from the mean
    means = (DTYPE_BYTES[jc["store_dtype"]] + B * group_bytes) * d * d
    c.disk_bytes = L * s.jacobian_groups * (means + n_first * P * 4.0 * d * d)
    return c


def jacobian_block_size(config: dict, s: Shape, usable_bytes: float) -> int:
    """The most layers per Jacobian job whose every block fits ``usable_bytes`` of one GPU.

    Blocks are contiguous runs of that many layers from layer 0 (the last one shorter); the
    heaviest are the last full block and the last block (their boundary states run through the
    deepest layers), so only those two are priced (:func:`cost_jacobians` on a GPU). n when the
    whole model fits in one job; 1 when not even one layer fits (the plan's fit check then names
    the job).
    """
    n = s.n_layers
    for per in range(n, 0, -1):
        last_full, last = (n // per - 1) * per, (n - 1) // per * per
        heaviest = (list(range(last_full, last_full + per)), list(range(last, n)))
        if all(cost_jacobians(config, s, block, True).device_bytes <= usable_bytes for block in heaviest):
            return per
    return 1


def cost_activations(config: dict, s: Shape, gpu: bool) -> Cost:
    """``activations``: the boundary states of every layer.

    N forwards of T tokens, streamed sample by sample into the layer files
    (:func:`resdyn.study_a.activations.stream_activation_files`: the host holds one sample's
    (2n+1)·(T−skip)·d float32 states, not all N); disk: N·(2n+1)·(T−skip)·d in
    ``activations.dtype``."""
    N, T = config["samples"]["n"], config["samples"]["length"]
    Tk = T - config["activations"]["skip_positions"]
    c = Cost(gpu=gpu, fixed_s=STARTUP_S + s.weight_bytes / WEIGHT_READ_BPS)
    c.add("gemm16" if (gpu and s.dtype_bytes == 2) else "gemm32", N * _forward_flops(s, T, s.n_layers, T))
    states = N * (2 * s.n_layers + 1) * Tk * s.d
    c.add("stream", states * (4.0 + 4.0 + DTYPE_BYTES[config["activations"]["dtype"]]))
    c.add("calls", N * (2 * s.n_layers + 1))
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu) + 2 * 4.0 * (2 * s.n_layers + 1) * Tk * s.d
    c.device_bytes = s.weight_bytes + 4.0 * (2 * s.n_layers + 1) * T * s.d * 4 if gpu else 0.0
    c.disk_bytes = states * DTYPE_BYTES[config["activations"]["dtype"]]
    return c


def cost_lens(config: dict, s: Shape, gpu: bool) -> Cost:
    """Tuned-lens training (:func:`resdyn.study_b.lens.train_lens`), ``steps`` steps of B tokens, n layers.

    Per step: the frozen forward 2·B·P_layers (model dtype; its MLP holds two B × d_ff
    activations at a time, 2·4·B·d_ff bytes on a CPU); the final logits 2·B·d·V; the
    translators forward and weight gradient 2·2·B·n·d² (fp32: the translators are fp32); the
    readout of every layer through the frozen head, forward and input gradient 2·2·B·n·d·V in
    ``lens.readout_dtype`` (bfloat16: tensor-core GEMMs with fp32 accumulation, 13× the fp32
    rate on an H100; float32 by default; the readout dominates: V ≫ d); the fused KL streams the logits ≈ 3 times in
    fp32 (12·B·n·V bytes) plus
    the bf16 logits and their gradient (4·B·n·V). Held-out evaluation every ``eval_every`` steps:
    forward only, on n_heldout·T tokens. Every step runs its frozen forward, on fresh tokens
    (``lens.train_tokens``) as on reused ones (their states are cached only below 1 GiB, never at
    hub scale), so fresh tokens cost the steps they add. Host: the token windows (int64), twice
    for fresh ones (shuffled copy). Device: the weights and :func:`lens_working_bytes`.
    """
    lc, T = config["lens"], config["samples"]["length"]
    B, steps, n, d, V = lc["tokens_per_step"], lc["steps"], s.n_layers, s.d, s.vocab
    head = "gemm16" if (gpu and s.dtype_bytes == 2) else "gemm32"
    c = Cost(gpu=gpu, fixed_s=STARTUP_S + s.weight_bytes / WEIGHT_READ_BPS)
    if lc.get("source", "train") == "tuned_lens":  # imported (resdyn.study_b.lens_import): load, check, write
        c.add("stream", 3 * 4.0 * n * d * (d + 1))
        c.host_bytes = BASE_HOST_BYTES + s.weight_bytes + 2 * 4.0 * n * d * (d + 1)
        c.device_bytes = s.weight_bytes + 4.0 * n * d * (d + 1) if gpu else 0.0
        c.disk_bytes = 4.0 * n * d * (d + 1) * 2
        return c
    readout = "gemm16" if (gpu and lc.get("readout_dtype", "float32") == "bfloat16") else "gemm32"
    c.add(head, steps * (_forward_flops(s, B, n, T) + 2.0 * B * d * V))
    c.add(readout, steps * 4.0 * B * n * d * V)
    c.add("gemm32", steps * 4.0 * B * n * d * d)
    evals = steps // lc["eval_every"] + 1
    held = lc["n_heldout_blocks"] * T
    c.add(head, evals * (_forward_flops(s, held, n, T) + 2.0 * held * d * V * (n + 1) + 2.0 * held * n * d * d))
    c.add("stream", steps * 16.0 * B * n * V + evals * 12.0 * held * n * V)
    c.add("calls", steps * (n + 4) + evals * (n + 1))
    n_train = lens_train_blocks(lc, T)
    windows = (2 if lc.get("train_tokens") else 1) * n_train + lc["n_heldout_blocks"]
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu) + 8.0 * windows * T
    dev = s.weight_bytes + lens_working_bytes(config, s, gpu)
    c.device_bytes = dev if gpu else 0.0
    if not gpu:
        c.host_bytes += dev - s.weight_bytes
    c.disk_bytes = 4.0 * n * d * (d + 1) * 2  # translators + the tuned-lens export
    return c


def lens_working_bytes(config: dict, s: Shape, gpu: bool) -> float:
    """Memory of lens training besides the weights (:func:`resdyn.study_b.lens.train_lens`).

    Held all along: the translators W, b with their gradients and optimizer state, (2 + m)·4·n·(d²
    + d) (m = 1 momentum buffer for SGD, 2 moments for Adam), and the held-out states
    n_heldout·T·(n+1)·d in the model's dtype. On top, the largest of three moments of a step of
    B' = ⌊B/T⌋·T tokens (batches of ⌊B/T⌋ sequences, as the lens script makes them):
    * the fetch of the next batch (the spent one freed first,
      :class:`resdyn.study_b.lens.stream.TokenStream`): :func:`resdyn.lm.structure.residual_states`
      stacks the captured states and :func:`resdyn.study_b.lens.stream.layer_major_states` copies
      them layer-major, two batch states 2·B'·(n+1)·d, beside the forward's MLP activations
      2·4·B'·d_ff;
    * the batch (states B'·(n+1)·d and teacher statistics 4·B'·(d+1)) with the teacher's fp32
      copy of the head 4·V·d and one chunk in flight: logits, softmax and gradient, 3·4 bytes per
      element (2^27 elements on a GPU, 2^22 on a CPU, :func:`resdyn.study_b.lens.default_chunk_elements`);
    * the held-out evaluation (:func:`resdyn.study_b.lens.kl.layer_kl`, the spent batch still
      referenced by the stream): per chunk of c tokens × l layers the target probabilities 4·c·V
      and c·l·V logits in the model's dtype with two float32 arrays (log-softmax and its product
      with p), c = min(n_heldout·T, ⌊budget/V⌋), l = min(n, ⌊budget/(c·V)⌋).
    """
    lc, T = config["lens"], config["samples"]["length"]
    n, d, V = s.n_layers, s.d, s.vocab
    tokens = max(1, lc["tokens_per_step"] // T) * T
    moments = 2 if lc.get("optimizer") == "adam" else 1
    translators = (2 + moments) * 4.0 * n * (d * d + d)
    held = lc["n_heldout_blocks"] * T * (n + 1) * d * s.dtype_bytes
    batch = tokens * (n + 1) * d * s.dtype_bytes + 4.0 * tokens * (d + 1)
    budget = 2**27 if gpu else 2**22
    chunk = 3 * 4.0 * min(tokens * n * V, budget)
    fetch = 2 * tokens * (n + 1) * d * s.dtype_bytes + 2 * 4.0 * tokens * s.d_ff
    eval_tokens = max(1, min(lc["n_heldout_blocks"] * T, budget // V))
    eval_layers = max(1, min(n, budget // (eval_tokens * V)))
    evaluation = batch + (s.dtype_bytes + 8.0) * eval_tokens * eval_layers * V + 4.0 * eval_tokens * V
    return translators + held + max(fetch, batch + 4.0 * V * d + chunk, evaluation)


def cost_lens_metrics(config: dict, s: Shape, gpu: bool) -> Cost:
    """``lens_metrics``: KL/CE/Hit@k of tuned and logit lens on N held-out samples.

    One forward of N·T tokens, then every layer read out twice (tuned, logit) through the head:
    2·2·N·T·(n+1)·d·V, plus the translators 2·N·T·n·d²; the softmax streams the logits (12 bytes
    per logit)."""
    N, T, n, d, V = config["samples"]["n"], config["samples"]["length"], s.n_layers, s.d, s.vocab
    head = "gemm16" if (gpu and s.dtype_bytes == 2) else "gemm32"
    c = Cost(gpu=gpu, fixed_s=STARTUP_S + s.weight_bytes / WEIGHT_READ_BPS)
    c.add(head, _forward_flops(s, N * T, n, T) + 4.0 * N * T * (n + 1) * d * V)
    c.add("gemm32", 2.0 * N * T * n * d * d)
    c.add("stream", 2 * 12.0 * N * T * (n + 1) * V)
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu)
    c.device_bytes = s.weight_bytes + 4.0 * n * d * d + 2 * 2**30 if gpu else 0.0
    return c


def cost_causal(config: dict, s: Shape, gpu: bool) -> Cost:
    """Causal test (:func:`resdyn.beyond.causal.causal_table`).

    Runs: the :class:`~resdyn.beyond.causal.Continuation` forward once through all n layers (it keeps
    the streams h_0..h_n); then for every stream L = 0..n−1 the reference continuation and, per
    intervention (project, patch), the observed and ``n_random`` random subspaces' modified
    continuations through layers L..n−1: Σ_L (n−L) = n(n+1)/2 layer passes per run,
    runs = 1 + 2·(n_random + 1); each layer pass 2·B·T·P_layer (+ attention) on B =
    ``causal.n_samples`` sequences of T tokens, in the model dtype.
    Comparisons: 2·(n_random + 1) per layer, each reading out its modified final state through
    the head (2·B·T·d·V FLOPs; the reference once per layer, :class:`resdyn.beyond.causal.Reference`)
    and comparing the B·T·V logit pairs in float64
    (:func:`resdyn.beyond.causal.kl_and_flips`, op class ``kl64``); plus the readout subspace of every
    translator (n SVDs with vectors) and the Haar draws, on the host.
    Host memory: the n float64 translators, the n+1 streams (4·B·T·d each) and the larger of
    one comparison chunk of c = min(B·T, ⌊2^18/V⌋)·V logits (2^24 on a GPU) held as two fp32
    logits and five float64 arrays (the two log-softmaxes, exp, difference, product: 48 bytes
    per logit) plus the layer's reference readout (16·B·T·V bytes, kept when ≤ 2^28), and
    one readout-subspace SVD in flight (6·8·d², as :func:`cost_readout`) — on a CPU; on a GPU
    the streams and the chunk live on the device."""
    cc, T, n = config["causal"], config["samples"]["length"], s.n_layers
    B = min(cc["n_samples"], config["samples"]["n"])
    runs = 1 + 2 * (cc["n_random"] + 1)
    comparisons = 2 * (cc["n_random"] + 1)
    head = "gemm16" if (gpu and s.dtype_bytes == 2) else "gemm32"
    c = Cost(gpu=gpu, fixed_s=STARTUP_S + s.weight_bytes / WEIGHT_READ_BPS, host_ops=("svd", "gemm64"))
    c.add(
        head,
        _forward_flops(s, B * T, runs * n * (n + 1) / 2 + n, T) + (comparisons + 1) * n * 2.0 * B * T * s.d * s.vocab,
    )
    c.add("kl64", comparisons * n * B * T * s.vocab)
    k = k_from_fraction(s.d, config["causal"]["k_fraction"])
    c.add("gemm64", n * (cc["n_random"] + 1) * 6.0 * s.d * k * k)  # Haar draws (QR) and projectors
    c.add("svd", n * decomposition_flops("svd", s.d))  # the readout subspace of every translator
    c.add("calls", runs * n * (n + 1) / 2 + n * (cc["n_random"] + 1))
    chunk = min(B * T, max(1, (2**24 if gpu else 2**18) // s.vocab)) * s.vocab  # causal.default_chunk_elements
    reference = 16.0 * B * T * s.vocab  # causal.Reference: log p and p kept when ≤ REFERENCE_CACHE_BYTES
    work = 4.0 * (n + 1) * B * T * s.d + 48.0 * chunk + (reference if reference <= 2**28 else 0.0)
    svd = 6 * 8.0 * s.d * s.d
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu) + 8.0 * n * s.d * s.d + (svd if gpu else max(work, svd))
    c.device_bytes = s.weight_bytes + work if gpu else 0.0
    return c


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


#: Host bytes of weights a GPU job holds while loading: transformers' ``device_map`` reads each
#: safetensors shard straight to the device (resdyn.lm.models.load_model), ≈ one shard (≤ 5 GB).
SHARD_BYTES = 5.0 * GB


def _host_weights(s: Shape, gpu: bool) -> float:
    """Weights resident on the host: all of them on a CPU, about one shard on a GPU."""
    return min(s.weight_bytes, SHARD_BYTES) if gpu else float(s.weight_bytes)


def _n_sublayers(s: Shape) -> int:
    """Operators of the sublayer chain: two per layer, one per parallel-residual layer."""
    return s.n_layers if s.parallel else 2 * s.n_layers


def cost_spectra(config: dict, s: Shape, gpu: bool) -> Cost:
    """``spectra`` (:func:`resdyn.study_a.spectral.spectra_table` + ``bottleneck_table``), per sublayer:
    one real Schur factor T (eigenvalues = its diagonal blocks, Henrici = its strictly upper
    part), one SVD with vectors (singular values, self-alignment), the singular values of J − I,
    and for the bottleneck one fp64 product (2 d³) and its singular values (the single-sublayer
    reference reuses the SVD). On a GPU the eigenvalues (torch eigvals) and the SVDs run there,
    Henrici from ‖J‖² − Σ|λ|² with a host Schur fallback below 1e-3. With n = ``n_groups`` group
    means (else the ``store_first_n`` per-sample Jacobians), n ≥ 2, the noise bound of the complex
    share (:func:`resdyn.study_a.rotation.imag_noise_bound`): the n matrices read and held in float64
    with their deviations (2·n·8·d²), per draw one signed sum (2·n·d²) and a Lanczos norm (~40
    mat-vecs, 2·d² each), on the host.
    Memory: ~10 d×d float64 beside those."""
    S, d = _n_sublayers(s), s.d
    c = Cost(gpu=gpu, host_ops=("gemm64", "stream"))  # the bottleneck product and the noise draws: numpy
    c.add("eig" if gpu else "schur", S * decomposition_flops("eig", d))
    c.add("svd", S * decomposition_flops("svd", d))
    c.add("svdvals", 2 * S * decomposition_flops("svdvals", d))
    c.add("gemm64", S * 2.0 * d**3)
    c.add("gunzip", S * 4.0 * d * d)  # the mean Jacobians (uncompressed: read rate)
    c.host_bytes = BASE_HOST_BYTES + 10 * 8.0 * d * d
    n = config["jacobian"].get("n_groups", 0) or config["jacobian"]["store_first_n"]  # the groups first
    if n >= 2:
        draws = config["spectra"]["noise_draws"]
        c.add("stream", S * draws * (2.0 * n + 80.0) * d * d)
        c.add("gunzip", S * 4.0 * n * d * d)
        c.host_bytes += 2 * n * 8.0 * d * d
    c.device_bytes = 10 * 8.0 * d * d if gpu else 0.0
    c.disk_bytes = S * 3 * 16.0 * d
    return c


def cost_schur(config: dict, s: Shape) -> Cost:
    """``schur`` (:func:`resdyn.study_a.schur.schur_bottleneck`).

    Per sublayer: one real Schur with its basis Z (25 d³ nominal); per α: J(α) = Z (D(α) + αU) Zᵀ
    (two fp64 GEMMs, 4 d³), the running product (2 d³) and its singular values. Host only (no torch
    Schur). Memory: J, T, Z, a temporary and one product per α."""
    S, d, A = _n_sublayers(s), s.d, len(config["schur"]["alphas"])
    c = Cost()
    c.add("schurv", S * decomposition_flops("schurv", d))
    c.add("gemm64", S * A * 6.0 * d**3)
    c.add("svdvals", S * A * decomposition_flops("svdvals", d))
    c.add("gunzip", S * 4.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + (6 + A) * 8.0 * d * d
    return c


def cost_bootstrap(config: dict, s: Shape, gpu: bool) -> Cost:
    """``bootstrap`` (:func:`resdyn.beyond.bootstrap.jacobian_bootstrap`), R = ``n_resamples`` + 2 rows
    (the all-N mean, the n-sample mean, R − 2 replicates) × S sublayers, d×d, n stored samples.

    ``method: exact``: each row and sublayer one eigen-analysis of the resampled mean: on the
    host one real Schur factor T (eigenvalues and Henrici together), on a GPU torch eigvals
    (Henrici by subtraction, guarded): R·S eigvals (10 d³ nominal each).

    ``method: perturbative`` (:func:`resdyn.beyond.bootstrap.perturbative_spectra`), per sublayer:
      * the two means exactly: 2 eigvals (20 d³);
      * one eigendecomposition with vectors of the n-sample mean: 25 d³ nominal (GVL: Hessenberg
        + QR with the accumulated basis and back-substitution), i.e. 2.5 eigvals-equivalents,
        priced at the eig rate;
      * V⁻¹ (complex LU inverse, ≈ 8 d³ real FLOPs) and E_i = V⁻¹ D_i V for the n samples:
        2 complex GEMMs each, 8 d³ real FLOPs per complex GEMM → 16·n·d³ (gemm64);
      * the Gram matrices of (J_0, J_i − J_0) and of their antisymmetric parts: 4·n²·d² (gemm64);
      * two passes over the replicates forming F_r = Σ_i (w_ri − 1/n) E_i (a complex GEMM
        (R × n)·(n × d²)) and the O(d²) second-order sums, gaps and couplings: ≈ 2·R·(n + 10)·8·d²
        real FLOPs, priced as gemm64 on the job's device (memory-bound there, but ≪ one eig);
      * clusters: their small eigenproblems cost at most CLUSTER_FRACTION = 1/32 of R eigvals
        (beyond that the sublayer falls back), priced at that bound: R/32 eigvals;
      * the a-posteriori check: VERIFY_REPLICATES = 2 eigvals.
      In all ≈ (2 + 2.5 + 2 + R/32) eigvals-equivalents per sublayer instead of R (R = 52:
      8.1 instead of 52, 6.4× fewer). The worst case — every sublayer fails the check and falls
      back — is the exact price plus these 6.5 + R/32 decompositions; that is what a second
      attempt (runtime × attempt) covers, and what the zoo's transformer Jacobians need today
      (docs/bootstrap.md), which is why the default is ``exact``.

    Both: per row and sublayer the resampled mean (2·n·d² FLOPs, streamed on the host; for
    ``perturbative`` on a GPU one device GEMM, gemm64) and the running
    product (2 d³ fp64) and its singular values (``cum_erank`` of P_s; the last is
    ``cum_erank_full_depth``).
    The per-sample Jacobians n·d² float32 are decompressed (gzip) once per pass over the files;
    a pass holds as many rows as fit in the memory budget (2·8·d² per row).

    With group means (``jacobian.n_groups`` B) the pass is the group jackknife (B means, B + 2 rows),
    and with ``bootstrap.first_n`` the first-n bootstrap follows as a second pass (the work adds up,
    the memory is the larger pass's)."""
    first_n = config["jacobian"]["store_first_n"]
    R_boot = config["bootstrap"]["n_resamples"] + 2
    B = config["jacobian"].get("n_groups", 0)
    if not B:
        return _bootstrap_pass(config, s, gpu, first_n, R_boot)
    c = _bootstrap_pass(config, s, gpu, B, B + 2)
    if config["bootstrap"].get("first_n", True) and first_n >= 2:
        second = _bootstrap_pass(config, s, gpu, first_n, R_boot)
        for op, amount in second.work.items():
            c.add(op, amount)
        c.host_bytes, c.device_bytes = max(c.host_bytes, second.host_bytes), max(c.device_bytes, second.device_bytes)
    return c


def _bootstrap_pass(config: dict, s: Shape, gpu: bool, n: int, R: int) -> Cost:
    """One pass of :func:`cost_bootstrap`: R rows resampling n stored matrices per sublayer."""
    S, d = _n_sublayers(s), s.d
    c = Cost(gpu=gpu, host_ops=("stream",))  # the resampled means are formed on the host
    eig_op = "eig" if gpu else "schur"
    perturbative = config["bootstrap"].get("method", "exact") == "perturbative"
    if perturbative:
        c.add(eig_op, S * (2 + 2) * decomposition_flops("eig", d))  # the two means + the check
        c.add("eig", S * (2.5 + R / 32.0) * decomposition_flops("eig", d))  # with vectors; clusters
        c.add("gemm64", S * ((8.0 + 16.0 * n) * d**3 + 4.0 * n * n * d * d + 2.0 * R * (n + 10) * 8.0 * d * d))
    else:
        c.add(eig_op, R * S * decomposition_flops("eig", d))
    c.add("gemm64", R * S * 2.0 * d**3)
    if perturbative and gpu:  # the resampled means as a GEMM on the device (weights · X)
        c.add("gemm64", R * S * n * 2.0 * d * d)
    else:
        c.add("stream", R * S * n * 8.0 * d * d)
    depths = S if config["bootstrap"].get("per_depth_erank", True) else 1  # erank of P_s per row: every s or the last
    c.add("svdvals", R * depths * decomposition_flops("svdvals", d))
    budget = bootstrap_memory_budget(d, R)
    passes = math.ceil(R / max(1, budget // (2 * 8 * d * d)))
    c.add("gunzip", passes * S * n * 4.0 * d * d)
    # perturbative (resdyn.beyond.bootstrap.perturbative_spectra): E (n complex d²) throughout; while E
    # is built, the samples and their deviations (3 n real d², freed before the replicates);
    # then a chunk of F_r with its two temporaries (chunk_bytes ≤ 2 GiB holds all three); and
    # the d² arrays V, V⁻¹, K, λ_p − λ_q (complex, 16 B), gaps, couplings (8 B), the cluster
    # mask (1 B): 81 bytes per entry. The two phases do not overlap: max.
    chunk_f = min(2.0 * 2**30, R * 3 * 16.0 * d * d)
    extra = (n * 16.0 * d * d + max(3 * n * 8.0 * d * d, chunk_f) + 81.0 * d * d) if perturbative else 0.0
    c.host_bytes = BASE_HOST_BYTES + n * 12.0 * d * d + budget + 6 * 8.0 * d * d + (0.0 if gpu else extra)
    c.device_bytes = n * 8.0 * d * d + budget + 6 * 8.0 * d * d + extra if gpu else 0.0
    return c


def bootstrap_memory_budget(d: int, rows: int) -> int:
    """Bytes of replicate matrices held at once: all rows if ≤ 16 GiB, else 16 GiB."""
    return int(min(rows * 2 * 8 * d * d, 16 * 2**30))


def cost_communities(config: dict, s: Shape) -> Cost:
    """``communities``: correlation graphs of every boundary's states and their Leiden communities.

    Per boundary (2n), the N·(T−skip) × d states as float32, a float64 copy chunk by chunk and the
    correlation by ``dsyrk`` (M·d² FLOPs, fp64), top-k sparsification of the d×d matrix (streamed ~3
    times) and signed Leiden on ≈ 2·d·k edges per resolution (``graph``). Memory: the larger of the
    read (fp16 states and their float32 upcast, 6·M·d,
    :meth:`resdyn.artifacts.Activations.read_boundary`) and the analysis (the float32 states, two
    float64 token chunks of ``resdyn.study_a.topology.graph._CHUNK_BYTES`` = 32 MiB: the chunk and
    its shifted copy), plus R and its sparsified copy (2·8·d²)."""
    N, Tk = config["samples"]["n"], config["samples"]["length"] - config["activations"]["skip_positions"]
    M, d, S = N * Tk, s.d, _n_sublayers(s)
    c = Cost()
    c.add("gemm64", S * M * d * d)
    c.add("stream", S * (M * d * (2 + 4 + 8) + 3 * 8.0 * d * d))
    c.add("calls", S)
    c.add("graph", S * 2.0 * d * config["topology"]["top_k"] * len(_as_list(config["topology"]["resolution"])))
    c.host_bytes = BASE_HOST_BYTES + max(6.0 * M * d, 4.0 * M * d + 2 * 32.0 * MiB) + 2 * 8.0 * d * d
    c.disk_bytes = S * d * 40.0
    return c


def cost_coupling(config: dict, s: Shape) -> Cost:
    """``coupling``: column norms of every sublayer's mean Jacobian and rank tests per boundary.

    Reading is 4 d² bytes and 4 d² FLOPs per Jacobian; streaming only.
    """
    S, d = _n_sublayers(s), s.d
    c = Cost()
    c.add("gunzip", S * 4.0 * d * d)
    c.add("stream", S * 3 * 8.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + 3 * 8.0 * d * d
    return c


def cost_bridge(config: dict, s: Shape) -> Cost:
    """``bridge``: the layer Jacobian against the readout subspaces, per layer.

    Per layer the layer Jacobian J_mlp·J_attn (2 d³ fp64), the readout subspace of two translators
    (SVD with vectors, each once: n SVDs), and for the observed and ``n_random`` Haar subspaces J·V
    (2 d²k) and Vᵀ(JV) (2 d k²) plus a QR per draw (4 d k²)."""
    n, d, R = s.n_layers, s.d, config["bridge"]["n_random"]
    k = k_from_fraction(d, config["bridge"]["k_fraction"])
    c = Cost()
    c.add("gemm64", n * (2.0 * d**3 + (R + 1) * (2.0 * d * d * k + 6.0 * d * k * k)))
    c.add("svd", n * decomposition_flops("svd", d))
    c.add("gunzip", 2 * n * 4.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + (6 + n) * 8.0 * d * d
    return c


def cost_readout(config: dict, s: Shape) -> Cost:
    """``rss`` and ``resolution`` (:mod:`resdyn.study_b.readout`).

    One SVD with vectors per translator (n), then per k and consecutive pair the k×k overlap V_Lᵀ
    V_{L+1} (2 d k²) and its singular values (8/3 k³ ≪). Memory: the n float64 translators and their
    V (2n·8·d²) at once, plus one SVD in flight (gesdd: the copy it overwrites, U, Vᵀ and a ≈ 4 d²
    workspace, 6·8·d²)."""
    n, d = s.n_layers, s.d
    ks = [k_from_fraction(d, f) for f in config["readout"]["k_fractions"]]
    c = Cost()
    c.add("svd", n * decomposition_flops("svd", d))
    c.add("gemm64", n * sum(2.0 * d * k * k + 4.0 * k**3 for k in ks))
    c.add("gunzip", n * 4.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + (2 * n + 6) * 8.0 * d * d
    return c


def cost_phase_metrics(config: dict, s: Shape) -> Cost:
    """``phase_metrics``: effective rank and token cosines of every boundary's states.

    The states are streamed from the layer files one state and one chunk of samples at a time
    (:class:`resdyn.artifacts.BoundaryView`), per layer a centred token × d effective rank (Gram
    2·M·d² + singular values 8/3 d³) and token cosines."""
    N, Tk = config["samples"]["n"], config["samples"]["length"] - config["activations"]["skip_positions"]
    M, d, n = N * Tk, s.d, s.n_layers
    c = Cost()
    c.add("gemm64", (n + 1) * 2.0 * M * d * d)
    c.add("svdvals", (n + 1) * decomposition_flops("svdvals", d))
    c.add("stream", N * (2 * n + 1) * Tk * d * (2 + 4 + 8.0))
    # read lazily (resdyn.artifacts.BoundaryView): a chunk of ~2^22 entries, the d×d Gram, and
    # the pooled M×d float64 tokens when the exact SVD path is taken (≤ 2^24 entries)
    c.host_bytes = BASE_HOST_BYTES + 4 * 8.0 * 2**22 + 2 * 8.0 * d * d + 8.0 * min(M * d, 2**24)
    return c


def cost_zoo_train(config: dict, model: str, s: Shape) -> Cost:
    """Zoo training: steps × batch × T tokens × 6 × parameters (forward + backward), fp32."""
    t = config["models"][model]["train"]
    tokens = t["steps"] * t.get("batch_size", 16) * t.get("seq_len", config["samples"]["length"])
    c = Cost()
    c.add("gemm32", 3.0 * _forward_flops(s, tokens, s.n_layers, t.get("seq_len", 128)) + 6.0 * tokens * s.d * s.vocab)
    c.host_bytes = BASE_HOST_BYTES + 16.0 * s.params + 0.5 * GB
    c.disk_bytes = len(t["checkpoints"]) * 4.0 * s.params
    return c


def cost_light(config: dict, rule: str = "") -> Cost:
    """Rules that only read, tokenize, sample or resolve: a minute and a gigabyte.

    They are corpus, tokenizer, samples, lens_tokens, resolve_checkpoint and resolve_tokenizer;
    that budget covers them at every scale the presets reach, but for the windows ``lens_tokens``
    draws (``config`` as the model sees it): W·T tokens at least to encode, at :data:`TOKENIZE_TPS`,
    held as int32 pieces, their concatenation and the int64 windows (16 bytes a token).
    """
    c = Cost(fixed_s=60.0)
    c.host_bytes = BASE_HOST_BYTES + 1.0 * GB
    if rule == "lens_tokens":
        lc, T = config["lens"], config["samples"]["length"]
        tokens = (lens_train_blocks(lc, T) + lc["n_heldout_blocks"]) * T
        c.fixed_s += tokens / TOKENIZE_TPS
        c.host_bytes += 16.0 * tokens
    return c


#: Rules priced by the model, with whether they run on a GPU when ``device`` is cuda.
GPU_RULES = ("jacobians", "activations", "lens", "lens_metrics", "causal")


#: Rules whose decompositions move to the GPU when ``device`` is cuda (torch.linalg on cuda).
GPU_LINALG_RULES = ("spectra", "bootstrap")

#: GPU rules whose device memory is traced on meta tensors against the plan (resdyn.beyond.memtrace)
TRACED_MEMORY_RULES = GPU_RULES


LIGHT_RULES = ("corpus", "tokenizer", "samples", "lens_tokens", "resolve_checkpoint", "resolve_tokenizer")


RULES = (
    *GPU_RULES,
    "spectra",
    "schur",
    "bootstrap",
    "communities",
    "coupling",
    "bridge",
    "rss",
    "resolution",
    "phase_metrics",
    "zoo_train",
    *LIGHT_RULES,
)


#: The workflow's other rules: tables and figures from tables, run as localrules on the submit
#: host in seconds; nothing is requested or priced for them.
LOCAL_UNPRICED_RULES = (
    "phases",
    "scaling",
    "checkpoints",
    "checkpoint_integrity",
    "scorecard",
    "paper_comparison",
    "sensitivity",
    "figure_ckpt",
    "figure_lens",
    "figure_model",
    "figure_zoo",
    "figure_global",
    "figure_trajectory",
    "figure_lens_trajectory",
    "all",
)


#: Priced rules that run on the submit host all the same: they fetch from the hub when it is
#: reachable, and on clusters only the submit (login) host has internet.
LOCAL_PRICED_RULES = ("corpus", "resolve_checkpoint", "resolve_tokenizer")


#: The workflow's localrules (workflow/rules/common.smk passes them to Snakemake): never submitted.
LOCALRULES = (*LOCAL_PRICED_RULES, *LOCAL_UNPRICED_RULES)


def uses_gpu(config: dict, rule: str, kind: str | None = None) -> bool:
    """Whether a rule's job runs on a GPU.

    GPU rules and GPU-linalg rules do when ``device`` asks for CUDA (``auto`` counts as CUDA for
    planning: the cluster profile gives these rules a GPU), the GPU-linalg rules only on a GPU kind
    with FP64 to use (:func:`host_linalg`; default kind :func:`gpu_kind`)."""
    if config.get("device", "auto") not in ("cuda", "auto"):
        return False
    return rule in GPU_RULES or (rule in GPU_LINALG_RULES and not host_linalg(kind or gpu_kind()))


def seconds(cost: Cost, device: str, threads: int = 1) -> float:
    """Predicted wall seconds of a job on a device kind with ``threads`` CPU threads.

    CPU: Σ work/rate / (1 + (t−1)·eff_op). GPU: Σ work/rate_gpu, except :data:`HOST_OPS`, which
    run on the host CPU with ``threads`` threads."""
    dev = DEVICES[device]
    total = cost.fixed_s * measured_factor(device, None, "startup")
    for op, amount in cost.work.items():
        if dev.kind == "gpu" and op not in HOST_OPS and op not in cost.host_ops:
            total += amount / dev.rates[op]
        else:
            total += amount / DEVICES["cpu"].rates[op] / (1.0 + (threads - 1) * THREAD_EFFICIENCY[op])
    return total
