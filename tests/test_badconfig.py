"""Bad configurations stop before any job, each with one clear line naming key/file and value.

Every case mutates the smoke preset (or writes a YAML file) and must raise ConfigError whose
message holds exactly one problem, names the key (or file and line), and never dumps the config.
Two cases go through `snakemake -n` to check the same holds where users meet it, and that
nothing is written.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from resdyn.pipeline import config as rc

ROOT = Path(__file__).resolve().parent.parent
SMOKE = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())


def _set(path: str, value):
    """A mutation setting a dotted key (creating mappings on the way)."""

    def change(cfg):
        keys = path.split(".")
        node = cfg
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value

    return change


def _del(path: str):
    def change(cfg):
        keys = path.split(".")
        node = cfg
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return change


def _hub_model(**extra):
    def change(cfg):
        cfg["models"]["hub"] = {
            "source": "hf",
            "dataset": "kjv",
            "repo": "org/name",
            "revisions": ["main"],
            "n_layers": 4,
            "family": "llama",
            **extra,
        }

    return change


M = "models.tiny_llama"
#: (case id, mutation, text the single problem line must contain)
CASES = [
    ("unknown top-level key", _set("foo", {"a": list(range(500))}), "'foo': unknown key"),
    ("models missing", _del("models"), "'models': required"),
    ("datasets missing", _del("datasets"), "'datasets': required"),
    ("bad family", _set(f"{M}.family", "llamaX"), f"{M}.family"),
    ("train family not trainable", _set(f"{M}.family", "gemma4"), f"{M}.family"),
    (
        "hub model without repo",
        lambda c: (_hub_model()(c), c["models"]["hub"].pop("repo")),
        "'models.hub.repo': required",
    ),
    ("hub revisions empty", _hub_model(revisions=[]), "models.hub.revisions"),
    ("n_heads does not divide d_model", _set(f"{M}.n_heads", 6), f"{M}.n_heads"),
    ("n_kv_heads does not divide n_heads", _set(f"{M}.n_kv_heads", 3), f"{M}.n_kv_heads"),
    ("checkpoint after train.steps", _set(f"{M}.train.checkpoints", [0, 50]), f"{M}.train.checkpoints"),
    ("samples.length > max_position", _set("samples.length", 128), "samples.length"),
    ("positions outside samples.length", _set("jacobian.positions", [0, 16]), "jacobian.positions"),
    ("positions negative outside", _set("jacobian.positions", [-17]), "jacobian.positions"),
    ("positions repeated", _set("jacobian.positions", [1, 1]), "jacobian.positions"),
    ("causal.n_samples > samples.n", _set("causal.n_samples", 7), "causal.n_samples"),
    ("store_first_n = 1", _set("jacobian.store_first_n", 1), "jacobian.store_first_n"),
    ("store_first_n > samples.n", _set("jacobian.store_first_n", 7), "jacobian.store_first_n"),
    ("bootstrap.complex_tol not a spectra tolerance", _set("bootstrap.complex_tol", 1e-4), "bootstrap.complex_tol"),
    ("bridge.complex_tol not a spectra tolerance", _set("bridge.complex_tol", 1e-5), "bridge.complex_tol"),
    ("even smoothing window", _set("phases.window", 4), "phases.window"),
    ("scaling group names unknown model", _set("scaling.groups.llama", ["nope"]), "scaling.groups.llama"),
    ("model dataset unknown", _set(f"{M}.dataset", "wiki"), f"{M}.dataset"),
    (
        "text dataset file missing",
        _set("datasets.kjv", {"source": "text", "paths": ["no/such.txt"]}),
        "datasets.kjv.paths",
    ),
    (
        "local model folder missing",
        lambda c: c["models"].update(
            loc={"source": "local", "dataset": "kjv", "path": "no/such/folder", "n_layers": 2, "family": "llama"}
        ),
        "models.loc",
    ),
    ("samples.n below 2", _set("samples.n", 1), "samples.n"),
    ("negative seed", _set("seed", -1), "'seed'"),
    ("unknown device", _set("device", "gpu"), "'device'"),
    ("k fraction above 1", _set("readout.k_fractions", [0.1, 1.5]), "readout.k_fractions"),
    ("zero Leiden resolution", _set("topology.resolution", 0), "topology.resolution"),
    ("model name with a space", lambda c: c["models"].update({"my model": c["models"].pop("tiny_llama")}), "'models'"),
    ("lens.checkpoints unknown", _set("lens.checkpoints", "some"), "lens.checkpoints"),
    ("lens.train_tokens negative", _set("lens.train_tokens", -1), "lens.train_tokens"),
    (
        "fresh lens tokens fewer than its steps use",
        _set("lens.train_tokens", 2559),
        "'lens.train_tokens': 2,559 (model tiny_llama) is less than lens.steps × lens.tokens_per_step = 20 × 128 = "
        "2,560 tokens",
    ),
    (
        "a model's fresh lens tokens fewer than its steps use",
        _set(f"{M}.overrides", {"lens": {"steps": 21}}),
        "(model tiny_llama) is less than lens.steps × lens.tokens_per_step = 21 × 128",
    ),
    ("skip_positions leaves no token", _set("activations.skip_positions", 16), "activations.skip_positions"),
    ("vocab below the byte alphabet", _set("tokenizer.vocab_size", 100), "tokenizer.vocab_size"),
    ("section is not a mapping", _set("samples", 5), "'samples'"),
    ("unknown dtype", _set(f"{M}.dtype", "float8"), f"{M}.dtype"),
    ("threads 0", _set("threads", 0), "'threads'"),
    ("unknown key inside a model", _set(f"{M}.layers", 6), f"{M}.layers': unknown key"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_config_gives_one_clear_line(case):
    _, change, key = case
    cfg = copy.deepcopy(SMOKE)
    change(cfg)
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(cfg, base_dir=ROOT)
    lines = str(err.value).splitlines()
    problems = [ln for ln in lines if ln.startswith("  - ")]
    assert len(problems) == 1, str(err.value)  # each problem reported once
    assert key in problems[0], problems[0]
    assert len(problems[0]) < 400, problems[0]  # never the whole config


YAML_CASES = [
    ("duplicate model key", "models:\n  m: {source: train}\n  m: {source: hf}\n", "duplicate key 'm'", 3),
    ("duplicate nested key", "samples:\n  n: 4\n  length: 16\n  n: 8\n", "duplicate key 'n'", 4),
    ("duplicate top-level key", "seed: 0\ndevice: cpu\nseed: 1\n", "duplicate key 'seed'", 3),
    ("YAML syntax error", "models: [unclosed\n", "not valid YAML", None),
]


@pytest.mark.parametrize("case", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_bad_yaml_file_names_file_and_line(case, tmp_path):
    _, text, msg, line = case
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(rc.ConfigError) as err:
        rc.check_config_files([path])
    message = str(err.value)
    assert "\n" not in message and msg in message and str(path) in message, message
    if line:
        assert f"{path}:{line}:" in message


def test_yaml_merge_keys_may_be_overridden():
    """config.yaml builds models from a `<<: *zoo` anchor and overrides n_layers: not a duplicate."""
    cfg = rc.read_yaml(ROOT / "config.yaml")
    assert cfg["models"]["llama12"]["n_layers"] == 12 and cfg["models"]["llama12"]["d_model"] == 64


def test_defaults_pass_validation_together():
    """A minimal config (every other key from the schema's defaults) validates, and the defaults
    that depend on samples.n follow it."""
    cfg = {
        "datasets": {"d": {"source": "embedded"}},
        "models": {
            "m": {
                "source": "train",
                "dataset": "d",
                "family": "llama",
                "n_layers": 2,
                "d_model": 16,
                "n_heads": 2,
                "d_ff": 32,
            }
        },
    }
    rc.validate_config(cfg)
    assert cfg["jacobian"]["store_first_n"] == cfg["samples"]["n"]
    assert cfg["causal"]["n_samples"] == min(16, cfg["samples"]["n"])
    small = copy.deepcopy(SMOKE)
    rc.validate_config(small)
    assert small["causal"]["n_samples"] == 6


def _dry_run(tmp_path: Path, config_text: str, *targets: str) -> subprocess.CompletedProcess:
    work = tmp_path / "wf"
    ignore = __import__("shutil").ignore_patterns(
        ".venv", ".git", "results", "models", "logs", ".snakemake", "__pycache__", "*.egg-info", "benchmarks", "tests"
    )
    __import__("shutil").copytree(ROOT, work, ignore=ignore)
    (work / "configs" / "bad.yaml").write_text(config_text)
    env = {**os.environ, "PYTHONPATH": str(work)}
    return subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), *targets, "-n", "--configfile", "configs/bad.yaml"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
def test_snakemake_reports_a_top_level_error_in_one_short_line(tmp_path):
    cfg = copy.deepcopy(SMOKE)
    cfg["bogus"] = {"x": list(range(300))}
    proc = _dry_run(tmp_path, yaml.safe_dump(cfg))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    hits = [ln for ln in out.splitlines() if "config key" in ln]
    assert len(hits) == 1 and "'bogus'" in hits[0] and len(hits[0]) < 400, out[-2000:]
    assert max(map(len, out.splitlines())) < 500  # the config is never dumped
    assert not (tmp_path / "wf" / "results").exists()


@pytest.mark.slow
def test_snakemake_refuses_a_duplicate_key(tmp_path):
    text = (ROOT / "configs" / "smoke.yaml").read_text() + "samples: {n: 8, length: 16, seed: 0}\n"
    proc = _dry_run(tmp_path, text)
    assert proc.returncode != 0
    hits = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "duplicate key 'samples'" in ln]
    assert len(hits) == 1 and "configs/bad.yaml:" in hits[0], proc.stderr[-2000:]
    assert not (tmp_path / "wf" / "results").exists()


@pytest.mark.slow
def test_lens_train_tokens_beyond_the_split_stop_its_job_with_one_line(tmp_path):
    """More fresh lens tokens than the train split holds: the lens_tokens job stops with one line
    naming the key, the tokens asked and held, and the split; it writes no lens_tokens.h5."""
    cfg = copy.deepcopy(SMOKE)
    cfg["lens"].update(train_tokens=10**9)
    work = tmp_path / "wf"
    ignore = __import__("shutil").ignore_patterns(
        ".venv", ".git", "results", "models", "logs", ".snakemake", "__pycache__", "*.egg-info", "benchmarks", "tests"
    )
    __import__("shutil").copytree(ROOT, work, ignore=ignore)
    (work / "configs" / "bad.yaml").write_text(yaml.safe_dump(cfg))
    target = "results/tiny_llama/lens_tokens.h5"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), target, "--cores", "1", "--configfile", "configs/bad.yaml"],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(work)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    log = (work / "logs" / "lens_tokens" / "tiny_llama.log").read_text()
    hits = [ln for ln in log.splitlines() if "config key 'lens.train_tokens'" in ln]
    assert len(hits) == 1, log[-3000:]
    assert "1,000,000,000 tokens (62,500,000 windows of 16) plus lens.n_heldout_blocks=4" in hits[0], hits[0]
    assert "the train split of dataset 'kjv' (results/data/kjv/train.jsonl) holds " in hits[0], hits[0]
    assert not (work / target).exists()


LLAMA_JSON = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 4,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "vocab_size": 300,
}


def _local(folder_json, **model):
    """A mutation adding local model `loc` whose folder's config.json is ``folder_json``."""

    def change(cfg, base: Path):
        folder = base / "loc"
        folder.mkdir(exist_ok=True)
        text = folder_json if isinstance(folder_json, str) else __import__("json").dumps(folder_json)
        (folder / "config.json").write_text(text)
        cfg["models"]["loc"] = {"source": "local", "dataset": "kjv", "path": str(folder), **model}

    return change


#: checks read from a local/hub model's config.json (hub engineer's checks, covered here too)
LOCAL_CASES = [
    ("config.json disagrees with n_layers", _local(LLAMA_JSON, n_layers=6), "models.loc.n_layers"),
    ("config.json disagrees with family", _local(LLAMA_JSON, family="qwen2"), "models.loc.family"),
    (
        "samples.length beyond max_position_embeddings",
        _local({**LLAMA_JSON, "max_position_embeddings": 8}),
        "samples.length",
    ),
    ("invalid config.json", _local('{"model_type": "llama", '), "config.json"),
    ("unknown model_type in config.json", _local({**LLAMA_JSON, "model_type": "bert"}), "models.loc"),
    (
        "hub revisions out of training order",
        lambda c, base: _hub_model(revisions=["main", "stage1-step0-tokens0B"])(c),
        "models.hub.revisions",
    ),
]


@pytest.mark.parametrize("case", LOCAL_CASES, ids=[c[0] for c in LOCAL_CASES])
def test_bad_model_config_json_gives_one_clear_line(case, tmp_path):
    _, change, key = case
    cfg = copy.deepcopy(SMOKE)
    change(cfg, tmp_path)
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(cfg, base_dir=ROOT)
    problems = [ln for ln in str(err.value).splitlines() if ln.startswith("  - ")]
    assert len(problems) == 1, str(err.value)
    assert key in problems[0] and len(problems[0]) < 400, problems[0]


def test_local_model_with_a_good_config_json_validates(tmp_path):
    cfg = copy.deepcopy(SMOKE)
    _local(LLAMA_JSON)(cfg, tmp_path)
    rc.validate_config(cfg, base_dir=ROOT)
    assert cfg["models"]["loc"]["family"] == "llama" and cfg["models"]["loc"]["n_layers"] == 4


def test_scaling_table_without_groups_is_one_config_error():
    cfg = copy.deepcopy(SMOKE)
    cfg["scaling"] = {"groups": {}}
    rc.validate_config(cfg)  # valid: the run just has no scaling table
    with pytest.raises(rc.ConfigError) as err:
        rc.scaling_groups(cfg)
    assert "'scaling.groups'" in str(err.value) and "\n" not in str(err.value)
    assert rc.scaling_groups(SMOKE) == {"llama": ["tiny_llama"]}


@pytest.mark.slow
@pytest.mark.parametrize("target", [["results/scaling/phase_widths.tsv"], ["--until", "scaling"]])
def test_snakemake_asked_for_the_scaling_table_without_groups_says_so_in_one_line(tmp_path, target):
    cfg = copy.deepcopy(SMOKE)
    cfg["scaling"] = {"groups": {}}
    proc = _dry_run(tmp_path, yaml.safe_dump(cfg), *target)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    hits = [ln for ln in out.splitlines() if "config key 'scaling.groups'" in ln]
    assert len(hits) == 1 and "phase_widths.tsv" in hits[0] and len(hits[0]) < 400, out[-2000:]
    assert "ArtifactError" not in out
    assert not (tmp_path / "wf" / "results").exists()
