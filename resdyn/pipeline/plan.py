"""Size a run before submitting it: every rule's jobs, GPU- and CPU-hours, memory, disk, wall time.

Every number comes from :mod:`resdyn.cluster.cost` — the same prices the rules' SLURM resources are made
of — summed over the jobs of the config's DAG (:func:`resdyn.pipeline.dag.unique_jobs`).

* GPU-hours: Σ predicted seconds × GPUs of the GPU jobs on the chosen GPU kind (a job whose
  model does not fit one GPU spans several of one node, :func:`resdyn.pipeline.dag.job_placement`;
  one that fits no node of the kind is marked and counted on one GPU).
* CPU-hours: Σ threads × predicted seconds of the CPU jobs (core-hours, what an allocation
  bills), plus the host cores a GPU job holds (``GPU_HOST_THREADS``) counted separately as
  ``host_cpu_hours``.
* Critical path: per model the longest chain of rules through :data:`resdyn.pipeline.dag.DEPENDS`, each
  rule weighted by its longest job of that model; the maximum over models.
* Wall time with G GPUs and C cores: list scheduling is within Graham's bounds
  ``max(critical, GPU-h/G, CPU-h/C) ≤ wall ≤ critical + GPU-h/G + CPU-h/C``; the table reports
  both and the lower bound as the estimate (the DAG is wide: many models × checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from resdyn.cluster import cost as rcost
from resdyn.cluster import gpu_kinds, multigpu
from resdyn.pipeline import dag


@dataclass(frozen=True)
class Totals:
    gpu_hours: float
    cpu_hours: float
    host_cpu_hours: float
    disk_gb: float
    critical_h: float
    wall_low_h: float
    wall_high_h: float
    gpus: int
    cores: int
    device: str


def job_row(config: dict, rule: str, w: dict, device: str = "h100") -> dict:
    """The priced row of one job: rule, wildcards, gpu, gpus (of one node; 0 for CPU jobs), threads,
    seconds, TFLOP, host/device GB, disk GB, ``placement`` (multi-GPU jobs) or ``misfit`` (no node
    holds it). ``device`` is the GPU kind; a model's own ``gpu_kind`` override comes first."""
    model_kind = dag.model_config_kind(config, w, device)[1] or device
    c = dag.job_cost(config, rule, w, model_kind)
    threads = dag.threads_for(config, rule, w, model_kind)
    kind = model_kind if c.gpu else "cpu"
    gpus, where, misfit = int(c.gpu), "", ""
    if c.gpu:
        try:
            placed = dag.job_placement(config, rule, w, model_kind)
            gpus, where = placed.devices, (placed.describe() if placed.devices > 1 else "")
        except multigpu.FitError as err:
            misfit = str(err)
    return {
        "rule": rule,
        "model": w.get("model", ""),
        "ckpt": w.get("ckpt", ""),
        "block": w.get("block", ""),
        "gpu": c.gpu,
        "gpus": gpus,
        "threads": threads,
        "seconds": rcost.seconds(c, kind, threads) * gpu_kinds.measured_factor(kind, rule, "time"),
        "tflop": c.flops / 1e12,
        "host_gb": c.host_bytes * gpu_kinds.measured_factor(kind, rule, "mem") / 1e9,
        "device_gb": c.device_bytes / 1e9,
        "disk_gb": c.disk_bytes / 1e9,
        "placement": where,
        "misfit": misfit,
    }


def job_table(config: dict, device: str = "h100") -> pd.DataFrame:
    """One row per job (:func:`job_row`)."""
    return pd.DataFrame([job_row(config, rule, w, device) for rule, w in dag.unique_jobs(config)])


def rule_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, TFLOP, GPU-hours, CPU-hours, longest job (h), peak host/device GB per job, disk."""
    j = jobs.assign(
        gpu_hours=lambda t: (t.seconds * t.gpus).where(t.gpu, 0.0) / 3600,
        cpu_hours=lambda t: (t.seconds * t.threads).where(~t.gpu, 0.0) / 3600,
    )
    out = j.groupby("rule", sort=False).agg(
        jobs=("rule", "size"),
        gpus=("gpus", "max"),
        threads=("threads", "max"),
        tflop=("tflop", "sum"),
        gpu_hours=("gpu_hours", "sum"),
        cpu_hours=("cpu_hours", "sum"),
        max_job_h=("seconds", lambda s: s.max() / 3600),
        host_gb=("host_gb", "max"),
        device_gb=("device_gb", "max"),
        disk_gb=("disk_gb", "sum"),
    )
    return out.reset_index()


def critical_path_hours(jobs: pd.DataFrame) -> float:
    """Longest dependency chain (hours): per model, rules weighted by their longest job."""
    global_w = jobs[jobs.model == ""].groupby("rule").seconds.max().to_dict()
    best = 0.0
    for model, part in jobs[jobs.model != ""].groupby("model"):
        weight = {**global_w, **part.groupby("rule").seconds.max().to_dict()}

        @lru_cache(maxsize=None)
        def finish(rule: str) -> float:
            deps = dag.DEPENDS.get(rule, ())
            return weight.get(rule, 0.0) + max((finish(r) for r in deps), default=0.0)

        best = max(best, max(finish(r) for r in weight))
    return best / 3600


def totals(jobs: pd.DataFrame, gpus: int, cores: int, device: str) -> Totals:
    gpu_h = float((jobs.seconds * jobs.gpus).where(jobs.gpu, 0.0).sum() / 3600)
    cpu_h = float((jobs.seconds * jobs.threads).where(~jobs.gpu, 0.0).sum() / 3600)
    host_h = float((jobs.seconds * jobs.threads).where(jobs.gpu, 0.0).sum() / 3600)
    crit = critical_path_hours(jobs)
    low = max(crit, gpu_h / max(gpus, 1), cpu_h / max(cores, 1))
    high = crit + gpu_h / max(gpus, 1) + cpu_h / max(cores, 1)
    return Totals(gpu_h, cpu_h, host_h, float(jobs.disk_gb.sum()), crit, low, high, gpus, cores, device)


def estimate(config: dict, device: str = "h100") -> pd.DataFrame:
    """The per-rule table of :func:`rule_table` for a config (for callers that start from a config, not a job table)."""
    return rule_table(job_table(config, device))


def render(config: dict, device: str = "h100", gpus: int = 1, cores: int = 64) -> str:
    """The text ``resdyn plan`` prints: the rule table and the totals."""
    jobs = job_table(config, device)
    table = rule_table(jobs)
    t = totals(jobs, gpus, cores, device)
    dev = gpu_kinds.DEVICES[device]
    lines = [rates_line(), table.to_string(index=False, float_format=lambda x: f"{x:.3g}"), ""]
    lines.append(f"GPU kind {device} ({dev.note}); CPU rates: {rcost.DEVICES['cpu'].note}")
    lines.append(
        f"total: {len(jobs)} jobs, {t.gpu_hours:.2f} GPU-hours, {t.cpu_hours:.1f} CPU-hours "
        f"(+ {t.host_cpu_hours:.1f} core-hours held by GPU jobs), {t.disk_gb:.1f} GB on disk"
    )
    lines.append(
        f"largest job: {table.host_gb.max():.1f} GB host, {table.device_gb.max():.1f} GB GPU memory; "
        f"critical path {t.critical_h:.2f} h"
    )
    lines.append(
        f"wall time with {gpus} GPU(s) and {cores} CPU cores: ≈ {t.wall_low_h:.1f} h "
        f"(list-scheduling bounds {t.wall_low_h:.1f}–{t.wall_high_h:.1f} h)"
    )
    generic = sorted(k for k, m in config["models"].items() if m.get("family") == "generic")
    if generic:  # resdyn.lm.generic: priced GENERIC_SLOWDOWN times the hand-written Jacobian work
        from resdyn.lm.families import GENERIC_SLOWDOWN

        lines.append(
            f"generic path (no adapter; forward mode through HF's modules, self-checked at load): "
            f"{', '.join(generic)} - Jacobians priced {GENERIC_SLOWDOWN:g}x the hand-written engines"
        )
    lines += fit_lines(jobs, device)
    lines.append(memory_line())
    lines += override_lines(config)
    lines.append(
        "not priced (tables and figures from tables, run on the submit host in seconds): "
        + ", ".join(r for r in rcost.LOCAL_UNPRICED_RULES if r != "all")
    )
    return "\n".join(lines)


def rates_line() -> str:
    """The plan's header: which device kinds' rates are measured (``resdyn calibrate``), from which
    run and file, or that every rate is the table's."""
    m = gpu_kinds.MEASURED
    if not m:
        return (
            "rates: resdyn/data/gpus.yaml (datasheets x assumed efficiency) and the CPU benchmark; "
            "none measured on this site (`resdyn calibrate RUN` after a first run)"
        )
    kinds = ", ".join(f"{k} ({len(v.get('rules') or {})} rules)" for k, v in m["kinds"].items())
    return f"rates: MEASURED for {kinds} by resdyn calibrate from {m.get('source', '?')} ({m['path']})"


def memory_line() -> str:
    """Which device-memory figures are formulas checked against a trace of the code and which are
    formulas only (docs/cost.md, "Memory trace")."""
    traced = ", ".join(rcost.TRACED_MEMORY_RULES)
    untraced = ", ".join(r for r in rcost.GPU_LINALG_RULES if r not in rcost.TRACED_MEMORY_RULES)
    return (
        f"GPU memory figures: {traced} are formulas held against the live bytes of their own code traced at "
        f"the paper shapes (benchmarks/memory_trace.py, docs/cost.md); {untraced} are formulas only; neither "
        f"sees the allocator's slack, library workspaces or the CUDA context (the "
        f"{1 - gpu_kinds.GPU_USABLE_FRACTION:.0%} of a GPU kept free)"
    )


def fit_lines(jobs: pd.DataFrame, device: str) -> list[str]:
    """What the plan says about GPU memory on ``device``: every job that spans several GPUs (with
    its placement) or fits no node of the kind, and where FP64 decompositions run."""
    g = gpu_kinds.GPU_KINDS[device]
    usable = f"{g.usable_bytes / 1e9:.1f} GB usable of {g.memory_mib / 1024:.0f} GiB"
    lines = []
    multi, misfit = jobs[jobs.gpus > 1], jobs[jobs.misfit != ""]
    if multi.empty and misfit.empty:
        lines.append(f"GPU memory: every GPU job fits one {device} ({usable})")
    for _, j in multi.iterrows():
        lines.append(
            f"SPANS {j.gpus} GPUs: {j.rule} {j.model}/{j.ckpt}{'/' + j.block if j.block else ''} needs "
            f"{j.device_gb:.1f} GB > one {device} ({usable}); the rule requests gpu={j.gpus} of one node "
            f"and loads the model by layer: {j.placement}"
        )
    for _, j in misfit.iterrows():
        lines.append(f"DOES NOT FIT: {j.misfit}")
    if gpu_kinds.host_linalg(device):
        lines.append(
            f"FP64 on {device}: {g.fp64_tflops:g} TFLOP/s is slower than the {rcost.GPU_HOST_THREADS} host "
            "cores for eigendecompositions: spectra and bootstrap run as CPU jobs (priced on the CPU)"
        )
    return lines


def override_lines(config: dict) -> list[str]:
    """One line per model with its own settings (``models.<name>.overrides``), as the plan priced it."""
    lines = []
    for name, m in config["models"].items():
        over = m.get("overrides") or {}
        items = [f"{sec}.{k}={v}" for sec, vals in over.items() if isinstance(vals, dict) for k, v in vals.items()]
        items += [f"{k}={v}" for k, v in over.items() if not isinstance(v, dict)]
        if items:
            lines.append(f"model {name} overrides: {', '.join(items)}")
    return lines
