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

Kind ``cpu`` (:data:`CPU_KIND`) calibrates a run whose GPU rules ran on CPUs (a CPU-only
cluster, the local test SLURM): every job is priced as a CPU job (the config's ``device: cpu``)
and fitted to the ``cpu`` row; a job whose log names a GPU is refused, so kinds never mix.
Beside the fit, SLURM's accounting (``sacct``, for the job ids Snakemake's log records) and the
plugin's efficiency report are summarised per rule where the run has them; the fit itself reads
the benchmark files (each job's own wall seconds and peak memory), and the printed table says so.
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

#: The kind that calibrates a run whose GPU rules ran on CPUs.
CPU_KIND = "cpu"
#: What sacct reports per job (``sacct -P -n -o``): the plugin names each job's comment ``rule_{rule}_...``.
SACCT_FIELDS = ("JobID", "Comment", "State", "Elapsed", "TotalCPU", "MaxRSS")
#: Snakemake's log line of each SLURM submission.
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+)")

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


def measured_jobs(run: Path, config: dict, kind: str | None) -> pd.DataFrame:
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
    """Every GPU job ran on ``kind`` (kind ``cpu``: every job ran on a CPU): else one line naming
    a job, its device and the kind."""
    if kind == CPU_KIND:
        other = jobs[jobs.log_device.str.startswith("cuda")]
        if len(other):
            j = other.iloc[0]
            raise CalibrationError(
                f"job {j.rule} {j.job} ran on {j.log_device}, not a CPU ({len(other)} of {len(jobs)} jobs): "
                "--gpu cpu calibrates a run whose jobs all ran on CPUs; for a GPU run name its kind "
                "(--gpu KIND, a kind of resdyn/data/gpus.yaml)"
            )
        return
    other = jobs[jobs.gpu & (jobs.device != kind)]
    if len(other):
        j = other.iloc[0]
        raise CalibrationError(
            f"job {j.rule} {j.job} ran on {j.log_device or 'an unknown device'}, not GPU kind {kind!r} "
            f"({len(other)} of {int(jobs.gpu.sum())} GPU jobs): calibrate one GPU kind at a time "
            "(--gpu KIND, a kind of resdyn/data/gpus.yaml, or --gpu cpu for a run on CPUs) on a run "
            "whose GPU jobs all ran on it"
        )


def cpu_config(config: dict) -> dict:
    """``config`` as a run on CPUs prices it: ``device: cpu`` globally and in every model's overrides."""
    models = {}
    for name, entry in config["models"].items():
        over = {k: v for k, v in (entry.get("overrides") or {}).items() if k != "device"}
        models[name] = {**entry, "overrides": over} if "overrides" in entry else entry
    return {**config, "device": "cpu", "models": models}


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


def submitted_job_ids(run: Path) -> list[str]:
    """The SLURM job ids Snakemake's logs in the run folder (``.snakemake/log/``) record."""
    ids: list[str] = []
    for log in sorted(Path(run).glob(".snakemake/log/*.snakemake.log")):
        ids += SUBMITTED.findall(log.read_text(encoding="utf-8", errors="replace"))
    return list(dict.fromkeys(ids))


def sacct_table(text: str) -> pd.DataFrame:
    """Per rule, from ``sacct -P -n -o`` :data:`SACCT_FIELDS` output (allocation lines only): jobs,
    Σ elapsed seconds, Σ CPU seconds and the largest MaxRSS (MB) of a job's steps."""
    rows, peak = [], {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            continue
        rec = dict(zip(SACCT_FIELDS, parts))
        base = rec["JobID"].split(".")[0]
        peak[base] = max(peak.get(base, 0.0), _sacct_mb(rec["MaxRSS"]))
        m = re.match(r"'?rule_(\w+?)(?:_wildcards_|'?$)", rec["Comment"])
        if "." not in rec["JobID"] and m:
            rows.append(
                {"job": base, "rule": m[1], "elapsed_s": _sacct_s(rec["Elapsed"]), "cpu_s": _sacct_s(rec["TotalCPU"])}
            )
    table = pd.DataFrame(rows, columns=["job", "rule", "elapsed_s", "cpu_s"])
    table["max_rss_mb"] = [peak.get(j, 0.0) for j in table.job]
    return table.groupby("rule", sort=True).agg(
        jobs=("job", "size"), elapsed_s=("elapsed_s", "sum"), cpu_s=("cpu_s", "sum"), max_rss_mb=("max_rss_mb", "max")
    )


def _sacct_s(value: str) -> float:
    """sacct's [D-][HH:]MM:SS[.fff] in seconds."""
    days, _, hms = value.strip().rpartition("-")
    parts = [float(p) for p in hms.split(":") if p] or [0.0]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return 86400 * float(days or 0) + 3600 * parts[0] + 60 * parts[1] + parts[2]


def _sacct_mb(value: str) -> float:
    m = re.fullmatch(r"([\d.]+)([KMGT]?)", value.strip())
    return float(m[1]) * {"K": 1 / 1024, "": 1 / 1024**2, "M": 1, "G": 1024, "T": 1024**2}[m[2]] if m else 0.0


def sacct_lines(run: Path) -> list[str]:
    """SLURM's accounting of the run's jobs per rule (``sacct``), or one line saying why there is none."""
    import shutil
    import subprocess

    ids = submitted_job_ids(run)
    if not ids:
        return ["sacct: no SLURM job ids in the run's .snakemake/log/ (not a SLURM run)"]
    if shutil.which("sacct") is None:
        return [f"sacct: not on PATH; {len(ids)} SLURM jobs not read from accounting"]
    cmd = ["sacct", "-P", "-n", "-j", ",".join(ids), "-o", ",".join(SACCT_FIELDS)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return [f"sacct: no answer within 60 s; {len(ids)} SLURM jobs not read from accounting"]
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["exit status %d" % res.returncode])[-1]
        return [f"sacct: {why} ({len(ids)} SLURM jobs not read from accounting)"]
    table = sacct_table(res.stdout)
    if table.empty:
        return [f"sacct: no records of the run's {len(ids)} SLURM jobs (accounting storage off or purged)"]
    lines = ["sacct (SLURM accounting; shown beside the fit, which reads the benchmark files):"]
    return lines + [
        "  " + ln for ln in table.reset_index().to_string(index=False, float_format=lambda x: f"{x:.3g}").splitlines()
    ]


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
    """``resdyn calibrate``: measure, check the device kind, fit, write the rates file; the printed text."""
    cpu = kind == CPU_KIND
    jobs = measured_jobs(run, cpu_config(config) if cpu else config, None if cpu else kind)
    check_kind(jobs, kind)
    kinds, table = calibrate(jobs)
    write_rates(write, kinds, source)
    lines = [
        f"source of the fit: the benchmark files under {run / 'benchmarks/out'} ({len(jobs)} jobs)",
        render(table),
        "",
    ]
    for device, entry in kinds.items():
        fitted = ", ".join(f"{op} {rate:.3g}" for op, rate in entry["rates"].items()) or "none (start-up bound)"
        lines.append(f"{device}: start-up x{entry['startup_factor']:.3g}; fitted rates: {fitted}")
    lines.append(f"wrote {write}: `resdyn plan` and the SLURM resources use it (RESDYN_GPU_RATES=none: off)")
    lines += sacct_lines(run)
    reports = efficiency_reports(run)
    for report in reports:
        lines += efficiency_lines(report)
    if not reports:
        lines.append(
            "no SLURM efficiency report in the run folder: profiles/slurm writes one per run to logs/slurm/ "
            "(slurm-efficiency-report; docs/slurm.md, 'Calibrate after the first run')"
        )
    return "\n".join(lines)
