"""resdyn.study_b.lens_import: tuned-lens checkpoints (config.json + params.pt) into resdyn's Lens.

Oracles: the translators resdyn itself exported (round trip must be bit-identical), tuned-lens's
own ``transform_hidden``/``forward`` on a lens saved by the tuned-lens package (in a throwaway
venv that has it; skipped elsewhere), and HF's hub-cache layout for the hub path.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from resdyn.lm import structure
from resdyn.study_b import lens as L
from resdyn.study_b import lens_import

from helpers.lens_models import PINNED
from helpers.tiny_models import PARALLEL, make_model, sample_ids

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def pythia():
    return make_model(PARALLEL)


@pytest.fixture(scope="module")
def trained(pythia):
    batches = [torch.stack([sample_ids(seed + 10 * b) for seed in range(4)]) for b in range(3)]
    return L.train_lens(
        pythia,
        batches,
        **{**PINNED, "steps": 6, "eval_every": 3},
        progress=False,
        model_id="tiny-pythia",
        model_revision="step8",
    )


def test_round_trip_gives_identical_translators(pythia, trained, tmp_path):
    folder = trained.export_tuned_lens(tmp_path / "tl")
    imported = lens_import.import_tuned_lens(folder, pythia, source={"path": str(folder)})
    assert torch.equal(imported.weight, trained.weight) and torch.equal(imported.bias, trained.bias)
    assert imported.meta["stop_reason"] == "imported" and imported.options["unembed_hash_checked"]
    assert bool(trained.weight.abs().max() > 0)  # a trained lens, not the zero initialisation
    # ... and through resdyn's own format, as the lens rule writes it for study B.
    imported.save(tmp_path / "lens")
    again = L.Lens.load(tmp_path / "lens", pythia)
    assert torch.equal(again.weight, trained.weight) and torch.equal(again.bias, trained.bias)
    h = structure.residual_states(pythia, sample_ids()[None])[0, 2]
    torch.testing.assert_close(again.logits(h, 2), trained.logits(h, 2), atol=0, rtol=0)


def test_refuses_a_lens_of_another_model(trained, tmp_path):
    folder = trained.export_tuned_lens(tmp_path / "tl")
    other = make_model(PARALLEL, seed=5)  # same shapes, another unembedding
    with pytest.raises(ValueError, match="unembed_hash .* does not match"):
        lens_import.import_tuned_lens(folder, other)
    import transformers as tf

    from helpers.tiny_models import NEOX_CONFIG

    shallower = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**{**NEOX_CONFIG, "num_hidden_layers": 3})).eval()
    with pytest.raises(ValueError, match="4 translators of width 32, but the model has n_layers=3, d_model=32"):
        lens_import.import_tuned_lens(folder, shallower)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_hidden_layers=3 but params.pt holds 4"):
        lens_import.import_tuned_lens(folder, make_model(PARALLEL))


def test_bad_files_are_named(tmp_path, pythia):
    with pytest.raises(FileNotFoundError, match="no config.json, params.pt"):
        lens_import.fetch_tuned_lens(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    torch.save({"0.weight": torch.zeros(32, 32), "2.weight": torch.zeros(32, 32)}, tmp_path / "params.pt")
    with pytest.raises(ValueError, match=r"layers \[0, 2\]; expected 0..n-1"):
        lens_import.read_tuned_lens(tmp_path)
    torch.save({"0.linear": torch.zeros(3)}, tmp_path / "params.pt")
    with pytest.raises(ValueError, match="unexpected entry '0.linear'"):
        lens_import.read_tuned_lens(tmp_path)


def test_prefixed_keys_and_no_bias(tmp_path, pythia):
    """Whole-lens state dicts (``layer_translators.`` prefix) and lenses without biases."""
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(4, 32, 32, generator=gen) * 0.01
    torch.save({f"layer_translators.{i}.weight": weights[i] for i in range(4)}, tmp_path / "params.pt")
    (tmp_path / "config.json").write_text(json.dumps({"d_model": 32, "num_hidden_layers": 4, "bias": False}))
    imported = lens_import.import_tuned_lens(tmp_path, pythia)
    assert torch.equal(imported.weight, weights) and not bool(imported.bias.any())
    assert imported.options["unembed_hash_checked"] is False


def test_hub_cache_layout(trained, tmp_path, monkeypatch, pythia):
    """A lens in a hub Space (as AlignmentResearch/tuned-lens publishes them) read offline from
    the HF cache: spaces--{owner}--{name}/snapshots/{commit}/lens/{model}/ with refs/main."""
    cache = tmp_path / "hub"
    commit = "0" * 40
    snapshot = cache / "spaces--owner--lenses" / "snapshots" / commit / "lens" / "tiny-pythia"
    trained.export_tuned_lens(snapshot)
    (cache / "spaces--owner--lenses" / "refs").mkdir(parents=True)
    (cache / "spaces--owner--lenses" / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    folder = lens_import.fetch_tuned_lens("lens/tiny-pythia", repo="owner/lenses", repo_type="space")
    assert torch.equal(lens_import.import_tuned_lens(folder, pythia).weight, trained.weight)
    shutil.rmtree(snapshot)
    with pytest.raises(FileNotFoundError, match="owner/lenses:lens/tiny-pythia/config.json"):
        lens_import.fetch_tuned_lens("lens/tiny-pythia", repo="owner/lenses", repo_type="space")


def test_lens_saved_by_tuned_lens_imports(pythia, tmp_path):
    """A lens saved by the tuned-lens package itself (GPT-NeoX: a family it resolves natively)
    imports, and resdyn's translators and logits equal tuned-lens's own."""
    tl = pytest.importorskip(
        "tuned_lens.nn", reason="the tuned-lens package is optional (needs torchdata 0.9, not a resdyn dependency)"
    )
    theirs = tl.TunedLens.from_model(pythia)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for translator in theirs:
            translator.weight.copy_(0.05 * torch.randn(translator.weight.shape, generator=gen))
            translator.bias.copy_(0.05 * torch.randn(translator.bias.shape, generator=gen))
    theirs.save(tmp_path / "native")
    ours = lens_import.import_tuned_lens(tmp_path / "native", pythia)
    h = structure.residual_states(pythia, sample_ids()[None])[0]
    with torch.no_grad():
        for i in range(4):
            torch.testing.assert_close(ours.transform(h[i], i), theirs.transform_hidden(h[i], i), atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(ours.logits(h[i], i), theirs(h[i], i), atol=1e-5, rtol=1e-5)


def test_config_lens_import_spec_and_validation(tmp_path, trained):
    """lens.source: tuned_lens fills {model}/{ckpt}/{repo} per model; a local folder without the
    two files stops validation with one line naming the folder."""
    from resdyn.pipeline import config as rc

    cfg = {
        "datasets": {"e": {"source": "embedded"}},
        "models": {
            "m": {
                "source": "train",
                "dataset": "e",
                "family": "llama",
                "n_layers": 8,
                "d_model": 32,
                "n_heads": 4,
                "d_ff": 64,
            }
        },
        "jacobian": {"store_first_n": 2},
        "lens": {"source": "tuned_lens", "path": str(tmp_path / "{model}-{ckpt}")},
    }
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(json.loads(json.dumps(cfg)))
    problems = str(err.value).splitlines()[1:]
    assert len(problems) == 1 and "m-step600" in problems[0] and "config.json, params.pt" in problems[0]
    trained.export_tuned_lens(tmp_path / "m-step600")
    done = rc.validate_config(json.loads(json.dumps(cfg)))
    assert rc.lens_import_spec(done, "m", "step600") == {
        "path": str(tmp_path / "m-step600"),
        "repo": None,
        "repo_type": "space",
        "revision": None,
    }
    cfg["lens"] = {"source": "tuned_lens", "repo": "o/r", "path": "lens/{repo}-{oops}"}
    with pytest.raises(rc.ConfigError, match=r"only \{model\}, \{ckpt\} and \{repo\}"):
        rc.validate_config(json.loads(json.dumps(cfg)))
    assert rc.lens_import_spec(rc.validate_config({**cfg, "lens": {}}), "m", "step600") is None


def test_offline_hub_lens_must_be_cached(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE with a hub lens that is not in the cache stops validation with one line
    naming the repository, the folder and the download command."""
    from resdyn.pipeline import config as rc

    from helpers import hubcache

    cache = tmp_path / "hub"
    from safetensors.torch import save_file

    snap = hubcache.write_config_only(cache, "org/tiny-neox", "main", hubcache._gpt_neox(2).to_dict())
    save_file({}, str(snap / "model.safetensors"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {
        "datasets": {"e": {"source": "embedded"}},
        "models": {"m": {"source": "hf", "repo": "org/tiny-neox", "revisions": ["main"], "dataset": "e"}},
        "jacobian": {"store_first_n": 2},
        "lens": {"source": "tuned_lens", "repo": "org/lenses", "path": "lens/{repo}"},
    }
    with pytest.raises(rc.ConfigError) as err:
        rc.validate_config(json.loads(json.dumps(cfg)))
    problems = str(err.value).splitlines()[1:]
    assert len(problems) == 1, problems
    for needle in ("org/lenses:lens/org/tiny-neox", "hf download --repo-type space org/lenses"):
        assert needle in problems[0], problems[0]
    space = hubcache.add_snapshot(cache, "org/lenses", "main", "space") / "lens" / "org" / "tiny-neox"
    space.mkdir(parents=True)
    (space / "config.json").write_text("{}")
    (space / "params.pt").write_bytes(b"")
    assert rc.validate_config(json.loads(json.dumps(cfg)))["models"]["m"]["family"] == "gpt_neox"
