"""Checkpoint resolution and loading: local HF folders of each family, hub errors offline, zoo."""

import json

import numpy as np
import pytest
import torch
import transformers

from resdyn.infra import data, io, models, zoo

FAMILY_CONFIGS = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "olmo2": transformers.Olmo2Config,
    "olmo3": transformers.Olmo3Config,
}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    data.train_tokenizer(data.kjv_chapters()[:50], 300, out)
    return out


def _save_tiny(cls_config, folder, tok_dir, vocab=300):
    cfg = cls_config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(folder)
    data.load_tokenizer(tok_dir).save_pretrained(folder)
    return model


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_local_folder_resolves_and_loads_each_family(tmp_path, tok_dir, family):
    original = _save_tiny(FAMILY_CONFIGS[family], tmp_path / "m", tok_dir)
    rec = models.resolve_checkpoint({"model": "m", "checkpoint": "local", "source": "local",
                                     "path": str(tmp_path / "m"), "dtype": "float32"})
    assert rec["content_hash"] == io.sha256_tree(tmp_path / "m", models.WEIGHT_PATTERNS)
    model, tok = models.load_model(rec, "cpu", verify_hash=True)
    ids = torch.tensor([tok("In the beginning")["input_ids"]])
    saved = original.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name  # weights load bit-exactly
    # logits agree up to the attention kernel (eager here, sdpa in the original)
    torch.testing.assert_close(model(ids).logits, original.eval()(ids).logits, atol=1e-5, rtol=1e-5)
    assert not any(p.requires_grad for p in model.parameters())


def test_hash_changes_with_weights_and_verify_detects_it(tmp_path, tok_dir):
    _save_tiny(transformers.LlamaConfig, tmp_path / "m", tok_dir)
    spec = {"model": "m", "checkpoint": "local", "source": "local", "path": str(tmp_path / "m")}
    rec = models.resolve_checkpoint(spec)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-3
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    assert models.resolve_checkpoint(spec)["content_hash"] != rec["content_hash"]
    with pytest.raises(RuntimeError, match="content hash mismatch"):
        models.load_model(rec, "cpu", verify_hash=True)


def test_missing_local_folder_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        models.resolve_checkpoint({"model": "m", "checkpoint": "c", "source": "local", "path": str(tmp_path)})


def test_hub_offline_error_is_helpful(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(RuntimeError) as err:
        models.resolve_checkpoint({"model": "m", "checkpoint": "main", "source": "hf",
                                   "repo": "nobody/not-a-model", "revision": "stage1-step0"})
    msg = str(err.value)
    assert "nobody/not-a-model" in msg and "stage1-step0" in msg and "source: local" in msg


def test_hub_source_resolves_from_a_local_cache(tmp_path, tok_dir, monkeypatch):
    """The hf path is real: a snapshot placed in an HF cache layout resolves offline with revision."""
    cache = tmp_path / "hub"
    snap = cache / "models--org--tiny" / "snapshots" / ("a" * 40)
    _save_tiny(transformers.LlamaConfig, snap, tok_dir)
    (cache / "models--org--tiny" / "refs").mkdir(parents=True)
    (cache / "models--org--tiny" / "refs" / "stage1-step0").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    rec = models.resolve_checkpoint({"model": "m", "checkpoint": "stage1-step0", "source": "hf",
                                     "repo": "org/tiny", "revision": "stage1-step0", "dtype": "bfloat16"})
    assert rec["resolved_commit"] == "a" * 40
    model, _ = models.load_model(rec, "cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_pick_device():
    assert models.pick_device("cpu").type == "cpu"
    assert models.pick_device("auto").type in ("cpu", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA"):
            models.pick_device("cuda")


def test_device_name_agrees_with_torch_and_skips_it_without_a_gpu_driver(monkeypatch):
    # oracle: torch's own answer on this machine
    assert models.device_name("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert models.cuda_available() == torch.cuda.is_available()
    assert models.device_name("cpu") == "cpu" and models.device_name("cuda:1") == "cuda:1"
    assert models.pick_device("auto") == torch.device(models.device_name("auto"))
    # an explicit `cuda` is checked by torch itself (refused here when torch sees no GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="config device: 'cuda' but no CUDA device"):
        models.device_name("cuda")
    # no driver file: `auto` is CPU without asking torch
    monkeypatch.setattr(models, "GPU_MARKERS", ("/nonexistent/nvidiactl",))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch was asked"))
    assert models.device_name("auto") == "cpu"
    # a model job asks torch itself: a GPU without the listed driver files is still used
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert models.pick_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models.pick_device("auto") == torch.device("cpu")


def test_zoo_model_families_and_determinism():
    arch = zoo.Architecture("olmo2", 2, 32, 4, 2, 64, 64)
    a, b = zoo.build_model(arch, 100, seed=1), zoo.build_model(arch, 100, seed=1)
    assert type(a).__name__ == "Olmo2ForCausalLM"
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    assert not a.config.tie_word_embeddings
    with pytest.raises(ValueError, match="allowed: llama, olmo2"):
        zoo.build_model(zoo.Architecture("gpt2", 2, 32, 4, 2, 64, 64), 100, 0)


def test_lr_schedule_closed_form():
    assert zoo.lr_at(0, 1.0, 10, 100) == pytest.approx(0.1)
    assert zoo.lr_at(9, 1.0, 10, 100) == pytest.approx(1.0)
    assert zoo.lr_at(100, 1.0, 10, 100) == pytest.approx(0.1)
    assert zoo.lr_at(55, 1.0, 10, 100) == pytest.approx(0.55)


def test_unigram_baseline_closed_form():
    train = np.array([0, 0, 1, 1])
    # add-one smoothing over a vocabulary of 4: p = [3, 3, 1, 1] / 8
    assert zoo.unigram_cross_entropy(train, np.array([0, 2]), 4) == pytest.approx(-(np.log(3 / 8) + np.log(1 / 8)) / 2)


def _train(tok_dir, tmp_path, tag, steps=12, state_every=100):
    tok = data.load_tokenizer(tok_dir)
    stream = data.token_stream(tok, data.kjv_chapters()[:40])
    arch = zoo.Architecture("llama", 2, 32, 4, 2, 64, 64)
    return zoo.train_zoo_model(
        arch, stream[:20000], stream[20000:], tok_dir, {0: tmp_path / tag / "s0", steps: tmp_path / tag / "final"},
        steps=steps, batch_size=4, seq_len=32, lr=3e-3, warmup=2, weight_decay=0.0, eval_every=4,
        n_eval_windows=8, seed=0, state_path=tmp_path / tag / "state.pt", state_every=state_every, progress=False)


def test_zoo_training_learns_saves_and_resumes(tmp_path, tok_dir):
    curve = _train(tok_dir, tmp_path, "a")
    assert list(curve["step"]) == [0, 4, 8, 12]
    assert curve["heldout_loss"].iloc[-1] < curve["heldout_loss"].iloc[0]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "final")
    assert loaded.config.num_hidden_layers == 2
    assert (tmp_path / "a" / "final" / "tokenizer.json").is_file()
    # An interrupted run (state saved at step 8) resumed gives the same final weights and curve.
    _train(tok_dir, tmp_path, "b", steps=12, state_every=8)
    import shutil

    shutil.rmtree(tmp_path / "c", ignore_errors=True)
    # simulate the kill: run to a state at step 8 by copying b's state mid-way is not possible after
    # completion, so train with a state and stop early by raising inside the loop
    class Stop(Exception):
        pass

    orig = zoo.heldout_loss
    calls = {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:  # the eval after step 12 → the state of step 8 exists
            raise Stop
        return orig(*a, **k)

    zoo.heldout_loss = failing
    try:
        with pytest.raises(Stop):
            _train(tok_dir, tmp_path, "c", steps=12, state_every=8)
    finally:
        zoo.heldout_loss = orig
    assert (tmp_path / "c" / "state.pt").is_file()
    resumed = _train(tok_dir, tmp_path, "c", steps=12, state_every=8)
    a = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "final")
    c = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "c" / "final")
    for (n, p), (_, q) in zip(a.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q), n
    np.testing.assert_allclose(resumed["heldout_loss"], curve["heldout_loss"], rtol=0, atol=0)
    assert not (tmp_path / "c" / "state.pt").exists()


def test_a_folder_with_broken_json_or_weights_gets_no_record(tmp_path):
    """resolve_checkpoint refuses (naming the file) a folder whose config.json, tokenizer JSON or
    safetensors header does not parse, so no checkpoint.json hashes a broken folder."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    good = tmp_path / "good"
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    LlamaForCausalLM(cfg).save_pretrained(str(good), safe_serialization=True)
    spec = {"model": "m", "checkpoint": "local", "source": "local", "dtype": "float32"}
    assert models.resolve_checkpoint({**spec, "path": str(good)})["tokenizer_hash"]
    for name, damage, message in [
        ("config.json", lambda p: p.write_text('{"model_type": '), "config.json is not valid JSON"),
        ("config.json", lambda p: p.write_text("{}"), "has no 'model_type'"),
        ("generation_config.json", lambda p: p.write_text("[1,"), "generation_config.json is not valid JSON"),
        ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:100]), "not a readable safetensors file"),
    ]:
        bad = tmp_path / f"bad-{name}-{message[:8]}"
        shutil.copytree(good, bad)
        damage(bad / name)
        with pytest.raises(ValueError, match=message):
            models.resolve_checkpoint({**spec, "path": str(bad)})
