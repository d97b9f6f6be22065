"""Write tiny random-weight hub models and a small hub dataset into a Hugging Face cache layout.

The miniature of the paper run (configs/paper-mini.yaml) reads every model and its dataset from
the HF cache offline, exactly as a cluster run does after `hf download`. This script builds that
cache: for each repository, ``models--org--name/refs/<revision>`` holds a commit hash and
``snapshots/<hash>/`` the files (config.json, safetensors weights, tokenizer); the dataset goes
to ``datasets--org--name/`` the same way, as parquet files with a README declaring its config.

Each model is built from its family's own transformers config class (so its config.json is the
real format: Gemma 4 nested in ``text_config`` with per-layer inputs and KV sharing, Llama 3.1
with llama3 RoPE scaling, ...), at tiny sizes, with weights from a fixed seed.

    python tests/helpers/hubcache.py HF_HOME        # then: HF_HOME=HF_HOME HF_HUB_OFFLINE=1 snakemake ...
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

VOCAB = 320  # model vocabulary: > the tiny tokenizer's 300 entries
TOKENIZER_VOCAB = 300
DATASET = "resdyn-ci/wikitext-mini"
DATASET_CONFIG = "wikitext-mini-raw-v1"
N_DOCUMENTS = 240  # King James chapters: ~180k tokens of the tiny tokenizer

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)


def _llama31(n_layers: int):
    from transformers import LlamaConfig

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    return LlamaConfig(**_COMMON, num_hidden_layers=n_layers, rope_parameters=rope)


def _olmo3(n_layers: int):
    from transformers import Olmo3Config

    return Olmo3Config(**_COMMON, num_hidden_layers=n_layers, sliding_window=8)


def _qwen2(n_layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(**_COMMON, num_hidden_layers=n_layers)


def _olmo2(n_layers: int):
    from transformers import Olmo2Config

    return Olmo2Config(**_COMMON, num_hidden_layers=n_layers)


def _qwen3(n_layers: int):
    """Qwen3 in miniature: per-head q/k norms, the upper half of the layers sliding."""
    from transformers import Qwen3Config

    return Qwen3Config(
        **_COMMON,
        num_hidden_layers=n_layers,
        head_dim=8,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=n_layers // 2,
    )


def _gemma3(n_layers: int):
    """Gemma 3 (text) in miniature: sandwich norms (1 + w), per-head q/k norms, sliding/global
    layers with their own RoPE, sqrt(d)-scaled embedding."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_COMMON,
        num_hidden_layers=n_layers,
        head_dim=8,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * (n_layers // 2),
    )


def _gemma4_e4b(n_layers: int):
    """Gemma 4 E4B in miniature: the multimodal wrapper config (text only), per-layer inputs,
    the last layers sharing the K/V of earlier ones, sliding/full attention alternating."""
    from transformers import Gemma4Config, Gemma4TextConfig

    text = Gemma4TextConfig(
        **_COMMON,
        num_hidden_layers=n_layers,
        head_dim=8,
        global_head_dim=16,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention", "full_attention"] * (n_layers // 2),
        sliding_window=8,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=n_layers // 4,
        final_logit_softcapping=30.0,
    )
    return Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=None)


#: configs/reach-mini.yaml: the Qwen3 and Gemma 3 stand-ins (run whole by tests/test_user_configs.py)
REACH_MODELS: dict[str, tuple] = {
    "resdyn-ci/Qwen3-mini": (_qwen3, 4, ["main"]),
    "resdyn-ci/gemma-3-mini": (_gemma3, 4, ["main"]),
}

#: repo -> (config builder, n_layers, revisions in training order)
MODELS: dict[str, tuple] = {
    "resdyn-ci/Llama-3.1-mini": (_llama31, 8, ["main"]),
    "resdyn-ci/Olmo-3-mini": (_olmo3, 8, ["stage1-step0", "stage1-step471000", "stage1-step1413814"]),
    "resdyn-ci/gemma-4-E4B-mini": (_gemma4_e4b, 8, ["main"]),
    "resdyn-ci/Qwen2.5-mini-8L": (_qwen2, 8, ["main"]),
    "resdyn-ci/Qwen2.5-mini-12L": (_qwen2, 12, ["main"]),
    "resdyn-ci/Qwen2.5-mini-16L": (_qwen2, 16, ["main"]),
    "resdyn-ci/OLMo-2-mini-8L": (_olmo2, 8, ["main"]),
    "resdyn-ci/OLMo-2-mini-12L": (_olmo2, 12, ["main"]),
}


def _commit(*parts: str) -> str:
    """A fake 40-hex commit hash, deterministic in its parts."""
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


def repo_dir(hub_cache: Path, repo: str, repo_type: str = "model") -> Path:
    return Path(hub_cache) / f"{repo_type}s--{repo.replace('/', '--')}"


def add_snapshot(hub_cache: Path, repo: str, revision: str, repo_type: str = "model") -> Path:
    """Create ``refs/<revision>`` and an empty ``snapshots/<commit>/``; returns the snapshot folder."""
    root = repo_dir(hub_cache, repo, repo_type)
    commit = _commit(repo_type, repo, revision)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def documents() -> list[str]:
    from resdyn.lm import corpus as data

    return data.kjv_chapters()[:N_DOCUMENTS]


def write_dataset(hub_cache: Path, docs: list[str]) -> Path:
    """The dataset repo: ``<config>/{train,test}-00000-of-00001.parquet`` + README configs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    snap = add_snapshot(hub_cache, DATASET, "main", "dataset")
    n_test = len(docs) // 4
    splits = {"test": docs[:n_test], "train": docs[n_test:]}
    (snap / DATASET_CONFIG).mkdir(exist_ok=True)
    for split, texts in splits.items():
        pq.write_table(pa.table({"text": texts}), snap / DATASET_CONFIG / f"{split}-00000-of-00001.parquet")
    (snap / "README.md").write_text(
        "---\nconfigs:\n"
        f"- config_name: {DATASET_CONFIG}\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: {DATASET_CONFIG}/{s}-*\n" for s in splits)
        + "---\nKing James Bible chapters, a stand-in for WikiText in resdyn's CI.\n"
    )
    return snap


def write_model(hub_cache: Path, repo: str, tokenizer_dir: Path, models: dict | None = None) -> list[Path]:
    """One snapshot per revision: config.json, model.safetensors (seeded per revision), tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build, n_layers, revisions = (models or MODELS)[repo]
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for i, revision in enumerate(revisions):
        snap = add_snapshot(hub_cache, repo, revision)
        torch.manual_seed(int(_commit(repo, revision)[:8], 16))
        model = AutoModelForCausalLM.from_config(build(n_layers))
        model.save_pretrained(snap, safe_serialization=True)
        tokenizer.save_pretrained(snap)
        out.append(snap)
    return out


def write_config_only(hub_cache: Path, repo: str, revision: str, config: dict) -> Path:
    """A snapshot holding only config.json (what validation and `resdyn plan` read)."""
    snap = add_snapshot(hub_cache, repo, revision)
    (snap / "config.json").write_text(json.dumps(config, indent=2))
    return snap


# Stand-ins for the paper presets' models: config.json with the sizes their hub repositories
# publish (model_type, layers, width, heads, KV heads, d_ff, vocabulary, positions) and an empty
# safetensors file, so that configs/paper-{a,b}.yaml validate and dry-run offline in CI.
def _shape(model_type, n_layers, d, heads, kv, d_ff, vocab, positions) -> dict:
    return {
        "model_type": model_type,
        "num_hidden_layers": n_layers,
        "hidden_size": d,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": d_ff,
        "vocab_size": vocab,
        "max_position_embeddings": positions,
    }


PAPER_STANDINS: dict[str, dict] = {
    "meta-llama/Llama-3.1-8B": _shape("llama", 32, 4096, 32, 8, 14336, 128256, 131072),
    "allenai/Olmo-3-1025-7B": _shape("olmo3", 32, 4096, 32, 32, 11008, 100278, 65536),
    "google/gemma-4-E4B": {
        "model_type": "gemma4",
        "text_config": {
            **_shape("gemma4_text", 42, 2560, 8, 2, 10240, 262144, 131072),
            "hidden_size_per_layer_input": 256,
            "vocab_size_per_layer_input": 262144,
        },
    },
    "Qwen/Qwen2.5-0.5B": _shape("qwen2", 24, 896, 14, 2, 4864, 151936, 32768),
    "Qwen/Qwen2.5-1.5B": _shape("qwen2", 28, 1536, 12, 2, 8960, 151936, 131072),
    "Qwen/Qwen2.5-3B": _shape("qwen2", 36, 2048, 16, 2, 11008, 151936, 32768),
    "Qwen/Qwen2.5-7B": _shape("qwen2", 28, 3584, 28, 4, 18944, 152064, 131072),
    "Qwen/Qwen2.5-14B": _shape("qwen2", 48, 5120, 40, 8, 13824, 152064, 131072),
    "Qwen/Qwen2.5-32B": _shape("qwen2", 64, 5120, 40, 8, 27648, 152064, 131072),
    "allenai/OLMo-2-0425-1B": _shape("olmo2", 16, 2048, 16, 16, 8192, 100352, 4096),
    "allenai/OLMo-2-1124-7B": _shape("olmo2", 32, 4096, 32, 32, 11008, 100352, 4096),
    "allenai/OLMo-2-1124-13B": _shape("olmo2", 40, 5120, 40, 40, 13824, 100352, 4096),
    "allenai/OLMo-2-0325-32B": _shape("olmo2", 64, 5120, 40, 8, 27648, 100352, 4096),
    # configs/qwen3-gemma3.yaml (Gemma 3 4B-27B are multimodal: the text tower in text_config)
    "Qwen/Qwen3-0.6B-Base": _shape("qwen3", 28, 1024, 16, 8, 3072, 151936, 32768),
    "Qwen/Qwen3-1.7B-Base": _shape("qwen3", 28, 2048, 16, 8, 6144, 151936, 32768),
    "Qwen/Qwen3-4B-Base": _shape("qwen3", 36, 2560, 32, 8, 9728, 151936, 32768),
    "Qwen/Qwen3-8B-Base": _shape("qwen3", 36, 4096, 32, 8, 12288, 151936, 32768),
    "google/gemma-3-1b-pt": _shape("gemma3_text", 26, 1152, 4, 1, 6912, 262144, 32768),
    "google/gemma-3-4b-pt": {
        "model_type": "gemma3",
        "text_config": _shape("gemma3_text", 34, 2560, 8, 4, 10240, 262208, 131072),
    },
    "google/gemma-3-12b-pt": {
        "model_type": "gemma3",
        "text_config": _shape("gemma3_text", 48, 3840, 16, 8, 15360, 262208, 131072),
    },
    "google/gemma-3-27b-pt": {
        "model_type": "gemma3",
        "text_config": _shape("gemma3_text", 62, 5376, 32, 16, 21504, 262208, 131072),
    },
    # configs/pythia.yaml (GPT-NeoX: no num_key_value_heads, heads = kv heads)
    "EleutherAI/pythia-70m-deduped": _shape("gpt_neox", 6, 512, 8, 8, 2048, 50304, 2048),
    "EleutherAI/pythia-160m-deduped": _shape("gpt_neox", 12, 768, 12, 12, 3072, 50304, 2048),
    "EleutherAI/pythia-410m-deduped": _shape("gpt_neox", 24, 1024, 16, 16, 4096, 50304, 2048),
    "EleutherAI/pythia-2.8b-deduped": _shape("gpt_neox", 32, 2560, 32, 32, 10240, 50304, 2048),
    "EleutherAI/pythia-12b-deduped": _shape("gpt_neox", 36, 5120, 40, 40, 20480, 50688, 2048),
}


def olmo_branch(step: int, stage: int = 1, tokens_per_step: int = 4_194_304) -> str:
    """An OLMo-style branch name, ``stage1-step471000-tokens1976B`` (tokens seen, rounded up to
    billions; the stand-in's batch of 4M tokens)."""
    return f"stage{stage}-step{step}-tokens{-(-step * tokens_per_step // 10**9)}B"


def standin_revisions(model: dict) -> list[str]:
    """Branch names a stand-in of a preset's hub model needs: its revisions, or for training steps
    (``steps: [0, 471000, final]`` or integer revisions) OLMo-style branches and ``main``."""
    wanted = model["steps"] if isinstance(model.get("steps"), list) else model["revisions"]
    return ["main" if s == "final" else s if isinstance(s, str) else olmo_branch(s) for s in wanted]


def build_paper_standins(hub_cache: Path, config_files: list[Path]) -> Path:
    """Stand-in snapshots (config.json + empty weights) of every hub model and dataset of the
    given preset files, at their revisions."""
    import yaml
    from safetensors.torch import save_file

    for path in config_files:
        cfg = yaml.safe_load(Path(path).read_text())
        for m in cfg["models"].values():
            if m["source"] != "hf":
                continue
            for rev in standin_revisions(m):
                snap = write_config_only(hub_cache, m["repo"], rev, PAPER_STANDINS[m["repo"]])
                save_file({}, str(snap / "model.safetensors"))
        for ds in cfg["datasets"].values():
            if ds["source"] == "hf" and "name" in ds:
                add_snapshot(hub_cache, ds["name"], ds.get("revision") or "main", "dataset")
        lens = cfg.get("lens", {})
        if lens.get("source") == "tuned_lens" and lens.get("repo"):  # published-lens stand-ins (files only)
            space = add_snapshot(
                hub_cache, lens["repo"], lens.get("revision") or "main", lens.get("repo_type", "space")
            )
            for key, m in cfg["models"].items():
                folder = space / lens["path"].format(model=key, repo=m.get("repo", ""), ckpt="")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "config.json").write_text("{}")
                (folder / "params.pt").write_bytes(b"")
    return Path(hub_cache)


# --- tiny Pythia (GPT-NeoX, parallel residual) and its "published" tuned lenses (pythia-mini.yaml)


def _gpt_neox(n_layers: int):
    """Pythia in miniature: parallel residual, partial rotary (rotary_pct 0.25), LayerNorms."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=128,
        num_attention_heads=4,
        max_position_embeddings=128,
        num_hidden_layers=n_layers,
        rotary_pct=0.25,
        use_parallel_residual=True,
        bos_token_id=0,
        eos_token_id=0,
    )


def _gpt2(n_layers: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_inner=64,
        n_head=4,
        n_positions=128,
        n_layer=n_layers,
        bos_token_id=0,
        eos_token_id=0,
    )


PYTHIA_LENS_REPO = "resdyn-ci/tuned-lens"  # a Space, like AlignmentResearch/tuned-lens
#: repo -> (config builder, n_layers, revisions in training order)
PYTHIA_MODELS: dict[str, tuple] = {
    "resdyn-ci/pythia-mini-8L": (_gpt_neox, 8, ["step0", "step1000", "step143000"]),
    "resdyn-ci/pythia-mini-12L": (_gpt_neox, 12, ["step143000"]),
    "resdyn-ci/pythia-mini-16L": (_gpt_neox, 16, ["step143000"]),
}


def write_tuned_lens(hub_cache: Path, repo: str, snapshot: Path, seed: int = 0) -> Path:
    """A tuned lens for the final snapshot of ``repo`` in the tuned-lens Space layout
    ``lens/{repo}/{config.json, params.pt}``: small seeded translators, the model's unembed_hash."""
    import torch
    from transformers import AutoModelForCausalLM

    from resdyn.study_b import lens

    model = AutoModelForCausalLM.from_pretrained(snapshot)
    n, d = model.config.num_hidden_layers, model.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    weight, bias = 0.02 * torch.randn(n, d, d, generator=gen), 0.02 * torch.randn(n, d, generator=gen)
    space = add_snapshot(hub_cache, PYTHIA_LENS_REPO, "main", "space")
    fitted = lens.Lens(model, weight, bias, meta={"model_id": repo, "model_revision": snapshot.name})
    return fitted.export_tuned_lens(space / "lens" / repo)


def build_pythia(hf_home: Path) -> Path:
    """The tiny Pythia models (a checkpoint series and a depth series), their lenses in the
    Space layout, and the dataset under ``hf_home/hub``; returns the hub cache."""
    from resdyn.lm import corpus as data

    hub_cache = Path(hf_home) / "hub"
    docs = documents()
    write_dataset(hub_cache, docs)
    tok = Path(hf_home) / "tokenizer"
    data.train_tokenizer(docs, TOKENIZER_VOCAB, tok)
    for i, repo in enumerate(PYTHIA_MODELS):
        snaps = write_model(hub_cache, repo, tok, PYTHIA_MODELS)
        write_tuned_lens(hub_cache, repo, snaps[-1], seed=i)
    return hub_cache


def build_reach(hf_home: Path) -> Path:
    """The tiny Qwen3 and Gemma 3 models of configs/reach-mini.yaml and the dataset."""
    return build(hf_home, REACH_MODELS)


def build(hf_home: Path, models: dict | None = None) -> Path:
    """Every model of ``models`` (default: the paper-mini :data:`MODELS`) and the dataset under
    ``hf_home/hub``, with one tokenizer trained on the dataset; returns the hub cache."""
    from resdyn.lm import corpus as data

    hub_cache = Path(hf_home) / "hub"
    docs = documents()
    write_dataset(hub_cache, docs)
    tok = Path(hf_home) / "tokenizer"
    data.train_tokenizer(docs, TOKENIZER_VOCAB, tok)
    for repo in MODELS if models is None else models:
        write_model(hub_cache, repo, tok, models)
    return hub_cache


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):  # never build a cache in a folder named --help
        sys.exit("usage: python tests/helpers/hubcache.py HF_HOME  (writes the paper-mini models and dataset there)")
    print(build(Path(sys.argv[1])))


# --- a user's own hub models (tests/test_revisions.py, tests/test_user_configs.py) ------------------

#: OLMo-style branches (stage, step, tokens; a stage-2 branch at a stage-1 step, so step 1000 is
#: ambiguous) and Pythia-style ones (their alphabetical order is not their training order)
USER_MODELS: dict[str, tuple] = {
    "org/olmo-style": (
        _llama31,
        8,
        ["stage1-step0-tokens0B", "stage1-step1000-tokens5B", "stage2-ingredient1-step1000-tokens5B", "main"],
    ),
    "org/pythia-style": (_gpt_neox, 8, ["step0", "step1000", "step143000", "step8000", "main"]),
}


def build_user(hf_home: Path) -> Path:
    """:data:`USER_MODELS` and the dataset under ``hf_home/hub``; returns the hub cache."""
    return build(hf_home, USER_MODELS)


def to_blob_layout(snapshot: Path) -> Path:
    """Store a snapshot's files the way ``hf download`` does: each in ``blobs/``, linked from the
    snapshot; weight files (LFS) named by their SHA-256, the others by their git blob SHA-1."""
    blobs = Path(snapshot).parent.parent / "blobs"
    blobs.mkdir(exist_ok=True)
    for path in sorted(p for p in Path(snapshot).rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        lfs = path.suffix in (".safetensors", ".bin", ".pt")
        name = (hashlib.sha256(data) if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data)).hexdigest()
        path.replace(blobs / name)
        path.symlink_to(Path("../" * (len(path.relative_to(snapshot).parts) + 1)) / "blobs" / name)
    return Path(snapshot)
