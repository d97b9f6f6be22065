"""Site settings of the SLURM profile (resdyn.cluster.site, profiles/slurm/config.yaml): QOS,
constraints and extra sbatch flags for GPU and CPU jobs, per-rule overrides, the constraint table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yte

from resdyn.cluster import site

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean(monkeypatch):
    import os

    for k in list(os.environ):
        if k.startswith("RESDYN_SLURM_") or k == "RESDYN_GPU_KIND":
            monkeypatch.delenv(k)
    return monkeypatch


def _profile() -> dict:
    with open(REPO / "profiles" / "slurm" / "config.yaml") as f:
        return yte.process_yaml(f, require_use_yte=True)


def test_gpu_and_cpu_jobs_get_their_own_qos_constraint_and_flags(clean):
    clean.setenv("RESDYN_SLURM_QOS", "normal")
    clean.setenv("RESDYN_SLURM_GPU_QOS", "gpu_long")
    clean.setenv("RESDYN_SLURM_CONSTRAINT", "intel")
    clean.setenv("RESDYN_SLURM_GPU_CONSTRAINT", "h100")
    clean.setenv("RESDYN_SLURM_EXTRA", "--exclude=n01")
    clean.setenv("RESDYN_SLURM_GPU_EXTRA", "--signal=B:USR1@120 --gres-flags=enforce-binding")
    clean.setenv("RESDYN_SLURM_PARTITION", "cpuq")
    res = _profile()["set-resources"]
    for rule in ("jacobians", "lens", "causal", "spectra"):
        assert res[rule]["qos"] == "gpu_long" and res[rule]["constraint"] == "h100", rule
        assert res[rule]["slurm_extra"] == "--signal=B:USR1@120 --gres-flags=enforce-binding"
        assert "slurm_partition" not in res[rule]  # never the CPU partition
    for rule in ("schur", "communities", "rss", "samples", "zoo_train"):
        assert res[rule] == {
            "qos": "normal",
            "constraint": "intel",
            "slurm_extra": "--exclude=n01",
            "slurm_partition": "cpuq",
        }, rule
    assert "corpus" not in res and "resolve_checkpoint" not in res  # localrules: never submitted


def test_a_rule_overrides_its_job_class(clean):
    clean.setenv("RESDYN_SLURM_GPU_QOS", "gpu")
    clean.setenv("RESDYN_SLURM_LENS_QOS", "long")
    clean.setenv("RESDYN_SLURM_LENS_PARTITION", "bigmem_gpu")
    clean.setenv("RESDYN_SLURM_SCHUR_EXTRA", "--exclusive")
    res = site.set_resources()
    assert res["lens"]["qos"] == "long" and res["lens"]["slurm_partition"] == "bigmem_gpu"
    assert res["lens_metrics"]["qos"] == "gpu"
    assert res["schur"] == {"slurm_extra": "--exclusive"}


@pytest.mark.parametrize("var", ["RESDYN_SLURM_GPU_EXTRA", "RESDYN_SLURM_EXTRA", "RESDYN_SLURM_LENS_EXTRA"])
@pytest.mark.parametrize("flags", ["--mem=10G", "--frobnicate", "-p gpu", "--qos=x"])
def test_an_sbatch_flag_the_plugin_sets_or_sbatch_lacks_is_one_line(clean, var, flags):
    clean.setenv(var, flags)
    with pytest.raises(ValueError) as err:
        site.set_resources()
    msg = str(err.value)
    assert msg.startswith(f"{var}={flags!r}: ") and "\n" not in msg and "allowed: --begin" in msg


@pytest.mark.parametrize(
    "kind,want",
    [
        ("a100-40", "a100_40g"),
        ("a100-80", "a100_80g|h100_80g"),
        ("h100", "a100_80g|h100_80g"),
        ("l40s", "l40s_48g"),
        ("h200", "h200_141g"),
    ],
)
def test_the_constraint_table_picks_the_entry_of_the_gpu_kinds_memory(clean, tmp_path, kind, want):
    text = "40=a100_40g,48=l40s_48g,80=a100_80g|h100_80g,141=h200_141g"
    clean.setenv("RESDYN_GPU_KIND", kind)
    clean.setenv("RESDYN_SLURM_GPU_CONSTRAINTS", text)
    assert site.job_class_settings(gpu=True)["constraint"] == want
    table = tmp_path / "constraints.yaml"
    table.write_text("40: a100_40g\n48: l40s_48g\n80: a100_80g|h100_80g\n141: h200_141g\n")
    clean.setenv("RESDYN_SLURM_GPU_CONSTRAINTS", str(table))
    assert site.job_class_settings(gpu=True)["constraint"] == want
    clean.setenv("RESDYN_SLURM_GPU_CONSTRAINT", "explicit")  # an explicit constraint wins
    assert site.job_class_settings(gpu=True)["constraint"] == "explicit"


def test_a_bad_constraint_table_is_one_line(clean):
    clean.setenv("RESDYN_SLURM_GPU_CONSTRAINTS", "forty=a100")
    with pytest.raises(ValueError, match=r"^RESDYN_SLURM_GPU_CONSTRAINTS='forty=a100': entry 'forty'"):
        site.set_resources()
    clean.setenv("RESDYN_SLURM_GPU_CONSTRAINTS", "40=a100_40g")
    clean.setenv("RESDYN_GPU_KIND", "h200")
    with pytest.raises(ValueError, match="no entry of at least 133 GB for RESDYN_GPU_KIND=h200"):
        site.set_resources()
    clean.setenv("RESDYN_GPU_KIND", "v100")
    with pytest.raises(ValueError, match="RESDYN_GPU_KIND='v100': not a GPU kind of gpus.yaml; allowed: a100-40"):
        site.set_resources()


def test_on_a_weak_fp64_gpu_spectra_and_bootstrap_are_cpu_jobs(clean):
    clean.setenv("RESDYN_GPU_KIND", "l40s")
    clean.setenv("RESDYN_SLURM_PARTITION", "cpuq")
    clean.setenv("RESDYN_SLURM_GPU_PARTITION", "gpuq")
    clean.setenv("RESDYN_SLURM_GPU_MODEL", "l40s")
    profile = _profile()
    for rule in ("spectra", "bootstrap"):
        assert profile["set-resources"][rule] == {"slurm_partition": "cpuq"}, rule
        assert rule not in profile["set-threads"]  # threads: the cost model's, as every CPU job
    assert profile["set-resources"]["lens"]["gpu_model"] == "l40s"
    clean.setenv("RESDYN_GPU_KIND", "a100-40")
    assert _profile()["set-resources"]["spectra"]["slurm_partition"] == "gpuq"
