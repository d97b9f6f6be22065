"""Calibrate the cost model from a finished run (``resdyn calibrate RUN``).

Every priced job of the run's DAG (:func:`resdyn.pipeline.dag.unique_jobs`) left a Snakemake
benchmark file ``benchmarks/out/{rule}/{wildcards}.tsv`` (wall seconds ``s``, peak resident
memory ``max_rss`` in MB) and a log ``logs/{rule}/{wildcards}.log`` whose closing line names the
device it ran on (``device cpu`` or ``device cuda:<GPU name>``). Per device kind the rates are
fitted the way ``benchmarks/plan.py`` fits the CPU's: non-negative least squares on relative
error, ``measured_j ≈ a·fixed_j + Σ_op work_j,op · x_op`` with ``x_op = 1 / rate_op`` (CPU work
divided by the thread speed-up ``1 + (t − 1)·eff_op``) and ``a`` the start-up factor. An op class
is fitted only where it is at least :data:`MIN_SHARE` of some job's planned time (a small run's
jobs are mostly start-up: its other classes cannot be measured and keep the table's rates), within
:data:`MAX_CHANGE` of the table's rate. What the op model still misses is a per-rule factor,
``time_factor = Σ measured / Σ predicted`` over the rule's jobs (after the rate fit), and
``mem_factor = max_j measured peak / planned host memory``. ``resdyn plan`` and the SLURM
resources multiply by them (:func:`resdyn.cluster.gpu_kinds.measured_factor`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from resdyn.cluster import cost as rcost
from resdyn.cluster import gpu_kinds
from resdyn.pipeline import dag

#: An op class is fitted where, at the table's rate, it is at least this share of a job's time.
MIN_SHARE = 0.1
#: Fitted rates stay within this factor of the table's (either way).
MAX_CHANGE = 10.0
#: The plugin's efficiency report (``--slurm-efficiency-report``): CSV files of this pattern.
EFFICIENCY_GLOB = "efficiency_report_*.csv"

_DEVICE = re.compile(r"; device (cpu|cuda:[^;]+?)(?:,|;|$)", re.M)


class CalibrationError(ValueError):
    """Bad input to ``resdyn calibrate``: one line naming the file or job and what was expected."""


def job_files(rule: str, w: dict) -> tuple[str, str]:
    """(benchmark file, log file) of one job, relative to the run folder (the rules' own paths)."""
    rel = "/".join(str(v) for v in w.values())
    return f"benchmarks/out/{rule}/{rel}.tsv", f"logs/{rule}/{rel}.log"


def read_benchmark(path: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in bytes) of a Snakemake benchmark file: its last repeat."""
    table = pd.read_csv(path, sep="\t")
    if table.empty or not {"s", "max_rss"} <= set(table.columns):
        raise CalibrationError(f"{path}: not a Snakemake benchmark file (columns s, max_rss expected)")
    last = table.iloc[-1]
    rss = pd.to_numeric(last["max_rss"], errors="coerce")
    return float(last["s"]), float(rss) * 1e6 if np.isfinite(rss) else float("nan")


def log_device(path: Path) -> str | None:
    """The device a job's log says it ran on (``cpu``, ``cuda:<name>``), or None."""
    if not path.is_file():
        return None
    found = _DEVICE.findall(path.read_text(encoding="utf-8", errors="replace"))
    return found[-1].strip() if found else None


def device_kind(device: str | None, gpu: bool, kind: str | None) -> str | None:
    """The device kind of a job: ``cpu`` for a CPU job (or a log saying cpu), else the GPU kind
    whose name the log's ``cuda:<name>`` carries (``kind`` when it names none or the log is
    silent); None when no kind of the table matches."""
    if not gpu or device == "cpu":
        return "cpu"
    if device is None:
        return kind
    name = device.removeprefix("cuda:").lower().replace(" ", "")
    hits = [k for k, g in gpu_kinds.GPU_KINDS.items() if re.split("[-_]", k)[0] in name]
    if len(hits) > 1:  # several memory sizes of one model: the size in the name decides
        sized = [k for k in hits if any(part in name for part in re.split("[-_]", k)[1:])]
        hits = sized or ([kind] if kind in hits else hits)
    return hits[0] if len(hits) == 1 else None


def measured_jobs(run: Path, config: dict, kind: str) -> pd.DataFrame:
    """One row per priced job of ``config`` with a benchmark file under ``run``: rule, wildcards,
    gpu, device kind, threads, measured seconds and peak bytes, and its :class:`resdyn.cluster.cost.Cost`.

    Raises :class:`CalibrationError` (one line) when no job has a benchmark file."""
    rows = []
    for rule, w in dag.unique_jobs(config):
        bench, log = job_files(rule, w)
        if not (run / bench).is_file():
            continue
        seconds, peak = read_benchmark(run / bench)
        c = dag.job_cost(config, rule, w, kind)
        device = log_device(run / log)
        rows.append(
            {
                "rule": rule,
                "job": "/".join(w.values()),
                "gpu": bool(c.gpu),
                "log_device": device or "",
                "device": device_kind(device, bool(c.gpu), kind),
                "threads": dag.threads_for(config, rule, w, kind),
                "seconds": seconds,
                "peak_bytes": peak,
                "cost": c,
            }
        )
    if not rows:
        raise CalibrationError(
            f"{run}: no Snakemake benchmark files of this config's jobs under {run / 'benchmarks/out'} "
            "(calibrate a finished run's folder, with the config it ran)"
        )
    return pd.DataFrame(rows)


def check_kind(jobs: pd.DataFrame, kind: str) -> None:
    """Every GPU job ran on ``kind``: else one line naming a job, its device and the kind."""
    other = jobs[jobs.gpu & (jobs.device != kind)]
    if len(other):
        j = other.iloc[0]
        raise CalibrationError(
            f"job {j.rule} {j.job} ran on {j.log_device or 'an unknown device'}, not GPU kind {kind!r} "
            f"({len(other)} of {int(jobs.gpu.sum())} GPU jobs): calibrate one GPU kind at a time "
            "(--gpu KIND, a kind of resdyn/data/gpus.yaml) on a run whose GPU jobs all ran on it"
        )


def _speedup(device: str, op: str, threads: int) -> float:
    if gpu_kinds.DEVICES[device].kind == "gpu" and op not in gpu_kinds.HOST_OPS:
        return 1.0
    return 1.0 + (threads - 1) * gpu_kinds.THREAD_EFFICIENCY[op]


def _host_rate(device: str, op: str) -> float:
    gpu = gpu_kinds.DEVICES[device].kind == "gpu" and op not in gpu_kinds.HOST_OPS
    return gpu_kinds.DEVICES[device if gpu else "cpu"].rates[op]


def fitted_ops(jobs: pd.DataFrame, device: str) -> list[str]:
    """The op classes a run can measure: those that are at least :data:`MIN_SHARE` of some job's
    planned time at the table's rates (the others stay at the table's rates)."""
    out = []
    for op in gpu_kinds.OPS:
        shares = [
            r.cost.work.get(op, 0.0)
            / _host_rate(device, op)
            / _speedup(device, op, r.threads)
            / rcost.seconds(r.cost, device, r.threads)
            for r in jobs.itertuples()
        ]
        if max(shares, default=0.0) >= MIN_SHARE:
            out.append(op)
    return out


def fit_device(jobs: pd.DataFrame, device: str) -> tuple[dict[str, float], float]:
    """(fitted op rates, start-up factor) of one device kind from its jobs (module docstring).

    Columns of the NNLS: ``fixed_j / measured_j`` and, per op of :func:`fitted_ops`, ``work_j,op /
    (speed-up · measured_j)``; the target is 1 minus the share the other op classes take at the
    table's rates (relative error), the columns scaled to their maximum."""
    import scipy.optimize

    ops = fitted_ops(jobs, device)
    rows = list(jobs.itertuples())
    cols = [np.array([r.cost.fixed_s / r.seconds for r in rows])]
    for op in ops:
        cols.append(np.array([r.cost.work.get(op, 0.0) / _speedup(device, op, r.threads) / r.seconds for r in rows]))
    rest = np.array(
        [
            sum(
                v / _host_rate(device, op) / _speedup(device, op, r.threads)
                for op, v in r.cost.work.items()
                if op not in ops
            )
            / r.seconds
            for r in rows
        ]
    )
    A = np.column_stack(cols)
    scale = np.where(A.max(axis=0) > 0, A.max(axis=0), 1.0)
    x, _ = scipy.optimize.nnls(A / scale, 1.0 - rest)
    x = x / scale
    rates = {}
    for op, xi in zip(ops, x[1:]):
        prior = _host_rate(device, op)
        rate = 1.0 / xi if xi > 0 else prior * MAX_CHANGE
        rates[op] = float(min(max(rate, prior / MAX_CHANGE), prior * MAX_CHANGE))
    return rates, float(x[0]) if x[0] > 0 else 1.0


def predict(c: rcost.Cost, device: str, threads: int, rates: dict[str, float], startup: float) -> float:
    """Seconds of a job with ``rates`` put over the device's and the start-up factor (as
    :func:`resdyn.cluster.cost.seconds`)."""
    total = c.fixed_s * startup
    for op, amount in c.work.items():
        rate = rates.get(op, _host_rate(device, op))
        total += amount / rate / _speedup(device, op, threads)
    return total


def calibrate(jobs: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """(the rates file's ``kinds`` mapping, the per-rule table) from :func:`measured_jobs`' rows.

    Table columns: device, rule, jobs, measured_s (Σ wall seconds), planned_s (Σ the table's
    prediction: :func:`resdyn.cluster.cost.seconds`), rates_s (Σ with the fitted rates), calibrated_s
    (rates and the rule's time factor), measured_gb (max peak), planned_gb (max planned host)."""
    kinds, rows = {}, []
    for device, dj in jobs.groupby("device", sort=True):
        rates, startup = fit_device(dj, device)
        entry = {"rates": rates, "startup_factor": startup, "rules": {}}
        for rule, rj in dj.groupby("rule", sort=False):
            fitted = sum(predict(r.cost, device, r.threads, rates, startup) for r in rj.itertuples())
            planned = sum(rcost.seconds(r.cost, device, r.threads) for r in rj.itertuples())
            host = np.array([r.cost.host_bytes for r in rj.itertuples()])
            peak = rj.peak_bytes.to_numpy(dtype=float)
            mem = float(np.nanmax(peak / host)) if np.isfinite(peak).any() else 1.0
            factor = float(rj.seconds.sum() / fitted) if fitted > 0 else 1.0
            entry["rules"][rule] = {"time_factor": factor, "mem_factor": mem, "jobs": len(rj)}
            rows.append(
                {
                    "device": device,
                    "rule": rule,
                    "jobs": len(rj),
                    "measured_s": float(rj.seconds.sum()),
                    "planned_s": planned,
                    "rates_s": fitted,
                    "calibrated_s": fitted * factor,
                    "measured_gb": float(np.nanmax(peak)) / 1e9 if np.isfinite(peak).any() else float("nan"),
                    "planned_gb": float(host.max()) / 1e9,
                }
            )
        kinds[device] = entry
    return kinds, pd.DataFrame(rows)


def efficiency_reports(run: Path) -> list[Path]:
    """The SLURM plugin's efficiency reports in the run folder (``--slurm-efficiency-report``)."""
    return sorted(Path(run).glob(EFFICIENCY_GLOB)) + sorted(Path(run).glob(f"logs/**/{EFFICIENCY_GLOB}"))


def efficiency_lines(path: Path) -> list[str]:
    """Per rule of the plugin's efficiency report (sacct: elapsed, CPU time, MaxRSS, request): jobs,
    median CPU efficiency and the largest share of its memory request a job used."""
    table = pd.read_csv(path)
    need = {"RuleName", "CPU Efficiency (%)", "Memory Usage (%)"}
    if not need <= set(table.columns):
        return [f"{path}: not the plugin's efficiency report (columns {sorted(need)} expected)"]
    lines = [f"{path}: rule, jobs, median CPU efficiency %, max memory used % of the request"]
    for rule, rows in table[table.RuleName.fillna("").astype(str) != ""].groupby("RuleName"):
        lines.append(
            f"  {rule}\t{len(rows)}\t{rows['CPU Efficiency (%)'].median():.0f}\t{rows['Memory Usage (%)'].max():.0f}"
        )
    return lines


def write_rates(path: Path, kinds: dict, source: str) -> None:
    """Write the user rates file (:func:`resdyn.cluster.gpu_kinds.load_measured` reads it)."""
    import yaml

    from resdyn import io

    text = (
        "# resdyn user rates, written by `resdyn calibrate` (docs/slurm.md, 'Calibrate after the first run').\n"
        "# resdyn plan and the SLURM resources read it (RESDYN_GPU_RATES=none turns it off).\n"
        + yaml.safe_dump({"source": source, "kinds": kinds}, sort_keys=False)
    )
    with io.atomic_path(Path(path).expanduser()) as tmp:
        tmp.write_text(text, encoding="utf-8")


def render(table: pd.DataFrame) -> str:
    """The measured-vs-planned table ``resdyn calibrate`` prints (seconds summed per rule)."""
    show = table.assign(
        ratio_planned=table.planned_s / table.measured_s, ratio_calibrated=table.calibrated_s / table.measured_s
    )
    return show.to_string(index=False, float_format=lambda x: f"{x:.3g}")


def run_command(run: Path, config: dict, kind: str, write: Path, source: str) -> str:
    """``resdyn calibrate``: measure, check the GPU kind, fit, write the rates file; the printed text."""
    jobs = measured_jobs(run, config, kind)
    check_kind(jobs, kind)
    kinds, table = calibrate(jobs)
    write_rates(write, kinds, source)
    lines = [render(table), ""]
    for device, entry in kinds.items():
        fitted = ", ".join(f"{op} {rate:.3g}" for op, rate in entry["rates"].items()) or "none (start-up bound)"
        lines.append(f"{device}: start-up x{entry['startup_factor']:.3g}; fitted rates: {fitted}")
    lines.append(f"wrote {write}: `resdyn plan` and the SLURM resources use it (RESDYN_GPU_RATES=none: off)")
    reports = efficiency_reports(run)
    for report in reports:
        lines += efficiency_lines(report)
    if not reports:
        lines.append(
            "no SLURM efficiency report in the run folder: profiles/slurm writes one per run to logs/slurm/ "
            "(slurm-efficiency-report; docs/slurm.md, 'Calibrate after the first run')"
        )
    return "\n".join(lines)
