"""GPU kinds as data, jobs placed on one GPU or several, and what `resdyn plan` says.

The kinds come from resdyn/data/gpus.yaml; a job fits one GPU or spans several of one node (the
cost model's placement and the loader that follows it).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from resdyn.cluster import cost, gpu_kinds, multigpu
from resdyn.lm import decompose, models, structure
from resdyn.pipeline import config as rc
from resdyn.pipeline import dag, plan

REPO = Path(__file__).resolve().parents[1]
KINDS = ("a100-40", "a100-80", "l40s", "h100", "h200")


@pytest.fixture(scope="module")
def paper_b(paper_hub_cache):
    import os

    old = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(paper_hub_cache)
    try:
        yield rc.load_config(REPO / "configs" / "paper-b.yaml")
    finally:
        if old is None:
            os.environ.pop("HF_HUB_CACHE", None)
        else:
            os.environ["HF_HUB_CACHE"] = old


def test_the_table_has_every_kind_with_sources_and_prices_h100_as_before():
    assert set(KINDS) <= set(gpu_kinds.GPU_KINDS)
    for kind, g in gpu_kinds.GPU_KINDS.items():
        assert g.source and "datasheet" in g.source, kind
        assert g.memory_mib > 0 and g.bf16_tflops > g.fp32_tflops > 0 and g.hbm_tb_s > 0, kind
        assert gpu_kinds.DEVICES[kind].kind == "gpu"
    # the H100's rates from the table equal the cost model's reference H100 rates (the efficiencies are fitted to them)
    before = {
        "gemm32": 4.5e13,
        "gemm16": 6.0e14,
        "gemm64": 4.5e13,
        "jvp": 2.0e13,
        "eig": 2.3e11,
        "svd": 3.8e11,
        "svdvals": 1.2e11,
        "stream": 2.5e12,
    }
    for op, rate in before.items():
        assert gpu_kinds.DEVICES["h100"].rates[op] == pytest.approx(rate, rel=0.02), op
    assert gpu_kinds.DEVICES["h200"].rates["stream"] == pytest.approx(3.6e12, rel=1e-9)  # 0.75 · 4.8 TB/s


def test_a_table_row_with_a_missing_or_unknown_column_is_refused(tmp_path):
    good = gpu_kinds.GPU_TABLE.read_text()
    bad = tmp_path / "gpus.yaml"
    bad.write_text(good.replace("  hbm_tb_s: 1.555\n", "  hbm_tbs: 1.555\n", 1))
    with pytest.raises(ValueError, match=r"a100-40.*missing \['hbm_tb_s'\], unknown \['hbm_tbs'\]"):
        gpu_kinds.load_gpu_kinds(bad)


def test_weak_fp64_moves_the_decompositions_to_the_host_cpu():
    """L40S runs the decompositions on the host; every other kind keeps them on the GPU.

    Its FP64 = FP32/64: the eigvals rate (0.68 % of 1.43 TFLOP/s) is below 8 host cores'
    (1.19e10 · (1 + 7 · 0.35)).
    """
    host = gpu_kinds.CPU_CALIBRATION["eig"] * (1 + 7 * gpu_kinds.THREAD_EFFICIENCY["eig"])
    for kind in KINDS:
        gpu = gpu_kinds.GPU_KINDS[kind].fp64_tflops * 1e12 * gpu_kinds.GPU_EFFICIENCY["eig"][1]
        assert gpu_kinds.host_linalg(kind) is (gpu < host), kind
    assert [k for k in KINDS if gpu_kinds.host_linalg(k)] == ["l40s"]
    config = {"device": "cuda"}
    assert cost.linalg_device(config, "l40s") == "cpu" and cost.linalg_device(config, "a100-40") == "cuda"
    assert not cost.uses_gpu(config, "spectra", "l40s") and cost.uses_gpu(config, "spectra", "h100")
    assert cost.uses_gpu(config, "lens", "l40s")


def _brute_force_min_max(sizes, capacities):
    """Smallest largest load over every contiguous split of ``sizes`` onto the devices in order.

    Devices may stay empty, and each holds at most its capacity; None when no split fits.
    """
    best, n, k = None, len(sizes), len(capacities)
    for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
        bounds = (0, *cuts, n)
        loads = [sum(sizes[bounds[i] : bounds[i + 1]]) for i in range(k)]
        if all(load <= cap for load, cap in zip(loads, capacities)):
            best = max(loads) if best is None else min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_split_blocks_is_the_balanced_contiguous_split(seed):
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(1, 10, size=rng.integers(3, 9)).astype(float))
    k = int(rng.integers(2, 4))
    capacities = list(rng.integers(int(max(sizes)), int(sum(sizes)) + 1, size=k).astype(float))
    want = _brute_force_min_max(sizes, capacities)
    got = multigpu.split_blocks(sizes, capacities)
    if want is None:
        assert got is None
        return
    assert got == sorted(got) and len(got) == len(sizes)  # contiguous, in order
    loads = [sum(s for s, d in zip(sizes, got) if d == dev) for dev in range(k)]
    assert all(load <= cap for load, cap in zip(loads, capacities))
    assert max(loads) == pytest.approx(want, rel=1e-9)


def test_32b_lens_on_h100_spans_two_gpus_and_fits_one_h200(paper_b, monkeypatch):
    w = {"model": "qwen25_32b", "ckpt": "main"}
    c = dag.job_cost(paper_b, "lens", w, "h100")
    s = cost.model_shape(paper_b, "qwen25_32b")
    usable = gpu_kinds.GPU_KINDS["h100"].usable_bytes
    assert c.device_bytes > usable  # 112.7 GB: more than one H100 holds, so one GPU would run out of memory
    p = dag.job_placement(paper_b, "lens", w, "h100")
    assert p.devices == 2 and p.embed == 0 and p.head == 1
    assert list(p.layers) == sorted(p.layers) and set(p.layers) == {0, 1}
    assert sum(p.loads) == pytest.approx(sum(multigpu.block_bytes(s)) + multigpu.working_bytes(c, s))
    assert max(p.loads) <= usable and p.loads[1] >= multigpu.working_bytes(c, s)
    assert dag.resources(paper_b, "lens", w, device="h100")["gpu"] == 2
    assert dag.resources(paper_b, "lens", w, device="h200")["gpu"] == 1
    monkeypatch.setenv("RESDYN_GPU_KIND", "h100")  # the rule's param: the map the loader follows
    assert dag.placement_param(paper_b, "lens", w) == p.device_map()
    monkeypatch.setenv("RESDYN_GPU_KIND", "h200")
    assert dag.placement_param(paper_b, "lens", w) is None
    dm = p.device_map()
    assert dm["embed"] == 0 and dm["head"] == 1 and [dm[f"layers.{i}"] for i in range(s.n_layers)] == list(p.layers)


def test_plan_marks_what_spans_and_what_fits_no_node(paper_b):
    text = plan.render(paper_b, "h100")
    assert "SPANS 2 GPUs: lens qwen25_32b/main" in text and "the rule requests gpu=2" in text
    jobs = plan.job_table(paper_b, "h100")
    lens32 = jobs[(jobs.rule == "lens") & (jobs.model == "qwen25_32b")].iloc[0]
    rules = plan.rule_table(jobs).set_index("rule")
    assert rules.loc["lens", "gpu_hours"] == pytest.approx(
        (jobs[jobs.rule == "lens"].seconds * jobs[jobs.rule == "lens"].gpus).sum() / 3600
    )
    assert lens32.gpus == 2  # priced as two GPUs for its whole run
    small = plan.render(paper_b, "a100-40")
    assert "DOES NOT FIT: job lens qwen25_32b/main" in small and "a100-80, h100, h200" in small
    assert "every GPU job fits one h200" in plan.render(paper_b, "h200")


def test_the_jacobians_never_span_gpus(paper_b):
    w = {"model": "qwen25_32b", "ckpt": "main", "block": "layers000-063"}
    cfg = {**paper_b, "studies": ["A", "B"], "jacobian": {**paper_b["jacobian"]}}
    with pytest.raises(multigpu.FitError, match="lower jacobian.layers_per_job"):
        dag.job_placement(cfg, "jacobians", w, "a100-40")


def test_plan_with_an_unknown_gpu_kind_is_one_line(paper_hub_cache):
    res = subprocess.run(
        [sys.executable, "-m", "resdyn.cli", "plan", "configs/smoke.yaml", "--gpu", "v100"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "resdyn plan: error: --gpu='v100': not a GPU kind of gpus.yaml; allowed: a100-40, a100-80, l40s, h100, h200"
    )


# ----------------------------------------------------------------------------------------------
# loading a placed model: the same code path on the CPU (every device "cpu") gives the same numbers


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from resdyn.lm import corpus

    out = tmp_path_factory.mktemp("tok")
    corpus.train_tokenizer(corpus.kjv_chapters()[:50], 300, out)
    return out


def _tiny(folder: Path, tied: bool, tok_dir: Path | None = None) -> Path:
    cls = transformers.Qwen2Config if tied else transformers.LlamaConfig
    cfg = cls(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    if tok_dir is not None:
        from resdyn.lm import corpus

        corpus.load_tokenizer(tok_dir).save_pretrained(folder)
    return folder


def _record(folder: Path) -> dict:
    return models.resolve_checkpoint(
        {"model": "m", "checkpoint": "local", "source": "local", "path": str(folder), "dtype": "float32"}
    )


@pytest.mark.parametrize("tied", [False, True])
def test_module_device_map_follows_the_blocks(tmp_path, tied):
    folder = _tiny(tmp_path / "m", tied)
    blocks = {"embed": 0, "layers.0": 0, "layers.1": 0, "layers.2": 1, "layers.3": 1, "head": 1}
    dm = models.placed_device_map(folder, blocks, ["cuda:0", "cuda:1"])
    assert [dm[f"model.layers.{i}"] for i in range(4)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert dm["lm_head"] == dm["model.norm"] == "cuda:1"
    assert dm["model.embed_tokens"] == ("cuda:1" if tied else "cuda:0")  # a tied table lives with the head
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    for name, _ in model.named_parameters():  # every weight is placed by exactly one entry
        assert sum(name == k or name.startswith(k + ".") for k in dm) == 1, name


@pytest.mark.parametrize("tied", [False, True])
def test_a_placed_model_on_cpu_gives_the_single_device_numbers(tmp_path, tied, tok_dir, monkeypatch):
    from resdyn.beyond import causal
    from resdyn.study_b import lens

    rec = _record(_tiny(tmp_path / "m", tied, tok_dir))
    one, _ = models.load_model(rec, "cpu")
    blocks = {"embed": 0, "layers.0": 0, "layers.1": 1, "layers.2": 1, "layers.3": 2, "head": 2}
    maps, build = [], models.placed_device_map
    monkeypatch.setattr(models, "placed_device_map", lambda *a: maps.append(build(*a)) or maps[-1])
    placed, _ = models.load_model(rec, "cpu", placement=blocks)
    assert len(maps) == 1 and set(maps[0].values()) == {"cpu"} and "model.layers.3" in maps[0]  # the device_map path
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    for fn in (structure.residual_states, decompose.boundary_states, lens.layer_major_states):
        assert torch.equal(fn(one, ids), fn(placed, ids)), fn.__name__
    a, b = causal.Continuation(one, ids), causal.Continuation(placed, ids)
    h = a.stream(2) * 0.5
    assert torch.equal(a.run(h, 2), b.run(h, 2))
    assert torch.equal(structure.unembed_logits(one, a.stream(4)), structure.unembed_logits(placed, b.stream(4)))


def test_a_placement_on_more_gpus_than_visible_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeError, match="placed on 2 GPUs but this job sees 1"):
        models.placement_devices(torch.device("cuda"), 2)


def test_a_run_whose_job_fits_no_node_stops_before_any_job(paper_b, paper_hub_cache):
    dag.check_fits(paper_b, "h100")  # spans, but fits
    with pytest.raises(
        multigpu.FitError, match=r"^job lens \S+_32b/main: .* fits no 8 x a100-40 .*a100-80, h100, h200"
    ):
        dag.check_fits(paper_b, "a100-40")
    # a CPU run holds no GPU, so no GPU kind refuses it; its 13B lens would run for weeks on a CPU
    with pytest.raises(multigpu.FitError, match=r"^job lens \S+: asks for .* h; a job may ask for at most") as err:
        dag.check_fits({**paper_b, "device": "cpu"}, "a100-40")
    assert "a100-40" not in str(err.value)
    env = {
        **__import__("os").environ,
        "HF_HUB_CACHE": str(paper_hub_cache),
        "HF_HUB_OFFLINE": "1",
        "RESDYN_GPU_KIND": "a100-40",
        "PYTHONPATH": str(REPO),
    }
    res = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--configfile", "configs/paper-b.yaml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert res.returncode != 0 and "fits no 8 x a100-40" in res.stdout + res.stderr


@pytest.mark.parametrize("model,kind", [("qwen25_14b", "h100"), ("qwen25_32b", "h200")])
def test_layers_per_job_0_gives_the_most_layers_one_gpu_of_the_priced_kind_holds(paper_b, monkeypatch, model, kind):
    """jacobian.layers_per_job 0 on a GPU: blocks of K layers, every block's job fits one GPU of the
    kind and K + 1 layers would not; on a CPU, all layers in one job."""
    monkeypatch.setenv("RESDYN_GPU_KIND", kind)
    cfg = {**paper_b, "jacobian": {**paper_b["jacobian"], "layers_per_job": 0}}
    s, usable = cost.model_shape(cfg, model), gpu_kinds.GPU_KINDS[kind].usable_bytes
    blocks = [rc.block_layers(b) for b in rc.layer_blocks(cfg, model)]
    per = len(blocks[0])
    assert 1 < per < s.n_layers and sum(map(len, blocks)) == s.n_layers
    assert all(cost.cost_jacobians(cfg, s, b, True).device_bytes <= usable for b in blocks)
    wider = [list(range(a, min(a + per + 1, s.n_layers))) for a in range(0, s.n_layers, per + 1)]
    assert max(cost.cost_jacobians(cfg, s, b, True).device_bytes for b in wider) > usable
    cpu = {**cfg, "device": "cpu"}
    assert rc.layer_blocks(cpu, model) == [f"layers000-{s.n_layers - 1:03d}"]


def test_a_jacobian_block_that_fits_no_gpu_names_the_most_layers_that_do(paper_b):
    cfg = {**paper_b, "jacobian": {**paper_b["jacobian"], "layers_per_job": 32}}
    w = {"model": "qwen25_32b", "ckpt": "main", "block": "layers000-031"}
    most = cost.jacobian_block_size(cfg, cost.model_shape(cfg, "qwen25_32b"), gpu_kinds.GPU_KINDS["h200"].usable_bytes)
    with pytest.raises(multigpu.FitError) as err:
        dag.job_placement(cfg, "jacobians", w, "h200")
    assert f"lower jacobian.layers_per_job to at most {most} (0: the most that fit)" in str(err.value)
    assert "\n" not in str(err.value)
