"""resdyn plan --changes (resdyn.provenance.changes): a dry run's job blocks read back, each reason
explained from the outputs' provenance and the stored code manifests, and priced."""

from pathlib import Path

import pytest

from resdyn import io
from resdyn.pipeline import config as rc
from resdyn.provenance import changes

ROOT = Path(__file__).resolve().parent.parent

DRY_RUN = """\
Building DAG of jobs...
Job stats:
job          count
---------  -------
jacobians        1
communities      1
spectra          1
total            3

[Tue Dec  1 20:03:05 2026]
rule jacobians:
    input: models/m/step0/checkpoint.json, results/m/samples.h5
    output: results/m/step0/jacobians/layers000-003
    log: logs/jacobians/m/step0/layers000-003.log
    jobid: 2
    reason: Params have changed since last execution: Union of exclusive params before and now across all output: before: '{old}' now: '{new}'
    wildcards: model=tiny_llama, ckpt=step0, block=layers000-003
    resources: tmpdir=/tmp, runtime=6, mem_mb=1257
[Tue Dec  1 20:03:05 2026]
localrule communities:
    output: results/m/step0/communities, results/m/step0/communities_summary.tsv
    reason: Params have changed since last execution: Union of exclusive params before and now across all output: before: 0.05,[1, 2] now: 0.1,[1, 3]
    wildcards: model=tiny_llama, ckpt=step0
[Tue Dec  1 20:03:05 2026]
rule spectra:
    output: results/m/step0/spectra.tsv
    reason: Missing output files: results/m/step0/spectra.tsv; Input files updated by another job: results/m/step0/jacobians/layers000-003
    wildcards: model=tiny_llama, ckpt=step0
This was a dry-run (flag -n).
"""


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    old = {"script:0": "a", "resdyn.study_a.jacobian:attn_jacobian": "b", "resdyn.io:x": "c"}
    new = {**old, "resdyn.study_a.jacobian:attn_jacobian": "B", "resdyn.io:y": "d"}
    io.write_json(old, cache / "manifests" / "1111111111111111.json")
    io.write_json(new, cache / "manifests" / "2222222222222222.json")
    for out, params in [
        ("results/m/step0/jacobians/layers000-003", {"positions": "last", "code": "1111111111111111"}),
        (
            "results/m/step0/communities",
            {"resolution": 0.05, "seed": 0, "min_abs_r": 0.0, "ks": [1, 2], "code": "3333333333333333"},
        ),
    ]:
        io.write_json({"params": params}, io.prov_path(out))
    text = DRY_RUN.format(old="1111111111111111", new="2222222222222222")
    return changes.parse_dry_run(text), cache


def test_job_blocks_are_read(run):
    jobs, _ = run
    assert [j.rule for j in jobs] == ["jacobians", "communities", "spectra"]
    assert jobs[0].wildcards == {"model": "tiny_llama", "ckpt": "step0", "block": "layers000-003"}
    assert jobs[1].outputs == ["results/m/step0/communities", "results/m/step0/communities_summary.tsv"]


def test_reasons_name_the_symbols_params_and_inputs(run):
    jobs, cache = run
    assert changes.explain(jobs[0], cache) == ["code: resdyn.study_a.jacobian:attn_jacobian, +resdyn.io:y"]
    # 0.0 and 0 are inside "0.05" as text but are not among the old values: only the changed two
    assert changes.explain(jobs[1], cache) == ["params: resolution, ks"]
    assert changes.explain(jobs[2], cache) == [
        "new: output missing",
        "input: rerun upstream (results/m/step0/jacobians/layers000-003)",
    ]


def test_unknown_old_manifest_shows_the_versions(run):
    jobs, cache = run
    (cache / "manifests" / "1111111111111111.json").unlink()
    assert changes.explain(jobs[0], cache) == ["code: version 1111111111111111 -> 2222222222222222"]


def test_render_groups_by_rule_and_prices_with_the_cost_model(run):
    jobs, cache = run
    cfg = rc.load_config(ROOT / "configs" / "smoke.yaml")
    text = changes.render_changes(cfg, jobs, device="h100", cache=cache)
    lines = text.splitlines()
    assert lines[0].startswith("jacobians: 1 job(s), 0 GPU-h, ") and "CPU-h" in lines[0]  # smoke: device cpu
    assert lines[1] == (
        "  model=tiny_llama ckpt=step0 block=layers000-003: code: resdyn.study_a.jacobian:attn_jacobian, +resdyn.io:y"
    )
    assert jobs[0].cpu_hours > 0 and jobs[0].gpu_hours == 0
    assert lines[-1].startswith("total: 3 jobs, 0 GPU-hours (h100), ")
    assert "  model=tiny_llama ckpt=step0: new: output missing; input: after jacobians" in lines  # by rule
    assert changes.render_changes(cfg, [], cache=cache).startswith("nothing to rerun")
