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

import os
import re
import textwrap
import time
from pathlib import Path

import pytest
import yte

from helpers.slurm import (
    SLURM_PROFILE,
    SUBMITTED_RE,
    TEST_STATUS_DELAY_S,
    _copy_repo,
    _env,
    _load_profile,
    _run,
    require_slurm,
    write_test_profile,
)

REPO = Path(__file__).resolve().parents[1]
LOCAL_PROFILE = REPO / "profiles" / "local"
GPU_RULES = ("jacobians", "activations", "lens", "lens_metrics")
# rules that load no model but run their decompositions on the GPU (resdyn.cluster.cost.GPU_LINALG_RULES)
GPU_LINALG_RULES = ("spectra", "bootstrap")


# ------------------------------------------------------------------------------------ helpers
# (the environment, runs, profile loading and the local cluster's probe: tests/helpers/slurm.py)


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
    """What users run: `make install-slurm-profile` (the Makefile's target when it exists;
    otherwise the same two steps, done here)."""
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
# (require_slurm, write_test_profile, _copy_repo: tests/helpers/slurm.py)

SMOKE_SLURM_TARGETS = ("results/tiny_llama/step30/coupling.tsv", "results/tiny_llama/step30/lens_metrics.tsv")


def _smoke_available() -> bool:
    return (REPO / "Snakefile").exists() and (REPO / "configs" / "smoke.yaml").exists()


@pytest.mark.slurm
@pytest.mark.slow
# The repository's own workflow runs through SLURM in tests/test_slurm_mini.py (configs/paper-mini.yaml:
# hub models of every family, every GPU rule); the smoke variant below stays for manual runs
# (`pytest tests/test_slurm.py -k smoke -m slurm`) but is not in CI, which has no time for both.
@pytest.mark.parametrize(
    "workflow",
    [
        "toy",
        pytest.param(
            "smoke",
            marks=pytest.mark.skipif(
                os.environ.get("RESDYN_SLURM_SMOKE") != "1",
                reason="covered by test_slurm_mini; RESDYN_SLURM_SMOKE=1 runs it",
            ),
        ),
    ],
)
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
