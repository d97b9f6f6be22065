"""resdyn collect / resdyn.load / resdyn compare on small hand-made runs (the smoke run's own
checks are in tests/test_pipeline.py): identity and provenance columns, stale and missing
sidecars, the catalog, lazy loading, and comparisons within tolerance and up to relabelling."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import resdyn
from resdyn import artifacts as A
from resdyn import compare, io, results
from resdyn.provenance import sidecars

ROOT = Path(__file__).resolve().parent.parent


def sidecar(
    path: Path,
    run: Path,
    rule: str,
    params: dict,
    inputs: dict | None = None,
    checkpoint=None,
    device: str = "cpu",
    torch: str = "2.4.0",
) -> None:
    """A sidecar as provenance.Step.finish writes it (artifact fingerprint included)."""
    prov = {
        "rule": rule,
        "wildcards": {},
        "params": params,
        "inputs": inputs or {},
        "checkpoint": checkpoint,
        "git": {"commit": "abc123", "dirty": False},
        "versions": {"resdyn": "9.9.9", "torch": torch},
        "device": device,
        "artifact": sidecars.fingerprint(path),
    }
    io.write_json(prov, io.prov_path(path))


def rss_table(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "layer": [0, 1, 2],
            "k": 2,
            "k_fraction": 0.25,
            "d": 8,
            "rss": rng.uniform(0, 1, 3),
            "grassmann_distance": rng.uniform(0, 1, 3),
            "energy": rng.uniform(0, 1, 3),
        }
    )


CKPTS = {  # ckpt name -> (checkpoint record, expected step, expected tokens)
    "stage1-step1000-tokens2B": ({"source": "hf", "repo": "org/m", "revision": "stage1-step1000-tokens2B"}, 1000, 2e9),
    "main": ({"source": "hf", "repo": "org/m", "revision": "main"}, np.nan, np.nan),
}


def make_run(tmp: Path, seed: int = 0) -> Path:
    """A run of one hub model (two revisions: rss.tsv each, communities of one) without models/:
    the identity comes from the sidecars' checkpoint records."""
    run = tmp / "run"
    for i, (ckpt, (rec, _, _)) in enumerate(CKPTS.items()):
        path = A.RssProfile.path(run, model="m", ckpt=ckpt)
        path.parent.mkdir(parents=True, exist_ok=True)
        A.RssProfile.write(rss_table(seed + i), path)
        sidecar(path, run, "rss", {"code": "c0de", "seed": seed}, checkpoint={"model": "m", "checkpoint": ckpt, **rec})
    folder = A.CommunityPartitions.path(run, model="m", ckpt="main")
    folder.mkdir()
    part = pd.DataFrame(
        {
            "unit": range(6),
            "community": [3, 3, 7, 7, 1, 1],
            "participation": 0.0,
            "is_boundary": False,
            "n_other_communities": 0,
            "layer": 0,
            "boundary": "h",
        }
    )
    A.CommunityPartitions.write(part, A.CommunityPartitions.layer_file(folder, 0))
    io.write_json(
        {"rule": "communities", "params": {"code": "c0de"}, "inputs": {}, "artifact": sidecars.fingerprint(folder)},
        io.prov_path(folder),
    )
    return run


def test_every_tsv_artifact_class_is_a_table_kind():
    names = results.table_classes()
    assert set(names.values()) == {c for c in A.artifact_classes() if issubclass(c, A.TsvArtifact)}
    assert {"spectra", "rss", "lens_metrics", "communities", "phase_widths", "training"} <= set(names)


def test_collect_adds_identity_and_provenance(tmp_path):
    run = make_run(tmp_path)
    got = results.collect(run / "results")  # the results folder or the run folder: same run
    assert got.skipped == [] and set(got.tables) == {"rss", "communities"}
    rss = got.tables["rss"]
    assert len(rss) == 6 and list(rss.columns[:8]) == list(results.IDENTITY_COLUMNS)
    for ckpt, (_, step, tokens) in CKPTS.items():
        rows = rss[rss["ckpt"] == ckpt]
        np.testing.assert_array_equal(rows["step"], step)
        np.testing.assert_array_equal(rows["tokens"], tokens)
        assert (rows["step_reason"] == ("" if np.isfinite(step) else "revision 'main' names no training step")).all()
        pd.testing.assert_frame_equal(
            rows[list(A.RssProfile.columns)].reset_index(drop=True),
            A.RssProfile.read(A.RssProfile.path(run, model="m", ckpt=ckpt)),
        )
    assert set(rss["code_version"]) == {"c0de"} and set(rss["resdyn_version"]) == {"9.9.9"}
    assert set(rss["params"]) == {'{"seed": 0}'} and set(rss["versions"]) == {"resdyn=9.9.9 torch=2.4.0"}
    assert set(rss["stale"]) == {""} and set(rss["model"]) == {"m"}


def test_checkpoint_step_of_zoo_local_and_pythia():
    assert results.checkpoint_step("step30", {"source": "train", "step": 30}) == (30.0, "")
    assert results.checkpoint_step("step143000", {"source": "hf", "revision": "step143000"}) == (143000.0, "")
    step, reason = results.checkpoint_step("local", {"source": "local"})
    assert np.isnan(step) and "local" in reason


def test_clashing_table_columns_are_renamed(tmp_path):
    run = tmp_path / "run"
    path = A.PhaseMetrics.path(run, model="m", ckpt="main")
    path.parent.mkdir(parents=True)
    A.PhaseMetrics.write(
        pd.DataFrame(
            {
                "phase": [1],
                "phase_name": ["rise"],
                "metric": ["x"],
                "mean": [1.0],
                "sd": [np.nan],
                "n_layers": [1],
                "reason": ["one layer"],
            }
        ),
        path,
    )
    sidecar(path, run, "phase_metrics", {"code": "c"})
    t = results.collect(run).tables["phase_metrics"]
    assert t["phase_metrics_n_layers"].tolist() == [1] and t["n_layers"].isna().all()


def test_stale_and_missing_sidecars_are_skipped_and_named(tmp_path):
    run = make_run(tmp_path)
    edited = A.RssProfile.path(run, model="m", ckpt="main")
    edited.write_text(edited.read_text().replace("\t8\t", "\t9\t"))
    io.prov_path(A.CommunityPartitions.path(run, model="m", ckpt="main")).unlink()
    got = results.collect(run)
    assert len(got.skipped) == 2
    assert "results/m/main/rss.tsv: changed since rule rss wrote it" in got.skipped[1]
    assert got.skipped[0].startswith("results/m/main/communities: no provenance sidecar communities.prov.json")
    assert set(got.tables) == {"rss"} and set(got.tables["rss"]["ckpt"]) == {"stage1-step1000-tokens2B"}
    kept = results.collect(run, allow_stale=True)
    assert kept.skipped == [] and set(kept.tables["rss"]["ckpt"]) == set(CKPTS)
    assert kept.tables["rss"].groupby("ckpt")["stale"].first()["main"].startswith("changed since")


def test_a_table_made_from_a_rebuilt_input_is_stale(tmp_path):
    run = make_run(tmp_path)
    up = A.RssProfile.path(run, model="m", ckpt="main")
    down = A.ResolutionTable.path(run, model="m", ckpt="main")
    A.ResolutionTable.write(
        pd.DataFrame(
            {"k_fraction": [0.25], "k": [2], "energy": [0.5], "mean_rss": [0.5], "visibility": [0.5], "pareto": [True]}
        ),
        down,
    )
    layout = results.run_layout(run)
    sidecar(down, run, "resolution", {"code": "c"}, inputs={str(up.relative_to(run)): "0" * 64})
    assert results.sidecar_problem(down, layout).startswith("stale: made from an older results/m/main/rss.tsv")
    sidecar(down, run, "resolution", {"code": "c"}, inputs={str(up.relative_to(run)): sidecars.hash_path(up)})
    assert results.sidecar_problem(down, layout) == ""


def test_write_collected_catalog_and_load_both_ways(tmp_path):
    run = make_run(tmp_path)
    got = results.collect(run)
    catalog = io.read_json(results.write_collected(got, tmp_path / "t"))
    rss = catalog["tables"]["rss"]
    assert rss["artifact"] == "RssProfile" and rss["rows"] == 6 and len(rss["sources"]) == 2
    assert rss["columns"]["grassmann_distance"] == {"kind": "float", "unit": "radians", "role": "value"}
    assert rss["columns"]["step"]["role"] == "identity" and rss["columns"]["commit"]["role"] == "provenance"
    assert catalog["resdyn_version"] == resdyn.__version__
    from_parquet, from_run = resdyn.load(tmp_path / "t"), resdyn.load(run)
    assert list(from_parquet) == list(from_run) == ["communities", "rss"]
    for name in from_run:
        pd.testing.assert_frame_equal(from_parquet[name], from_run[name], check_dtype=False)
    with pytest.raises(KeyError, match="no table 'spectra'"):
        from_run["spectra"]


def test_not_a_results_tree(tmp_path):
    (tmp_path / "results").mkdir()
    for bad in (tmp_path / "nope", tmp_path / "results"):
        with pytest.raises(results.NotAResultsTree, match="not a results tree"):
            results.collect(bad)
    with pytest.raises(results.NotAResultsTree, match="not a results tree"):
        resdyn.load(tmp_path)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "resdyn.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_cli_exit_codes_and_one_line_errors(tmp_path):
    run = make_run(tmp_path)
    out = cli("collect", str(run / "results"), "-o", str(tmp_path / "t"))
    assert out.returncode == 0 and out.stdout == "" and "collected 2 tables (12 rows)" in out.stderr
    assert (tmp_path / "t" / "rss.parquet").is_file()
    io.prov_path(A.RssProfile.path(run, model="m", ckpt="main")).unlink()
    out = cli("collect", str(run), "-o", str(tmp_path / "t2"))
    assert out.returncode == 1 and out.stdout.count("\n") == 1 and "rss.tsv: no provenance sidecar" in out.stdout
    out = cli("collect", str(tmp_path / "nope"), "-o", str(tmp_path / "t3"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a results tree" in out.stderr
    assert not (tmp_path / "t3").exists()
    out = cli("compare", str(tmp_path / "t"), str(tmp_path / "nope"))
    assert out.returncode == 2 and out.stderr.startswith("resdyn compare: error: ") and out.stderr.count("\n") == 1


# --- compare -----------------------------------------------------------------------------------


def test_relabel_is_canonical_within_groups():
    labels = pd.Series([5, 5, 2, 9, 2, 2])
    groups = pd.DataFrame({"layer": [0, 0, 0, 1, 1, 1]})
    np.testing.assert_array_equal(compare.relabel(labels, groups), [0, 0, 1, 0, 1, 1])
    np.testing.assert_array_equal(compare.relabel(pd.Series([1, 2, 1])), compare.relabel(pd.Series([7, 0, 7])))


def test_column_differences_tolerance_and_exact_kinds():
    a = pd.DataFrame({"x": [1.0, 2.0, np.nan], "n": [1, 2, 3], "s": ["a", "b", "c"], "p_value": [0.01, 0.5, 1.0]})
    b = a.copy()
    b["x"] = [1.0 + 5e-6, 2.0, np.nan]  # within rtol 1e-5
    b["p_value"] = [0.01 * (1 + 5e-4), 0.5, 1.0]  # within the p-value tolerance, not the default one
    assert compare.column_differences(a, b) == []
    assert compare.column_differences(a, b, rtol=1e-7, atol=0)[0].startswith("x: 1 of 3 rows beyond rtol=1e-07")
    b.loc[1, "n"], b.loc[2, "s"], b.loc[0, "x"] = 3, "z", 1.001
    lines = compare.column_differences(a, b)
    assert [line.split(":")[0] for line in lines] == ["x", "n", "s"]
    assert "max |Δ| 0.001" in lines[0] and "row 2: 'c' vs 'z'" in lines[2]


def test_compare_a_run_with_itself_a_relabelled_and_a_perturbed_copy(tmp_path):
    run = make_run(tmp_path)
    same = compare.compare_runs(run, run)
    assert same.differences == [] and same.not_shared == [] and same.compared == {"rss": 2, "communities": 1}
    assert "no differences" in same.render()
    other = tmp_path / "other"
    shutil.copytree(run, other)
    folder = A.CommunityPartitions.path(other, model="m", ckpt="main")  # the same partition, other labels
    part = A.CommunityPartitions.read_folder(folder)
    part["community"] = part["community"].map({3: 0, 7: 1, 1: 2})
    A.CommunityPartitions.write(part, A.CommunityPartitions.layer_file(folder, 0))
    path = A.RssProfile.path(other, model="m", ckpt="main")  # one table made with another seed, on a GPU
    A.RssProfile.write(rss_table(5), path)
    sidecar(
        path,
        other,
        "rss",
        {"code": "c0de", "seed": 4},
        device="cuda:H100",
        torch="2.5.0",
        checkpoint={"model": "m", "checkpoint": "main", **CKPTS["main"][0]},
    )
    got = compare.compare_runs(run, other)
    assert [(d.table, d.file) for d in got.differences] == [("rss", "results/m/main/rss.tsv")]
    assert got.differences[0].provenance == ("device cpu → cuda:H100; versions torch 2.4.0 → 2.5.0; params seed 0 → 4")
    assert {c.split(":")[0] for c in got.differences[0].columns} == {"rss", "grassmann_distance", "energy"}
    part["community"] = [0, 1, 0, 1, 2, 2]  # a different partition
    A.CommunityPartitions.write(part, A.CommunityPartitions.layer_file(folder, 0))
    got = compare.compare_runs(run, other)
    assert sorted(d.table for d in got.differences) == ["communities", "rss"]
    assert "partitions differ (beyond relabelling) in 2 of 6 rows" in got.differences[0].columns[0]


def test_a_renamed_results_folder_is_the_same_run(tmp_path):
    """A results folder copied under another name (e.g. from a cluster) pairs up by logical path."""
    run = make_run(tmp_path)
    shutil.copytree(run / "results", tmp_path / "cluster_results")
    got = results.collect(tmp_path / "cluster_results")
    assert got.skipped == [] and got.files["rss"] == [
        "results/m/main/rss.tsv",
        "results/m/stage1-step1000-tokens2B/rss.tsv",
    ]
    same = compare.compare_runs(run, tmp_path / "cluster_results")
    assert same.differences == [] and same.not_shared == [] and same.compared == {"rss": 2, "communities": 1}


def test_compare_runs_of_different_configs_says_what_is_not_shared(tmp_path):
    run = make_run(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    shutil.rmtree(A.CommunityPartitions.path(other, model="m", ckpt="main"))
    io.prov_path(A.CommunityPartitions.path(other, model="m", ckpt="main")).unlink()
    for p in (
        A.RssProfile.path(other, model="m", ckpt="main"),
        io.prov_path(A.RssProfile.path(other, model="m", ckpt="main")),
    ):
        p.unlink()
    got = compare.compare_runs(run, other)
    assert got.differences == [] and got.compared == {"rss": 1}
    assert got.not_shared == ["table communities only in A", "rss: results/m/main/rss.tsv only in A"]
    assert "not compared: table communities only in A" in got.render()
    assert json.loads(json.dumps(got.compared)) == {"rss": 1}


def test_one_version_everywhere():
    """pyproject.toml's version is what resdyn.__version__, `resdyn --version`, the provenance
    sidecars (provenance.versions) and CITATION.cff say (collect's catalog: test above)."""
    import tomllib

    import yaml

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert resdyn.__version__ == version == sidecars.versions()["resdyn"]
    assert cli("--version").stdout.strip() == f"resdyn {version}"
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["version"] == version and cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert all(ref["title"] and ref["authors"] for ref in cff["references"]) and len(cff["references"]) == 2
