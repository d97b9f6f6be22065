"""The DAG's jobs and what each one asks for.

Every priced job of a config as (rule, wildcards), its price on the GPU kind it runs on
(:mod:`resdyn.cluster.cost`), its threads, its Snakemake resources and its placement, and the
check that every GPU job fits before any job runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping

from resdyn.cluster.cost import (
    LIGHT_RULES,
    RULES,
    Cost,
    cost_activations,
    cost_bootstrap,
    cost_bridge,
    cost_causal,
    cost_communities,
    cost_coupling,
    cost_jacobians,
    cost_lens,
    cost_lens_metrics,
    cost_light,
    cost_phase_metrics,
    cost_readout,
    cost_schur,
    cost_spectra,
    cost_zoo_train,
    jacobian_block_size,
    model_shape,
    seconds,
    uses_gpu,
)
from resdyn.cluster.gpu_kinds import (
    CPU_THREADS,
    GB,
    GPU_HOST_THREADS,
    GPU_KINDS,
    THREADS_ABOVE_S,
    MiB,
    gpu_kind,
    measured_factor,
)
from resdyn.cluster.multigpu import (
    SPANNING_RULES,
    FitError,
    Placement,
    placement,
    working_bytes,
)
from resdyn.pipeline import config as rc

#: Requests: memory = peak · MEM_SAFETY + MEM_PAD, runtime = predicted · TIME_SAFETY + TIME_PAD,
#: both times the attempt number (a retry after an OOM kill or a timeout asks for more).
MEM_SAFETY, MEM_PAD_MB = 1.3, 512


TIME_SAFETY, TIME_PAD_MIN = 2.0, 5


def model_config_kind(config: dict, wildcards: Mapping[str, str], kind: str | None) -> tuple[dict, str | None]:
    """The config as the job's model sees it, and the GPU kind its GPU jobs run on.

    The config carries the model's overrides (:func:`resdyn.pipeline.config.model_config`); the
    kind is the model's ``gpu_kind`` before ``kind``.
    """
    if "model" not in wildcards:
        return config, kind
    mc = rc.model_config(config, wildcards["model"])
    return mc, mc.get("gpu_kind") or kind


def job_cost(config: dict, rule: str, wildcards: Mapping[str, str] | None = None, kind: str | None = None) -> Cost:
    """Price of one job of ``rule`` with ``wildcards`` (``model``, ``ckpt``, ``block``) on GPU kind ``kind``.

    ``kind`` defaults to :func:`gpu_kind`; it decides only whether spectra/bootstrap are GPU jobs.
    """
    w = dict(wildcards or {})
    if rule in LIGHT_RULES:
        return cost_light(model_config_kind(config, w, kind)[0], rule)
    if rule not in RULES:
        raise KeyError(f"rule {rule!r} has no cost function; priced rules: {RULES}")
    config, kind = model_config_kind(config, w, kind)
    s = model_shape(config, w["model"])
    gpu = uses_gpu(config, rule, kind)
    if rule == "jacobians":
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


def threads_for(config: dict, rule: str, wildcards: Mapping[str, str] | None = None, kind: str | None = None) -> int:
    """Threads of a job: 1 for a short job, else :data:`GPU_HOST_THREADS` (GPU jobs) or :data:`CPU_THREADS`.

    Short: the whole job takes at most :data:`THREADS_ABOVE_S` on one CPU thread. A job that short
    gains nothing from more threads wherever it runs, and a GPU-capable job (``device: auto``) that
    lands on a CPU would otherwise hold every core of a small machine (on 2 cores the zoo's spectra
    and bootstrap jobs would then run one at a time)."""
    cost = job_cost(config, rule, wildcards, kind)
    if seconds(cost, "cpu", 1) <= THREADS_ABOVE_S:
        return 1
    return GPU_HOST_THREADS if cost.gpu else CPU_THREADS


def resources(
    config: dict, rule: str, wildcards: Mapping[str, str] | None = None, attempt: int = 1, device: str | None = None
) -> dict[str, int]:
    """Snakemake resources of one job, all from :func:`job_cost`; memory and runtime × ``attempt``.

    ``mem_mb`` (host), ``runtime`` (minutes), ``threads``, ``disk_mb``, ``gpu`` (GPUs of one
    node: 0, 1, or more for a model that does not fit one, :func:`job_placement`).

    ``device``: the GPU kind to price GPU jobs for (default :func:`gpu_kind`); CPU jobs always use
    the calibrated CPU rates.
    """
    kind = model_config_kind(config, wildcards or {}, device)[1] or gpu_kind()
    cost = job_cost(config, rule, wildcards, kind)
    threads = threads_for(config, rule, wildcards, kind)
    device = kind if cost.gpu else "cpu"
    secs = seconds(cost, device, threads) * measured_factor(device, rule, "time")
    host = cost.host_bytes * measured_factor(device, rule, "mem")
    a = max(1, int(attempt))
    return {
        "mem_mb": int(math.ceil((host * MEM_SAFETY / MiB + MEM_PAD_MB) * a)),
        "runtime": int(math.ceil((secs * TIME_SAFETY / 60.0 + TIME_PAD_MIN) * a)),
        "threads": threads,
        "disk_mb": int(math.ceil(cost.disk_bytes / MiB)) + 1,
        "gpu": job_placement(config, rule, wildcards or {}, kind).devices if cost.gpu else 0,
    }


def placement_param(config: dict, rule: str, wildcards: Mapping[str, str]) -> dict[str, int] | None:
    """The rule param ``placement``: the block -> GPU map of a job that spans several GPUs.

    The GPUs are of :func:`gpu_kind`; None when the job runs on one GPU or on the CPU (``device: cpu``).
    """
    if config.get("device", "auto") == "cpu":
        return None
    found = job_placement(config, rule, dict(wildcards.items()))
    return found.device_map() if found is not None and found.devices > 1 else None


#: What one job may ask of the site unless ``RESDYN_MAX_JOB_MEMORY_GB`` / ``RESDYN_MAX_JOB_HOURS``
#: say otherwise: host memory of the largest common node (1 TB) and the longest common time
#: limit (7 days). A job over either is a mistake in the config, not a job to queue.
DEFAULT_MAX_JOB_MEMORY_GB = 1000.0
DEFAULT_MAX_JOB_HOURS = 168.0


def job_ceiling() -> tuple[float, float]:
    """(host memory in GB, hours) one job may request.

    :data:`DEFAULT_MAX_JOB_MEMORY_GB` and :data:`DEFAULT_MAX_JOB_HOURS`, or the site's
    ``RESDYN_MAX_JOB_MEMORY_GB`` / ``RESDYN_MAX_JOB_HOURS``.
    """
    out = []
    for var, default in (
        ("RESDYN_MAX_JOB_MEMORY_GB", DEFAULT_MAX_JOB_MEMORY_GB),
        ("RESDYN_MAX_JOB_HOURS", DEFAULT_MAX_JOB_HOURS),
    ):
        text = os.environ.get(var) or ""
        try:
            value = float(text) if text else default
        except ValueError:
            value = -1.0
        if not value > 0 or not math.isfinite(value):
            raise ValueError(f"{var}={text!r}: expected a positive number")
        out.append(value)
    return out[0], out[1]


def check_fits(config: dict, kind: str | None = None) -> None:
    """Check, before any job, that every job of the config fits where it runs.

    Every GPU job fits the GPUs of one node of ``kind`` (default :func:`gpu_kind`), and every job,
    CPU or GPU, asks for at most :func:`job_ceiling`; else :class:`FitError` names the first job
    that does not, with its numbers.
    """
    max_gb, max_hours = job_ceiling()
    for rule, w in unique_jobs(config):
        res = resources(config, rule, w, device=kind)  # places a GPU job: FitError when no node holds it
        gb, hours = res["mem_mb"] * MiB / GB, res["runtime"] / 60.0
        if gb > max_gb or hours > max_hours:
            job = f"{rule} {'/'.join(w.values())}".strip()
            raise FitError(
                f"job {job}: asks for {gb:,.0f} GB of host memory and {hours:,.1f} h; a job may ask for at most "
                f"{max_gb:,.0f} GB and {max_hours:,.0f} h (RESDYN_MAX_JOB_MEMORY_GB, RESDYN_MAX_JOB_HOURS): lower the "
                "model's size or the config's sample and token counts"
            )


def job_placement(config: dict, rule: str, wildcards: Mapping[str, str], kind: str | None = None) -> Placement | None:
    """Placement of a GPU job's model on GPU kind ``kind``; None for a CPU job.

    The model goes on the fewest GPUs of one node that hold it (1 for most jobs). Raises
    :class:`FitError` (one line: the job, its device memory, the kind and what to do) when even
    ``max_per_node`` GPUs do not hold it."""
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
        fewer = ""
        if rule == "jacobians":
            most = jacobian_block_size(model_config_kind(config, wildcards, kind)[0], s, g.usable_bytes)
            fewer = f"lower jacobian.layers_per_job to at most {most} (0: the most that fit), or "
        raise FitError(
            f"job {rule} {'/'.join(wildcards.values())}: {cost.device_bytes / GB:.1f} GB of device memory "
            f"> one {kind} ({g.usable_bytes / GB:.1f} GB usable) and {rule} runs on one GPU: "
            + fewer
            + "choose a GPU kind with more memory (RESDYN_GPU_KIND / --gpu)"
        )
    fits = [k for k, other in GPU_KINDS.items() if placement(s, other.max_per_node, other.usable_bytes, work)]
    raise FitError(
        f"job {rule} {'/'.join(wildcards.values())}: {cost.device_bytes / GB:.1f} GB of device memory "
        f"({work / GB:.1f} GB of it besides the weights, all on the head's GPU) fits no {g.max_per_node} x {kind} "
        f"({g.usable_bytes / GB:.1f} GB usable each); GPU kinds that hold it: {', '.join(fits) or 'none'} "
        "(RESDYN_GPU_KIND / --gpu), or lower what sets the working memory (samples.length, lens.tokens_per_step)"
    )


def jobs(config: dict) -> Iterator[tuple[str, dict[str, str]]]:
    """Every priced job of a config's DAG as (rule, wildcards), in the order of ``rule all``."""
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


#: Inputs of each rule in the DAG (rule -> priced rules whose outputs it reads, directly or through
#: unpriced rules: bridge, causal and phase_metrics read phases.json, made from rss
#: and resolution), for the critical path.
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
    "bootstrap": ("jacobians", "spectra"),
    "communities": ("activations",),
    "coupling": ("communities", "jacobians", "spectra"),
    "lens": ("resolve_checkpoint", "lens_tokens"),
    "lens_metrics": ("resolve_checkpoint", "lens", "samples"),
    "rss": ("lens",),
    "resolution": ("lens",),
    "causal": ("resolve_checkpoint", "lens", "samples", "rss", "resolution"),
    "bridge": ("jacobians", "lens", "spectra", "rss", "resolution"),
    "phase_metrics": ("activations", "lens_metrics", "rss", "resolution"),
    "corpus": (),
}
