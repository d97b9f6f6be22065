"""Checkpoint resolution and loading: local HF folders of each family, hub errors offline, zoo."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from resdyn import io
from resdyn.lm import corpus, models, zoo

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
    corpus.train_tokenizer(corpus.kjv_chapters()[:50], 300, out)
    return out


def _save_tiny(cls_config, folder, tok_dir, vocab=300):
    cfg = cls_config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(folder)
    corpus.load_tokenizer(tok_dir).save_pretrained(folder)
    return model


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_local_folder_resolves_and_loads_each_family(tmp_path, tok_dir, family):
    original = _save_tiny(FAMILY_CONFIGS[family], tmp_path / "m", tok_dir)
    rec = models.resolve_checkpoint(
        {"model": "m", "checkpoint": "local", "source": "local", "path": str(tmp_path / "m"), "dtype": "float32"}
    )
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
        models.resolve_checkpoint(
            {
                "model": "m",
                "checkpoint": "main",
                "source": "hf",
                "repo": "nobody/not-a-model",
                "revision": "stage1-step0",
            }
        )
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
    rec = models.resolve_checkpoint(
        {
            "model": "m",
            "checkpoint": "stage1-step0",
            "source": "hf",
            "repo": "org/tiny",
            "revision": "stage1-step0",
            "dtype": "bfloat16",
        }
    )
    assert rec["resolved_commit"] == "a" * 40
    model, _ = models.load_model(rec, "cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_weights_hash_from_cache_blob_names(tmp_path, tok_dir, monkeypatch):
    """In the HF cache layout the record's content hash comes from the blob names (weights not
    read, but the smallest one), and equals the full re-hash (the oracle: io.sha256_tree)."""
    from helpers import hubcache

    cache = tmp_path / "hub"
    snap = hubcache.add_snapshot(cache, "org/tiny", "main")
    _save_tiny(transformers.LlamaConfig, snap, tok_dir)
    from safetensors.torch import save_file

    save_file({"extra": torch.arange(4.0)}, str(snap / "adapter.safetensors"))  # a second, smaller LFS file
    full = io.sha256_tree(snap, models.WEIGHT_PATTERNS)
    hubcache.to_blob_layout(snap)
    assert (snap / "model.safetensors").is_symlink() and models.cache_blob_sha256(snap / "config.json") is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    read = []
    sha256_file = io.sha256_file
    monkeypatch.setattr(io, "sha256_file", lambda p, *a: read.append(p.name) or sha256_file(p, *a))
    spec = {
        "model": "m",
        "checkpoint": "main",
        "source": "hf",
        "repo": "org/tiny",
        "revision": "main",
        "dtype": "float32",
    }
    rec = models.resolve_checkpoint(spec)
    assert rec["content_hash"] == full
    weights_read = [n for n in read if n.endswith(".safetensors")]
    assert weights_read == ["adapter.safetensors"]  # the sample: the smallest blob, verified in full
    # a blob whose bytes no longer match its name stops the record with one line naming it
    blob = (snap / "adapter.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    with pytest.raises(RuntimeError, match=r"adapter.safetensors: its cache blob is named sha256 .* fetch it again"):
        models.resolve_checkpoint(spec)


def test_tokenizer_copy_matches_every_checkpoint_record(tmp_path, tok_dir, monkeypatch):
    """resolve_tokenizer's copy: real files (blob links followed), the hash every checkpoint record
    of the repo holds, a tokenizer that encodes as the source does; the rerun identity is the repo
    (hub) or the tokenizer files' hash (local: a weight edit leaves it, a tokenizer edit moves it);
    a folder without tokenizer files stops with its name and leaves nothing behind."""
    from helpers import hubcache

    cache = tmp_path / "hub"
    for rev in ("step0", "step10"):
        snap = hubcache.add_snapshot(cache, "org/tiny", rev)
        _save_tiny(transformers.LlamaConfig, snap, tok_dir)
        hubcache.to_blob_layout(snap)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    specs = [
        {"model": "m", "checkpoint": r, "source": "hf", "repo": "org/tiny", "revision": r, "dtype": "float32"}
        for r in ("step0", "step10")
    ]
    digest = models.copy_tokenizer(specs[0], tmp_path / "run" / "tokenizer")
    copied = tmp_path / "run" / "tokenizer"
    assert {models.resolve_checkpoint(s)["tokenizer_hash"] for s in specs} == {digest}
    assert digest == io.sha256_tree(copied, models.TOKENIZER_PATTERNS)
    assert not any(p.is_symlink() for p in copied.rglob("*")) and (copied / "config.json").is_file()
    text = "In the beginning God created the heaven and the earth."
    assert corpus.load_tokenizer(copied).encode(text) == corpus.load_tokenizer(tok_dir).encode(text)
    assert models.tokenizer_identity(specs[1]) == {"repo": "org/tiny"}

    local = tmp_path / "local"
    _save_tiny(transformers.LlamaConfig, local, tok_dir)
    spec = {"model": "m", "checkpoint": "local", "source": "local", "dtype": "float32", "path": str(local)}
    before = models.tokenizer_identity(spec)
    assert before == {"tokenizer_hash": io.sha256_tree(local, models.TOKENIZER_PATTERNS)}
    (local / "model.safetensors").write_bytes((local / "model.safetensors").read_bytes() + b" ")
    assert models.tokenizer_identity(spec) == before
    cfg = local / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("{", '{"model_max_length": 7, ', 1))
    assert models.tokenizer_identity(spec) != before

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    (tmp_path / "run2").mkdir()
    with pytest.raises(FileNotFoundError, match=r"bare \(checkpoint local\) holds no tokenizer files"):
        models.copy_tokenizer({**spec, "path": str(bare)}, tmp_path / "run2" / "tokenizer")
    import shutil

    copyfile = shutil.copyfile

    def disk_full(src, dst, *a, **k):
        if Path(src).name == "tokenizer_config.json":
            raise OSError(28, "No space left on device")
        return copyfile(src, dst, *a, **k)

    monkeypatch.setattr(shutil, "copyfile", disk_full)
    with pytest.raises(OSError, match="No space left"):
        models.copy_tokenizer(spec, tmp_path / "run2" / "tokenizer")
    assert list((tmp_path / "run2").iterdir()) == []  # neither the folder nor its staging copy


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


def _ce_problem(n=300, d=16, v=50, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    h = (2 * torch.randn(n, d, generator=g, dtype=dtype)).requires_grad_()
    w = torch.randn(v, d, generator=g, dtype=dtype).requires_grad_()
    return h, w, torch.randint(0, v, (n,), generator=g)


def test_linear_cross_entropy_matches_autograd_of_cross_entropy():
    h, w, y = _ce_problem()
    ref = torch.nn.functional.cross_entropy(h @ w.T, y)
    ref_h, ref_w = torch.autograd.grad(ref, (h, w))
    for chunk in (7, 128, 1000):  # chunks that do and do not divide N, and one chunk
        loss = zoo.linear_cross_entropy(h, w, y, chunk=chunk)
        got_h, got_w = torch.autograd.grad(2.5 * loss, (h, w))  # an upstream gradient ≠ 1
        assert loss.item() == pytest.approx(ref.item(), rel=1e-13)
        torch.testing.assert_close(got_h, 2.5 * ref_h, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(got_w, 2.5 * ref_w, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="expected"):
        zoo.linear_cross_entropy(h, w[:, :3], y)


def test_linear_cross_entropy_bfloat16_gradient_matmuls():
    """bfloat16 rounds g, h, W and the two matmul outputs (relative error ≤ 2⁻⁸ each); the
    value keeps float32 logits. Oracle: the same formula in float64 from the rounded inputs."""
    h, w, y = _ce_problem(dtype=torch.float32)
    loss = zoo.linear_cross_entropy(h, w, y, torch.bfloat16, chunk=1000)
    got_h, got_w = torch.autograd.grad(loss, (h, w))
    h64, w64 = h.detach().double(), w.detach().double()
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(h64 @ w64.T, y).item(), rel=1e-6)
    g = torch.softmax(h64 @ w64.T, -1) - torch.nn.functional.one_hot(y, w.shape[0])
    bf = lambda x: x.to(torch.bfloat16).double()  # noqa: E731
    g = bf(g.float())
    want_h = (g @ bf(w64)) / len(y)
    want_w = (g.T @ bf(h64)) / len(y)
    # rounding of the output (2⁻⁸) plus float32 accumulation and g's float32 softmax (≪ 2⁻⁸)
    torch.testing.assert_close(got_h.double(), want_h, rtol=2**-8, atol=1e-7)
    torch.testing.assert_close(got_w.double(), want_w, rtol=2**-8, atol=1e-7)
    exact_h = torch.autograd.grad(zoo.linear_cross_entropy(h, w, y), h)[0]
    assert not torch.equal(got_h, exact_h)  # the bfloat16 path was taken


@pytest.mark.parametrize("family", ["llama", "olmo2"])
def test_next_token_loss_equals_transformers_loss(family):
    model = zoo.build_model(zoo.Architecture(family, 2, 32, 4, 2, 64, 64), 100, seed=0)
    batch = torch.randint(0, 100, (3, 20), generator=torch.Generator().manual_seed(1))
    ref = model(input_ids=batch, labels=batch, use_cache=False).loss
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    loss = zoo.next_token_loss(model, batch, "float32")
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    low = zoo.next_token_loss(model, batch, "bfloat16")
    assert low.item() == pytest.approx(ref.item(), rel=1e-2) and low.item() != loss.item()
    with pytest.raises(ValueError, match="allowed: float32, bfloat16"):
        zoo.next_token_loss(model, batch, "float16")


def test_training_attention_is_sdpa_in_float32():
    """Without autocast the training attention is SDPA bit for bit; under bfloat16 autocast its
    output is SDPA of the float32-upcast inputs (not the bfloat16 kernel)."""
    model = zoo.build_model(zoo.Architecture("llama", 2, 32, 4, 2, 64, 64), 100, seed=0)
    assert model.config._attn_implementation == zoo.TRAIN_ATTENTION
    batch = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    ours = model(input_ids=batch).logits
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours, model(input_ids=batch).logits)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g).bfloat16() for _ in range(3))
    attn = model.model.layers[0].self_attn
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = zoo._sdpa_float32(attn, q, k, v, None, is_causal=True, scaling=8**-0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want.transpose(1, 2).to(torch.bfloat16))


def _train(tok_dir, tmp_path, tag, steps=12, state_every=100, precision="float32"):
    tok = corpus.load_tokenizer(tok_dir)
    stream = corpus.token_stream(tok, corpus.kjv_chapters()[:40])
    arch = zoo.Architecture("llama", 2, 32, 4, 2, 64, 64)
    return zoo.train_zoo_model(
        arch,
        stream[:20000],
        stream[20000:],
        tok_dir,
        {0: tmp_path / tag / "s0", steps: tmp_path / tag / "final"},
        steps=steps,
        batch_size=4,
        seq_len=32,
        lr=3e-3,
        warmup=2,
        weight_decay=0.0,
        eval_every=4,
        n_eval_windows=8,
        seed=0,
        state_path=tmp_path / tag / "state.pt",
        state_every=state_every,
        progress=False,
        precision=precision,
    )


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_zoo_training_learns_saves_and_resumes(tmp_path, tok_dir, precision):
    curve = _train(tok_dir, tmp_path, "a", precision=precision)
    assert list(curve["step"]) == [0, 4, 8, 12]
    assert curve["heldout_loss"].iloc[-1] < curve["heldout_loss"].iloc[0]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "final")
    assert loaded.config.num_hidden_layers == 2
    assert (tmp_path / "a" / "final" / "tokenizer.json").is_file()
    # An interrupted run (state saved at step 8) resumed gives the same final weights and curve.
    _train(tok_dir, tmp_path, "b", steps=12, state_every=8, precision=precision)
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
            _train(tok_dir, tmp_path, "c", steps=12, state_every=8, precision=precision)
    finally:
        zoo.heldout_loss = orig
    assert (tmp_path / "c" / "state.pt").is_file()
    resumed = _train(tok_dir, tmp_path, "c", steps=12, state_every=8, precision=precision)
    a, b, c = (transformers.AutoModelForCausalLM.from_pretrained(tmp_path / t / "final") for t in "abc")
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q) and torch.equal(p, r), n  # same seed: bit-identical, resumed or not
    np.testing.assert_allclose(resumed["heldout_loss"], curve["heldout_loss"], rtol=0, atol=0)
    assert not (tmp_path / "c" / "state.pt").exists()


def test_a_folder_with_broken_json_or_weights_gets_no_record(tmp_path):
    """resolve_checkpoint refuses (naming the file) a folder whose config.json, tokenizer JSON or
    safetensors header does not parse, so no checkpoint.json hashes a broken folder."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    good = tmp_path / "good"
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
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


@pytest.mark.parametrize(
    "var,value",
    [("SLURM_JOB_GPUS", "0"), ("SLURM_GPUS_ON_NODE", "2"), ("SLURM_GPUS", "a100:1"), ("CUDA_VISIBLE_DEVICES", "0,1")],
)
def test_a_job_given_gpus_never_falls_back_to_the_cpu_silently(monkeypatch, var, value):
    """No silent CPU: `device: auto` in a job given GPUs whose torch has no CUDA stops at start
    with one line on how to install a CUDA torch; hidden or absent GPUs are not an allocation."""
    for name in (*models.GPU_COUNT_VARS, *models.GPU_LIST_VARS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(models, "GPU_MARKERS", ("/nonexistent/nvidiactl",))
    assert models.device_name("auto") == "cpu" and models.pick_device("auto").type == "cpu"
    for hidden in ("", "-1", "NoDevFiles"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert models.device_name("auto") == "cpu"
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "0")
    assert models.gpu_allocation() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")
    monkeypatch.setenv(var, value)
    assert models.gpu_allocation() == f"{var}={value}"
    for resolve in (models.device_name, models.pick_device):
        with pytest.raises(RuntimeError) as err:
            resolve("auto")
        msg = str(err.value)
        assert "\n" not in msg and f"given GPUs ({var}={value})" in msg
        assert "make setup TORCH_BUILD=cuda" in msg and "Installing on a GPU cluster" in msg
        if torch.version.cuda is None:
            assert f"torch {torch.__version__} is a CPU-only build" in msg
    with pytest.raises(
        RuntimeError, match="config device: 'cuda' but no CUDA device is available: .*CONDA_OVERRIDE_CUDA"
    ):
        models.device_name("cuda")


def test_a_zoo_training_state_from_other_numerics_is_ignored_with_one_line(tmp_path, tok_dir, monkeypatch, caplog):
    """The training state's fingerprint carries the numerics record (GPU model, versions, fp32
    precision): a state saved under another record is ignored with one line naming both, and training
    starts over; under the same record it resumes."""
    from resdyn.numerics import precision

    def numerics_of(gpu: str) -> None:
        record = {**precision.numerics_record("cpu"), "device": "cuda", "gpus": [gpu], "torch": "2.13.0+cu128"}
        monkeypatch.setattr(precision, "numerics_record", lambda device: dict(record))

    class Stop(Exception):
        pass

    save = zoo._save_training_state

    def save_then_stop(*args, **kwargs):
        save(*args, **kwargs)
        raise Stop

    reference = _train(tok_dir, tmp_path, "ref", steps=8)
    for resumed_on, resumes in (("NVIDIA H100 80GB HBM3", True), ("NVIDIA A100-SXM4-80GB", False)):
        numerics_of("NVIDIA H100 80GB HBM3")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(zoo, "_save_training_state", save_then_stop)
            with pytest.raises(Stop):
                _train(tok_dir, tmp_path, resumed_on, steps=8, state_every=4)
        numerics_of(resumed_on)
        caplog.clear()
        with caplog.at_level("INFO", logger=zoo.log.name):
            curve = _train(tok_dir, tmp_path, resumed_on, steps=8, state_every=4)
        ignored = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
        resumed = [r.getMessage() for r in caplog.records if "resuming training from step 4" in r.getMessage()]
        if resumes:
            assert not ignored and len(resumed) == 1, caplog.text
        else:
            assert len(ignored) == 1 and not resumed, caplog.text
            line = ignored[0]
            assert "\n" not in line and "NVIDIA H100 80GB HBM3" in line and "NVIDIA A100-SXM4-80GB" in line, line
        np.testing.assert_allclose(curve["heldout_loss"], reference["heldout_loss"], rtol=0, atol=0)
