"""SLURM test helpers: the environment snakemake runs in, interruptible runs, the local cluster.

Used by tests/test_slurm.py, tests/test_slurm_mini.py and tests/test_requeue.py. `require_slurm`
skips a test when no SLURM node is reachable and fails it instead when RESDYN_REQUIRE_SLURM=1
(.ci/run sets it); `write_test_profile` adapts profiles/slurm to the local test cluster
(.ci/slurm-up).
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
import yte

REPO = Path(__file__).resolve().parents[2]
SLURM_PROFILE = REPO / "profiles" / "slurm"

# the plugin's first status check comes this many seconds after a submission; the local
# cluster's MinJobAge must be >= 3x this or the plugin falls back to sacct (no accounting here)
TEST_STATUS_DELAY_S = 2


# the plugin's line for each submission: "Job 3 has been submitted with SLURM jobid 14 (log: ...)"
SUBMITTED_RE = re.compile(r"submitted with SLURM jobid (\d+)")


def _bin_dir() -> Path:
    return Path(sys.executable).parent


def _env(**extra: str | None) -> dict[str, str]:
    """The test's environment for snakemake: the venv first on PATH, no SLURM job context, no
    RESDYN_SLURM_* site settings from the caller; then `extra` (None deletes a variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RESDYN_SLURM_", "SNAKEMAKE_PROFILE"))}
    env["PATH"] = f"{_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run(cmd, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run `cmd`; past `timeout` interrupt it like Ctrl-C (Snakemake then scancels its SLURM
    jobs, so none outlive the test), and fail with its output."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} ran over {timeout}s\n{out[-3000:]}\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _load_profile(path: Path, env: dict[str, str]) -> dict:
    """A profile's config.yaml as Snakemake reads it: YTE-processed under `env`."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        with open(path / "config.yaml") as f:
            return yte.process_yaml(f, require_use_yte=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@functools.lru_cache(maxsize=1)
def _probe_slurm() -> tuple[dict | None, str]:
    """({partition, cpus, mem_mb, min_job_age}, '') when a SLURM node is up, else (None, why)."""
    if shutil.which("sinfo") is None:
        return None, "no `sinfo` on PATH"
    try:
        res = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%P|%T|%c|%m"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        return None, "`sinfo` timed out (slurmctld not answering?)"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"`sinfo` failed: {last[:200]}"
    usable = []
    for line in res.stdout.splitlines():
        part, state, cpus, mem = line.split("|")
        if re.fullmatch(r"(idle|mixed|allocated|completing)", state):
            usable.append((part.endswith("*"), part.rstrip("*"), int(cpus), int(mem)))
    if not usable:
        return None, f"no usable SLURM node: {res.stdout.strip()[:300]!r}"
    usable.sort(reverse=True)  # the default partition first
    _, partition, cpus, mem = usable[0]
    min_job_age = None
    cfg = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20)
    m = re.search(r"^MinJobAge\s*=\s*(\d+)", cfg.stdout, re.M)
    if m:
        min_job_age = int(m.group(1))
    return {"partition": partition, "cpus": cpus, "mem_mb": mem, "min_job_age": min_job_age}, ""


def require_slurm() -> dict:
    info, why = _probe_slurm()
    if info is None:
        if os.environ.get("RESDYN_REQUIRE_SLURM") == "1":
            pytest.fail(f"RESDYN_REQUIRE_SLURM=1 but SLURM is not reachable: {why}", pytrace=False)
        pytest.skip(f"SLURM not reachable ({why}); start one with .ci/slurm-up")
    return info


def write_test_profile(dest: Path, slurm: dict, logdir: Path) -> Path:
    """profiles/slurm adapted to the local test cluster: its partition, no account, no GPUs,
    threads/memory capped to the node, squeue status checks (no accounting database)."""
    base = _load_profile(SLURM_PROFILE, _env())
    prof = copy.deepcopy(base)

    def cap_mem(value) -> str:  # a core's share, so that jobs can run side by side
        return f"min({value}, {slurm['mem_mb'] // slurm['cpus']})"

    dres = prof["default-resources"]
    dres.pop("slurm_account", None)
    dres["slurm_partition"] = repr(slurm["partition"])
    dres["mem_mb"] = cap_mem(dres["mem_mb"])
    for rule, res in prof["set-resources"].items():
        gpu_job = "cpus_per_gpu" in res
        for key in ("gpu", "cpus_per_gpu", "gpu_model", "slurm_partition", "slurm_account"):
            res.pop(key, None)
        if gpu_job:  # the rules ask the cost model for GPUs; the local cluster has none
            res["gpu"] = 0
        if "mem_mb" in res:
            res["mem_mb"] = cap_mem(res["mem_mb"])
    # A rule left with nothing to set would become a bare `--set-resources` (a usage error).
    prof["set-resources"] = {rule: res for rule, res in prof["set-resources"].items() if res}
    if not prof["set-resources"]:
        del prof["set-resources"]
    prof.update(
        {
            "max-threads": slurm["cpus"],
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


def _copy_repo(dest: Path) -> Path:
    """The repository's tracked and untracked-but-not-ignored files (no .venv, results, ...)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest
