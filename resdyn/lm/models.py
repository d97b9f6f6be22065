"""Resolve and load model checkpoints (hub, local folder or trained zoo) with a content hash.

Resolution turns a checkpoint spec (see ``resdyn.pipeline.config.checkpoint_spec``) into a record —
the folder holding the weights, the hub commit when known, and a SHA-256 over the weight and
config files — written as ``models/{model}/{ckpt}/checkpoint.json``. Every downstream artifact
loads through that record, so its provenance names exactly which weights it saw.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from resdyn import io
from resdyn.lm.hub import DTYPES

if TYPE_CHECKING:  # torch is imported where a model is loaded: light jobs never pay for it
    import torch

log = logging.getLogger(__name__)

#: Driver files / device nodes without which torch can see no GPU (NVIDIA, ROCm, WSL2).
GPU_MARKERS = ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/kfd", "/dev/dxg")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "config.json")
TOKENIZER_PATTERNS = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "*.model")


def _check_folder(folder: Path, what: str) -> None:
    """Refuse a folder whose config.json or safetensors headers do not parse (names the file)."""
    import json

    for path in sorted(folder.glob("*.json")):  # config, tokenizer, generation config
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"checkpoint {what}: {path} is not valid JSON ({err})") from err
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ValueError(
            f"checkpoint {what}: {folder / 'config.json'} has no 'model_type' (expected a Hugging Face model config)"
        )
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="numpy") as f:  # header only: no torch needed
                f.keys()
        except Exception as err:  # safetensors raises its own SafetensorError
            raise ValueError(f"checkpoint {what}: {path} is not a readable safetensors file ({err})") from err


def _hub_snapshot(repo: str, revision: str) -> Path:
    """Local snapshot folder of ``repo@revision``: from the HF cache, downloading only if allowed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from resdyn.lm import hub

    cache = hub.hub_cache_dir()
    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=hub.hub_offline(), cache_dir=cache))
    except LocalEntryNotFoundError:
        pass
    except Exception as err:  # network errors come in many types
        log.warning("download of %s@%s failed (%s); trying the local cache", repo, revision, err)
    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=True, cache_dir=cache))
    except Exception as err:
        raise RuntimeError(
            f"model {repo!r} at revision {revision!r} is not in the local Hugging Face cache and "
            "cannot be downloaded (offline?). Pre-download it on a machine with internet: "
            f"`{hub.download_command(repo, revision)}` and copy ~/.cache/huggingface "
            "(or set HF_HOME), or save it with save_pretrained and point the model at the folder "
            "with `source: local`."
        ) from err


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def cache_blob_sha256(path: Path) -> str | None:
    """The SHA-256 of a file in the HF cache, read from its name: a snapshot file is a link to
    ``blobs/<name>``, and an LFS file's blob (weights) is named by the SHA-256 of its content
    (small git files by their 40-hex git hash: None, as for a file outside the cache)."""
    if not path.is_symlink():
        return None
    blob = path.resolve()
    return blob.name if blob.parent.name == "blobs" and _SHA256_HEX.fullmatch(blob.name) else None


def weights_manifest(folder: Path, patterns: tuple[str, ...], verify: int = 1) -> dict[str, str]:
    """:func:`resdyn.io.manifest` of ``folder``, without reading the weights where the HF
    cache names them: an LFS file's SHA-256 is its blob's name (:func:`cache_blob_sha256`), so
    resolving an 8B checkpoint reads kilobytes, not 16 GB. The ``verify`` smallest such files are
    hashed in full and must match their names (a corrupt or hand-edited cache stops here; the
    compute job re-hashes everything, :func:`load_model`)."""
    named = {}
    for path in sorted({p for pat in patterns for p in folder.rglob(pat) if p.is_file()}):
        rel = path.relative_to(folder)
        if not any(part.startswith(".") for part in rel.parts):
            named[rel.as_posix()] = (path, cache_blob_sha256(path))
    for rel, (path, digest) in sorted(
        ((r, v) for r, v in named.items() if v[1]), key=lambda kv: kv[1][0].stat().st_size
    )[:verify]:
        actual = io.sha256_file(path)
        if actual != digest:
            raise RuntimeError(
                f"{path}: its cache blob is named sha256 {digest[:16]}… but holds {actual[:16]}… "
                "(a corrupt or edited download): delete the repository from the HF cache and fetch it again"
            )
    return {rel: digest or io.sha256_file(path) for rel, (path, digest) in named.items()}


def resolve_checkpoint(spec: dict) -> dict:
    """A provenance record for one checkpoint: folder, hub id and revision, content hash."""
    source = spec["source"]
    if source == "hf":
        folder = _hub_snapshot(spec["repo"], spec["revision"])
        commit = folder.name  # snapshot folders are named by the resolved commit hash
    else:
        folder = Path(spec["path"])
        commit = None
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"checkpoint {spec['model']}/{spec['checkpoint']}: {folder} has no config.json "
                "(expected a Hugging Face model folder)"
            )
    _check_folder(folder, f"{spec['model']}/{spec['checkpoint']}")
    weights = sorted(p.name for pat in WEIGHT_PATTERNS for p in folder.glob(pat))
    if not any(w != "config.json" for w in weights):
        raise FileNotFoundError(f"checkpoint {spec['model']}/{spec['checkpoint']}: no weight files in {folder}")
    return {
        **spec,
        "folder": str(folder.resolve()),
        "resolved_commit": commit,
        "weight_files": weights,
        "content_hash": io.tree_digest(weights_manifest(folder, WEIGHT_PATTERNS)),  # = io.sha256_tree
        # the tokenizer decides which tokens every sample holds: recorded beside the weights
        "tokenizer_hash": io.sha256_tree(folder, TOKENIZER_PATTERNS),
    }


def tokenizer_folder(spec: dict) -> Path:
    """The folder holding checkpoint ``spec``'s tokenizer: its hub snapshot or its local folder."""
    return _hub_snapshot(spec["repo"], spec["revision"]) if spec["source"] == "hf" else Path(spec["path"])


def copy_tokenizer(spec: dict, dest: Path) -> str:
    """Copy checkpoint ``spec``'s tokenizer files into the new folder ``dest``; return their hash.

    Copied: the :data:`TOKENIZER_PATTERNS` files (sub-folders kept) and ``config.json``, which
    ``AutoTokenizer`` reads when ``tokenizer_config.json`` names no class. The hash is
    :func:`resdyn.io.sha256_tree` over :data:`TOKENIZER_PATTERNS`, the ``tokenizer_hash`` of
    the checkpoint's record. Written beside ``dest`` and renamed into place: a failed copy leaves
    nothing.
    """
    import shutil
    import tempfile

    folder = tokenizer_folder(spec)
    names = sorted(io.manifest(folder, TOKENIZER_PATTERNS))
    if not names:
        raise FileNotFoundError(
            f"model {spec['model']}: {folder} (checkpoint {spec['checkpoint']}) holds no "
            f"tokenizer files ({', '.join(TOKENIZER_PATTERNS)})"
        )
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for rel in [*names, *(["config.json"] if (folder / "config.json").is_file() else [])]:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / rel, staging / rel)  # follows the hub cache's blob links
        digest = io.sha256_tree(staging, TOKENIZER_PATTERNS)
        io.publish_modes(staging)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return digest


def tokenizer_identity(spec: dict) -> dict:
    """What decides a model's tokenizer, for the rerun trigger of ``resolve_tokenizer``: the hub
    repository (all revisions of a repository share a tokenizer; each checkpoint record holds its
    own ``tokenizer_hash``), or a local folder's tokenizer hash (read when the DAG is built: the
    files are small). Not the revision or the folder: removing a checkpoint reruns no samples."""
    if spec["source"] == "hf":
        return {"repo": spec["repo"]}
    folder = Path(spec["path"])
    return {"tokenizer_hash": io.sha256_tree(folder, TOKENIZER_PATTERNS) if folder.is_dir() else None}


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, answered without importing torch where no GPU driver exists.

    Without any :data:`GPU_MARKERS` path CUDA cannot initialise, so the answer is False and the
    seconds of ``import torch`` are saved; otherwise torch is asked.
    """
    if not any(os.path.exists(p) for p in GPU_MARKERS):
        return False
    import torch

    return torch.cuda.is_available()


#: Variables that say this process was given GPUs: counts (SLURM) and device lists (SLURM, CUDA).
GPU_COUNT_VARS = ("SLURM_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")
GPU_LIST_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
#: How to get a CUDA torch (docs/slurm.md, "Installing on a GPU cluster").
CUDA_TORCH_HINT = (
    "install a CUDA build: `make setup TORCH_BUILD=cuda` (pip: torch from "
    "https://download.pytorch.org/whl/cu128), or build the conda env on a GPU node or with "
    'CONDA_OVERRIDE_CUDA=12.8 (docs/slurm.md, "Installing on a GPU cluster")'
)


def gpu_allocation() -> str | None:
    """``NAME=value`` of the first variable saying this process was given GPUs (a SLURM job with
    ``--gpus``/``--gres=gpu``, or CUDA_VISIBLE_DEVICES naming devices), else None. A count of 0, an
    empty list, ``-1`` or ``NoDevFiles`` (GPUs hidden on purpose) give none."""
    for name in GPU_COUNT_VARS:
        value = os.environ.get(name, "").strip()
        count = value.split(":")[-1]  # SLURM_GPUS may read "a100:2"
        if count.isdigit() and int(count) > 0:
            return f"{name}={value}"
    for name in GPU_LIST_VARS:
        value = os.environ.get(name, "").strip()
        if value and value not in ("-1", "NoDevFiles", "none", "None"):
            return f"{name}={value}"
    return None


def cuda_missing(why: str) -> str:
    """One line: ``why``, what this torch is (a CPU-only build, or a CUDA build that sees no GPU)
    and :data:`CUDA_TORCH_HINT`."""
    import torch

    if torch.version.cuda is None:
        return (
            f"{why} but no CUDA device is available: torch {torch.__version__} is a CPU-only build; {CUDA_TORCH_HINT}"
        )
    return (
        f"{why} but no CUDA device is available: torch {torch.__version__} (built for CUDA "
        f"{torch.version.cuda}) sees no GPU: check "
        f"`nvidia-smi` on the node (a driver older than CUDA {torch.version.cuda} cannot run it); {CUDA_TORCH_HINT}"
    )


def refuse_silent_cpu() -> None:
    """Stop a job about to fall back to the CPU (``device: auto``) although it was given GPUs: a GPU
    job on a CPU-only torch would crawl for days instead of failing."""
    where = gpu_allocation()
    if where:
        raise RuntimeError(cuda_missing(f"config device: 'auto' in a job given GPUs ({where})"))


def device_name(device: str) -> str:
    """The config ``device`` resolved to ``"cuda"`` or ``"cpu"``, without torch where it can be.

    ``auto`` → ``"cuda"`` when :func:`cuda_available`, else ``"cpu"`` — unless the job was given
    GPUs (:func:`refuse_silent_cpu`); ``cuda`` without a GPU is
    an error (torch itself is asked: a job told to use the GPU imports it anyway, and a GPU whose
    driver files are not among :data:`GPU_MARKERS` must not stop it); anything else (``cpu``,
    ``cuda:1``) is returned unchanged. For the numpy jobs whose device switch is
    :func:`resdyn.numerics.linalg.on_cuda` (a string suffices there).
    """
    if device == "auto":
        if cuda_available():
            return "cuda"
        refuse_silent_cpu()
        return "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(cuda_missing("config device: 'cuda'") + "; or set device: auto / cpu")
    return device


def pick_device(device: str) -> torch.device:
    """The device of a job that runs a model: ``auto`` → CUDA when torch sees one, else CPU;
    otherwise :func:`device_name`. Such a job imports torch anyway, so ``auto`` asks torch
    itself rather than the driver-file shortcut of :func:`device_name`."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        refuse_silent_cpu()
        return torch.device("cpu")
    return torch.device(device_name(device))


def load_kwargs(folder: Path, dtype: str, device: torch.device) -> dict:
    """Keyword arguments of ``from_pretrained`` that put weights straight onto ``device``.

    On an accelerator, ``device_map`` makes transformers read each safetensors shard (memory
    mapped) directly into device memory, so host RAM holds at most about one shard, never the
    whole model (this needs the ``accelerate`` package). On the CPU the weights are on the host
    anyway. Safetensors are required when the folder has them (never the pickled .bin files).
    """
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"checkpoint dtype {dtype!r}; allowed: {DTYPES}")
    kwargs: dict = {"dtype": getattr(torch, dtype), "attn_implementation": "eager"}
    if device.type != "cpu":
        kwargs["device_map"] = str(device) if device.index is not None else f"{device.type}:0"
    if any(Path(folder).glob("*.safetensors")):
        kwargs["use_safetensors"] = True
    return kwargs


def module_device_map(model, blocks: dict[str, int], devices: list[str]) -> dict[str, str]:
    """``from_pretrained``'s ``device_map`` for a placement by blocks (the cost model's
    :meth:`resdyn.cluster.multigpu.Placement.device_map`: ``embed``, ``layers.{i}``, ``head`` -> index
    into ``devices``), in ``model``'s module names (an empty model of the same config will do).

    Each decoder layer goes where its block says; the final norm and the unembedding with the
    head; every other module (embeddings, rotary tables, Gemma's per-layer inputs) with the
    embedding — unless the unembedding is tied to the embedding, in which case the embedding
    moves to the head's device (one tensor cannot live on two GPUs; the head's device holds the
    job's working memory, so the readout stays there).
    """
    from resdyn.lm import structure

    layers = structure.decoder_layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    head_modules = {id(model.get_output_embeddings()), id(structure.final_norm(model))}
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    tied = out_emb is not None and (
        out_emb.weight is in_emb.weight or bool(getattr(text_config, "tie_word_embeddings", False))
    )
    embed = devices[blocks["head"] if tied else blocks["embed"]]
    head = devices[blocks["head"]]
    mapping: dict[str, str] = {}
    for i in range(len(layers)):  # layers beyond num_hidden_layers (none in practice) with the last
        mapping[f"{names[id(layers)]}.{i}"] = devices[blocks.get(f"layers.{i}", blocks["head"])]

    def visit(module, prefix: str) -> None:
        for name, child in module.named_children():
            if child is layers:
                continue
            if any(m is layers for m in child.modules()):
                visit(child, f"{prefix}{name}.")
            else:
                mapping[f"{prefix}{name}"] = head if id(child) in head_modules else embed

    visit(model, "")
    return mapping


def placed_device_map(folder: Path, blocks: dict[str, int], devices: list[str]) -> dict[str, str]:
    """:func:`module_device_map` for the model in ``folder``, named from an empty (meta) copy."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), attn_implementation="eager")
    return module_device_map(empty, blocks, devices)


def placement_devices(target: torch.device, n: int) -> list[str]:
    """The devices of a placement over ``n`` blocks' devices: cuda:0 … cuda:n−1 on a GPU (one
    line if fewer are visible), ``cpu`` n times on the CPU (the same code path, for tests)."""
    import torch

    if target.type == "cpu":
        return ["cpu"] * n
    visible = torch.cuda.device_count()
    if visible < n:
        raise RuntimeError(
            f"the model is placed on {n} GPUs but this job sees {visible} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); the rule's "
            "resources request them (resources gpu): run it through the workflow, or give it more GPUs"
        )
    return [f"cuda:{i}" for i in range(n)]


def load_model(record: dict, device: str = "auto", verify_hash: bool = True, placement: dict | None = None):
    """Load (model, tokenizer) from a checkpoint record, eval mode, eager attention.

    Eager attention makes every sublayer an explicit, differentiable PyTorch function.
    With ``verify_hash`` (the default) the folder is re-hashed and must match the record, so
    swapped weights stop the job instead of being analysed under the old record's name.
    ``placement``: the cost model's block -> device index map of a model that does not fit one
    GPU (:meth:`resdyn.cluster.multigpu.Placement.device_map`); its layers are loaded onto as many GPUs
    (accelerate's device map; resdyn's own forward moves the activations along,
    :meth:`resdyn.lm.sublayers.LayerSublayers.placed`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(record["folder"])
    if verify_hash and io.sha256_tree(folder, WEIGHT_PATTERNS) != record["content_hash"]:
        raise RuntimeError(
            f"checkpoint {record['model']}/{record['checkpoint']}: weights in {folder} changed since they were "
            f"resolved (content hash mismatch with models/{record['model']}/{record['checkpoint']}/checkpoint.json) "
            "— rerun snakemake to redo the checkpoint record and everything made from it"
        )
    target = pick_device(device)
    kwargs = load_kwargs(folder, record.get("dtype", "float32"), target)
    if placement and len(set(placement.values())) > 1:
        kwargs["device_map"] = placed_device_map(
            folder, placement, placement_devices(target, max(placement.values()) + 1)
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # transformers refuses pickled weights, remote code and bad headers in many types
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise RuntimeError(
            f"cannot load checkpoint {record['model']}/{record['checkpoint']} from {folder}: "
            f"{first} ({type(err).__name__})"
        ) from err
    if "device_map" not in kwargs:
        model.to(target)
    model.eval()
    if record.get("family") == "generic":  # config family: generic (resdyn.lm.generic)
        from resdyn.lm import decompose

        decompose.use_generic(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer


def model_attrs(record: dict) -> dict:
    """The attributes every artifact derived from this checkpoint records."""
    return {
        "model": record["model"],
        "checkpoint": record["checkpoint"],
        "source": record["source"],
        "model_id": record.get("repo") or record["folder"],
        "revision": record.get("revision") or record["checkpoint"],
        "content_hash": record["content_hash"],
        "dtype": record.get("dtype", "float32"),
    }
