"""Per-model overrides (``models.<name>.overrides``): lens (train vs import), samples, the Jacobian
block size, device and GPU kind — merged into the global sections, validated like them, used by
the DAG, the cost model and shown by `resdyn plan`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from resdyn.pipeline import config as rc
from resdyn.pipeline import dag, plan

REPO = Path(__file__).resolve().parents[1]


def _default(**overrides) -> dict:
    cfg = rc.read_yaml(REPO / "config.yaml")
    cfg["models"]["llama8"]["overrides"] = overrides
    return cfg


def test_overrides_merge_into_the_model_s_view_only():
    cfg = rc.validate_config(
        _default(
            samples={"n": 8, "length": 32},
            jacobian={"layers_per_job": 3},
            lens={"steps": 7},
            device="cpu",
            gpu_kind="a100-80",
        )
    )
    mine, other = rc.model_config(cfg, "llama8"), rc.model_config(cfg, "llama12")
    assert other is cfg  # no overrides: the config itself
    assert mine["samples"] == {**cfg["samples"], "n": 8, "length": 32}
    assert mine["lens"] == {**cfg["lens"], "steps": 7} and mine["device"] == "cpu" and mine["gpu_kind"] == "a100-80"
    assert mine["jacobian"]["store_first_n"] == min(cfg["jacobian"]["store_first_n"], 8)
    assert mine["causal"]["n_samples"] <= 8
    assert rc.layer_blocks(cfg, "llama8") == ["layers000-002", "layers003-005", "layers006-007"]
    assert rc.layer_blocks(cfg, "llama12") == rc.layer_blocks(rc.validate_config(_default()), "llama12")


def test_the_cost_model_prices_a_model_with_its_own_values():
    cfg = rc.validate_config(_default(samples={"n": 8}))
    same = rc.validate_config(rc.read_yaml(REPO / "config.yaml"))
    same["samples"]["n"] = 8
    same["jacobian"]["store_first_n"] = min(same["jacobian"]["store_first_n"], 8)
    same["causal"]["n_samples"] = min(same["causal"]["n_samples"], 8)
    w = {"model": "llama8", "ckpt": "step600", "block": rc.layer_blocks(cfg, "llama8")[0]}
    for rule in ("jacobians", "activations", "lens_metrics", "causal"):
        assert dag.job_cost(cfg, rule, w).work == dag.job_cost(same, rule, w).work, rule
    # the other models keep the global samples
    w12 = {"model": "llama12", "ckpt": "step600"}
    assert dag.job_cost(cfg, "activations", w12).work != dag.job_cost(same, "activations", w12).work


def test_a_model_s_gpu_kind_and_device_price_its_jobs():
    cfg = rc.validate_config(_default(gpu_kind="l40s"))
    w = {"model": "llama8", "ckpt": "step600"}
    assert not dag.job_cost(cfg, "spectra", w, "h100").gpu  # l40s: weak FP64, on the CPU
    assert dag.job_cost(cfg, "spectra", {"model": "llama12", "ckpt": "step600"}, "h100").gpu
    cpu = rc.validate_config(_default(device="cpu"))
    assert not dag.job_cost(cpu, "lens", w).gpu and dag.resources(cpu, "lens", w)["gpu"] == 0
    text = plan.render(cfg, "h100")
    assert "model llama8 overrides: gpu_kind=l40s" in text


@pytest.mark.parametrize(
    "over,line",
    [
        ({"samples": {"n": 1}}, "config key 'models.llama8.overrides.samples.n': value 1 is invalid"),
        ({"samples": {"size": 3}}, "config key 'models.llama8.overrides.samples.size': unknown key"),
        ({"lens": {"source": "tuned_lens"}}, "config key 'models.llama8.overrides.lens.path': required but missing"),
        (
            {"jacobian": {"layers_per_job": -1}},
            "config key 'models.llama8.overrides.jacobian.layers_per_job': value -1",
        ),
        ({"device": "tpu"}, "config key 'models.llama8.overrides.device': value 'tpu' is invalid"),
        ({"gpu_kind": "v100"}, "config key 'models.llama8.overrides.gpu_kind'='v100': not a GPU kind of gpus.yaml"),
        ({"steps": 3}, "config key 'models.llama8.overrides.steps': unknown key"),
    ],
)
def test_a_bad_override_is_one_line_naming_its_key(over, line):
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(_default(**over))
    problems = str(err.value).splitlines()[1:]
    assert len(problems) == 1 and line in problems[0], problems


def test_one_model_imports_a_published_lens_while_the_others_train(tmp_path):
    folder = tmp_path / "lens" / "llama8"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "params.pt").write_bytes(b"")
    cfg = rc.validate_config(_default(lens={"source": "tuned_lens", "path": str(tmp_path / "lens" / "{model}")}))
    assert rc.lens_import_spec(cfg, "llama8", "step600")["path"] == str(folder)
    assert rc.lens_import_spec(cfg, "llama12", "step600") is None
    assert dag.job_cost(cfg, "lens", {"model": "llama8", "ckpt": "step600"}).work.keys() == {"stream"}  # imported
    assert "gemm32" in dag.job_cost(cfg, "lens", {"model": "llama12", "ckpt": "step600"}).work  # trained
    missing = _default(lens={"source": "tuned_lens", "path": str(tmp_path / "nowhere")})
    with pytest.raises(rc.ConfigError, match="tuned-lens folder .*nowhere.* \\(model llama8"):
        rc.validate_config(missing)


@pytest.mark.slow
def test_the_dag_follows_a_model_s_overrides(tmp_path):
    """`snakemake -n` with one zoo model's own samples and Jacobian blocks: its jobs, not the
    others', change."""
    cfg = _default(samples={"n": 8}, jacobian={"layers_per_job": 4})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "2", "--configfile", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    blocks = set(re.findall(r"results/(\w+)/step600/jacobians/(layers\d{3}-\d{3})", res.stdout))
    assert {b for m, b in blocks if m == "llama8"} == {"layers000-003", "layers004-007"}
    assert {b for m, b in blocks if m == "llama12"} == {"layers000-011"}
