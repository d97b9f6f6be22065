"""A config of one's own never dies: the configs a user writes from the README (one hub model; two
models of different families; no scaling groups; a group with one model; study A only; study B
only) plan a DAG whose every job has its inputs, and (slow) run to the end, on tiny hub-cache
models with OLMo-style and Pythia-style branch names (tests/helpers/hubcache.py USER_MODELS' repos and
branches). The models behind those names are the tiny Qwen3 and Gemma 3 stand-ins of
configs/reach-mini.yaml, so that the one full run also takes those families through the whole
DAG."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import yaml

from helpers import codecache, hubcache

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

pytestmark = pytest.mark.slow

_TINY = {  # small enough that a whole run is minutes on 2 cores
    "datasets": {
        "wiki": {
            "source": "hf",
            "name": hubcache.DATASET,
            "config": hubcache.DATASET_CONFIG,
            "split": "test",
            "heldout_fraction": 0.5,
        }
    },
    "samples": {"n": 4, "length": 16},
    "lens": {"n_train_blocks": 8, "n_heldout_blocks": 2, "steps": 4, "tokens_per_step": 64, "eval_every": 2},
    "bootstrap": {"n_resamples": 6, "interval": "studentized"},
    "causal": {"n_random": 2, "n_samples": 2},
    "topology": {"top_k": 4},
}
OLMO = {"source": "hf", "repo": "org/olmo-style", "steps": [0, "final"], "dataset": "wiki"}
PYTHIA = {"source": "hf", "repo": "org/pythia-style", "revisions": ["main"], "dataset": "wiki"}

#: the cache's models: USER_MODELS' repositories and branch names, with the tiny Qwen3 (OLMo-style
#: branches) and Gemma 3 (Pythia-style) of hubcache.REACH_MODELS behind them
MODELS = {
    "org/olmo-style": (hubcache._qwen3, 4, hubcache.USER_MODELS["org/olmo-style"][2]),
    "org/pythia-style": (hubcache._gemma3, 4, hubcache.USER_MODELS["org/pythia-style"][2]),
}
FAMILIES = {"olmo": "qwen3", "pythia": "gemma3"}  # config key -> the family its config.json names

#: name -> (config beyond _TINY, rule -> jobs expected in the plan (0: not scheduled))
CONFIGS = {
    "one_hub_model": ({"models": {"olmo": OLMO}}, {"jacobians": 2, "lens": 1, "scaling": 0, "bridge": 1}),
    "two_families_no_groups": (
        {"models": {"olmo": OLMO, "pythia": PYTHIA}},
        {"resolve_checkpoint": 3, "scaling": 0, "bridge": 2, "scorecard": 2},
    ),
    "group_of_one": (
        {"models": {"olmo": OLMO, "pythia": PYTHIA}, "studies": ["B"], "scaling": {"groups": {"pythia": ["pythia"]}}},
        {"scaling": 1, "jacobians": 0, "bridge": 0},
    ),
    "study_a_only": (
        {"models": {"olmo": OLMO}, "studies": ["A"]},
        {"jacobians": 2, "lens": 0, "scaling": 0, "bridge": 0, "scorecard": 1},
    ),
    "study_b_only": (
        {"models": {"pythia": PYTHIA}, "studies": ["B"]},
        {"jacobians": 0, "lens": 1, "phases": 1, "scaling": 0, "bridge": 0, "scorecard": 1},
    ),
}


@pytest.fixture(scope="module")
def user_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("user-hf")
    hubcache.build(home, MODELS)
    return home


def _run(work: Path, home: Path, name: str, *args: str, code_cache: Path | None = None) -> subprocess.CompletedProcess:
    extra, _ = CONFIGS[name]
    cfg = {**copy.deepcopy(_TINY), **copy.deepcopy(extra)}
    work.mkdir(parents=True, exist_ok=True)
    if code_cache is not None:  # a new workdir, but for the code versions of the rules
        codecache.warm(work, code_cache)
    (work / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(
        [
            SNAKEMAKE,
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(work / "cfg.yaml"),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
    )


def _planned(out: str) -> dict[str, int]:
    stats = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s*(\w+)\s+(\d+)\s*$", stats, re.M)}


@pytest.mark.parametrize("name", CONFIGS)
def test_user_config_plans_every_job_with_its_inputs(user_home, tmp_path, name, code_cache_seed):
    proc = _run(tmp_path / name, user_home, name, "-n", code_cache=code_cache_seed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _planned(proc.stdout)
    for rule, n in CONFIGS[name][1].items():
        assert jobs.get(rule, 0) == n, (rule, jobs)
    extra = CONFIGS[name][0]
    if "olmo" in extra["models"]:  # steps resolved to the cache's OLMo-style branch names
        assert "olmo/main/" in proc.stdout
        # study B reads the final checkpoint only: step 0 enters the DAG with study A
        assert ("olmo/stage1-step0-tokens0B/" in proc.stdout) == ("A" in extra.get("studies", ["A", "B"]))


@pytest.fixture(scope="module")
def two_families_run(user_home, tmp_path_factory, code_cache_seed) -> Path:
    """two_families_no_groups run to the end once; the tests below read it or a copy of it."""
    work = tmp_path_factory.mktemp("user-run") / "two_families_no_groups"
    proc = _run(work, user_home, "two_families_no_groups", "--cores", "2", code_cache=code_cache_seed)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return work


@pytest.mark.parametrize("name", ["two_families_no_groups", "group_of_one"])
def test_user_config_runs_to_the_end(user_home, two_families_run, tmp_path, name):
    """The case that died 4 s in (two hub models, both studies, no groups), and a scaling group of
    one model (its fit says why it is empty). Study A only and B only are their halves.

    The group of one runs in a copy of the finished two-family run (results, models and
    Snakemake's records, mtimes kept): the jobs it shares with that run are done, so it plans the
    scaling job and what a scaling group adds, and its own config's jobs run to the end."""
    if name == "two_families_no_groups":
        work = two_families_run
        assert not (work / "results/scaling").exists()
        assert (work / "results/pythia/main/bridge.tsv").is_file() and (work / "results/olmo/scorecard.tsv").is_file()
        return
    work = tmp_path / name
    shutil.copytree(two_families_run, work, symlinks=True)
    dry = _run(work, user_home, name, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    jobs = _planned(dry.stdout)
    model_jobs = {
        "resolve_checkpoint",
        "resolve_tokenizer",
        "samples",
        "lens_tokens",
        "jacobians",
        "activations",
        "lens",
        "lens_metrics",
        "causal",
        "rss",
        "resolution",
        "phases",
        "phase_metrics",
    }  # done already
    assert jobs.get("scaling") == 1 and not model_jobs & set(jobs), jobs
    proc = _run(work, user_home, name, "--cores", "2")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    fits = (work / "results/scaling/phase_widths.tsv").read_text().splitlines()
    assert all("too_few_depths" in row for row in fits[1:]), fits


def test_qwen3_and_gemma3_minis_run_the_whole_dag(two_families_run):
    """The tiny Qwen3 and Gemma 3 stand-ins (configs/reach-mini.yaml's models) end to end, offline:
    the two-family user run above (OLMo-style branch names resolved for the Qwen3 stand-in)."""
    work = two_families_run
    for model, family in FAMILIES.items():
        blocks = sorted((work / "results" / model / "main" / "jacobians").rglob("layer*.h5"))
        assert len(blocks) == 4, blocks
        for block in blocks:
            with h5py.File(block) as f:
                assert f.attrs["family"] == family
        assert (work / "results" / model / "main" / "phases.json").is_file()
    assert (work / "results/olmo/stage1-step0-tokens0B/jacobians").is_dir()  # step 0 -> its OLMo-style branch
