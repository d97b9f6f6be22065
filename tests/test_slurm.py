"""SLURM profile tests.

Without a cluster (always run):
  * profiles/slurm and profiles/local parse, and give the GPU rules (jacobians, activations,
    lens) a GPU and their own partition while CPU rules stay on the CPU partition;
  * the literal `snakemake --profile slurm -n` resolves the profile after
    `make install-slurm-profile` (HOME pointed at a temporary directory).

With a real SLURM (marker `slurm`; .ci/slurm-up starts one on localhost):
  * a small workflow runs through the SLURM executor with a test profile derived from
    profiles/slurm (with RESDYN_SLURM_SMOKE=1 also the `configs/smoke.yaml` preset; the
    repository's workflow runs through SLURM in tests/test_slurm_mini.py, configs/paper-mini.yaml).
These skip when SLURM is not reachable, and FAIL instead when RESDYN_REQUIRE_SLURM=1.
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
import textwrap
import time
from pathlib import Path

import pytest
import yaml
import yte

REPO = Path(__file__).resolve().parents[1]
SLURM_PROFILE = REPO / "profiles" / "slurm"
LOCAL_PROFILE = REPO / "profiles" / "local"
GPU_RULES = ("jacobians", "activations", "lens", "lens_metrics")
# rules that load no model but run their decompositions on the GPU (resdyn.cluster.cost.GPU_LINALG_RULES)
GPU_LINALG_RULES = ("spectra", "bootstrap")
# the plugin's first status check comes this many seconds after a submission; the local
# cluster's MinJobAge must be >= 3x this or the plugin falls back to sacct (no accounting here)
TEST_STATUS_DELAY_S = 2
# the plugin's line for each submission: "Job 3 has been submitted with SLURM jobid 14 (log: ...)"
SUBMITTED_RE = re.compile(r"submitted with SLURM jobid (\d+)")


# ------------------------------------------------------------------------------------ helpers


def _bin_dir() -> Path:
    return Path(sys.executable).parent


def _env(**extra: str | None) -> dict[str, str]:
    """The test's environment for snakemake: the venv first on PATH, no SLURM job context, no
    RESDYN_SLURM_* site settings from the caller; then `extra` (None deletes a variable)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RESDYN_SLURM_", "SNAKEMAKE_PROFILE"))
    }
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
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
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


def _job_resources(dry_run_output: str) -> dict[str, dict[str, str]]:
    """rule name -> {resource: value} from the job listing of `snakemake -n`."""
    jobs: dict[str, dict[str, str]] = {}
    rule = None
    for line in dry_run_output.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if m:
            rule = m.group(1)
        elif rule and line.strip().startswith("resources:"):
            items = line.strip()[len("resources:") :].split(", ")
            jobs[rule] = dict(item.strip().split("=", 1) for item in items if "=" in item)
    return jobs


TOY_SNAKEFILE = textwrap.dedent("""
    # throwaway workflow whose rule names are the ones profiles/slurm configures
    rule all:
        input: "spectra.txt", "lens_metrics.txt", "activations.txt", "zoo.txt"

    rule zoo_train:
        output: "zoo.txt"
        shell: "echo ${{SLURM_JOB_ID:-none}} {threads} > {output}"

    rule jacobians:
        input: "zoo.txt"
        output: "jacobians.txt"
        threads: 1
        resources: gpu=1
        shell: "echo ${{SLURM_JOB_ID:-none}} ${{SLURM_CPUS_PER_TASK:-none}} {threads} > {output}"

    rule activations:
        output: "activations.txt"
        resources: gpu=1
        shell: "echo ${{SLURM_JOB_ID:-none}} > {output}"

    rule lens:
        output: "lens.txt"
        resources: gpu=2
        shell: "echo ${{SLURM_JOB_ID:-none}} > {output}"

    rule lens_metrics:
        input: "lens.txt"
        output: "lens_metrics.txt"
        resources: gpu=1
        shell: "echo ${{SLURM_JOB_ID:-none}} > {output}"

    rule spectra:
        input: "jacobians.txt"
        output: "spectra.txt"
        resources: gpu=1
        script: "scripts/spectra.py"

    rule fails:
        output: "never.txt"
        shell: "echo 'failing on purpose' >&2; exit 3"
    """)

TOY_SCRIPT = textwrap.dedent("""
    import os
    job_id, cpus, threads = open(snakemake.input[0]).read().split()
    with open(snakemake.output[0], "w") as f:
        f.write(f"{job_id} {cpus} {threads} {os.environ.get('SLURM_JOB_ID', 'none')}\\n")
    """)


def _toy_workflow(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "Snakefile").write_text(TOY_SNAKEFILE)
    (where / "scripts").mkdir(exist_ok=True)
    (where / "scripts" / "spectra.py").write_text(TOY_SCRIPT)
    return where


def _install_profile(home: Path) -> None:
    """What users run: `make install-slurm-profile` (the Makefile's target once the lead has
    has it; without it the same two steps, done here)."""
    env = _env(HOME=str(home), XDG_CONFIG_HOME=None)
    makefile = REPO / "Makefile"
    if makefile.exists() and re.search(r"^install-slurm-profile:", makefile.read_text(), re.M):
        res = _run(["make", "-s", "-C", str(REPO), "install-slurm-profile"], REPO, env, 60)
        assert res.returncode == 0, res.stdout + res.stderr
    else:
        target_dir = home / ".config" / "snakemake"
        target_dir.mkdir(parents=True, exist_ok=True)
        link = target_dir / "slurm"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(SLURM_PROFILE, target_is_directory=True)


# ------------------------------------------------------------------ profile tests (no SLURM)


def test_profiles_are_valid_yaml_with_expected_keys():
    slurm = _load_profile(SLURM_PROFILE, _env())
    assert slurm["executor"] == "slurm"
    for key in (
        "jobs",
        "retries",
        "latency-wait",
        "rerun-incomplete",
        "printshellcmds",
        "slurm-logdir",
        "default-resources",
        "set-resources",
        "set-threads",
    ):
        assert key in slurm, key
    # threads come from set-threads: cpus_per_task would silently override them
    for rule, res in slurm["set-resources"].items():
        assert "cpus_per_task" not in res, rule
    for rule in (*GPU_RULES, *GPU_LINALG_RULES):
        # GPUs per job are the rules' (the cost model's: more than one for a model that does not fit)
        assert "gpu" not in slurm["set-resources"][rule]
        assert slurm["set-resources"][rule]["cpus_per_gpu"] == slurm["set-threads"][rule]
    assert slurm["slurm-requeue"] is True
    local = _load_profile(LOCAL_PROFILE, _env())
    assert local["keep-going"] is False and local["cores"] == "all"
    assert "executor" not in local


@pytest.mark.parametrize(
    "site",
    [
        {},
        {
            "RESDYN_SLURM_PARTITION": "cpuq",
            "RESDYN_SLURM_GPU_PARTITION": "gpuq",
            "RESDYN_SLURM_ACCOUNT": "proj42",
            "RESDYN_SLURM_GPU_MODEL": "a100",
            "RESDYN_SLURM_CPUS_PER_GPU": "6",
        },
        {"RESDYN_SLURM_GPU_PARTITION": "gpuq", "RESDYN_SLURM_ZOO_GPU": "1"},
    ],
    ids=["unset", "all-set", "zoo-gpu"],
)
def test_slurm_profile_resources(tmp_path, site):
    """GPU rules get a GPU (and the GPU partition), CPU rules never do."""
    wf = _toy_workflow(tmp_path / "wf")
    # --cores: a dry run caps threads at its default of 1 core, SLURM runs do not
    res = _run(
        ["snakemake", "--profile", str(SLURM_PROFILE), "-n", "--cores", "64", "-p"],
        wf,
        _env(**site),
        120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    jobs = _job_resources(res.stdout)
    assert set(jobs) >= {*GPU_RULES, "zoo_train", "spectra"}, res.stdout
    zoo_gpu = site.get("RESDYN_SLURM_ZOO_GPU") == "1"
    gpu_rules = set(GPU_RULES) | set(GPU_LINALG_RULES) | ({"zoo_train"} if zoo_gpu else set())
    cpus_per_gpu = site.get("RESDYN_SLURM_CPUS_PER_GPU", "8")
    for rule, resources in jobs.items():
        if rule == "all":
            continue
        if rule in gpu_rules:
            assert resources.get("gpu") == ("2" if rule == "lens" else "1"), (rule, resources)
            assert resources.get("cpus_per_gpu") == cpus_per_gpu, (rule, resources)
            assert resources.get("slurm_partition") == site.get("RESDYN_SLURM_GPU_PARTITION"), (
                rule,
                resources,
            )
            assert resources.get("gpu_model") == site.get("RESDYN_SLURM_GPU_MODEL"), (
                rule,
                resources,
            )
        else:
            assert "gpu" not in resources and "cpus_per_gpu" not in resources, (rule, resources)
            assert resources.get("slurm_partition") == site.get("RESDYN_SLURM_PARTITION"), (
                rule,
                resources,
            )
        assert resources.get("slurm_account") == site.get("RESDYN_SLURM_ACCOUNT"), (rule, resources)
        assert "runtime" in resources and "mem_mb" in resources, (rule, resources)
    # set-threads reached the jobs (spectra: default 1)
    assert re.search(rf"echo \S+ \S+ {cpus_per_gpu} > jacobians.txt", res.stdout), res.stdout


def test_local_profile_dry_run(tmp_path):
    wf = _toy_workflow(tmp_path / "wf")
    res = _run(["snakemake", "--profile", str(LOCAL_PROFILE), "-n"], wf, _env(), 120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "jacobians" in res.stdout


@pytest.mark.parametrize("where", ["toy", "repo"])
def test_bare_profile_name_resolves_after_install(tmp_path, where):
    """`snakemake --profile slurm` looks in ./, ~/.config/snakemake/ ($XDG_CONFIG_HOME) and
    /etc/xdg/snakemake/ — not in profiles/ (that is --workflow-profile)."""
    if where == "repo":
        if not (REPO / "Snakefile").exists():
            pytest.skip("the repository has no Snakefile yet")
        assert not (REPO / "slurm").exists(), "a ./slurm would shadow the installed profile"
        cwd = REPO
    else:
        cwd = _toy_workflow(tmp_path / "wf")
    home = tmp_path / "home"
    home.mkdir()
    env = _env(HOME=str(home), XDG_CONFIG_HOME=None)
    cmd = ["snakemake", "--profile", "slurm", "-n"]

    if not Path("/etc/xdg/snakemake/slurm").exists():  # a site-wide profile would answer
        before = _run(cmd, cwd, env, 120)
        assert before.returncode != 0
        assert "profile directory given (slurm)" in before.stderr, before.stderr

    _install_profile(home)
    installed = home / ".config" / "snakemake" / "slurm"
    # a link to profiles/slurm or a copy of it
    assert (installed / "config.yaml").read_text() == (SLURM_PROFILE / "config.yaml").read_text()

    after = _run(cmd, cwd, env, 300)
    assert after.returncode == 0, after.stdout + after.stderr
    if where == "toy":
        jobs = _job_resources(after.stdout)
        assert jobs["jacobians"].get("gpu") == "1", after.stdout  # the profile was applied
        assert jobs["spectra"].get("gpu") == "1", after.stdout  # decompositions on the GPU
        assert "gpu" not in jobs["zoo_train"], after.stdout
    # installing again is harmless
    _install_profile(home)
    assert (installed / "config.yaml").read_text() == (SLURM_PROFILE / "config.yaml").read_text()


# --------------------------------------------------------------------- real SLURM (localhost)


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


SMOKE_SLURM_TARGETS = ("results/tiny_llama/step30/coupling.tsv", "results/tiny_llama/step30/lens_metrics.tsv")


def _smoke_available() -> bool:
    return (REPO / "Snakefile").exists() and (REPO / "configs" / "smoke.yaml").exists()


@pytest.mark.slurm
@pytest.mark.slow
# The repository's own workflow runs through SLURM in tests/test_slurm_mini.py (configs/paper-mini.yaml:
# hub models of every family, every GPU rule); the smoke variant below stays for manual runs
# (`pytest tests/test_slurm.py -k smoke -m slurm`) but is not in CI, which has no time for both.
@pytest.mark.parametrize("workflow", ["toy", pytest.param("smoke", marks=pytest.mark.skipif(
    os.environ.get("RESDYN_SLURM_SMOKE") != "1", reason="covered by test_slurm_mini; RESDYN_SLURM_SMOKE=1 runs it"))])
def test_workflow_runs_through_slurm(tmp_path, workflow):
    slurm = require_slurm()
    if slurm["min_job_age"] is not None:
        assert slurm["min_job_age"] >= 3 * TEST_STATUS_DELAY_S, (
            "MinJobAge too short: the plugin would fall back to sacct",
            slurm,
        )
    profile = write_test_profile(tmp_path / "profile", slurm, tmp_path / "slurm-logs")
    env = _env()

    if workflow == "toy":
        wd = _toy_workflow(tmp_path / "wf")
        args = ["all"]
        timeout = 300
    else:
        if not _smoke_available():
            pytest.skip("Snakefile and configs/smoke.yaml not in the repository yet")
        wd = _copy_repo(tmp_path / "repo")
        # One model's path through the smoke DAG: every GPU-resourced rule (jacobians,
        # activations, lens, lens_metrics) and the CPU rules feeding them, ~14 SLURM jobs. The
        # whole preset (~100 jobs at 10-15 s of SLURM overhead each on 2 cores) runs locally in
        # tests/test_pipeline.py; here the executor, resources and profile are what is tested.
        # The targets first: --configfile takes every word after it.
        args = [*SMOKE_SLURM_TARGETS, "--configfile", "configs/smoke.yaml"]
        timeout = 1200

    t0 = time.monotonic()
    res = _run(["snakemake", *args, "--profile", str(profile)], wd, env, timeout)
    elapsed = time.monotonic() - t0
    log = res.stdout + res.stderr
    slurm_logs = sorted((tmp_path / "slurm-logs").rglob("*.log"))
    detail = log[-8000:] + "".join(f"\n--- {p}\n{p.read_text()[-2000:]}" for p in slurm_logs[-3:])
    assert res.returncode == 0, detail
    submitted = set(SUBMITTED_RE.findall(log))
    print(f"\n[{workflow}] {len(submitted)} SLURM jobs, {elapsed:.1f}s")
    assert submitted, "no job was submitted to SLURM:\n" + detail

    if workflow == "toy":
        jac = (wd / "jacobians.txt").read_text().split()
        job_id, cpus_per_task, threads = jac
        assert job_id in submitted  # ran inside a SLURM job that this run submitted
        # set-threads asked for 8, the test profile caps at the node's CPUs; SLURM gave as many
        assert int(threads) == min(slurm["cpus"], 8) == int(cpus_per_task)
        spectra = (wd / "spectra.txt").read_text().split()
        assert spectra[:3] == jac and spectra[3] in submitted and spectra[3] != job_id
        for name in ("lens.txt", "lens_metrics.txt", "activations.txt", "zoo.txt"):
            assert (wd / name).read_text().split()[0] in submitted
        assert len(submitted) == 6
    if workflow == "smoke":
        import h5py
        import pandas as pd

        for target in SMOKE_SLURM_TARGETS:
            assert not pd.read_csv(wd / target, sep="\t").empty, target
        for f in (wd / "results" / "tiny_llama" / "step30" / "jacobians").rglob("layer*.h5"):
            with h5py.File(f, "r") as h5:
                assert h5["attn"]["mean"].shape == (32, 32), f
    # whatever ran, nothing is left to do
    again = _run(["snakemake", *args, "-n"], wd, env, 300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout


@pytest.mark.slurm
@pytest.mark.slow
def test_failing_slurm_job_is_reported(tmp_path):
    """A job that fails ends the run with an error naming it (not a hang), log kept."""
    slurm = require_slurm()
    profile = write_test_profile(tmp_path / "profile", slurm, tmp_path / "slurm-logs")
    wd = _toy_workflow(tmp_path / "wf")
    res = _run(["snakemake", "--profile", str(profile), "fails"], wd, _env(), 300)
    log = res.stdout + res.stderr
    assert res.returncode != 0, log
    assert re.search(r"Error in rule fails", log), log[-4000:]
    assert not (wd / "never.txt").exists()
    logs = list((tmp_path / "slurm-logs").rglob("*.log"))
    assert any("failing on purpose" in p.read_text() for p in logs), logs


def test_every_model_loading_rule_of_the_workflow_is_a_gpu_rule():
    """Rules that load a model on config["device"] (and causal) get a GPU in profiles/slurm."""
    text = (SLURM_PROFILE / "config.yaml").read_text()
    rendered = yte.process_yaml(text, variables={})
    smk = "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    for rule in (*GPU_RULES, "causal"):
        assert rendered["set-resources"][rule]["cpus_per_gpu"] == rendered["set-threads"][rule], rule
        assert f'gpu=cost("{rule}", "gpu")' in smk, rule  # GPUs per job: the cost model's
    loaders = set(re.findall(r"rule (\w+):\n(?:(?!\nrule ).)*?ckpt=ckpt_record", smk, flags=re.S))
    assert loaders == set(GPU_RULES) | {"causal"}, loaders
