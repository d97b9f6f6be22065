"""Qwen3 and Gemma 3 at the workflow level: the Qwen3/Gemma 3 preset validates, plans and
dry-runs against config.json stand-ins; ``family: generic`` is priced and flagged by the plan.
Their tiny hub stand-ins (configs/reach-mini.yaml's models) run through the whole DAG offline in
tests/test_user_configs.py (test_qwen3_and_gemma3_minis_run_the_whole_dag: one run serves both)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from resdyn.cluster import cost
from resdyn.lm import families
from resdyn.pipeline import config as rc
from resdyn.pipeline import plan

from helpers import hubcache

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
PRESET = ROOT / "configs" / "qwen3-gemma3.yaml"


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Path:
    return hubcache.build_paper_standins(tmp_path_factory.mktemp("reach-hub"), [PRESET])


@pytest.fixture
def offline_standins(standins, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(standins))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return standins


def test_preset_validates_with_shapes_from_config_json(offline_standins):
    cfg = rc.validate_config(yaml.safe_load(PRESET.read_text()))
    assert {m["family"] for m in cfg["models"].values()} == {"qwen3", "gemma3"}
    assert (cfg["models"]["qwen3_8b"]["n_layers"], cfg["models"]["qwen3_8b"]["d_model"]) == (36, 4096)
    # the multimodal Gemma 3 checkpoints: shapes of the text tower
    assert (cfg["models"]["gemma3_27b"]["n_layers"], cfg["models"]["gemma3_27b"]["d_model"]) == (62, 5376)
    text = plan.render(cfg, "h100", gpus=4)
    assert "total:" in text and "generic path" not in text


def test_generic_family_is_priced_and_flagged(offline_standins):
    """family: generic validates for these checkpoints, costs GENERIC_SLOWDOWN times the
    Jacobian work of the adapter, and the plan names it."""
    raw = yaml.safe_load(PRESET.read_text())
    raw["models"] = {"qwen3_06b": raw["models"]["qwen3_06b"]}
    raw["scaling"]["groups"] = {"qwen3": ["qwen3_06b"]}
    adapter = rc.validate_config(copy.deepcopy(raw))
    raw["models"]["qwen3_06b"]["family"] = "generic"
    generic = rc.validate_config(raw)
    assert generic["models"]["qwen3_06b"]["family"] == "generic"
    assert rc.checkpoint_spec(generic, "qwen3_06b", "main")["family"] == "generic"
    assert "family" not in rc.checkpoint_spec(adapter, "qwen3_06b", "main")
    s_adapter, s_generic = cost.model_shape(adapter, "qwen3_06b"), cost.model_shape(generic, "qwen3_06b")
    c_adapter = cost.cost_jacobians(adapter, s_adapter, [0, 1, 2, 3], gpu=True)
    c_generic = cost.cost_jacobians(generic, s_generic, [0, 1, 2, 3], gpu=True)
    assert c_generic.work["jvp"] == pytest.approx(families.GENERIC_SLOWDOWN * c_adapter.work["jvp"])
    assert c_generic.flops > c_adapter.flops
    text = plan.render(generic, "h100")
    assert "generic path" in text and "qwen3_06b" in text


@pytest.mark.slow
def test_preset_dry_runs(standins, tmp_path):
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_CACHE": str(standins),
        "HF_HUB_OFFLINE": "1",
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", str(PRESET), "--directory", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for rule in ("jacobians", "lens", "scaling"):
        assert rule in out
    assert "results/gemma3_27b/main/jacobians" in out and "results/qwen3_8b/main/jacobians" in out


def test_family_contradicting_config_json_is_one_line(offline_standins):
    """A family written in the config that config.json contradicts stops validation in one line."""
    raw = yaml.safe_load(PRESET.read_text())
    raw["models"]["qwen3_06b"]["family"] = "qwen2"
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(raw)
    lines = [line for line in str(err.value).splitlines() if "qwen3_06b" in line]
    assert len(lines) == 1 and "'qwen2' disagrees with config.json" in lines[0] and "'qwen3'" in lines[0], lines
