"""Time a whole pipeline run, per rule: jobs, seconds, start-up vs compute, peak memory.

    .venv/bin/python benchmarks/run.py [--configfile configs/smoke.yaml] [--cores 2] [--directory DIR]
    .venv/bin/python benchmarks/run.py --no-run --directory DIR     # tabulate a finished run

Runs ``snakemake --profile profiles/local --cores N`` from scratch in DIR (default: a fresh
temporary folder holding a copy of the config; nothing in the repository is touched), then its
``--report`` (as ``make run`` does), and prints the wall time of both and one row per rule.
Asserts nothing.

Sources, per job (a job = one ``job_hash`` in Snakemake's ``.snakemake/metadata`` records):
- job seconds: ``endtime − starttime`` of Snakemake's record (the whole job: Python start-up,
  imports, the script, writing outputs);
- compute seconds: ``end − start`` of the job's provenance sidecar (``<output>.prov.json``,
  written by ``resdyn.provenance.sidecars.step`` from the moment the script's imports are done), so
  start-up = job − compute. The sidecar's times have one-second resolution: ±1 s per job;
- peak RSS and CPU seconds: the rule's ``benchmark:`` files (``benchmarks/out/<rule>/…``,
  Snakemake's own ``max_rss`` in MB and ``cpu_time``); "–" for a rule without one. Snakemake
  samples a job every 0.5 s (every 30 s after its first 30 s), so these CPU seconds miss each
  job's last interval: a lower bound.
The run's exact CPU total comes from the operating system: ``getrusage(RUSAGE_CHILDREN)`` of
this process covers Snakemake and every job it waited for; Snakemake's own process (scheduling,
bookkeeping, the ``benchmark:`` sampling itself) is read with psutil every 0.5 s.
The machine's load average (1 min) before and after the run is printed too: on a shared machine
wall times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def metadata_jobs(workdir: Path) -> dict[tuple[str, int], dict]:
    """{(rule, job_hash): {"start", "end", "outputs"}} from Snakemake's per-output metadata."""
    jobs: dict[tuple[str, int], dict] = {}
    meta = workdir / ".snakemake" / "metadata"
    if not meta.is_dir():
        return jobs
    import base64

    for f in meta.rglob("*"):
        if not f.is_file():
            continue
        try:
            rec = json.loads(f.read_text())
            # urlsafe base64 of the output path, split into 255-character folder names if long
            output = base64.urlsafe_b64decode("".join(p.lstrip("@") for p in f.relative_to(meta).parts)).decode()
        except (ValueError, OSError):
            continue
        if rec.get("starttime") is None or rec.get("endtime") is None:
            continue
        key = (rec["rule"], rec.get("job_hash"))
        job = jobs.setdefault(key, {"start": rec["starttime"], "end": rec["endtime"], "outputs": []})
        job["start"] = min(job["start"], rec["starttime"])
        job["end"] = max(job["end"], rec["endtime"])
        job["outputs"].append(output)
    return jobs


def compute_seconds(workdir: Path, outputs: list[str]) -> float | None:
    """``end − start`` of the first provenance sidecar among a job's outputs (None if none)."""
    for out in sorted(outputs):
        side = workdir / f"{out}.prov.json"
        if side.is_file():
            try:
                prov = json.loads(side.read_text())
                return (datetime.fromisoformat(prov["end"]) - datetime.fromisoformat(prov["start"])).total_seconds()
            except (KeyError, TypeError, ValueError):
                return None
    return None


def benchmark_files(workdir: Path) -> dict[str, list[dict]]:
    """{rule: [row of each benchmark TSV]} from ``benchmarks/out/<rule>/**.tsv``."""
    out: dict[str, list[dict]] = defaultdict(list)
    root = workdir / "benchmarks" / "out"
    if not root.is_dir():
        return out
    for f in root.rglob("*.tsv"):
        rule = f.relative_to(root).parts[0]
        lines = f.read_text().splitlines()
        if len(lines) >= 2:
            head, *rows = (line.split("\t") for line in lines)
            for row in rows:
                out[rule].append(dict(zip(head, row)))
    return out


def table(workdir: Path) -> list[dict]:
    """One row per rule (see the module docstring), sorted by total seconds."""
    per_rule: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "total": 0.0, "compute": 0.0, "timed": 0})
    for (rule, _), job in metadata_jobs(workdir).items():
        r = per_rule[rule]
        r["jobs"] += 1
        wall = job["end"] - job["start"]
        r["total"] += wall
        c = compute_seconds(workdir, job["outputs"])
        if c is not None:
            r["compute"] += min(c, wall)
            r["timed"] += 1
    bench = benchmark_files(workdir)
    rows = []
    for rule, r in per_rule.items():
        b = bench.get(rule, [])
        rss = max((float(x["max_rss"]) for x in b if x.get("max_rss") not in (None, "", "NA", "-")), default=None)
        cpu = sum(float(x["cpu_time"]) for x in b if x.get("cpu_time") not in (None, "", "NA", "-")) if b else None
        startup = r["total"] - r["compute"] if r["timed"] == r["jobs"] else None
        rows.append(
            dict(
                rule=rule,
                jobs=r["jobs"],
                total=r["total"],
                startup=startup,
                compute=r["compute"] if r["timed"] == r["jobs"] else None,
                cpu=cpu,
                rss=rss,
            )
        )
    return sorted(rows, key=lambda x: -x["total"])


def fmt(x, spec: str) -> str:
    """``format(x, spec)``; a dash of the same width for a missing value."""
    if x is not None:
        return format(x, spec)
    return format("–", ">" + spec.lstrip(">").split(".")[0])


def print_table(rows: list[dict]) -> None:
    print(
        f"{'rule':<20} {'jobs':>5} {'total s':>9} {'start-up s':>11} {'compute s':>10} {'cpu s':>8} {'peak RSS MB':>12}"
    )
    for r in rows:
        print(
            f"{r['rule']:<20} {r['jobs']:>5} {r['total']:>9.1f} {fmt(r['startup'], '>11.1f')} "
            f"{fmt(r['compute'], '>10.1f')} "
            f"{fmt(r['cpu'], '>8.1f')} {fmt(r['rss'], '>12.0f')}"
        )
    jobs = sum(r["jobs"] for r in rows)
    total = sum(r["total"] for r in rows)
    known = [r for r in rows if r["startup"] is not None]
    print(
        f"{'all':<20} {jobs:>5} {total:>9.1f} {sum(r['startup'] for r in known):>11.1f} "
        f"{sum(r['compute'] for r in known):>10.1f}   "
        f"(start-up/compute over {sum(r['jobs'] for r in known)} jobs with a sidecar)"
    )
    rss = [r["rss"] for r in rows if r["rss"] is not None]
    if rss:
        print(f"largest peak RSS of one job: {max(rss):.0f} MB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", help="a preset (default: the repository's config.yaml)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--directory", help="working directory of the run (default: a new temporary folder)")
    ap.add_argument("--no-run", action="store_true", help="only tabulate the run already in --directory")
    ap.add_argument("--snakemake", default=str(Path(sys.executable).with_name("snakemake")))
    args = ap.parse_args(argv)

    if args.no_run:
        if not args.directory:
            ap.error("--no-run needs --directory")
        print_table(table(Path(args.directory)))
        return
    workdir = Path(args.directory or tempfile.mkdtemp(prefix="resdyn-run-"))
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "config.yaml", workdir / "config.yaml")
    cmd = [
        args.snakemake,
        "-s",
        str(REPO / "Snakefile"),
        "--profile",
        str(REPO / "profiles" / "local"),
        "--cores",
        str(args.cores),
        "--directory",
        str(workdir),
    ]
    if args.configfile:
        cmd += ["--configfile", str(Path(args.configfile).resolve())]
    # As `make run` does before Snakemake: the package's bytecode, so that jobs do not compile it.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "resdyn")], check=True)
    load0 = os.getloadavg()[0]
    wall, own_cpu, all_cpu, returncode, err = run_snakemake(cmd, workdir)
    load1 = os.getloadavg()[0]
    if returncode:
        sys.stderr.write(err[-4000:])
        sys.exit(f"snakemake failed (exit {returncode}) in {workdir}")
    print(f"run: {' '.join(cmd[1:])}")
    print(
        f"wall {wall:.1f} s ({wall / 60:.1f} min) in {workdir}; "
        f"load average (1 min) before {load0:.2f}, after {load1:.2f}; "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"CPU: {all_cpu:.1f} s in all processes (user + system, every job and Snakemake), of which Snakemake's own "
        f"process {own_cpu:.1f} s"
    )
    # `make run` ends with the report: time it too.
    t1 = time.perf_counter()
    report = subprocess.run(
        cmd + ["--report", str(workdir / "report.html")],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    report_wall = time.perf_counter() - t1
    if report.returncode:
        sys.stderr.write(report.stderr[-4000:])
        sys.exit(f"snakemake --report failed (exit {report.returncode}) in {workdir}")
    print(
        f"report.html: {report_wall:.1f} s; `make run` = run + report: {wall + report_wall:.1f} s "
        f"({(wall + report_wall) / 60:.1f} min)"
    )
    rows = table(workdir)
    print_table(rows)
    sampled = sum(r["cpu"] for r in rows if r["cpu"] is not None)
    print(
        f"the benchmark files' cpu s sum to {sampled:.1f} (sampled: a lower bound of the jobs' {all_cpu - own_cpu:.1f})"
    )


def run_snakemake(cmd: list[str], workdir: Path) -> tuple[float, float, float, int, str]:
    """Run ``cmd``; (wall s, Snakemake's own CPU s, CPU s of it and all its descendants, exit code, stderr)."""
    import psutil  # a dependency of Snakemake

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=err, text=True)
        me, own = psutil.Process(proc.pid), 0.0
        while proc.poll() is None:
            try:
                t = me.cpu_times()
                own = t.user + t.system
            except psutil.Error:
                pass
            time.sleep(0.5)
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, own, total, proc.returncode, stderr


if __name__ == "__main__":
    main()
