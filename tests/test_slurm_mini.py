"""The paper run in miniature through real SLURM: configs/paper-mini.yaml, hub models and a hub
dataset from an offline HF cache (tests/helpers/hubcache.py), the literal profiles/slurm.

The local test cluster (.ci/slurm-up) has no GPU and a few cores, so `sbatch` is wrapped: the
wrapper records the exact options each submission asked for, then drops the GPU request and caps
CPUs/memory to what the node has before handing the job to the real sbatch. The test asserts on
the recorded options (every GPU rule asked for a GPU, its CPUs and its memory; CPU rules for no
GPU), and that every job's peak memory and elapsed time (SLURM's RunTime) stayed within what it
requested and was granted. The peak memory is the job's own: the script's peak RSS
(`getrusage`) that its log's closing line records (resdyn.pipeline.joblog.peak_memory), which
exists for every job however short; Snakemake's benchmark samples every 0.5 s and reads 0 for a
job that ends before its first sample, so it is only checked where it has a sample.

One checkpoint per family runs study A's Jacobians (OLMo 3 at step 0 and final, Gemma 4 its
activations; Llama 3.1 also spectra and bootstrap) and one Qwen2.5 model study B's lens, lens
metrics and the causal test: every rule profiles/slurm gives a GPU, about 17 SLURM jobs. The whole
preset runs in dry-run form in tests/test_hub.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from helpers.slurm import (
    SLURM_PROFILE,
    SUBMITTED_RE,
    TEST_STATUS_DELAY_S,
    _copy_repo,
    _env,
    _load_profile,
    _run,
    require_slurm,
)

MINI_TARGETS = (
    "results/llama31/main/spectra.tsv",
    "results/llama31/main/bootstrap.tsv",
    "results/olmo3/stage1-step0/jacobians/layers000-007",
    "results/olmo3/stage1-step1413814/jacobians/layers000-007",
    "results/olmo2_8l/main/jacobians/layers000-007",
    "results/gemma4_e4b/main/activations",
    "results/qwen25_8l/main/lens_metrics.tsv",
    "results/qwen25_8l/main/causal.tsv",
)

WRAPPER = """#!{python}
# sbatch/srun as the resdyn test sees them: record the options, fit the request to the local node
# (no GPU gres; at most the CPUs and memory a job may have there).
import json, os, re, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
cpus = min({cpus}, int(os.environ.get("SLURM_CPUS_ON_NODE", {cpus})))
out, i = [], 0
while i < len(args):
    a = args[i]
    if re.match(r"--(gpus|gres|gpus-per-task)(=|$)", a):
        i += 1 if "=" in a else 2
        continue
    m = re.fullmatch(r"--cpus-per-(gpu|task)=(\\d+)", a)
    if m:
        out.append("--cpus-per-task=%d" % min(int(m[2]), cpus))
    elif a in ("--mem", "--mem-per-cpu"):
        out += [a, str(min(int(args[i + 1]), {mem}))]
        i += 1
    else:
        out.append(a)
    i += 1
os.execv({real!r}, [{real!r}] + out)
"""


def _wrap_slurm(bin_dir: Path, logs: Path, cpus: int, mem_mb: int) -> Path:
    """`sbatch` and `srun` wrappers in ``bin_dir`` (put it first on PATH); calls go to
    ``logs/{sbatch,srun}.jsonl``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    for tool in ("sbatch", "srun"):
        real = shutil.which(tool)
        assert real, f"no {tool} on PATH"
        wrapper = bin_dir / tool
        wrapper.write_text(
            WRAPPER.format(python=sys.executable, log=str(logs / f"{tool}.jsonl"), cpus=cpus, mem=mem_mb, real=real)
        )
        wrapper.chmod(0o755)
    return bin_dir


def _gpu_rules() -> set[str]:
    """The rules profiles/slurm treats as GPU jobs (their GPU count is the cost model's; zoo_train
    only on request: no zoo in a hub run)."""
    prof = _load_profile(SLURM_PROFILE, _env())
    return {rule for rule, res in prof["set-resources"].items() if "cpus_per_gpu" in res} - {"zoo_train"}


def _profile(dest: Path, slurm: dict, logdir: Path) -> Path:
    """profiles/slurm as installed, with only the local cluster's partition, no account, squeue
    status checks (no accounting database) and kept logs; GPU/CPU/memory requests untouched."""
    prof = _load_profile(SLURM_PROFILE, _env())
    prof["default-resources"].pop("slurm_account", None)
    prof["default-resources"]["slurm_partition"] = repr(slurm["partition"])
    for res in prof["set-resources"].values():
        res.pop("slurm_partition", None)
        res.pop("slurm_account", None)
    prof.update(
        {
            "jobs": 4,
            "retries": 0,
            "keep-going": False,
            "latency-wait": 5,
            "slurm-status-command": "squeue",
            "slurm-init-seconds-before-status-checks": TEST_STATUS_DELAY_S,
            "slurm-logdir": str(logdir),
            "slurm-keep-successful-logs": True,
        }
    )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return dest


class _JobWatcher(threading.Thread):
    """Polls `scontrol -o show job` (finished jobs stay MinJobAge seconds) and keeps the last
    record of every job: state, run time, time limit, granted CPUs and memory."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.jobs: dict[str, dict] = {}
        self.stop = threading.Event()

    def poll(self) -> None:
        res = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True, timeout=30)
        for line in res.stdout.splitlines():
            rec = dict(re.findall(r"(\w+)=(\S*)", line))
            if "JobId" in rec:
                self.jobs[rec["JobId"]] = rec

    def run(self) -> None:
        while not self.stop.wait(2):
            try:
                self.poll()
            except subprocess.TimeoutExpired:  # a slow answer on a loaded machine: ask again, keep watching
                continue


def _seconds(slurm_time: str) -> float:
    """SLURM's [D-]HH:MM:SS or MM:SS (or a bare number of minutes for -t) in seconds."""
    if re.fullmatch(r"\d+", slurm_time):
        return 60.0 * int(slurm_time)
    days, _, hms = slurm_time.rpartition("-")
    parts = [int(p) for p in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return 86400 * int(days or 0) + 3600 * parts[0] + 60 * parts[1] + parts[2]


def _mb(value: str) -> float:
    m = re.fullmatch(r"([\d.]+)([KMGT]?)", value)
    return float(m[1]) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[m[2]]


def _option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


@pytest.mark.slurm
@pytest.mark.slow
def test_paper_mini_through_slurm(tmp_path, mini_hf_home):
    slurm = require_slurm()
    GPU_RULES = _gpu_rules()
    wd = _copy_repo(tmp_path / "repo")
    calls = tmp_path / "calls"
    # two jobs side by side on the test node: one core and half its memory each
    wrapper_dir = _wrap_slurm(tmp_path / "bin", calls, 1, slurm["mem_mb"] // 2)
    profile = _profile(tmp_path / "profile", slurm, tmp_path / "slurm-logs")
    env = _env(HF_HOME=str(mini_hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(wd))
    env["PATH"] = f"{wrapper_dir}:{env['PATH']}"

    watcher = _JobWatcher()
    watcher.start()
    t0 = time.monotonic()
    # 1800 s: a guard against a hang, not a speed (6-11 min on the shared 2-core machine)
    res = _run(
        ["snakemake", *MINI_TARGETS, "--configfile", "configs/paper-mini.yaml", "--profile", str(profile)],
        wd,
        env,
        1800,
    )
    wall = time.monotonic() - t0
    watcher.stop.set()
    watcher.join()
    watcher.poll()
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-8000:]
    submitted = SUBMITTED_RE.findall(log)
    recorded = [json.loads(line) for line in (calls / "sbatch.jsonl").read_text().splitlines()]
    steps = [json.loads(line) for line in (calls / "srun.jsonl").read_text().splitlines()]
    assert len(steps) == len(submitted)  # each job ran its rule as one job step
    for step in steps:  # ... and the step inside a GPU job asked for the GPU again
        rule = step[step.index("--target-jobs") + 1].split(":")[0]
        assert any(re.match(r"--(gpus|gres)=(gpu:)?1$", a) for a in step) == (rule in GPU_RULES), step[:6]
    assert len(recorded) == len(submitted) > 0

    # --- what each submission asked for (the literal profile), matched to SLURM's job by comment ---
    by_comment = {_option(args, "--comment").strip("'\""): args for args in recorded}
    rows = []
    for jobid in submitted:
        rec = watcher.jobs.get(jobid)
        assert rec is not None, f"job {jobid} never seen by scontrol"
        args = by_comment[rec["Comment"]]
        rule, wildcards = re.match(r"rule_(\w+?)(?:_wildcards_(.*))?$", rec["Comment"]).group(1, 2)
        gpus = _option(args, "--gpus") or _option(args, "--gres")
        cpus = _option(args, "--cpus-per-gpu") if gpus else _option(args, "--cpus-per-task")
        rows.append(
            {
                "jobid": jobid,
                "rule": rule,
                "wildcards": wildcards or "",
                "gpus": gpus,
                "cpus": cpus,
                "mem_mb": int(_option(args, "--mem")),
                "time_s": _seconds(_option(args, "-t")),
            }
        )
    assert GPU_RULES <= {job["rule"] for job in rows}, (GPU_RULES, rows)  # every GPU rule ran
    for job in rows:
        if job["rule"] in GPU_RULES:
            assert job["gpus"] is not None and re.fullmatch(r"(gpu:)?(\w+:)?1", job["gpus"]), job
            assert job["cpus"] is not None and int(job["cpus"]) >= 1, job
        else:
            assert job["gpus"] is None, job
        assert job["mem_mb"] > 0 and job["time_s"] > 0, job
    jobs = pd.DataFrame(rows)
    assert not {"corpus", "resolve_checkpoint", "phases"} & set(jobs.rule)  # local rules: submit host

    # --- what each job used: SLURM's run time, the benchmark's peak memory ---
    used = []
    for _, job in jobs.iterrows():
        rec = watcher.jobs[job.jobid]
        assert rec["JobState"] == "COMPLETED", rec
        parts = job.wildcards.split("_") if job.wildcards else []
        where = Path(job.rule, *_wildcard_path(job.rule, parts))
        b = pd.read_csv(wd / "benchmarks" / "out" / where.with_suffix(".tsv"), sep="\t").iloc[0]
        used.append(
            {
                "granted_mem_mb": _mb(rec["MinMemoryNode"]),
                "granted_cpus": int(rec["NumCPUs"]),
                "limit_s": _seconds(rec["TimeLimit"]),
                "elapsed_s": _seconds(rec["RunTime"]),
                "rule_s": float(b["s"]),
                "peak_rss_mb": _logged_peak_mb(wd / "logs" / where.with_suffix(".log")),
                "bench_rss_mb": float(b["max_rss"]),
            }
        )
    table = pd.concat([jobs.reset_index(drop=True), pd.DataFrame(used)], axis=1).fillna({"gpus": "-"})
    table.to_csv(tmp_path / "jobs.tsv", sep="\t", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(f"\n[paper-mini via SLURM] {len(table)} jobs, {wall:.0f} s wall\n{table.to_string(index=False)}")
    assert (table.peak_rss_mb > 0).all() and (table.peak_rss_mb <= table.granted_mem_mb).all()
    assert (table.bench_rss_mb <= table.granted_mem_mb).all()  # 0 where the sampler missed a short job
    assert (table.granted_mem_mb <= table.mem_mb).all()
    assert (table.elapsed_s <= table.limit_s).all() and (table.limit_s <= table.time_s).all()
    assert (table.rule_s <= table.elapsed_s + 1).all()

    # --- the science side ran on the right checkpoints ---
    import h5py

    for target in MINI_TARGETS:
        assert (wd / target).exists(), target
    for model, ckpt in (
        ("llama31", "main"),
        ("olmo3", "stage1-step0"),
        ("olmo3", "stage1-step1413814"),
        ("olmo2_8l", "main"),
    ):
        for f in (wd / "results" / model / ckpt / "jacobians" / "layers000-007").glob("layer*.h5"):
            with h5py.File(f, "r") as h5:
                assert h5["attn"]["mean"].shape == (32, 32), f
        record = json.loads((wd / "models" / model / ckpt / "checkpoint.json").read_text())
        refs = mini_hf_home / "hub" / f"models--{record['repo'].replace('/', '--')}" / "refs" / record["revision"]
        assert record["revision"] == ckpt and record["resolved_commit"] == refs.read_text()
    assert not pd.read_csv(wd / "results" / "qwen25_8l" / "main" / "causal.tsv", sep="\t").empty
    again = _run(["snakemake", *MINI_TARGETS, "--configfile", "configs/paper-mini.yaml", "-n"], wd, env, 300)
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    _calibrate_and_plan_again(wd, env, tmp_path)


#: Per rule, over the jobs of the config that left a benchmark file in the run (argv: config, run):
#: Σ measured wall seconds and Σ planned seconds (resdyn.pipeline.plan.job_row).
_PER_RULE = """
import json, sys
from pathlib import Path
import pandas as pd
from resdyn.pipeline import calibrate, dag, plan, config as rc
cfg, run = rc.load_config(sys.argv[1]), Path(sys.argv[2])
out = {"measured": {}, "planned": {}}
for rule, w in dag.unique_jobs(cfg):
    bench = run / calibrate.job_files(rule, w)[0]
    if bench.is_file():
        out["measured"][rule] = out["measured"].get(rule, 0.0) + float(pd.read_csv(bench, sep="\\t").iloc[-1]["s"])
        out["planned"][rule] = out["planned"].get(rule, 0.0) + plan.job_row(cfg, rule, w)["seconds"]
print(json.dumps(out))
"""


def _calibrate_and_plan_again(wd: Path, env: dict, tmp_path: Path) -> None:
    """`resdyn calibrate --gpu cpu` on the run (its GPU rules ran on the node's CPUs), then the plan
    of the same config on CPUs, in a fresh process reading the rates file: every rule's planned
    seconds within 25 % of its measured ones (the benchmark files' Σ wall seconds)."""
    rates = tmp_path / "rates.yaml"
    cal = _run(
        [sys.executable, "-m", "resdyn.cli", "calibrate", ".", "--configfile", "configs/paper-mini.yaml"]
        + ["--gpu", "cpu", "--write", str(rates)],
        wd,
        env,
        300,
    )
    assert cal.returncode == 0, cal.stderr[-3000:]
    print(f"\n[resdyn calibrate --gpu cpu]\n{cal.stdout}")
    assert "source of the fit: the benchmark files" in cal.stdout and "sacct" in cal.stdout
    cpu_cfg = tmp_path / "paper-mini-cpu.yaml"
    mini = yaml.safe_load((wd / "configs" / "paper-mini.yaml").read_text())
    cpu_cfg.write_text(yaml.safe_dump({**mini, "device": "cpu"}, sort_keys=False))
    planned = {}
    for name, value in (("before", "none"), ("after", str(rates))):
        proc = _run(
            [sys.executable, "-c", _PER_RULE, str(cpu_cfg), str(wd)], wd, {**env, "RESDYN_GPU_RATES": value}, 300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        planned[name] = json.loads(proc.stdout)
    measured = planned["after"]["measured"]
    rows = [(r, measured[r], planned["before"]["planned"][r], planned["after"]["planned"][r]) for r in sorted(measured)]
    print("rule\tmeasured_s\tplanned_before_s\tplanned_after_s")
    print("\n".join(f"{r}\t{m:.1f}\t{b:.1f}\t{a:.1f}" for r, m, b, a in rows))
    assert all(abs(a / m - 1) <= 0.25 for r, m, _, a in rows), rows


def _logged_peak_mb(log: Path) -> float:
    """The peak host RSS in MiB that a job's log records in its closing line ("... peak memory host
    123.4 MiB"): the script's own getrusage maximum, there for every job that finished."""
    found = re.findall(r"peak memory host ([\d.]+) (B|KiB|MiB|GiB)", log.read_text())
    assert found, f"{log}: no 'peak memory host' line"
    value, unit = found[-1]
    return float(value) * {"B": 1 / 1024**2, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}[unit]


def _wildcard_path(rule: str, values: list[str]) -> list[str]:
    """Benchmark path parts of a job from its SLURM comment's wildcard values (joined by '_',
    which model names also contain: the checkpoint/block values are split off the end)."""
    n_after_model = {"samples": 0, "lens_tokens": 0, "jacobians": 2}.get(rule, 1)
    if n_after_model == 0:
        return ["_".join(values)]
    return ["_".join(values[:-n_after_model]), *values[-n_after_model:]]


def test_the_logged_peak_exists_for_a_job_too_short_to_sample(tmp_path):
    """The measure the SLURM test reads: a job that does nothing (shorter than any sampler's first
    sample) still closes its log with its own peak RSS, > 0 and what getrusage says."""
    import resource
    import types

    from resdyn.provenance import sidecars

    log = tmp_path / "logs" / "resolution" / "m" / "c.log"
    job = types.SimpleNamespace(
        rule="resolution", input=[], output=[], log=[str(log)], threads=1, wildcards={}, params={}
    )
    with sidecars.step(job):
        pass
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    unit = re.findall(r"peak memory host [\d.]+ (B|KiB|MiB|GiB)", log.read_text())[-1]
    half_digit = 0.05 * {"B": 1 / 1024**2, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}[unit]  # printed to 0.1
    assert 0 < _logged_peak_mb(log) <= own + half_digit
    log.write_text("rule resolution, wildcards {}\n")  # a log without its closing line (the job died)
    with pytest.raises(AssertionError, match="no 'peak memory host' line"):
        _logged_peak_mb(log)
