"""Checkpoint integrity: duplicate weights and changed architectures among a model's checkpoints
(resdyn.lm.integrity), `resdyn revisions REPO --check` on an offline cache and on the hub's
metadata, and the workflow stopping before the later duplicate's model jobs."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from resdyn import cli, io
from resdyn.lm import integrity, revisions

from helpers import hubcache

REPO = "org/pythia-style"
ARCH = {"model_type": "gpt_neox", "family": "gpt_neox", "n_layers": 8, "d_model": 64}


def _id(ckpt: str, digest: str, **arch) -> dict:
    return {"ckpt": ckpt, "weights_sha256": digest * 64, "architecture": {**ARCH, **arch}}


def test_distinct_checkpoints_pass_unmarked():
    out = integrity.check("m", [_id("step0", "a"), _id("step1000", "b")], _id("step8000", "c"), allow=False)
    assert out["duplicate_of"] == [] and out["architecture_differs_from"] == []
    assert integrity.marks({"step8000": out}) == {"step8000": ""}


def test_identical_weights_stop_with_one_line_naming_both_and_the_key():
    with pytest.raises(ValueError) as err:
        integrity.check("m", [_id("step0", "a"), _id("step1000", "b")], _id("step8000", "b"), allow=False)
    msg = str(err.value)
    assert "\n" not in msg and "'step1000' and 'step8000'" in msg and "allow_duplicate_weights: true" in msg
    out = integrity.check("m", [_id("step0", "a"), _id("step1000", "b")], _id("step8000", "b"), allow=True)
    assert out["duplicate_of"] == ["step1000"] and out["allowed"] is True
    assert integrity.marks({"step8000": out})["step8000"] == "duplicate of step1000"


def test_another_architecture_stops_unless_allowed():
    with pytest.raises(ValueError, match=r"'step8000' has another architecture than 'step0' \(n_layers 8 vs 12\)"):
        integrity.check("m", [_id("step0", "a")], _id("step8000", "c", n_layers=12), allow=False)
    out = integrity.check("m", [_id("step0", "a")], _id("step8000", "c", n_layers=12), allow=True)
    assert integrity.marks({"x": out})["x"] == "architecture differs from step0"


def test_duplicate_groups_keep_order_and_skip_unknown():
    groups = integrity.duplicate_groups({"a": "1", "b": "2", "c": "1", "d": None, "e": None, "f": "2"})
    assert groups == [["a", "c"], ["b", "f"]]
    assert integrity.duplicate_groups({"a": "1", "b": "2"}) == []


# --- on an offline HF cache whose step8000 branch serves step1000's weights --------------------


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("dup-hf")
    hubcache.build(home, {REPO: hubcache.USER_MODELS[REPO]})
    return home


@pytest.fixture
def offline(hf_home, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf_home


def _snap(home: Path, rev: str) -> Path:
    root = hubcache.repo_dir(home / "hub", REPO)
    return root / "snapshots" / (root / "refs" / rev).read_text().strip()


def _check(capsys) -> tuple[int, list[str], str]:
    rc = cli.main(["revisions", REPO, "--check"])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def test_check_finds_branches_sharing_weights_in_the_cache(offline, capsys):
    rc, out, err = _check(capsys)
    assert (rc, out) == (0, ["weights_sha256\tbranches"]), (out, err)  # every branch seeded on its own
    assert "5 revisions of org/pythia-style checked, from the cache" in err and "0 group(s)" in err
    src, dst = _snap(offline, "step1000") / "model.safetensors", _snap(offline, "step8000") / "model.safetensors"
    shutil.copyfile(src, dst)  # plain files: hashed
    rc, out, err = _check(capsys)
    digest = integrity.weights_digest(src.parent)
    assert rc == 1 and out[1:] == [f"{digest[:16]}\tstep1000, step8000"], (out, err)
    # the hub's layout: files are links into content-addressed blobs, read by name, not hashed
    for rev in ("step1000", "step8000"):
        hubcache.to_blob_layout(_snap(offline, rev))
    assert os.path.islink(dst) and os.readlink(dst) == os.readlink(src)
    assert _check(capsys)[:2] == (1, out)
    # the record-level check of the workflow sees the same pair
    ids = [integrity.identity(r, _snap(offline, r)) for r in ("step1000", "step8000")]
    with pytest.raises(ValueError, match=r"checkpoints 'step1000' and 'step8000' have identical weights"):
        integrity.check("pythia", ids[:1], ids[1], allow=False)


def test_check_online_reads_the_hubs_lfs_hashes(offline, monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    files = {"step0": b"w0", "step1000": b"w1", "main": b"w1"}  # main serves step1000's weights
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "list_repo_refs",
        lambda self, repo, repo_type="model": SimpleNamespace(branches=[SimpleNamespace(name=n) for n in files]),
    )

    def model_info(self, repo, revision=None, files_metadata=False):
        assert files_metadata
        sha = hashlib.sha256(files[revision]).hexdigest()
        return SimpleNamespace(
            siblings=[
                SimpleNamespace(rfilename="config.json", lfs=None),
                SimpleNamespace(rfilename="model.safetensors", lfs=SimpleNamespace(sha256=sha)),
            ]
        )

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    rc, out, err = _check(capsys)
    expected = io.tree_digest({"model.safetensors": hashlib.sha256(b"w1").hexdigest()})
    assert rc == 1 and out[1:] == [f"{expected[:16]}\tstep1000, main"] and "from the hub" in err, (out, err)
    assert revisions.weight_hashes(REPO, ["step0"], "the hub")["step0"] == io.tree_digest(
        {"model.safetensors": hashlib.sha256(b"w0").hexdigest()}
    )


# --- the workflow: the later duplicate's model jobs never start -----------------------------------


def _workflow_config(path: Path, allow: bool) -> Path:
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "pythia-mini.yaml").read_text())
    cfg["models"] = {
        "pythia": {
            "source": "hf",
            "repo": REPO,
            "revisions": ["step0", "step1000", "step8000"],
            "dataset": "wikitext",
            "family": "gpt_neox",
            "dtype": "float32",
            **({"allow_duplicate_weights": True} if allow else {}),
        }
    }
    cfg.update(studies=["A"], scaling={})
    cfg.pop("lens")
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_workflow_stops_before_the_duplicates_model_jobs(offline, tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    src, dst = _snap(offline, "step1000") / "model.safetensors", _snap(offline, "step8000") / "model.safetensors"
    if not (dst.is_symlink() and os.readlink(dst) == os.readlink(src)):  # the cache test above may have run
        shutil.copyfile(src, dst)
    env = {**os.environ, "PYTHONPATH": str(root), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    jac = [f"results/pythia/{c}/jacobians/layers000-007" for c in ("step0", "step8000")]

    def run(allow: bool, *targets: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", "--snakefile", str(root / "Snakefile"),
             "--configfile", str(_workflow_config(tmp_path / f"c{allow}.yaml", allow)), "--directory",
             str(tmp_path / "run"), *targets],
            cwd=root, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip

    dry = run(False, "-n", *jac)
    assert dry.returncode == 0 and "checkpoint_integrity" in dry.stdout, dry.stdout + dry.stderr
    proc = run(False, jac[1])
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert "checkpoints 'step1000' and 'step8000' have identical weights" in log and "allow_duplicate_weights" in log
    assert not (tmp_path / "run" / jac[1]).exists()
    target = "models/pythia/step8000/integrity.json"
    assert run(True, target).returncode == 0
    record = io.read_json(tmp_path / "run" / target)
    assert record["duplicate_of"] == ["step1000"] and record["allowed"] is True


def test_trajectory_figures_mark_the_duplicate_checkpoint():
    import pandas as pd

    from resdyn.plots import render, trajectory

    pairs = [("m", "step0"), ("m", "step1000"), ("m", "step8000")]
    boot = [
        pd.DataFrame({"metric": ["cum_erank_full_depth"], "layer": [None], "estimate": [float(i)], "ci_low": [i - 0.5],
                      "ci_high": [i + 0.5], "bootstrapped": [True]})
        for i in range(3)
    ]  # fmt: skip
    ids = [_id("step0", "a"), _id("step1000", "b"), _id("step8000", "b")]
    records = [integrity.check("m", ids[:i], ids[i], allow=True) for i in range(3)]
    fig = trajectory.study_a_trajectory(render.trajectory_table(boot, pairs), render.trajectory_table(records, pairs))
    (ax,) = fig.axes
    texts = [(t.get_text(), t.xy) for t in ax.texts]
    assert texts == [("duplicate of step1000", (8000.0, 2.0))]  # only the later copy, at its point
    clean = trajectory.study_a_trajectory(render.trajectory_table(boot, pairs))
    assert not clean.axes[0].texts
