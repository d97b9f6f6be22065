"""Device kinds and their rates.

The GPU table (``resdyn/data/gpus.yaml``: memory, bf16/fp32/fp64 rates, bandwidth, GPUs per
node), the CPU rates measured by ``benchmarks/plan.py``, and the GPU kind a run prices
(``RESDYN_GPU_KIND``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: Op classes a price is made of (see the module docstring).
OPS: tuple[str, ...] = (
    "gemm32",
    "gemm16",
    "gemm64",
    "jvp",
    "eig",
    "schur",
    "schurv",
    "svd",
    "svdvals",
    "stream",
    "gunzip",
    "calls",
    "graph",
    "kl64",
)


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


GB = 1e9


MiB = 2**20


@dataclass(frozen=True)
class Device:
    """Throughputs of one device kind.

    FLOP/s (or byte/s for ``stream``/``gunzip``) per op class, per thread for a CPU, per device
    for a GPU.
    """

    name: str
    kind: str  # "cpu" | "gpu"
    rates: Mapping[str, float]
    note: str = ""


# Calibrated 2026-11-30 13:46 UTC by `benchmarks/plan.py` on the project's 2-core CI-class
# machine (Debian, Python 3.11, torch 2.13.0+cpu, numpy/scipy wheels' OpenBLAS, one thread,
# load average 7-10 from other processes: CPU time is fitted, not wall time): per-thread
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
        """Device memory a job may plan for: total · :data:`GPU_USABLE_FRACTION`.

        The CUDA context, cuBLAS/cuSOLVER workspaces and the caching allocator's fragmentation
        take the rest.
        """
        return self.memory_mib * MiB * GPU_USABLE_FRACTION


#: Share of a GPU's memory the cost model fills (the rest: CUDA context ≈ 0.5 GB, library
#: workspaces, allocator fragmentation).
GPU_USABLE_FRACTION = 0.9


#: How well resdyn's code uses a GPU, per op class: (datasheet column, fraction of its peak). Documented
#: assumptions (the same for every kind; ``benchmarks/gpu_check.sh`` measures them on a lent GPU),
#: chosen so that the H100 SXM gets the cost model's reference H100 rates: fp32 GEMM
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


def datasheet_peaks(g: GPUKind) -> dict[str, float]:
    """The kind's datasheet peaks by the column names :data:`GPU_EFFICIENCY` uses (TFLOP/s, TB/s);
    fp64 GEMMs run at the larger of the fp64 tensor-core and plain fp64 peaks."""
    return {
        "fp32_tflops": g.fp32_tflops,
        "bf16_tflops": g.bf16_tflops,
        "fp64_tflops": g.fp64_tflops,
        "fp64_gemm_tflops": max(g.fp64_tensor_tflops, g.fp64_tflops),
        "hbm_tb_s": g.hbm_tb_s,
    }


def gpu_rates(g: GPUKind) -> dict[str, float]:
    """Op-class rates (FLOP/s, byte/s) of a GPU kind: datasheet peak × :data:`GPU_EFFICIENCY`.

    The host-side classes (zlib, Python steps, Leiden) run at the calibrated CPU rates.
    """
    peaks = datasheet_peaks(g)
    rates = {op: peaks[col] * 1e12 * eff for op, (col, eff) in GPU_EFFICIENCY.items()}
    rates["kl64"] = rates["stream"] / KL64_BYTES
    rates.update({op: CPU_CALIBRATION[op] for op in ("gunzip", "calls", "graph", "schur", "schurv")})
    return rates


def load_gpu_kinds(path: Path = GPU_TABLE) -> dict[str, GPUKind]:
    """The GPU table (:data:`GPU_TABLE`) as {kind: :class:`GPUKind`}.

    A row missing a column, or with one the table does not define, is an error naming the file,
    kind and column.
    """
    import yaml

    table = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    names = [f for f in GPUKind.__dataclass_fields__ if f != "kind"]
    out = {}
    for kind, row in table.items():
        if not isinstance(row, dict) or set(row) != set(names):
            have = set(row) if isinstance(row, dict) else set()
            raise ValueError(
                f"{path}: GPU kind {kind!r}: columns {sorted(have)}; expected exactly {names} "
                f"(missing {sorted(set(names) - have)}, unknown {sorted(have - set(names))})"
            )
        out[kind] = GPUKind(kind, **row)
    return out


GPU_KINDS: dict[str, GPUKind] = load_gpu_kinds()


DEVICES: dict[str, Device] = {
    "cpu": Device("cpu", "cpu", CPU_CALIBRATION, "measured here, per thread (benchmarks/plan.py)"),
    **{
        k: Device(k, "gpu", gpu_rates(g), f"{g.name}; datasheet peaks × assumed efficiency")
        for k, g in GPU_KINDS.items()
    },
}


#: Environment variable naming the user rates file ``resdyn calibrate`` writes; unset: :data:`USER_RATES`
#: when it exists; ``none``: no user rates.
RATES_ENV = "RESDYN_GPU_RATES"
USER_RATES = Path("~/.config/resdyn/gpus.yaml")


def user_rates_path() -> Path | None:
    """The user rates file in force: ``$RESDYN_GPU_RATES`` (``none``: none), else
    ``~/.config/resdyn/gpus.yaml`` when it exists."""
    value = os.environ.get(RATES_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "none") else Path(value).expanduser()
    path = USER_RATES.expanduser()
    return path if path.is_file() else None


def load_measured(path: Path | None) -> dict:
    """The user rates file of ``resdyn calibrate`` (``{source, kinds: {device: {rates, startup_factor,
    rules: {rule: {time_factor, mem_factor, jobs}}}}}``), or ``{}`` without one; a device that is
    neither ``cpu`` nor a GPU kind, or an op that is no op class, is an error naming the file."""
    import yaml

    if path is None:
        return {}
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    kinds = data.get("kinds") if isinstance(data, dict) else None
    if not isinstance(kinds, dict):
        raise ValueError(f"{path}: expected a mapping with key 'kinds' (written by `resdyn calibrate`)")
    for device, entry in kinds.items():
        if device != "cpu" and device not in GPU_KINDS:
            raise ValueError(f"{path}: device {device!r} is not cpu or a GPU kind ({', '.join(GPU_KINDS)})")
        bad = sorted(set((entry or {}).get("rates") or {}) - set(OPS))
        if bad:
            raise ValueError(f"{path}: {device}: unknown op class(es) {bad}; allowed: {', '.join(OPS)}")
    return {"path": str(path), **data}


def _with_measured(devices: dict[str, Device], measured: dict) -> dict[str, Device]:
    """``devices`` with the measured rates of ``measured`` (:func:`load_measured`) put over the table's."""
    out = dict(devices)
    for device, entry in (measured.get("kinds") or {}).items():
        old = out[device]
        note = f"{old.note}; measured by resdyn calibrate from {measured.get('source', '?')} ({measured['path']})"
        out[device] = Device(device, old.kind, {**old.rates, **(entry.get("rates") or {})}, note)
    return out


MEASURED: dict = load_measured(user_rates_path())
DEVICES = _with_measured(DEVICES, MEASURED)


def measured_factor(device: str, rule: str | None, what: str) -> float:
    """The measured correction of a device kind: ``startup`` (the fixed seconds' factor) or, for a
    rule, ``time``/``mem`` (measured over predicted after the rate fit); 1 when not measured."""
    entry = (MEASURED.get("kinds") or {}).get(device) or {}
    if what == "startup":
        return float(entry.get("startup_factor", 1.0))
    return float(((entry.get("rules") or {}).get(rule) or {}).get(f"{what}_factor", 1.0))


#: Ops a GPU job still runs on its host CPU (no torch routine on cuda).
HOST_OPS = ("schur", "schurv", "gunzip", "calls", "graph")


#: Parallel efficiency of t CPU threads per op class (assumed, not measured: the calibration machine
#: has 2 shared cores): level-3 BLAS scales well, LAPACK's QR sweeps and zlib hardly.
THREAD_EFFICIENCY = {
    "gemm32": 0.85,
    "gemm16": 0.85,
    "gemm64": 0.85,
    "jvp": 0.7,
    "svd": 0.6,
    "svdvals": 0.5,
    "eig": 0.35,
    "schur": 0.35,
    "schurv": 0.45,
    "stream": 0.5,
    "gunzip": 0.0,
    "calls": 0.0,
    "graph": 0.0,
    "kl64": 0.5,
}


#: Threads of a CPU-heavy rule on the cluster (when its single-thread time exceeds
#: :data:`THREADS_ABOVE_S`), and CPU cores that come with one GPU (profile: cpus_per_gpu).
CPU_THREADS = 8


THREADS_ABOVE_S = 600.0


GPU_HOST_THREADS = 8


#: Fixed seconds per job: interpreter start and imports, the model class and its setup (docs/speed.md,
#: "Fixed cost of a job"; ``resdyn calibrate`` fits a site's factor); reading weights is priced on its own.
STARTUP_S = 15.0


def gpu_kind() -> str:
    """GPU kind the cluster requests are priced for: ``RESDYN_GPU_KIND`` (default h100)."""
    return check_gpu_kind(os.environ.get("RESDYN_GPU_KIND") or "h100", "RESDYN_GPU_KIND")


def check_gpu_kind(kind: str, key: str) -> str:
    """``kind`` if it is a row of the GPU table, else one ValueError line naming ``key`` and the kinds."""
    if kind not in GPU_KINDS:
        raise ValueError(f"{key}={kind!r}: not a GPU kind of {GPU_TABLE.name}; allowed: {', '.join(GPU_KINDS)}")
    return kind


def host_linalg(kind: str) -> bool:
    """Whether a GPU kind's FP64 is too weak for the decompositions.

    True when its eigvals rate is below the host's with the :data:`GPU_HOST_THREADS` cores a GPU
    job gets (the L40S: FP64 = FP32/64). Then spectra and bootstrap run as CPU jobs
    (:func:`uses_gpu`, :func:`linalg_device`).
    """
    host = CPU_CALIBRATION["eig"] * (1.0 + (GPU_HOST_THREADS - 1) * THREAD_EFFICIENCY["eig"])
    return DEVICES[kind].rates["eig"] < host
