"""Hub models and datasets: checkpoint order, shapes, the offline cache and bad hub input.

Shapes come from config.json; every bad hub input stops at validation with one line, before any job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml

from resdyn import io
from resdyn.lm import corpus, hub, models
from resdyn.pipeline import config as rc

from helpers import hubcache

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
OLMO3 = ["stage1-step0", "stage1-step471000", "stage1-step1413814"]


# --- checkpoint order ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "revision, expected",
    [
        ("stage1-step471000-tokens988B", (1, 471000)),
        ("stage1-step0", (1, 0)),
        ("stage2-ingredient1-step1000-tokens2B", (2, 1000)),
        ("step143000", (0, 143000)),
        ("main", None),
        ("v1.0", None),
        ("stepping-stone", None),
        ("laststep5", None),
    ],
)
def test_revision_step(revision, expected):
    assert hub.revision_step(revision) == expected


def test_order_revisions():
    assert hub.order_revisions(["main", "stage1-step0"]) == ["stage1-step0", "main"]
    assert hub.order_revisions(["step3000", "step20", "main", "step100"]) == ["step20", "step100", "step3000", "main"]
    # stage 2 restarts its step count but comes after stage 1
    assert hub.order_revisions(["stage2-step10", "stage1-step900"]) == ["stage1-step900", "stage2-step10"]
    # an explicit map replaces parsing
    assert hub.order_revisions(["late", "early", "main"], {"early": 0, "late": 5, "main": 9}) == [
        "early",
        "late",
        "main",
    ]


@pytest.mark.parametrize(
    "revisions, steps, words",
    [
        (["main", "v2"], None, ["['v2']", "training step"]),
        (["step0", "step0-tokens0B"], None, ["same training step", "step0", "step0-tokens0B"]),
        (["a", "b"], {"a": 1}, ["['b']", "steps map"]),
        (["a", "b"], {"a": 1, "b": 1}, ["same training step"]),
    ],
)
def test_unorderable_revisions_raise_naming_them(revisions, steps, words):
    with pytest.raises(ValueError) as err:
        hub.order_revisions(revisions, steps)
    for w in words:
        assert w in str(err.value)


# --- architecture from config.json ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen2", "olmo2", "olmo3", "gemma4"])
def test_architecture_read_from_each_family_config(name):
    builders = {
        "llama": hubcache._llama31,
        "qwen2": hubcache._qwen2,
        "olmo2": hubcache._olmo2,
        "olmo3": hubcache._olmo3,
        "gemma4": hubcache._gemma4_e4b,
    }
    cfg = builders[name](8)
    found = hub.architecture(json.loads(cfg.to_json_string()))  # what save_pretrained writes
    c = hubcache._COMMON  # the sizes the builder was given
    assert found == {
        "model_type": "gemma4_text" if name == "gemma4" else name,
        "family": name,
        "n_layers": 8,
        "d_model": c["hidden_size"],
        "n_heads": c["num_attention_heads"],
        "n_kv_heads": c["num_key_value_heads"],
        "d_ff": c["intermediate_size"],
        "vocab_size": c["vocab_size"],
        "max_position": c["max_position_embeddings"],
        # Gemma 4's per-layer input embeddings (priced as weights)
        **({"d_per_layer_input": 8, "vocab_per_layer_input": hubcache.VOCAB} if name == "gemma4" else {}),
    }


def test_architecture_defaults_kv_heads_and_refuses_unknown_types():
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    assert hub.architecture(cfg)["n_kv_heads"] == 2
    with pytest.raises(hub.HubError, match="'bloom' is not supported; supported families: llama"):
        hub.architecture({"model_type": "bloom"})
    with pytest.raises(hub.HubError, match="parallel residual"):
        hub.architecture({"model_type": "gptj"})


# --- the paper-mini preset against its cache ------------------------------------------------------


@pytest.fixture
def offline(mini_hf_home, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(mini_hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return mini_hf_home


def _mini() -> dict:
    return yaml.safe_load((ROOT / "configs" / "paper-mini.yaml").read_text())


def test_paper_mini_validates_offline_with_shapes_from_config_json(offline):
    cfg = rc.validate_config(_mini())
    for name, m in cfg["models"].items():
        repo = m["repo"]
        _, n_layers, revisions = hubcache.MODELS[repo]
        c = hubcache._COMMON
        assert (m["n_layers"], m["d_model"], m["n_heads"], m["n_kv_heads"], m["d_ff"], m["vocab_size"]) == (
            n_layers,
            c["hidden_size"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
            c["intermediate_size"],
            c["vocab_size"],
        ), name
        assert m["max_position"] == c["max_position_embeddings"]
        assert rc.checkpoints(cfg, name) == revisions
    assert rc.checkpoints(cfg, "olmo3") == OLMO3
    print("\nolmo3 checkpoint order:", " -> ".join(rc.checkpoints(cfg, "olmo3")))
    assert [rc.checkpoint_spec(cfg, "olmo3", c)["revision"] for c in OLMO3] == OLMO3


@pytest.mark.slow
def test_paper_mini_dry_run_offline(offline, tmp_path):
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(offline),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", "configs/paper-mini.yaml", "--directory", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for rule in ("corpus", "resolve_checkpoint", "jacobians", "activations", "lens", "causal", "scaling"):
        assert rule in out
    # one Jacobian block per 8 layers: 8 models (16-layer and 12-layer ones in two blocks), 10 checkpoints
    assert "results/qwen25_16l/main/jacobians/layers008-015" in out


def _stops(cfg: dict, *words: str) -> str:
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(cfg)
    msg = str(err.value)
    problems = msg.splitlines()[1:]
    assert len(problems) == 1, msg  # one line per problem, this problem once
    for w in words:
        assert w in problems[0], (w, problems[0])
    return problems[0]


def test_wrong_order_is_refused_naming_the_revisions(offline):
    cfg = _mini()
    cfg["models"]["olmo3"].pop("steps", None)
    cfg["models"]["olmo3"]["revisions"] = ["stage1-step1413814", "stage1-step0", "stage1-step471000"]
    _stops(cfg, "models.olmo3.revisions", "not in training order", str(OLMO3))
    # `main` written first: taken as listed, step 0 would be the "final" checkpoint
    cfg = _mini()
    cfg["models"]["olmo3"].pop("steps", None)
    cfg["models"]["olmo3"]["revisions"] = ["main", "stage1-step0"]
    _stops(
        cfg,
        "models.olmo3.revisions",
        "['main', 'stage1-step0'] is not in training order",
        "it is ['stage1-step0', 'main']",
    )


def test_unorderable_revisions_are_refused(offline):
    cfg = _mini()
    cfg["models"]["llama31"]["revisions"] = ["main", "release"]
    _stops(cfg, "models.llama31.revisions", "['release']", "steps:")


def test_missing_revision_names_the_download_command(offline):
    cfg = _mini()
    cfg["models"]["olmo3"].pop("steps", None)
    cfg["models"]["olmo3"]["revisions"] = ["stage1-step0", "stage1-step5"]
    _stops(
        cfg,
        "models.olmo3.revisions",
        "'resdyn-ci/Olmo-3-mini'",
        "'stage1-step5'",
        "`hf download resdyn-ci/Olmo-3-mini --revision stage1-step5`",
    )


def test_missing_snapshot_names_the_download_command(offline):
    cfg = _mini()
    cfg["models"]["llama31"]["repo"] = "meta-llama/Llama-3.1-8B"
    _stops(
        cfg, "'meta-llama/Llama-3.1-8B'", "HF_HUB_OFFLINE=1", "`hf download meta-llama/Llama-3.1-8B --revision main`"
    )


def test_snapshot_without_weights_is_refused_offline(offline, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    hubcache.write_config_only(
        cache,
        "org/cfg-only",
        "main",
        {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 32, "num_attention_heads": 4},
    )
    hubcache.add_snapshot(cache, hubcache.DATASET, "main", "dataset")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cfg = _mini()
    cfg["models"] = {"m": {"source": "hf", "repo": "org/cfg-only", "revisions": ["main"], "dataset": "wikitext"}}
    cfg["scaling"] = {}
    _stops(cfg, "'org/cfg-only'", "no weight files", "`hf download org/cfg-only --revision main`")


def test_missing_dataset_names_the_download_command(offline):
    cfg = _mini()
    cfg["datasets"]["wikitext"].update(name="Salesforce/wikitext", config="wikitext-2-raw-v1", revision="b08601e")
    _stops(
        cfg,
        "datasets.wikitext",
        "'Salesforce/wikitext'",
        "'wikitext-2-raw-v1'",
        "'b08601e'",
        "`hf download --repo-type dataset Salesforce/wikitext --revision b08601e`",
    )


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("n_layers", 12, "num_hidden_layers = 8"),
        ("d_model", 64, "hidden_size = 32"),
        ("n_kv_heads", 4, "num_key_value_heads = 2"),
        ("d_ff", 128, "intermediate_size = 64"),
        ("family", "llama", "model_type = 'qwen2'"),
    ],
)
def test_config_disagreeing_with_config_json_is_refused(offline, key, value, field):
    cfg = _mini()
    cfg["models"]["qwen25_8l"][key] = value
    _stops(cfg, f"models.qwen25_8l.{key}", repr(value), "resdyn-ci/Qwen2.5-mini-8L@main", field)


def test_agreeing_overrides_are_accepted(offline):
    cfg = _mini()
    cfg["models"]["qwen25_8l"].update(n_layers=8, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64)
    assert rc.validate_config(cfg)["models"]["qwen25_8l"]["n_layers"] == 8


def test_unknown_model_type_is_refused(offline, tmp_path):
    folder = tmp_path / "bloom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bloom", "n_layer": 4}))
    cfg = _mini()
    cfg["models"]["llama31"] = {"source": "local", "path": str(folder), "dataset": "wikitext"}
    _stops(cfg, "models.llama31", "'bloom' is not supported", "supported families: llama")


def test_local_model_reads_its_shapes(offline, tmp_path):
    snap = next((offline / "hub" / "models--resdyn-ci--OLMo-2-mini-12L" / "snapshots").iterdir())
    cfg = _mini()
    cfg["models"]["olmo2_12l"] = {"source": "local", "path": str(snap), "dataset": "wikitext"}
    m = rc.validate_config(cfg)["models"]["olmo2_12l"]
    assert (m["family"], m["n_layers"], m["d_model"]) == ("olmo2", 12, 32)


def test_samples_longer_than_the_model_positions_are_refused(offline):
    cfg = _mini()
    cfg["samples"]["length"] = 200
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(cfg)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 8 and all("samples.length': 200 exceeds" in ln and "max_position=128" in ln for ln in lines)


@pytest.mark.slow
def test_bad_hub_input_stops_snakemake_before_any_job(offline, tmp_path):
    bad = _mini()
    bad["models"]["olmo3"].pop("steps")
    bad["models"]["olmo3"]["revisions"] = list(reversed(OLMO3))
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(offline),
        "HF_HUB_OFFLINE": "1",
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", str(tmp_path / "bad.yaml"), "--directory", str(tmp_path / "w")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "models.olmo3.revisions" in out and "not in training order" in out, out[-2000:]
    assert not (tmp_path / "w" / "results").exists() and not (tmp_path / "w" / "models").exists()


# --- hub datasets -----------------------------------------------------------------------------------


def test_hub_dataset_loads_offline_from_the_cache(offline):
    spec = {"source": "hf", "name": hubcache.DATASET, "config": hubcache.DATASET_CONFIG, "split": "test"}
    docs = corpus.load_documents(spec)
    expected = hubcache.documents()
    assert docs == expected[: len(expected) // 4]
    train = corpus.load_documents({**spec, "split": "train", "max_documents": 5})
    assert train == expected[len(expected) // 4 :][:5]


def test_hub_dataset_missing_from_cache(offline):
    with pytest.raises(RuntimeError) as err:
        corpus.load_documents({"source": "hf", "name": "nobody/none", "config": "c1", "revision": "r1"})
    msg = str(err.value)
    assert "'nobody/none'" in msg and "'c1'" in msg and "'r1'" in msg
    assert "`hf download --repo-type dataset nobody/none --revision r1`" in msg


def test_local_datasets_save_to_disk_and_parquet(tmp_path):
    import datasets

    texts = ["alpha beta", "", "gamma delta", "epsilon"]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"body": texts})}).save_to_disk(str(tmp_path / "dict"))
    datasets.Dataset.from_dict({"text": texts[:2]}).to_parquet(str(tmp_path / "pq" / "a.parquet"))
    datasets.Dataset.from_dict({"text": texts[2:]}).to_parquet(str(tmp_path / "pq" / "b.parquet"))
    kept = [t for t in texts if t]
    assert corpus.load_documents({"source": "hf", "path": "one"}, tmp_path) == kept
    assert (
        corpus.load_documents({"source": "hf", "path": "dict", "split": "test", "text_field": "body"}, tmp_path) == kept
    )
    assert corpus.load_documents({"source": "hf", "path": "pq"}, tmp_path) == kept
    assert corpus.load_documents({"source": "hf", "path": "pq/b.parquet"}, tmp_path) == kept[1:]
    with pytest.raises(ValueError, match="no split 'train'; it has \\['test'\\]"):
        corpus.load_documents({"source": "hf", "path": "dict", "split": "train"}, tmp_path)
    with pytest.raises(ValueError, match="no text field 'text'"):
        corpus.load_documents({"source": "hf", "path": "dict", "split": "test"}, tmp_path)


def test_local_dataset_path_is_checked_at_validation(offline, tmp_path):
    cfg = _mini()
    cfg["datasets"]["wikitext"] = {"source": "hf", "path": str(tmp_path / "nothing")}
    _stops(cfg, "datasets.wikitext.path", "does not exist")


# --- weights straight to the device ----------------------------------------------------------------


def test_load_kwargs_map_weights_onto_the_accelerator(tmp_path):
    import torch

    (tmp_path / "model.safetensors").write_bytes(b"")
    gpu = models.load_kwargs(tmp_path, "bfloat16", torch.device("cuda"))
    assert gpu == {
        "dtype": torch.bfloat16,
        "attn_implementation": "eager",
        "device_map": "cuda:0",
        "use_safetensors": True,
    }
    assert models.load_kwargs(tmp_path, "float32", torch.device("cuda", 1))["device_map"] == "cuda:1"
    cpu = models.load_kwargs(tmp_path / "nothing", "float32", torch.device("cpu"))
    assert cpu == {"dtype": torch.float32, "attn_implementation": "eager"}


def test_load_model_passes_the_device_arguments(offline, monkeypatch):
    """load_model hands from_pretrained the device map and loads a hub snapshot bit-exactly on the CPU.

    from_pretrained is wrapped by a spy that records its arguments and drops ``device_map`` (the
    test machine may have no GPU).
    """
    import torch
    from safetensors.torch import load_file

    snap = next((offline / "hub" / "models--resdyn-ci--Qwen2.5-mini-8L" / "snapshots").iterdir())
    record = {
        "model": "q",
        "checkpoint": "main",
        "folder": str(snap),
        "dtype": "float32",
        "content_hash": io.sha256_tree(snap, models.WEIGHT_PATTERNS),
    }  # load_model re-hashes
    real = transformers.AutoModelForCausalLM.from_pretrained
    seen = {}

    def spy(folder, **kwargs):
        seen.update(kwargs)
        return real(folder, **{k: v for k, v in kwargs.items() if k != "device_map"})

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    model, _ = models.load_model(record, "cpu")
    assert seen == {"dtype": torch.float32, "attn_implementation": "eager", "use_safetensors": True}
    saved = load_file(str(snap / "model.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items()) and len(saved) > 10
    seen.clear()
    monkeypatch.setattr(models, "pick_device", lambda device: torch.device("meta"))
    models.load_model(record, "cuda")
    assert seen["device_map"] == "meta:0"  # the target device reaches from_pretrained


def test_gpt2_and_gpt_neox_shapes_from_their_config_json():
    """GPT-2's config.json keeps its own field names; GPT-NeoX's are the standard ones.

    GPT-2's: n_layer, n_embd, n_head, n_inner (null = 4·n_embd), n_positions.
    """
    gpt2 = transformers.GPT2Config(n_layer=5, n_embd=48, n_head=6, n_positions=96, vocab_size=300).to_dict()
    arch = hub.architecture(json.loads(json.dumps(gpt2)))
    assert (
        arch["family"],
        arch["n_layers"],
        arch["d_model"],
        arch["n_heads"],
        arch["n_kv_heads"],
        arch["d_ff"],
        arch["max_position"],
        arch["vocab_size"],
    ) == ("gpt2", 5, 48, 6, 6, 192, 96, 300)
    neox = hubcache._gpt_neox(3).to_dict()
    arch = hub.architecture(json.loads(json.dumps(neox)))
    assert (arch["family"], arch["n_layers"], arch["d_model"], arch["d_ff"]) == ("gpt_neox", 3, 32, 128)


def test_plan_prints_the_derived_checkpoint_order(offline, capsys):
    from resdyn import cli

    assert cli.main(["plan", str(ROOT / "configs" / "paper-mini.yaml")]) == 0
    out = capsys.readouterr().out
    assert "olmo3: checkpoints in training order: stage1-step0 -> stage1-step471000 -> stage1-step1413814" in out
    print(out.splitlines()[0])


def test_online_validation_fetches_only_config_json(tmp_path, monkeypatch):
    """Online with an empty cache, validation downloads config.json alone (hf_hub_download).

    When that fails too, the error names the `hf download` command.
    """
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    asked = []

    def fake_download(repo, filename, revision=None, cache_dir=None):
        asked.append((repo, filename, revision, cache_dir))
        path = tmp_path / "config.json"
        path.write_text(
            json.dumps({"model_type": "qwen2", "num_hidden_layers": 3, "hidden_size": 16, "num_attention_heads": 2})
        )
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    cfg, _ = hub.hub_config_json("org/m", "step5")
    assert asked == [("org/m", "config.json", "step5", str(tmp_path / "empty"))]
    assert hub.architecture(cfg)["n_layers"] == 3

    def no_network(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    with pytest.raises(
        hub.HubError, match="nor downloadable \\(ConnectionError\\).*`hf download org/m --revision step5`"
    ):
        hub.hub_config_json("org/m", "step5")


def test_online_dataset_load_falls_back_to_the_cache(offline, monkeypatch):
    """Online, load_dataset(name) is tried first; when the hub is unreachable the cached snapshot is used."""
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    real = datasets.load_dataset
    calls = []

    def flaky(path, *args, **kwargs):
        calls.append(path)
        if path == hubcache.DATASET:
            raise ConnectionError("hub unreachable")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", flaky)
    docs = corpus.load_documents(
        {"source": "hf", "name": hubcache.DATASET, "config": hubcache.DATASET_CONFIG, "split": "test"}
    )
    assert calls[0] == hubcache.DATASET and Path(calls[1]).parent.name == "snapshots"
    assert docs == hubcache.documents()[: len(hubcache.documents()) // 4]


# --- dtype auto: the checkpoint's own dtype --------------------------------------------------------


@pytest.mark.parametrize(
    "stored, expected",
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),
        ({"dtype": "float16"}, "float16"),
        ({"text_config": {"torch_dtype": "bfloat16"}}, "bfloat16"),
        ({}, "float32"),
        ({"torch_dtype": "int8"}, "float32"),
    ],
)
def test_dtype_auto_is_the_checkpoint_dtype(offline, tmp_path, monkeypatch, stored, expected):
    from safetensors.torch import save_file

    cache = tmp_path / "hub"
    shape = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 32, "num_attention_heads": 4}
    if "text_config" in stored:  # a multimodal wrapper keeps the decoder (and its dtype) in text_config
        shape = {"model_type": "gemma4", "text_config": {**shape, "model_type": "gemma4_text", **stored["text_config"]}}
    else:
        shape.update(stored)
    snap = hubcache.write_config_only(cache, "org/m", "main", shape)
    save_file({}, str(snap / "model.safetensors"))
    hubcache.add_snapshot(cache, hubcache.DATASET, "main", "dataset")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cfg = _mini()
    cfg["models"] = {"m": {"source": "hf", "repo": "org/m", "revisions": ["main"], "dataset": "wikitext"}}
    cfg["scaling"] = {}
    out = rc.validate_config(cfg)
    assert out["models"]["m"]["dtype"] == expected
    assert rc.checkpoint_spec(out, "m", "main")["dtype"] == expected
    cfg2 = _mini()  # written out, the dtype is kept whatever the checkpoint stores
    cfg2["models"] = {
        "m": {"source": "hf", "repo": "org/m", "revisions": ["main"], "dataset": "wikitext", "dtype": "float32"}
    }
    cfg2["scaling"] = {}
    assert rc.validate_config(cfg2)["models"]["m"]["dtype"] == "float32"
