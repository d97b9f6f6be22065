"""resdyn.pipeline.dag's jobs() and DEPENDS describe the DAG Snakemake plans.

For each preset that dry-runs offline here, `snakemake -n --profile profiles/local --configfile X`
from an empty workdir plans, per priced rule, as many jobs as :func:`resdyn.pipeline.dag.unique_jobs`
lists, and only unpriced local rules besides; among the priced rules, the edges of
`snakemake --rulegraph` (a path through unpriced rules counting as one edge) are exactly those
of :data:`resdyn.pipeline.dag.DEPENDS`.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from resdyn.cluster import cost
from resdyn.pipeline import config as rc
from resdyn.pipeline import dag

from helpers import codecache

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

#: Presets that need no hub model, and those whose models tests/hubcache.py stands in for.
OFFLINE = ("config.yaml", "configs/smoke.yaml")
STANDINS = ("configs/paper-a.yaml", "configs/paper-b.yaml", "configs/paper-b-extended.yaml", "configs/pythia.yaml")
#: Presets left out, with why.
SKIPPED = {
    "configs/pythia-mini.yaml": "needs a hub cache of its models (tests/hubcache.py builds none)",
    "configs/qwen3-gemma3.yaml": "needs a hub cache of its models (tests/hubcache.py builds none)",
    "configs/reach-mini.yaml": "needs a hub cache of its models (tests/hubcache.py builds none)",
}


def _snakemake(configfile: str, work: Path, env: dict, *args: str) -> str:
    res = subprocess.run(
        [SNAKEMAKE, *args, "--profile", "profiles/local", "--configfile", configfile, "-d", str(work)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def planned_counts(out: str) -> dict[str, int]:
    """Rule -> jobs, from a dry run's job-stats table."""
    counts = {}
    for line in out.split("Job stats:", 1)[1].splitlines():
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s+(\d+)\s*", line)
        if m and m[1] != "total":
            counts[m[1]] = int(m[2])
        if line.strip().startswith("total"):
            break
    return counts


def rulegraph_edges(dot: str) -> set[tuple[str, str]]:
    """(consumer, producer) pairs of a `--rulegraph` DOT graph."""
    names = dict(re.findall(r"^\s*(\d+)\[label = \"(\w+)\"", dot, flags=re.M))
    return {(names[b], names[a]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, flags=re.M)}


def priced_edges(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges between priced rules, a path through unpriced rules counting as one edge
    (causal reads phases.json of the unpriced rule phases, which reads rss: causal -> rss)."""
    producers = collections.defaultdict(set)
    for consumer, producer in edges:
        producers[consumer].add(producer)
    out = set()
    for rule in {c for c, _ in edges} & set(cost.RULES):
        todo, seen = list(producers[rule]), set()
        while todo:
            dep = todo.pop()
            if dep in seen:
                continue
            seen.add(dep)
            if dep in cost.RULES:
                out.add((rule, dep))
            else:
                todo.extend(producers[dep])
    return out


def check_preset(configfile: str, work: Path, env: dict, code_cache: Path) -> None:
    for run in ("dry", "graph"):  # empty workdirs, but for the code versions of the rules
        codecache.warm(work / run, code_cache)
    config = rc.load_config(REPO / configfile)
    want = collections.Counter(rule for rule, _ in dag.unique_jobs(config))
    got = planned_counts(_snakemake(configfile, work / "dry", env, "-n"))
    priced = {r: n for r, n in got.items() if r in cost.RULES}
    assert priced == dict(want), f"{configfile}: snakemake plans {priced}, dag.jobs lists {dict(want)}"
    other = set(got) - set(cost.RULES)
    assert other <= set(cost.LOCAL_UNPRICED_RULES), (configfile, other - set(cost.LOCAL_UNPRICED_RULES))
    edges = priced_edges(rulegraph_edges(_snakemake(configfile, work / "graph", env, "--rulegraph")))
    depends = {(rule, dep) for rule, deps in dag.DEPENDS.items() for dep in deps if rule in want and dep in want}
    assert edges == depends, (
        f"{configfile}: rulegraph edges not in DEPENDS {sorted(edges - depends)}, "
        f"DEPENDS edges not in the rulegraph {sorted(depends - edges)}"
    )


@pytest.mark.parametrize("configfile", OFFLINE)
def test_jobs_and_depends_match_the_dry_run_offline(configfile, tmp_path, code_cache_seed):
    check_preset(configfile, tmp_path, {**os.environ, "PYTHONPATH": str(REPO)}, code_cache_seed)


@pytest.mark.slow
@pytest.mark.parametrize("configfile", STANDINS)
def test_jobs_and_depends_match_the_dry_run_of_hub_presets(
    configfile, tmp_path, paper_hub_cache, monkeypatch, code_cache_seed
):
    monkeypatch.setenv("HF_HUB_CACHE", str(paper_hub_cache))
    check_preset(configfile, tmp_path, {**os.environ, "PYTHONPATH": str(REPO)}, code_cache_seed)


@pytest.mark.slow
def test_jobs_and_depends_match_the_dry_run_of_paper_mini(tmp_path, mini_hf_home, monkeypatch, code_cache_seed):
    """configs/paper-mini.yaml on the tiny hub models of tests/hubcache.py, offline."""
    monkeypatch.setenv("HF_HOME", str(mini_hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    check_preset("configs/paper-mini.yaml", tmp_path, {**os.environ, "PYTHONPATH": str(REPO)}, code_cache_seed)


@pytest.mark.parametrize("configfile", sorted(SKIPPED))
def test_presets_left_out(configfile):
    assert (REPO / configfile).exists()
    pytest.skip(SKIPPED[configfile])


def test_every_preset_is_checked_or_left_out_with_a_reason():
    presets = {str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml")} | {"config.yaml"}
    assert presets == set(OFFLINE) | set(STANDINS) | {"configs/paper-mini.yaml"} | set(SKIPPED)
