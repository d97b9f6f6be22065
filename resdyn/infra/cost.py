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
(``benchmarks/gpu_check.sh`` measures them on a real GPU). :func:`resources` turns a price into
Snakemake resources (``mem_mb``, ``runtime`` in minutes, ``threads``), growing with ``attempt``;
the rules call it through callables, and ``resdyn plan`` (:mod:`resdyn.infra.plan`) sums the same
prices over every job, so the cluster request and the plan cannot disagree.

Nominal decomposition counts for a d×d matrix (GVL, *Matrix Computations*, 4th ed., §7.5.6,
§8.6.3): eigenvalues only (Hessenberg + QR) 10 d³; real Schur factor T only 10 d³; T and Z
25 d³; SVD with U and V 22 d³ (R-SVD class); singular values only 8/3 d³. The effective rate of
each decomposition class is fitted (LAPACK runs them far below the matmul rate), so the counts
only fix the d³ scaling and the rates carry the constant.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from resdyn.infra import families
from resdyn.infra.linalg import k_from_fraction

#: Op classes a price is made of (see the module docstring).
OPS: tuple[str, ...] = (
    "gemm32", "gemm16", "gemm64", "jvp", "eig", "schur", "schurv", "svd", "svdvals", "stream", "gunzip", "calls",
    "graph", "kl64",
)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
GB = 1e9
MiB = 2**20
EXACT_SPECTRAL_MAX_D = 512  # = resdyn.study_a.jacobian.EXACT_SPECTRAL_MAX_D (not imported: no torch here)
JACOBIAN_GPU_BATCH = 16  # = resdyn.study_a.jacobian.default_batch_size on CUDA


@dataclass(frozen=True)
class Device:
    """Throughputs of one device kind: FLOP/s (or byte/s for ``stream``/``gunzip``) per op class,
    per thread for a CPU, per device for a GPU."""

    name: str
    kind: str  # "cpu" | "gpu"
    rates: Mapping[str, float]
    note: str = ""


# Calibrated 2026-11-30 13:46 UTC by `benchmarks/plan.py` on the project's 2-core CI-class
# machine (Debian, Python 3.11, torch 2.13.0+cpu, numpy/scipy wheels' OpenBLAS, one thread,
# load average 7-10 from other sessions: CPU time was fitted, not wall time): per-thread
# rates. Confirming run 13:47-13:50 UTC (load 8.4-9.4), with these stored rates: every rule
# core at d = 384/640/1024 within 0.71-1.21 of measured CPU time (worst 0.71: rss at d = 384,
# where LAPACK's small-size inefficiency still shows) and peak memory within 0.72-1.28
# (bootstrap's inputs are built outside the measured process, see docs/cost.md).
CPU_CALIBRATION: dict[str, float] = {
    "gemm32": 7.55e10,
    "gemm16": 7.55e10,  # not fitted: a CPU runs "bf16" models' matmuls no faster than fp32
    "gemm64": 4.30e10,
    "jvp": 3.78e10,  # tied to gemm32 (× 0.5, benchmarks/plan.py JVP_PER_GEMM32), not fitted
    "eig": 1.19e10,
    "schur": 1.30e10,
    "schurv": 2.37e10,
    "svd": 4.37e10,
    "svdvals": 1.30e10,
    "stream": 2.01e10,
    "gunzip": 1.5e8,  # not fitted (the cores get arrays): zlib inflate, ~150 MB/s one core
    "calls": 253.0,
    "graph": 6.44e4,
    "kl64": 2.56e7,  # logit pairs/s of resdyn.beyond.causal.kl_and_flips (float64)
}

#: The GPU kinds: hardware numbers from vendor datasheets (package data, sources in the file).
GPU_TABLE = Path(__file__).resolve().parents[1] / "data" / "gpus.yaml"


@dataclass(frozen=True)
class GPUKind:
    """One row of :data:`GPU_TABLE` (columns documented there)."""

    kind: str
    name: str
    memory_mib: int
    bf16_tflops: float
    fp32_tflops: float
    fp64_tflops: float
    fp64_tensor_tflops: float
    hbm_tb_s: float
    max_per_node: int
    source: str

    @property
    def usable_bytes(self) -> float:
        """Device memory a job may plan for: total · :data:`GPU_USABLE_FRACTION` (the CUDA context,
        cuBLAS/cuSOLVER workspaces and the caching allocator's fragmentation take the rest)."""
        return self.memory_mib * MiB * GPU_USABLE_FRACTION


#: Share of a GPU's memory the cost model fills (the rest: CUDA context ≈ 0.5 GB, library
#: workspaces, allocator fragmentation).
GPU_USABLE_FRACTION = 0.9

#: How well resdyn's code uses a GPU, per op class: (datasheet column, fraction of its peak). Documented
#: assumptions (the same for every kind; ``benchmarks/gpu_check.sh`` measures them on a lent GPU),
#: chosen so that the H100 SXM gets the rates this model used before GPU kinds were data: fp32 GEMM
#: without TF32 (the Jacobians disable it) ~67 % of peak; bf16 tensor-core GEMM with fp32
#: accumulation ~60 % of the dense peak; fp64 GEMM ~67 % of the fp64 tensor-core peak (the vector
#: peak where a GPU has none); the forward-mode attention core (batched small matmuls + softmax)
#: ~30 % of fp32; decompositions by torch.linalg on cuda (cuSOLVER: Xgeev for eigvals since torch
#: 2.10, gesvd/gesvdj for svd) scale with the fp64 vector peak: on an H100 ~3 s for a 4096² float64
#: eig (10 d³ / 3 s = 2.3e11 = 0.68 % of 34 TFLOP/s) and ~4 s for an SVD with vectors; memory-bound
#: streaming at ~75 % of the HBM bandwidth. The real Schur form has no torch routine: schur/schurv
#: stay on the host CPU (:data:`HOST_OPS`).
GPU_EFFICIENCY: dict[str, tuple[str, float]] = {
    "gemm32": ("fp32_tflops", 0.67),
    "gemm16": ("bf16_tflops", 0.6),
    "gemm64": ("fp64_gemm_tflops", 0.67),
    "jvp": ("fp32_tflops", 0.3),
    "eig": ("fp64_tflops", 0.0068),
    "svd": ("fp64_tflops", 0.0112),
    "svdvals": ("fp64_tflops", 0.0035),
    "stream": ("hbm_tb_s", 0.75),
}
#: bytes of memory traffic per logit pair of the float64 KL readout (``kl64``, module docstring):
#: memory-bound on a GPU, so its rate there is the HBM streaming rate / this
KL64_BYTES = 170.0


def gpu_rates(g: GPUKind) -> dict[str, float]:
    """Op-class rates (FLOP/s, byte/s) of a GPU kind: datasheet peak × :data:`GPU_EFFICIENCY`; the
    host-side classes (zlib, Python steps, Leiden) at the calibrated CPU rates."""
    peaks = {"fp32_tflops": g.fp32_tflops, "bf16_tflops": g.bf16_tflops, "fp64_tflops": g.fp64_tflops,
             "fp64_gemm_tflops": max(g.fp64_tensor_tflops, g.fp64_tflops), "hbm_tb_s": g.hbm_tb_s}
    rates = {op: peaks[col] * 1e12 * eff for op, (col, eff) in GPU_EFFICIENCY.items()}
    rates["kl64"] = rates["stream"] / KL64_BYTES
    rates.update({op: CPU_CALIBRATION[op] for op in ("gunzip", "calls", "graph", "schur", "schurv")})
    return rates


def load_gpu_kinds(path: Path = GPU_TABLE) -> dict[str, GPUKind]:
    """The GPU table (:data:`GPU_TABLE`) as {kind: :class:`GPUKind`}; a row missing a column or
    with one the table does not define is an error naming the file, kind and column."""
    import yaml

    table = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    names = [f for f in GPUKind.__dataclass_fields__ if f != "kind"]
    out = {}
    for kind, row in table.items():
        if not isinstance(row, dict) or set(row) != set(names):
            have = set(row) if isinstance(row, dict) else set()
            raise ValueError(f"{path}: GPU kind {kind!r}: columns {sorted(have)}; expected exactly {names} "
                             f"(missing {sorted(set(names) - have)}, unknown {sorted(have - set(names))})")
        out[kind] = GPUKind(kind, **row)
    return out


GPU_KINDS: dict[str, GPUKind] = load_gpu_kinds()
DEVICES: dict[str, Device] = {
    "cpu": Device("cpu", "cpu", CPU_CALIBRATION, "measured here, per thread (benchmarks/plan.py)"),
    **{k: Device(k, "gpu", gpu_rates(g), f"{g.name}; datasheet peaks × assumed efficiency") for k, g in GPU_KINDS.items()},
}
#: Ops a GPU job still runs on its host CPU (no torch routine on cuda).
HOST_OPS = ("schur", "schurv", "gunzip", "calls", "graph")

#: Parallel efficiency of t CPU threads per op class (assumed; the 2 shared cores here cannot
#: measure it): level-3 BLAS scales well, LAPACK's QR sweeps and zlib hardly.
THREAD_EFFICIENCY = {"gemm32": 0.85, "gemm16": 0.85, "gemm64": 0.85, "jvp": 0.7, "svd": 0.6, "svdvals": 0.5,
                     "eig": 0.35, "schur": 0.35, "schurv": 0.45, "stream": 0.5, "gunzip": 0.0, "calls": 0.0,
                     "graph": 0.0, "kl64": 0.5}
#: Threads of a CPU-heavy rule on the cluster (when its single-thread time exceeds
#: :data:`THREADS_ABOVE_S`), and CPU cores that come with one GPU (profile: cpus_per_gpu).
CPU_THREADS = 8
THREADS_ABOVE_S = 600.0
GPU_HOST_THREADS = 8
#: Fixed seconds per job: interpreter + imports (measured ≈ 4-6 s here), and reading weights.
STARTUP_S = 15.0
WEIGHT_READ_BPS = 1.0e9
#: Resident memory of a Python process with torch, numpy, scipy, h5py imported (measured ≈ 0.5 GB).
BASE_HOST_BYTES = 0.6 * GB
#: Requests: memory = peak · MEM_SAFETY + MEM_PAD, runtime = predicted · TIME_SAFETY + TIME_PAD,
#: both times the attempt number (a retry after an OOM kill or a timeout asks for more).
MEM_SAFETY, MEM_PAD_MB = 1.3, 512
TIME_SAFETY, TIME_PAD_MIN = 2.0, 5


def gpu_kind() -> str:
    """GPU kind the cluster requests are priced for: ``RESDYN_GPU_KIND`` (default h100)."""
    return check_gpu_kind(os.environ.get("RESDYN_GPU_KIND") or "h100", "RESDYN_GPU_KIND")


def check_gpu_kind(kind: str, key: str) -> str:
    """``kind`` if it is a row of the GPU table, else one ValueError line naming ``key`` and the kinds."""
    if kind not in GPU_KINDS:
        raise ValueError(f"{key}={kind!r}: not a GPU kind of {GPU_TABLE.name}; allowed: {', '.join(GPU_KINDS)}")
    return kind


def host_linalg(kind: str) -> bool:
    """Whether a GPU kind's FP64 is too weak for the decompositions: its eigvals rate is below
    the host's with the :data:`GPU_HOST_THREADS` cores a GPU job gets (the L40S: FP64 = FP32/64).
    Then spectra and bootstrap run as CPU jobs (:func:`uses_gpu`, :func:`linalg_device`)."""
    host = CPU_CALIBRATION["eig"] * (1.0 + (GPU_HOST_THREADS - 1) * THREAD_EFFICIENCY["eig"])
    return DEVICES[kind].rates["eig"] < host


def linalg_device(config: dict, kind: str | None = None) -> str:
    """The ``device`` the spectra and bootstrap jobs get: ``cpu`` on a GPU kind whose FP64 is weak
    (:func:`host_linalg`), else the config's ``device``."""
    return "cpu" if host_linalg(kind or config.get("gpu_kind") or gpu_kind()) else config.get("device", "auto")


# ----------------------------------------------------------------------------------------------
# shapes


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
        """Weights of one layer: q, o (d·H·hd each), k, v (d·KV·hd each), MLP (3·d·d_ff gated,
        2·d·d_ff plain)."""
        return 2 * self.d * self.d_q + 2 * self.d * self.d_kv + self.mlp_mats * self.d * self.d_ff

    @property
    def params(self) -> int:
        """Decoder layers plus embedding and unembedding (counted twice even when tied)."""
        return self.n_layers * self.layer_params + 2 * self.vocab * self.d

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes


#: families whose MLP is W_2 act(W_1 x) (two matrices), from the family table
PLAIN_MLP_FAMILIES = tuple(name for name, fam in families.FAMILIES.items() if fam.mlp_matrices == 2)


class ShapeError(ValueError):
    """A shape the cost model needs is neither in the config nor in a cached config.json."""


def model_shape(config: dict, model: str) -> Shape:
    """Shape of ``config["models"][model]`` from its keys: ``n_layers``, ``d_model``, ``n_heads``,
    ``n_kv_heads``, ``d_ff``, ``vocab_size`` — for hub/local models filled from the model's
    ``config.json`` by config validation (:mod:`resdyn.infra.hub`), for the zoo the tokenizer's
    vocabulary. Nothing is guessed: a missing key raises :class:`ShapeError` naming it.
    GPT-NeoX is parallel residual when ``parallel_residual`` (config.json's
    ``use_parallel_residual``) is true or absent — transformers' default, as
    :func:`resdyn.infra.arch.residual_kind` decides — and sequential (two sublayers) otherwise.
    """
    m = config["models"][model]
    vocab = config["tokenizer"]["vocab_size"] if m["source"] == "train" else m.get("vocab_size")
    heads = m.get("n_heads")
    values = {"n_layers": m.get("n_layers"), "d_model": m.get("d_model"), "n_heads": heads, "d_ff": m.get("d_ff"),
              "vocab_size": vocab}
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise ShapeError(
            f"config key 'models.{model}': the cost model needs {', '.join(missing)}; validate the config "
            "(resdyn.infra.config.validate_config reads them from the model's config.json) or set them"
        )
    d_ff = m["d_ff"]
    if isinstance(d_ff, list):  # per-layer widths: the mean prices the sum
        d_ff = int(round(sum(d_ff) / len(d_ff)))
    head_dim = m.get("head_dim")
    family = m.get("family")
    return Shape(int(m["n_layers"]), int(m["d_model"]), int(heads), int(m.get("n_kv_heads") or heads), int(d_ff),
                 int(vocab), DTYPE_BYTES[m.get("dtype", "float32")], int(head_dim) if head_dim else None,
                 mlp_mats=families.mlp_matrices(family),
                 parallel=families.is_parallel(family, {"use_parallel_residual": m.get("parallel_residual", True)}),
                 jacobian_slowdown=families.GENERIC_SLOWDOWN if family == "generic" else 1.0)


# ----------------------------------------------------------------------------------------------
# prices


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
    """Nominal FLOPs of one d×d decomposition (module docstring): eig 10 d³, schur 10 d³,
    schurv 25 d³, svd 22 d³, svdvals 8/3 d³."""
    return {"eig": 10.0, "schur": 10.0, "schurv": 25.0, "svd": 22.0, "svdvals": 8.0 / 3.0}[kind] * float(d) ** 3


def _mm(cost_dtype: str) -> str:
    return "gemm32" if cost_dtype == "float32" else ("gemm64" if cost_dtype == "float64" else "gemm16")


def _n_positions(config: dict) -> int:
    pos, T = config["jacobian"]["positions"], config["samples"]["length"]
    return T if pos == "all" else (1 if pos in (None, "last") or isinstance(pos, int) else len(pos))


def _forward_flops(s: Shape, tokens: float, layers: float, T: int) -> float:
    """Forward pass of ``layers`` decoder layers on ``tokens`` tokens of length-T sequences:
    2·tokens·P_layer for the weights plus 4·tokens·T·H·hd/2 for causal attention scores/values."""
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
                 bytes streamed; exact singular values for d ≤ 512), ‖J−I‖_F and the float64 sum into the accumulator (3·8·d²).
    Host: one shard of the weights (device_map loading; all of them on a CPU), float64 sums 2·8·d² and the first
    ``store_first_n`` per-sample Jacobians 2·n·P·4·d² per layer. Working memory (host on a CPU,
    device on a GPU): fp32 copies of the block's layers (only for non-fp32 weights,
    :meth:`resdyn.infra.arch.LayerSublayers.to_float32`), then the larger of the two stages — MLP:
    the d_ff × d matrices diag(·)W_gate and diag(·)W_up (2·4·d·d_ff) and the two d × d
    results; attention: the forward-mode tangents of one chunk of c input directions, about
    three H × T score-sized fp32 arrays each (12·H·T·c bytes; c = the engine's chunk,
    ≤ d) and J_attn — plus the float64 copy of each position's J for the summaries (8·d²·P).
    The benchmark measured 41-46 MiB of working memory at d = 1024 (T = 64-256) against 44 by
    this formula; the engine's own chunk budget (≈ 4·(8·H·(T+1) + 8·H·hd) per direction) is a
    bound, not the resident size. Disk per layer:
    2 kinds × (mean d² in ``store_dtype`` + per-sample n·P·d²·4, gzip ≈ incompressible).
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
    acc = L * s.jacobian_groups * (8.0 * d * d + n_first * P * 4.0 * d * d)
    # tangent chunk of resdyn.study_a.jacobian._attn_chunk: ≤ 1 GiB by its per-direction bound
    chunk = max(1, min(d, int(2**30 // (4 * (8 * s.n_heads * (T + 1) + 8 * s.d_q)))))
    copies = 4.0 * s.layer_params * L if s.dtype_bytes != 4 else 0.0
    stage = max(8.0 * d * s.d_ff + 8.0 * d * d, 12.0 * s.n_heads * T * chunk + 4.0 * d * d)
    work = copies + stage + 8.0 * d * d * P
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu) + acc + (0.0 if gpu else work)
    c.device_bytes = s.weight_bytes + work if gpu else 0.0
    c.disk_bytes = L * s.jacobian_groups * (DTYPE_BYTES[jc["store_dtype"]] * d * d + n_first * P * 4.0 * d * d)
    return c


def cost_activations(config: dict, s: Shape, gpu: bool) -> Cost:
    """Boundary states of every layer: N forwards of T tokens, streamed sample by sample into the
    layer files (:func:`resdyn.study_a.activations.stream_activation_files`: the host holds one sample's
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
    rate on an H100; float32 by default; the readout dominates: V ≫ d); the fused KL streams the logits ≈ 3 times in fp32 (12·B·n·V bytes) plus
    the bf16 logits and their gradient (4·B·n·V). Held-out evaluation every ``eval_every`` steps:
    forward only, on n_heldout·T tokens. Device: weights + translators, gradients, momentum
    (3·4·n·d²) + one chunk of logits (logits, softmax, gradient) + the cached states.
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
    c.host_bytes = BASE_HOST_BYTES + _host_weights(s, gpu) + 8.0 * (lc["n_train_blocks"] + lc["n_heldout_blocks"]) * T
    # logits chunk (resdyn.study_b.lens.default_chunk_elements: 2^27 on a GPU, 2^22 on a CPU) held as
    # logits, softmax and gradient in fp32
    chunk = min(B * n * V, 2**27 if gpu else 2**22)
    dev = s.weight_bytes + 3 * 4.0 * n * d * d + 3 * 4.0 * chunk + 4.0 * B * (n + 1) * d + 2 * 4.0 * B * s.d_ff
    c.device_bytes = dev if gpu else 0.0
    if not gpu:
        c.host_bytes += dev - s.weight_bytes
    c.disk_bytes = 4.0 * n * d * (d + 1) * 2  # translators + the tuned-lens export
    return c


def cost_lens_metrics(config: dict, s: Shape, gpu: bool) -> Cost:
    """KL/CE/Hit@k of tuned and logit lens on N held-out samples: one forward of N·T tokens,
    then every layer read out twice (tuned, logit) through the head: 2·2·N·T·(n+1)·d·V, plus
    the translators 2·N·T·n·d²; the softmax streams the logits (12 bytes per logit)."""
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
    c.add(head, _forward_flops(s, B * T, runs * n * (n + 1) / 2 + n, T)
          + (comparisons + 1) * n * 2.0 * B * T * s.d * s.vocab)
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
#: safetensors shard straight to the device (resdyn.infra.models.load_model), ≈ one shard (≤ 5 GB).
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
    Henrici from ‖J‖² − Σ|λ|² with a host Schur fallback below 1e-3. Memory: ~10 d×d float64."""
    S, d = _n_sublayers(s), s.d
    c = Cost(gpu=gpu, host_ops=("gemm64",))  # the bottleneck product runs in numpy on the host
    c.add("eig" if gpu else "schur", S * decomposition_flops("eig", d))
    c.add("svd", S * decomposition_flops("svd", d))
    c.add("svdvals", 2 * S * decomposition_flops("svdvals", d))
    c.add("gemm64", S * 2.0 * d**3)
    c.add("gunzip", S * 4.0 * d * d)  # the mean Jacobians (uncompressed: read rate)
    c.host_bytes = BASE_HOST_BYTES + 10 * 8.0 * d * d
    c.device_bytes = 10 * 8.0 * d * d if gpu else 0.0
    c.disk_bytes = S * 3 * 16.0 * d
    return c


def cost_schur(config: dict, s: Shape) -> Cost:
    """``schur`` (:func:`resdyn.study_a.schur.schur_bottleneck`), per sublayer: one real Schur with its
    basis Z (25 d³ nominal); per α: J(α) = Z (D(α) + αU) Zᵀ (two fp64 GEMMs, 4 d³), the running
    product (2 d³) and its singular values. Host only (no torch Schur). Memory: J, T, Z, a
    temporary and one product per α."""
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
    product (2 d³ fp64), per row one svdvals at the end (``cum_erank_full_depth`` stays exact).
    The per-sample Jacobians n·d² float32 are decompressed (gzip) once per pass over the files;
    a pass holds as many rows as fit in the memory budget (2·8·d² per row)."""
    n = config["jacobian"]["store_first_n"]
    R = config["bootstrap"]["n_resamples"] + 2
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
    c.add("svdvals", R * decomposition_flops("svdvals", d))
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
    """``communities``: per boundary (2n), the N·(T−skip) × d states as float32, a float64
    copy chunk by chunk and the correlation by ``dsyrk`` (M·d² FLOPs, fp64), top-k
    sparsification of the d×d matrix (streamed ~3 times) and signed Leiden on ≈ 2·d·k edges
    per resolution (``graph``). Memory: the larger of the read (fp16 states and their float32
    upcast, 6·M·d, :meth:`resdyn.artifacts.Activations.read_boundary`) and the analysis (the float32 states,
    two float64 token chunks of ``resdyn.study_a.topology._CHUNK_BYTES`` = 32 MiB: the chunk and its
    shifted copy), plus R and its sparsified copy (2·8·d²)."""
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
    """``coupling``: column norms of every sublayer's mean Jacobian (read, 4 d² bytes each,
    4 d² FLOPs) and rank tests per boundary: streaming only."""
    S, d = _n_sublayers(s), s.d
    c = Cost()
    c.add("gunzip", S * 4.0 * d * d)
    c.add("stream", S * 3 * 8.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + 3 * 8.0 * d * d
    return c


def cost_bridge(config: dict, s: Shape) -> Cost:
    """``bridge``: per layer the layer Jacobian J_mlp·J_attn (2 d³ fp64), the readout subspace of
    two translators (SVD with vectors, each once: n SVDs), and for the observed and ``n_random``
    Haar subspaces J·V (2 d²k) and Vᵀ(JV) (2 d k²) plus a QR per draw (4 d k²)."""
    n, d, R = s.n_layers, s.d, config["bridge"]["n_random"]
    k = k_from_fraction(d, config["bridge"]["k_fraction"])
    c = Cost()
    c.add("gemm64", n * (2.0 * d**3 + (R + 1) * (2.0 * d * d * k + 6.0 * d * k * k)))
    c.add("svd", n * decomposition_flops("svd", d))
    c.add("gunzip", 2 * n * 4.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + (6 + n) * 8.0 * d * d
    return c


def cost_readout(config: dict, s: Shape) -> Cost:
    """``rss`` and ``resolution`` (:mod:`resdyn.study_b.readout`): one SVD with vectors per translator
    (n), then per k and consecutive pair the k×k overlap V_Lᵀ V_{L+1} (2 d k²) and its singular
    values (8/3 k³ ≪). Memory: the n float64 translators and their V (2n·8·d²) at once, plus
    one SVD in flight (gesdd: the copy it overwrites, U, Vᵀ and a ≈ 4 d² workspace, 6·8·d²)."""
    n, d = s.n_layers, s.d
    ks = [k_from_fraction(d, f) for f in config["readout"]["k_fractions"]]
    c = Cost()
    c.add("svd", n * decomposition_flops("svd", d))
    c.add("gemm64", n * sum(2.0 * d * k * k + 4.0 * k**3 for k in ks))
    c.add("gunzip", n * 4.0 * d * d)
    c.host_bytes = BASE_HOST_BYTES + (2 * n + 6) * 8.0 * d * d
    return c


def cost_phase_metrics(config: dict, s: Shape) -> Cost:
    """``phase_metrics``: every boundary's states are streamed from the layer files one state and
    one chunk of samples at a time (:class:`resdyn.artifacts.BoundaryView`), per layer a
    centred token × d effective rank (Gram 2·M·d² + singular values 8/3 d³) and token cosines."""
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
    c.add("gemm32", 3.0 * _forward_flops(s, tokens, s.n_layers, t.get("seq_len", 128))
          + 6.0 * tokens * s.d * s.vocab)
    c.host_bytes = BASE_HOST_BYTES + 16.0 * s.params + 0.5 * GB
    c.disk_bytes = len(t["checkpoints"]) * 4.0 * s.params
    return c


def cost_light(config: dict) -> Cost:
    """Rules that only read, tokenize, sample or resolve (corpus, tokenizer, samples,
    lens_tokens, resolve_checkpoint, resolve_tokenizer): a minute and a gigabyte cover them at every scale here."""
    c = Cost(fixed_s=60.0)
    c.host_bytes = BASE_HOST_BYTES + 1.0 * GB
    return c


# ----------------------------------------------------------------------------------------------
# rules, jobs and resources

#: Rules priced by the model, with whether they run on a GPU when ``device`` is cuda.
GPU_RULES = ("jacobians", "activations", "lens", "lens_metrics", "causal")
#: Rules whose decompositions move to the GPU when ``device`` is cuda (torch.linalg on cuda).
GPU_LINALG_RULES = ("spectra", "bootstrap")
LIGHT_RULES = ("corpus", "tokenizer", "samples", "lens_tokens", "resolve_checkpoint", "resolve_tokenizer")
RULES = (*GPU_RULES, "spectra", "schur", "bootstrap", "communities", "coupling", "bridge", "rss",
         "resolution", "phase_metrics", "zoo_train", *LIGHT_RULES)
#: The workflow's other rules: tables and figures from tables, run as localrules on the submit
#: host (workflow/rules/common.smk) in seconds; nothing is requested or priced for them.
LOCAL_UNPRICED_RULES = ("phases", "scaling", "checkpoints", "scorecard", "paper_comparison", "figure_ckpt",
                        "figure_lens", "figure_model", "figure_zoo", "figure_global", "figure_trajectory",
                        "figure_lens_trajectory", "all")


def uses_gpu(config: dict, rule: str, kind: str | None = None) -> bool:
    """Whether a rule's job runs on a GPU: GPU rules and GPU-linalg rules when ``device`` asks
    for CUDA (``auto`` counts as CUDA for planning: the cluster profile gives these rules a GPU),
    the GPU-linalg rules only on a GPU kind with FP64 to use (:func:`host_linalg`; default kind
    :func:`gpu_kind`)."""
    if config.get("device", "auto") not in ("cuda", "auto"):
        return False
    return rule in GPU_RULES or (rule in GPU_LINALG_RULES and not host_linalg(kind or gpu_kind()))


def model_config_kind(config: dict, wildcards: Mapping[str, str], kind: str | None) -> tuple[dict, str | None]:
    """The config as the job's model sees it (its overrides, :func:`resdyn.infra.config.model_config`)
    and the GPU kind its GPU jobs run on: the model's ``gpu_kind`` before ``kind``."""
    if "model" not in wildcards:
        return config, kind
    from resdyn.infra import config as rc

    mc = rc.model_config(config, wildcards["model"])
    return mc, mc.get("gpu_kind") or kind


def job_cost(config: dict, rule: str, wildcards: Mapping[str, str] | None = None, kind: str | None = None) -> Cost:
    """Price of one job of ``rule`` with ``wildcards`` (``model``, ``ckpt``, ``block``) on GPU kind
    ``kind`` (default :func:`gpu_kind`; it decides only whether spectra/bootstrap are GPU jobs)."""
    w = dict(wildcards or {})
    if rule in LIGHT_RULES:
        return cost_light(config)
    if rule not in RULES:
        raise KeyError(f"rule {rule!r} has no cost function; priced rules: {RULES}")
    config, kind = model_config_kind(config, w, kind)
    s = model_shape(config, w["model"])
    gpu = uses_gpu(config, rule, kind)
    if rule == "jacobians":
        from resdyn.infra import config as rc

        layers = rc.block_layers(w["block"]) if "block" in w else list(range(s.n_layers))
        return cost_jacobians(config, s, layers, gpu)
    simple: dict[str, Callable[[], Cost]] = {
        "activations": lambda: cost_activations(config, s, gpu),
        "lens": lambda: cost_lens(config, s, gpu),
        "lens_metrics": lambda: cost_lens_metrics(config, s, gpu),
        "causal": lambda: cost_causal(config, s, gpu),
        "spectra": lambda: cost_spectra(config, s, gpu),
        "schur": lambda: cost_schur(config, s),
        "bootstrap": lambda: cost_bootstrap(config, s, gpu),
        "communities": lambda: cost_communities(config, s),
        "coupling": lambda: cost_coupling(config, s),
        "bridge": lambda: cost_bridge(config, s),
        "rss": lambda: cost_readout(config, s),
        "resolution": lambda: cost_readout(config, s),
        "phase_metrics": lambda: cost_phase_metrics(config, s),
        "zoo_train": lambda: cost_zoo_train(config, w["model"], s),
    }
    return simple[rule]()


def seconds(cost: Cost, device: str, threads: int = 1) -> float:
    """Predicted wall seconds of a job on a device kind with ``threads`` CPU threads.

    CPU: Σ work/rate / (1 + (t−1)·eff_op). GPU: Σ work/rate_gpu, except :data:`HOST_OPS`, which
    run on the host CPU with ``threads`` threads."""
    dev = DEVICES[device]
    total = cost.fixed_s
    for op, amount in cost.work.items():
        if dev.kind == "gpu" and op not in HOST_OPS and op not in cost.host_ops:
            total += amount / dev.rates[op]
        else:
            total += amount / CPU_CALIBRATION[op] / (1.0 + (threads - 1) * THREAD_EFFICIENCY[op])
    return total


def threads_for(config: dict, rule: str, wildcards: Mapping[str, str] | None = None, kind: str | None = None) -> int:
    """Threads of a job: 1 when the whole job would take at most :data:`THREADS_ABOVE_S` on one
    CPU thread, else :data:`GPU_HOST_THREADS` (GPU jobs) or :data:`CPU_THREADS`.

    A job that short gains nothing from more threads wherever it runs, and a GPU-capable job
    (``device: auto``) that lands on a CPU would otherwise hold every core of a small machine
    (the zoo's spectra and bootstrap jobs ran one at a time on 2 cores)."""
    cost = job_cost(config, rule, wildcards, kind)
    if seconds(cost, "cpu", 1) <= THREADS_ABOVE_S:
        return 1
    return GPU_HOST_THREADS if cost.gpu else CPU_THREADS


def resources(config: dict, rule: str, wildcards: Mapping[str, str] | None = None, attempt: int = 1,
              device: str | None = None) -> dict[str, int]:
    """Snakemake resources of one job: ``mem_mb`` (host), ``runtime`` (minutes), ``threads``,
    ``disk_mb``, ``gpu`` (GPUs of one node: 0, 1, or more for a model that does not fit one,
    :func:`job_placement`), all from :func:`job_cost`; memory and runtime × ``attempt``.

    ``device``: the GPU kind to price GPU jobs for (default :func:`gpu_kind`); CPU jobs always use
    the calibrated CPU rates.
    """
    kind = model_config_kind(config, wildcards or {}, device)[1] or gpu_kind()
    cost = job_cost(config, rule, wildcards, kind)
    threads = threads_for(config, rule, wildcards, kind)
    secs = seconds(cost, kind if cost.gpu else "cpu", threads)
    a = max(1, int(attempt))
    return {
        "mem_mb": int(math.ceil((cost.host_bytes * MEM_SAFETY / MiB + MEM_PAD_MB) * a)),
        "runtime": int(math.ceil((secs * TIME_SAFETY / 60.0 + TIME_PAD_MIN) * a)),
        "threads": threads,
        "disk_mb": int(math.ceil(cost.disk_bytes / MiB)) + 1,
        "gpu": job_placement(config, rule, wildcards or {}, kind).devices if cost.gpu else 0,
    }


# ----------------------------------------------------------------------------------------------
# jobs that do not fit one GPU: layers placed across the GPUs of one node


class FitError(ValueError):
    """A job that fits no GPU of a kind even on all the GPUs of one node."""


def working_bytes(cost: Cost, s: Shape) -> float:
    """Device bytes of a GPU job besides the weights (gathered states, logit chunks, translators and
    their optimiser state, Jacobian work). On several GPUs they sit on the head's device: resdyn
    gathers the states there and runs the readout there (:func:`resdyn.infra.arch.gather_device`);
    the activations passing through the other devices fit their 1 − :data:`GPU_USABLE_FRACTION`."""
    return max(0.0, cost.device_bytes - s.weight_bytes)


def block_bytes(s: Shape) -> list[float]:
    """Weight bytes of the blocks a model is placed by, in forward order: the embedding, each
    decoder layer, the final norm and unembedding (the head)."""
    embed = float(s.vocab * s.d * s.dtype_bytes)
    return [embed, *([float(s.layer_params * s.dtype_bytes)] * s.n_layers), embed]


def split_blocks(sizes: list[float], capacities: list[float]) -> list[int] | None:
    """Device of each block: contiguous runs over the devices (in order, device i holding at most
    ``capacities[i]`` bytes) that minimise the largest device's load — a balanced pipeline split
    that leaves each device as much headroom as it can; None when no split fits. Bisection on the
    largest load with the greedy check (a run is closed when the next block would exceed it)."""

    def greedy(bound: float) -> list[int] | None:
        out, dev, load = [], 0, 0.0
        for size in sizes:
            while load + size > min(bound, capacities[dev]):
                dev, load = dev + 1, 0.0
                if dev >= len(capacities):
                    return None
            out.append(dev)
            load += size
        return out

    if greedy(max(capacities)) is None:
        return None
    lo, hi = sum(sizes) / len(capacities), max(capacities)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if greedy(mid) is None:
            lo = mid
        else:
            hi = mid
    return greedy(hi)


@dataclass(frozen=True)
class Placement:
    """Where a model's blocks go on ``devices`` GPUs: ``embed``, ``layers`` (one device index per
    decoder layer), ``head``; ``loads``: weight + working bytes per device."""

    devices: int
    embed: int
    layers: tuple[int, ...]
    head: int
    loads: tuple[float, ...]

    def device_map(self) -> dict[str, int]:
        """The blocks' devices, accelerate style: ``embed``, ``layers.{i}``, ``head`` -> device index
        (:func:`resdyn.infra.models.device_map` turns it into the model's module names)."""
        return {"embed": self.embed, **{f"layers.{i}": d for i, d in enumerate(self.layers)}, "head": self.head}

    def describe(self) -> str:
        """``cuda:0 embed + layers 0-31 (60.1 GB), cuda:1 layers 32-63 + head (58.3 GB)``."""
        parts = []
        for dev in range(self.devices):
            idx = [i for i, d in enumerate(self.layers) if d == dev]
            what = (["embed"] if self.embed == dev else []) + ([f"layers {idx[0]}-{idx[-1]}"] if idx else []) \
                + (["head"] if self.head == dev else [])
            parts.append(f"cuda:{dev} {' + '.join(what)} ({self.loads[dev] / GB:.1f} GB)")
        return ", ".join(parts)


def placement(s: Shape, devices: int, capacity: float, working: float = 0.0) -> Placement | None:
    """The layer placement of a model on ``devices`` GPUs of ``capacity`` usable bytes each, with
    ``working`` bytes (:func:`working_bytes`) on the last one, which holds the head; None when it
    does not fit."""
    sizes = block_bytes(s)
    capacities = [capacity] * (devices - 1) + [capacity - working - sizes[-1]]
    where = split_blocks(sizes[:-1], capacities) if capacities[-1] >= 0 else None
    if where is None:
        return None
    where.append(devices - 1)
    loads = [0.0] * (devices - 1) + [working]
    for size, dev in zip(sizes, where):
        loads[dev] += size
    return Placement(devices, where[0], tuple(where[1:-1]), where[-1], tuple(loads))


#: GPU rules whose model may be placed by layer across the GPUs of one node (their forward passes
#: move the activations along: resdyn.infra.arch); the Jacobians run on one GPU (a block of layers
#: per job, jacobian.layers_per_job), spectra and bootstrap hold no model.
SPANNING_RULES = ("activations", "lens", "lens_metrics", "causal")


def placement_param(config: dict, rule: str, wildcards: Mapping[str, str]) -> dict[str, int] | None:
    """The rule param ``placement``: the block -> GPU map of a job that spans several GPUs of
    :func:`gpu_kind`, None when it runs on one GPU or on the CPU (``device: cpu``)."""
    if config.get("device", "auto") == "cpu":
        return None
    found = job_placement(config, rule, dict(wildcards.items()))
    return found.device_map() if found is not None and found.devices > 1 else None


def check_fits(config: dict, kind: str | None = None) -> None:
    """Before any job: every GPU job of the config fits the GPUs of one node of ``kind`` (default
    :func:`gpu_kind`), or :class:`FitError` names the first that does not (``device: cpu``: no check)."""
    if config.get("device", "auto") == "cpu":
        return
    for rule, w in unique_jobs(config):
        if rule in (*GPU_RULES, *GPU_LINALG_RULES):
            job_placement(config, rule, w, kind)


def job_placement(config: dict, rule: str, wildcards: Mapping[str, str], kind: str | None = None) -> Placement | None:
    """Placement of a GPU job's model on GPU kind ``kind``: on the fewest GPUs of one node that hold
    it (1 for most jobs); None for a CPU job. Raises :class:`FitError` (one line: the job, its
    device memory, the kind and what to do) when even ``max_per_node`` GPUs do not hold it."""
    kind = model_config_kind(config, wildcards, kind)[1] or gpu_kind()
    cost = job_cost(config, rule, wildcards, kind)
    if not cost.gpu:
        return None
    s, g = model_shape(config, wildcards["model"]), GPU_KINDS[kind]
    work = working_bytes(cost, s)
    if cost.device_bytes <= g.usable_bytes:
        return Placement(1, 0, (0,) * s.n_layers, 0, (cost.device_bytes,))
    for n in range(2, (g.max_per_node if rule in SPANNING_RULES else 1) + 1):
        found = placement(s, n, g.usable_bytes, work)
        if found is not None:
            return found
    if rule not in SPANNING_RULES:
        raise FitError(f"job {rule} {'/'.join(wildcards.values())}: {cost.device_bytes / GB:.1f} GB of device memory "
                       f"> one {kind} ({g.usable_bytes / GB:.1f} GB usable) and {rule} runs on one GPU: "
                       + ("lower jacobian.layers_per_job, or " if rule == "jacobians" else "")
                       + "choose a GPU kind with more memory (RESDYN_GPU_KIND / --gpu)")
    fits = [k for k, other in GPU_KINDS.items() if placement(s, other.max_per_node, other.usable_bytes, work)]
    raise FitError(
        f"job {rule} {'/'.join(wildcards.values())}: {cost.device_bytes / GB:.1f} GB of device memory "
        f"({work / GB:.1f} GB of it besides the weights, all on the head's GPU) fits no {g.max_per_node} x {kind} "
        f"({g.usable_bytes / GB:.1f} GB usable each); GPU kinds that hold it: {', '.join(fits) or 'none'} "
        "(RESDYN_GPU_KIND / --gpu), or lower what sets the working memory (samples.length, lens.tokens_per_step)")


def jobs(config: dict) -> Iterator[tuple[str, dict[str, str]]]:
    """Every priced job of a config's DAG as (rule, wildcards), in the order of ``rule all``."""
    from resdyn.infra import config as rc

    studies = {st for st in ("A", "B") if rc.runs(config, st)}
    datasets_used = set()
    for model, m in config["models"].items():
        ckpts = rc.checkpoints(config, model)
        lens_ckpts = rc.lens_checkpoints(config, model)
        if m["source"] == "train":
            datasets_used.add(m["dataset"])
            yield "zoo_train", {"model": model}
        for c in ckpts:
            yield "resolve_checkpoint", {"model": model, "ckpt": c}
        if m["source"] != "train":
            yield "resolve_tokenizer", {"model": model}
        yield "samples", {"model": model}
        if "B" in studies:
            yield "lens_tokens", {"model": model}
        for c in ckpts:
            w = {"model": model, "ckpt": c}
            if "A" in studies:
                for block in rc.layer_blocks(config, model):
                    yield "jacobians", {**w, "block": block}
                for rule in ("activations", "spectra", "schur", "bootstrap", "communities", "coupling"):
                    yield rule, w
            if "B" in studies and c in lens_ckpts:
                for rule in ("lens", "lens_metrics", "rss", "resolution", "causal"):
                    yield rule, w
                yield "activations", w  # phase_metrics needs them (deduplicated by unique_jobs)
                if "A" in studies:
                    yield "bridge", w
                yield "phase_metrics", w
    for ds in sorted(datasets_used | {m["dataset"] for m in config["models"].values()}):
        yield "corpus", {"dataset": ds}
        if ds in datasets_used:
            yield "tokenizer", {"dataset": ds}


def unique_jobs(config: dict) -> list[tuple[str, dict[str, str]]]:
    """:func:`jobs` without duplicates (a job listed by two studies counts once)."""
    seen, out = set(), []
    for rule, w in jobs(config):
        key = (rule, tuple(sorted(w.items())))
        if key not in seen:
            seen.add(key)
            out.append((rule, w))
    return out


#: Inputs of each rule in the DAG (rule -> rules whose outputs it reads), for the critical path.
DEPENDS: dict[str, tuple[str, ...]] = {
    "zoo_train": ("tokenizer", "corpus"),
    "tokenizer": ("corpus",),
    "samples": ("corpus", "resolve_tokenizer", "tokenizer"),
    "lens_tokens": ("corpus", "resolve_tokenizer", "tokenizer"),
    "resolve_checkpoint": ("zoo_train",),
    "resolve_tokenizer": (),
    "jacobians": ("resolve_checkpoint", "samples"),
    "activations": ("resolve_checkpoint", "samples"),
    "spectra": ("jacobians",),
    "schur": ("jacobians",),
    "bootstrap": ("jacobians",),
    "communities": ("activations",),
    "coupling": ("communities", "jacobians", "spectra"),
    "lens": ("resolve_checkpoint", "lens_tokens"),
    "lens_metrics": ("lens", "samples"),
    "rss": ("lens",),
    "resolution": ("lens",),
    "causal": ("lens", "samples", "rss"),
    "bridge": ("jacobians", "lens", "spectra", "rss"),
    "phase_metrics": ("activations", "lens_metrics", "rss"),
    "corpus": (),
}
