"""The cost model (resdyn/cluster/cost.py), `resdyn plan`, and that the rules take their resources from it."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch

from resdyn.cluster import cost, gpu_kinds
from resdyn.pipeline import config as rc
from resdyn.pipeline import dag, plan
from resdyn.study_a import spectral

REPO = Path(__file__).resolve().parents[1]
PAPER_A = REPO / "configs" / "paper-a.yaml"
PAPER_B = REPO / "configs" / "paper-b.yaml"
HEAVY = (
    "jacobians",
    "activations",
    "lens",
    "lens_metrics",
    "causal",
    "spectra",
    "schur",
    "bootstrap",
    "communities",
    "coupling",
    "bridge",
    "rss",
    "resolution",
    "phase_metrics",
)


@pytest.fixture(scope="module")
def hub_env(paper_hub_cache):
    """The paper presets validate against config.json stand-ins (tests/helpers/hubcache.py)."""
    old = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(paper_hub_cache)
    yield {**os.environ, "PYTHONPATH": str(REPO)}
    if old is None:
        os.environ.pop("HF_HUB_CACHE", None)
    else:
        os.environ["HF_HUB_CACHE"] = old


@pytest.fixture(scope="module")
def paper_a(hub_env) -> dict:
    return rc.load_config(PAPER_A)


@pytest.fixture(scope="module")
def paper_b(hub_env) -> dict:
    return rc.load_config(PAPER_B)


def _with_model(config: dict, **shape) -> dict:
    cfg = copy.deepcopy(config)
    name = next(iter(cfg["models"]))
    cfg["models"] = {name: {**cfg["models"][name], **shape}}
    return cfg


def _w(config: dict, rule: str) -> dict:
    name = next(iter(config["models"]))
    ckpt = rc.checkpoints(config, name)[-1]
    w = {"model": name, "ckpt": ckpt}
    if rule == "jacobians":
        w["block"] = rc.layer_blocks(config, name)[0]
    return w


@pytest.mark.parametrize("rule", HEAVY)
@pytest.mark.parametrize(
    "key,small,large", [("d_model", 2048, 4096), ("d_ff", 8192, 16384), ("vocab_size", 32000, 128256)]
)
def test_cost_is_monotonic_in_model_sizes(paper_a, rule, key, small, large):
    a = dag.job_cost(_with_model(paper_a, **{key: small}), rule, _w(paper_a, rule))
    b = dag.job_cost(_with_model(paper_a, **{key: large}), rule, _w(paper_a, rule))
    for dev in ("cpu", "h100"):
        assert cost.seconds(b, dev) >= cost.seconds(a, dev), (rule, key, dev)
    assert b.flops >= a.flops and b.host_bytes >= a.host_bytes and b.disk_bytes >= a.disk_bytes


@pytest.mark.parametrize("rule", ("jacobians", "activations", "communities", "lens_metrics", "phase_metrics"))
def test_cost_grows_with_samples(paper_a, rule):
    more = copy.deepcopy(paper_a)
    more["samples"]["n"] *= 2
    a, b = dag.job_cost(paper_a, rule, _w(paper_a, rule)), dag.job_cost(more, rule, _w(more, rule))
    assert b.flops > a.flops and cost.seconds(b, "cpu") > cost.seconds(a, "cpu")


def test_bootstrap_cost_is_linear_in_resamples(paper_a):
    """(R + 2) rows × S sublayers eigen-analyses: doubling R + 2 doubles the eigen work (the bootstrap
    of the first n samples, without group means)."""
    cfg = copy.deepcopy(paper_a)
    cfg["jacobian"]["n_groups"] = 0
    cfg["bootstrap"]["n_resamples"] = 48
    a = dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap")).work["eig"]
    cfg["bootstrap"]["n_resamples"] = 98
    b = dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap")).work["eig"]
    assert b == pytest.approx(2 * a)


def test_the_first_n_second_method_adds_its_bootstrap_pass(paper_a):
    """bootstrap.first_n with group means: the jackknife's work plus the first-n bootstrap's, the
    memory of the larger pass."""
    cfg = copy.deepcopy(paper_a)
    cfg["jacobian"]["n_groups"] = 20
    cfg["bootstrap"]["first_n"] = False
    jack = dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap"))
    cfg["bootstrap"]["first_n"] = True
    both = dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap"))
    cfg["jacobian"]["n_groups"] = 0
    first = dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap"))
    assert both.work["eig"] == pytest.approx(jack.work["eig"] + first.work["eig"])
    assert both.host_bytes == max(jack.host_bytes, first.host_bytes)


def test_group_jackknife_cost_has_one_row_per_group(paper_a):
    """With B group means: B + 2 rows, whatever n_resamples (the jackknife pass alone: bootstrap.first_n
    off); the Jacobian job holds and writes the B means (float32 here)."""
    cfg = copy.deepcopy(paper_a)
    cfg["jacobian"]["n_groups"] = 20
    cfg["jacobian"]["group_dtype"] = "float32"
    cfg["bootstrap"]["first_n"] = False
    a = dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap")).work["eig"]
    cfg["bootstrap"]["n_resamples"] = 98
    assert dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap")).work["eig"] == pytest.approx(a)
    cfg["jacobian"]["n_groups"] = 40
    assert dag.job_cost(cfg, "bootstrap", _w(cfg, "bootstrap")).work["eig"] == pytest.approx(a * 42 / 22)
    with_groups = dag.job_cost(cfg, "jacobians", _w(cfg, "jacobians"))
    cfg["jacobian"]["n_groups"] = 0
    without = dag.job_cost(cfg, "jacobians", _w(cfg, "jacobians"))
    # per sublayer of the block: 40 float32 means on disk; 40 float32 means and one float64 start in memory
    disk, host = with_groups.disk_bytes - without.disk_bytes, with_groups.host_bytes - without.host_bytes
    sublayer_d2 = disk / (40 * 4.0)  # Σ over the block's sublayers of d²
    assert sublayer_d2 > 0 and host == pytest.approx((40 * 4.0 + 8.0) * sublayer_d2)


@pytest.mark.parametrize("rule", HEAVY)
def test_resources_grow_with_attempt(paper_a, rule):
    one = dag.resources(paper_a, rule, _w(paper_a, rule), attempt=1)
    two = dag.resources(paper_a, rule, _w(paper_a, rule), attempt=2)
    three = dag.resources(paper_a, rule, _w(paper_a, rule), attempt=3)
    for key in ("mem_mb", "runtime"):
        assert one[key] < two[key] < three[key], (rule, key)
        assert abs(two[key] - 2 * one[key]) <= 2 and abs(three[key] - 3 * one[key]) <= 3
    assert one["threads"] == two["threads"] and one["gpu"] == two["gpu"]


def test_closed_form_flops_of_a_matmul_dominated_job():
    """The FLOPs of the Jacobians of one Llama-3.1-8B layer are its two closed-form GEMMs.

    One sample, last token, no forward context: the fp32 GEMMs are W_o·(∂o/∂x) = 2·d·(H·hd)·d
    and W_down·M = 2·d·d_ff·d.
    """
    s = cost.Shape(n_layers=32, d=4096, n_heads=32, n_kv_heads=8, d_ff=14336, vocab=128256)
    cfg = {
        "samples": {"n": 1, "length": 128},
        "jacobian": {"positions": "last", "store_first_n": 0, "store_dtype": "float32"},
    }
    c = cost.cost_jacobians(cfg, s, [0], gpu=True)
    assert c.work["gemm32"] == 2 * 4096**3 + 2 * 4096 * 14336 * 4096  # 618.5 GFLOP
    assert c.work["gemm32"] == pytest.approx(618.48e9, rel=1e-4)
    # the context forward through layer 0 in bf16: 2·T·P_layer + 2·T·T·H·hd
    assert c.work["gemm16"] == 128 * (2 * s.layer_params + 2 * 128 * 4096)
    assert s.layer_params == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # 218.1 M


def test_mlp_jacobian_flops_match_torch_flop_counter():
    """torch's FlopCounterMode counts the MLP Jacobian GEMM the cost model prices.

    Independent oracle: on a small layer it counts the same 2·d·d_ff·d GEMM (plus the two
    projections of the input).
    """
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    from resdyn.study_a import jacobian

    d, d_ff = 64, 224
    mlp = LlamaMLP(LlamaConfig(hidden_size=d, intermediate_size=d_ff)).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        jacobian.gated_mlp_jacobian(mlp, torch.randn(d))
    s = cost.Shape(1, d, 1, 1, d_ff, 10, 2, head_dim=d)  # bf16: the context forward is gemm16
    c = cost.cost_jacobians(
        {
            "samples": {"n": 1, "length": 1},
            "jacobian": {"positions": "last", "store_first_n": 0, "store_dtype": "float32"},
        },
        s,
        [0],
        gpu=True,
    )
    mlp_gemm = c.work["gemm32"] - 2.0 * d * s.d_q * d
    assert counter.get_total_flops() == mlp_gemm + 2 * 2 * d * d_ff


def test_shape_needs_d_ff_and_vocab_never_guesses(paper_a):
    cfg = copy.deepcopy(paper_a)
    name = next(iter(cfg["models"]))
    del cfg["models"][name]["d_ff"]
    del cfg["models"][name]["vocab_size"]
    with pytest.raises(cost.ShapeError) as err:
        cost.model_shape(cfg, name)
    assert f"models.{name}" in str(err.value) and "d_ff, vocab_size" in str(err.value), str(err.value)


def test_shapes_of_paper_configs(paper_a, paper_b):
    assert cost.model_shape(paper_b, "qwen25_32b").d_ff == 27648  # not 3.5·d = 17920
    assert cost.model_shape(paper_b, "olmo2_1b").vocab == 100352
    assert cost.model_shape(paper_a, "gemma4_e4b").vocab == 262144


@pytest.mark.parametrize("which", ["a", "b"])
def test_plan_is_complete_and_within_targets(paper_a, paper_b, which):
    cfg = paper_a if which == "a" else paper_b
    jobs = plan.job_table(cfg, "h100")
    table = plan.rule_table(jobs)
    rules = set(table.rule)
    study_a = {"jacobians", "activations", "spectra", "schur", "bootstrap", "communities", "coupling"}
    study_b = {"lens", "lens_metrics", "rss", "resolution", "causal", "phase_metrics", "activations"}
    want = (study_a if rc.runs(cfg, "A") else set()) | (study_b if rc.runs(cfg, "B") else set())
    want |= {"bridge"} if rc.runs(cfg, "A", "B") else set()
    assert rules >= want, want - rules
    assert not (rules & (study_a - study_b)) or rc.runs(cfg, "A")
    if rc.runs(cfg, "A"):
        n_blocks = sum(len(rc.layer_blocks(cfg, m)) * len(rc.checkpoints(cfg, m)) for m in cfg["models"])
        assert int(table.set_index("rule").loc["jacobians", "jobs"]) == n_blocks
    t = plan.totals(jobs, gpus=1, cores=64, device="h100")
    assert all(np.isfinite([t.gpu_hours, t.cpu_hours, t.disk_gb, t.critical_h, t.wall_low_h]))
    assert t.critical_h <= t.wall_low_h <= t.wall_high_h
    # budgets the paper presets stay within (paper-a ≤ 100 CPU-hours, paper-b ≤ 80 GPU-hours on H100s,
    # two thirds of it the lenses on tuned-lens's 65.5M fresh tokens), at the calibrated CPU rates and
    # the assumed H100 rates
    if which == "a":
        assert t.cpu_hours <= 100, t
    else:
        assert t.gpu_hours <= 80, t
    text = plan.render(cfg, "h100", 1, 64)
    for word in ("GPU-hours", "CPU-hours", "critical path", "wall time", "host_gb", "device_gb", "disk_gb", "jobs"):
        assert word in text
    # every rule of the DAG is in the table or named as not priced
    named = set(table.rule) | {r for r in cost.LOCAL_UNPRICED_RULES if r in text}
    assert named >= set(_rule_blocks()) - {"zoo_train", "tokenizer"} - (
        {"bridge"} if not rc.runs(cfg, "A", "B") else set()
    ) - (set() if rc.runs(cfg, "A") else {"jacobians", "spectra", "schur", "bootstrap", "communities", "coupling"}) - (
        set()
        if rc.runs(cfg, "B")
        else {"lens", "lens_metrics", "rss", "resolution", "causal", "phase_metrics", "lens_tokens"}
    )


def test_cli_plan_runs(hub_env):
    env = hub_env
    res = subprocess.run(
        [sys.executable, "-m", "resdyn.cli", "plan", str(PAPER_A), "--gpus", "2", "--cores", "32"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "bootstrap" in res.stdout and "2 GPU(s) and 32 CPU cores" in res.stdout


def test_eigen_henrici_reuses_one_schur_factor():
    """Eigenvalues read off the Schur factor equal scipy's eigvals; ‖N‖ gives the Henrici departure."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((60, 60)) + np.triu(rng.standard_normal((60, 60)), 1)
    lam, nn, fro = spectral.eigen_henrici(a)
    ref = scipy.linalg.eigvals(a)
    np.testing.assert_allclose(np.sort_complex(lam), np.sort_complex(ref), atol=1e-10)
    assert nn / fro == pytest.approx(spectral.henrici_departure(a), rel=1e-12)
    assert nn**2 == pytest.approx(fro**2 - np.sum(np.abs(ref) ** 2), rel=1e-8)


def _force_device_path(monkeypatch) -> list:
    """Make the CUDA switch treat any device as CUDA, so the torch code paths run on the CPU.

    The switch is resdyn.numerics.linalg.on_cuda, which bootstrap.py reads too; returns the call log.
    """
    from resdyn.numerics import linalg

    calls: list = []

    def fake(device):
        calls.append(device)
        return device is not None

    monkeypatch.setattr(linalg, "on_cuda", fake)
    return calls


def test_spectra_table_device_path_agrees_on_cpu_torch(monkeypatch):
    """The torch path (used on cuda) run on the CPU's torch equals the scipy reference."""
    rng = np.random.default_rng(1)
    mats = {(0, "attn"): np.eye(40) + rng.standard_normal((40, 40)) / 6, (0, "mlp"): rng.standard_normal((40, 40))}
    ref, ref_arr = spectral.spectra_table(mats)
    calls = _force_device_path(monkeypatch)
    got, got_arr = spectral.spectra_table(mats, device="cpu")
    assert calls, "the torch path was not taken"
    num = [c for c in ref.columns if c not in ("kind",)]
    np.testing.assert_allclose(got[num].to_numpy(float), ref[num].to_numpy(float), rtol=1e-9, atol=1e-9)
    for key in ref_arr:
        np.testing.assert_allclose(got_arr[key]["singular_values"], ref_arr[key]["singular_values"], rtol=1e-10)


def test_bottleneck_reuses_spectra_singular_values():
    rng = np.random.default_rng(2)
    mats = {(L, k): np.eye(30) + rng.standard_normal((30, 30)) / 5 for L in range(2) for k in ("attn", "mlp")}
    _, arrays = spectral.spectra_table(mats)
    a = spectral.bottleneck_table(mats)
    b = spectral.bottleneck_table(mats, spectra=arrays)
    num = [c for c in a.columns if c != "kind"]
    np.testing.assert_allclose(a[num].to_numpy(float), b[num].to_numpy(float), rtol=1e-12)


def _dry_run_resources(configfile: Path, env: dict) -> list[tuple[str, dict, dict]]:
    env = {**env, "RESDYN_GPU_KIND": "h100"}
    res = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "64", "--configfile", str(configfile)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", res.stdout):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        wc = re.search(r"wildcards: (.*)", block)
        rs = re.search(r"resources: (.*)", block)
        th = re.search(r"threads: (\d+)", block)
        wildcards = dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {}
        resources = dict(kv.split("=", 1) for kv in rs.group(1).split(", ")) if rs else {}
        resources["threads"] = th.group(1) if th else "1"
        jobs.append((m.group(1), wildcards, resources))
    return jobs


@pytest.mark.slow
def test_dry_run_of_paper_a_takes_every_resource_from_the_cost_model(paper_a, hub_env):
    """A dry run of paper-a takes every priced job's resources from the cost model.

    `snakemake -n --configfile configs/paper-a.yaml`: each priced job's mem_mb, runtime and (CPU
    rules) threads are exactly resdyn.pipeline.dag.resources(...), the numbers `resdyn plan` sums.
    """
    jobs = _dry_run_resources(PAPER_A, hub_env)
    priced = [(r, w, res) for r, w, res in jobs if r in cost.RULES]
    assert {r for r, _, _ in priced} >= set(HEAVY), {r for r, _, _ in priced}
    for rule, w, res in priced:
        want = dag.resources(paper_a, rule, w, attempt=1, device="h100")
        assert int(res["mem_mb"]) == want["mem_mb"], (rule, w, res, want)
        assert int(res["runtime"]) == want["runtime"], (rule, w, res, want)
        if rule in ("spectra", "schur", "bootstrap", "communities", "bridge", "rss", "resolution"):
            assert int(res["threads"]) == want["threads"], (rule, w, res, want)
    print(f"{len(priced)} jobs: resources equal resdyn.pipeline.dag.resources for every one")


def test_bootstrap_device_path_agrees_on_cpu_torch(monkeypatch):
    """The bootstrap's CUDA code path, run on the CPU's torch, equals the host path.

    The CUDA path uses torch eigvals, Henrici by subtraction and products on the device; the host
    path one Schur factor per matrix.
    """
    from resdyn.beyond import bootstrap as bs

    rng = np.random.default_rng(3)
    base = {(L, k): np.eye(24) + rng.standard_normal((24, 24)) / 4 for L in range(2) for k in ("attn", "mlp")}
    per = {key: m[None] + 0.1 * rng.standard_normal((5, 24, 24)) for key, m in base.items()}
    ref, ref_reps = bs.jacobian_bootstrap(per, n_resamples=20, seed=1)
    calls = _force_device_path(monkeypatch)
    got, got_reps = bs.jacobian_bootstrap(per, n_resamples=20, seed=1, device="cpu")
    assert calls, "the torch path was not taken"
    for col in ("estimate", "ci_low", "ci_high"):
        np.testing.assert_allclose(got[col].to_numpy(float), ref[col].to_numpy(float), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got_reps.value.to_numpy(), ref_reps.value.to_numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("parallel", [True, False, None])
def test_gpt_neox_is_priced_by_its_use_parallel_residual(parallel):
    """config.json's use_parallel_residual reaches the priced shape through config validation.

    Absent means transformers' default, true. Parallel NeoX layers are one operator (3 Jacobian
    groups, n sublayers), sequential ones two (2 groups, 2n sublayers), as resdyn.lm.sublayers
    decides.
    """
    import transformers

    from resdyn.lm import hub, structure

    kw = {} if parallel is None else {"use_parallel_residual": parallel}
    hf = transformers.GPTNeoXConfig(
        vocab_size=512, hidden_size=64, intermediate_size=256, num_attention_heads=4, num_hidden_layers=6, **kw
    )
    data = hf.to_dict()
    if parallel is None:
        data.pop("use_parallel_residual")
    want = parallel is not False
    assert hub.architecture(data)["parallel_residual"] is want
    assert (structure.residual_kind(transformers.GPTNeoXForCausalLM(hf)) == "parallel") is want  # the code agrees
    entry = {"source": "local", "dataset": "d", "family": "gpt_neox", "path": "m", "dtype": "float32"}
    assert rc._shape_errors("models.neox", entry, [("m", data)]) == []
    config = {"models": {"neox": entry}, "tokenizer": {}}
    s = cost.model_shape(config, "neox")
    assert (s.parallel, s.jacobian_groups, s.mlp_mats) == (want, 3 if want else 2, 2)
    cfg = {"schur": {"alphas": [0.0, 1.0]}}
    assert cost.cost_schur(cfg, s).work["schurv"] == (6 if want else 12) * cost.decomposition_flops("schurv", 64)
    wrong = {**entry, "parallel_residual": not want}
    err = rc._shape_errors("models.neox", wrong, [("m", data)])
    assert len(err) == 1 and "use_parallel_residual" in err[0], err


def _rule_blocks() -> dict[str, str]:
    text = "\n".join(p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk")))
    parts = re.split(r"^(?:local)?rule (\w+):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _localrules() -> set[str]:
    """The workflow's localrules.

    common.smk hands resdyn.cluster.cost.LOCALRULES to Snakemake, and no .smk file lists any of its own.
    """
    rules = REPO / "workflow" / "rules"
    assert "workflow.localrules(*rcost.LOCALRULES)" in (rules / "common.smk").read_text()
    for path in rules.glob("*.smk"):
        assert not re.search(r"^\s*localrules:", path.read_text(), flags=re.M), path
    return set(cost.LOCALRULES)


def test_unpriced_rules_are_exactly_the_localrules_without_a_cost_function():
    """`resdyn plan` names the rules it does not price: the workflow's localrules minus the priced ones.

    The localrules are the list common.smk hands to Snakemake: the figure rules are generated, so
    a scan of `rule x:` lines would miss them.
    """
    local = _localrules()
    assert local - set(cost.RULES) == set(cost.LOCAL_UNPRICED_RULES)
    assert set(cost.LOCAL_PRICED_RULES) <= set(cost.RULES)


def test_every_submitted_rule_takes_its_resources_from_the_cost_model_and_no_other():
    """Static check of workflow/rules: resources come from the cost model, for every submitted rule.

    A rule's mem_mb/runtime are cost("<that rule>", ...), no hand-written number; every priced
    rule has them; every rule without a cost function is a localrule (it runs on the submit host:
    nothing is requested for it).
    """
    blocks = _rule_blocks()
    local = _localrules()
    priced = set(cost.RULES)
    for rule, body in blocks.items():
        res = re.search(r"^    resources:\n((?:        .*\n)+)", body + "\n", flags=re.M)
        if rule not in priced:
            assert res is None and rule in local, (rule, "has no cost function: must be a localrule without resources")
            assert rule in cost.LOCAL_UNPRICED_RULES, (rule, "`resdyn plan` must name it")
            continue
        assert res is not None, (rule, "priced by resdyn.cluster.cost but requests nothing")
        items = dict(line.strip().rstrip(",").split("=", 1) for line in res.group(1).splitlines())
        assert set(items) >= {"mem_mb", "runtime"}, (rule, items)
        for key, value in items.items():
            assert value == f'cost("{rule}", "{key}")', (rule, key, value)
        threads = re.search(r"^    threads: (.*)$", body, flags=re.M)
        if threads and "cost(" in threads.group(1):
            assert threads.group(1) == f'cost("{rule}", "threads")', (rule, threads.group(1))
    assert priced <= set(blocks), priced - set(blocks)
    # GPU jobs' host cores: the profile's default cpus_per_gpu is the one the plan bills
    from resdyn.cluster import site

    saved = os.environ.pop("RESDYN_SLURM_CPUS_PER_GPU", None)
    try:
        assert site.job_class_settings(gpu=True)["cpus_per_gpu"] == gpu_kinds.GPU_HOST_THREADS
    finally:
        if saved is not None:
            os.environ["RESDYN_SLURM_CPUS_PER_GPU"] = saved
    assert "?site.set_resources(" in (REPO / "profiles" / "slurm" / "config.yaml").read_text()


def test_short_jobs_get_one_thread_long_gpu_jobs_the_host_threads(paper_a):
    config = rc.load_config(REPO / "config.yaml")
    # the zoo's GPU-capable linear algebra (device: auto) is seconds of work: one thread, so that a
    # 2-core machine runs two such jobs side by side
    for rule in ("spectra", "bootstrap"):
        w = {"model": "llama16", "ckpt": "step600"}
        assert dag.job_cost(config, rule, w).gpu
        assert cost.seconds(dag.job_cost(config, rule, w), "cpu", 1) <= gpu_kinds.THREADS_ABOVE_S
        assert dag.threads_for(config, rule, w) == 1 == dag.resources(config, rule, w)["threads"]
    # a paper-scale GPU job keeps the host threads that come with its GPU
    w = _w(paper_a, "lens")
    assert cost.seconds(dag.job_cost(paper_a, "lens", w), "cpu", 1) > gpu_kinds.THREADS_ABOVE_S
    assert dag.threads_for(paper_a, "lens", w) == gpu_kinds.GPU_HOST_THREADS
