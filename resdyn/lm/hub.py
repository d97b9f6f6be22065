"""The Hugging Face hub as resdyn sees it: cache look-ups, architecture from ``config.json``,
and the training order of checkpoint revisions.

Everything here runs at config validation (before any job), so it only reads small files:
``refs/<revision>`` and ``config.json`` of the local HF cache (``$HF_HUB_CACHE``, by default
``$HF_HOME/hub``), or a local model folder. Offline (``HF_HUB_OFFLINE=1``) a missing entry is an
error that names the ``hf download`` command which fetches it; online, only ``config.json`` is
downloaded here (the weights are fetched by the checkpoint job).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

#: shape keys of a model entry -> the config.json field they come from (text config for
#: multimodal wrappers such as Gemma 4)
SHAPE_FIELDS: dict[str, str] = {
    "n_layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position": "max_position_embeddings",
    # Gemma 4: per-layer input embeddings (weights the decoder layers do not hold)
    "d_per_layer_input": "hidden_size_per_layer_input",
    "vocab_per_layer_input": "vocab_size_per_layer_input",
}

#: GPT-2's config.json field names for the standard ones in SHAPE_FIELDS
_GPT2_FIELDS: dict[str, str] = {
    "num_hidden_layers": "n_layer",
    "hidden_size": "n_embd",
    "num_attention_heads": "n_head",
    "intermediate_size": "n_inner",
    "max_position_embeddings": "n_positions",
}

#: Allowed range of each config.json shape field: far beyond any released decoder, so only a
#: broken or hostile file is refused (0 layers, a negative width, a 10^12-token vocabulary).
SHAPE_RANGES: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 1 << 17),
    "num_attention_heads": (1, 1 << 12),
    "num_key_value_heads": (1, 1 << 12),
    "intermediate_size": (1, 1 << 20),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 24),
    "head_dim": (1, 1 << 12),
    "hidden_size_per_layer_input": (1, 1 << 17),
    "vocab_size_per_layer_input": (1, 1 << 24),
}

_TRUE = ("1", "true", "yes", "on")

#: Names of the torch dtypes a checkpoint may be stored in (torch.float32, …).
DTYPES = ("float32", "float16", "bfloat16")


class HubError(ValueError):
    """A hub model/dataset that cannot be used; the message is one line saying what to do."""


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``HF_DATASETS_OFFLINE`` for datasets) forbids downloads."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def datasets_offline() -> bool:
    """True when either ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set."""
    return hub_offline() or os.environ.get("HF_DATASETS_OFFLINE", "").strip().lower() in _TRUE


def download_command(repo: str, revision: str | None, repo_type: str = "model") -> str:
    """The ``hf`` CLI command that puts ``repo@revision`` into the local cache (shell-quoted)."""
    args = ["hf", "download", *([] if repo_type == "model" else ["--repo-type", repo_type]), repo]
    return shlex.join([*args, *(["--revision", revision] if revision else [])])


def cached_snapshot(repo: str, revision: str | None, repo_type: str = "model") -> Path | None:
    """The snapshot folder of ``repo@revision`` in the local HF cache, or None if it is not there.

    Never touches the network. ``revision`` may be a branch/tag (resolved through
    ``refs/<revision>``) or a commit hash; None means ``main``.
    """
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo, repo_type=repo_type, revision=revision, local_files_only=True, cache_dir=hub_cache_dir()
        )
    except Exception:  # LocalEntryNotFoundError, or a malformed cache entry
        return None
    return Path(folder)


def hub_config_json(repo: str, revision: str) -> tuple[dict, Path]:
    """(parsed config.json, its path) of a hub model at ``revision``: cache first, then (online) download.

    Raises :class:`HubError` with the ``hf download`` command when it is unavailable.
    """
    from huggingface_hub import hf_hub_download

    snap = cached_snapshot(repo, revision)
    path = snap / "config.json" if snap is not None else None
    if path is None or not path.is_file():
        if hub_offline():
            raise HubError(
                f"hub model {repo!r} at revision {revision!r} is not in the Hugging Face cache "
                f"(HF_HUB_OFFLINE=1, cache {hub_cache_dir()}); fetch it on a machine with internet: "
                f"`{download_command(repo, revision)}` (`resdyn fetch CONFIG` prints every download the config needs)"
            )
        try:
            path = Path(hf_hub_download(repo, "config.json", revision=revision, cache_dir=hub_cache_dir()))
        except Exception as err:
            raise HubError(
                f"hub model {repo!r} at revision {revision!r}: config.json is neither in the Hugging Face "
                f"cache ({hub_cache_dir()}) nor downloadable ({type(err).__name__}); fetch the model with "
                f"`{download_command(repo, revision)}`"
            ) from err
    return read_config_json(path), path


def hub_cache_dir() -> str:
    """The hub cache folder, read from the environment now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return str(constants.HF_HUB_CACHE)


def read_config_json(path: str | Path) -> dict:
    """A model's config.json as a dict; HubError naming the file when it is not valid JSON."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise HubError(f"{path}: not a readable config.json ({err})") from err
    if not isinstance(cfg, dict):
        raise HubError(f"{path}: config.json is not a JSON object")
    return cfg


def checkpoint_dtype(cfg: dict) -> str:
    """The dtype a checkpoint is stored in: ``torch_dtype`` (``dtype`` in newer transformers) of
    its config.json, or of the ``text_config`` of a multimodal wrapper; float32 (what
    ``from_pretrained`` loads without one) when it names none of float32/float16/bfloat16."""

    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    for source in (cfg, text):
        for field in ("torch_dtype", "dtype"):
            if source.get(field) in DTYPES:
                return source[field]
    return "float32"


def family_of(
    model_type: str | None,
    outer_type: str | None = None,
    settings: dict | None = None,
    remote_code: bool = False,
    generic: bool = False,
) -> str:
    """The resdyn family of an HF ``model_type`` (see :data:`resdyn.lm.families.FAMILIES`).

    Raises HubError naming the type, why it is refused (MoE, encoder-decoder, remote code, a
    refused setting in ``settings``, the text config) with the nearest supported family, and
    the supported families (:func:`resdyn.lm.families.refusal`). ``generic`` (config
    ``family: generic``): any type not refused by name gives "generic".
    """
    from resdyn.lm import families

    reason = families.refusal(model_type, outer_type, settings or {}, remote_code, generic)
    if reason:
        raise HubError(reason)
    return "generic" if generic else families.family_of_type(model_type, outer_type)


def check_shape(key: str, value: int, allowed: tuple[int, int], source: str) -> None:
    """Raise :class:`HubError` (one line: the file, the key, the value, the range) unless
    ``allowed[0] <= value <= allowed[1]``."""
    low, high = allowed
    if not low <= value <= high:
        raise HubError(f"{source}: key '{key}' = {value}; allowed {low} to {high}")


def architecture(cfg: dict, generic: bool = False, source: str = "config.json") -> dict:
    """Family and shape keys (``SHAPE_FIELDS``) of a parsed config.json (``source``: its path, for
    messages). Every shape value must lie in :data:`SHAPE_RANGES` (else :class:`HubError`).

    Multimodal wrappers keep the decoder in ``text_config``. ``n_kv_heads`` defaults to
    ``n_heads`` (multi-head attention) when the file has no ``num_key_value_heads``; a field
    that is absent or not a single integer (e.g. per-layer ``intermediate_size`` lists) is left out.
    GPT-NeoX also gets ``parallel_residual`` (``use_parallel_residual``, default true).
    """
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    out: dict = {"model_type": text.get("model_type") or cfg.get("model_type")}
    out["family"] = family_of(text.get("model_type"), cfg.get("model_type"), text, bool(cfg.get("auto_map")), generic)
    for key, field in SHAPE_FIELDS.items():
        name = field
        value = text.get(field)
        if value is None and field in _GPT2_FIELDS:  # GPT-2's config.json keeps its own names
            name, value = _GPT2_FIELDS[field], text.get(_GPT2_FIELDS[field])
        if isinstance(value, int) and not isinstance(value, bool):
            check_shape(name, value, SHAPE_RANGES[field], source)
            out[key] = value
    if isinstance(text.get("head_dim"), int) and not isinstance(text["head_dim"], bool):
        check_shape("head_dim", text["head_dim"], SHAPE_RANGES["head_dim"], source)
    if out.get("n_kv_heads", 0) > out.get("n_heads", 1 << 30):
        raise HubError(
            f"{source}: key 'num_key_value_heads' = {out['n_kv_heads']} exceeds num_attention_heads = "
            f"{out['n_heads']}; allowed 1 to {out['n_heads']}"
        )
    if out["family"] == "gpt2" and "d_ff" not in out and "d_model" in out:
        out["d_ff"] = 4 * out["d_model"]  # n_inner: null means 4·n_embd
    if "n_kv_heads" not in out and "n_heads" in out:
        out["n_kv_heads"] = out["n_heads"]
    if out["family"] == "gpt_neox":  # transformers' GPTNeoXConfig default: parallel (Pythia)
        out["parallel_residual"] = bool(text.get("use_parallel_residual", True))
    return out


# --- checkpoint order ----------------------------------------------------------------------------

_STEP = re.compile(r"(?:^|[-_/])step(\d+)(?=$|[-_/])")
_STAGE = re.compile(r"(?:^|[-_/])stage(\d+)(?=$|[-_/])")
FINAL_REVISIONS = ("main",)


def revision_step(revision: str) -> tuple[int, int] | None:
    """Training position of a revision name: (stage, step), or None when it names no step.

    OLMo: ``stage1-step471000-tokens988B`` → (1, 471000); Pythia: ``step143000`` → (0, 143000).
    ``main`` (the final model) and names without ``stepN`` give None.
    """
    step = _STEP.search(revision)
    if step is None:
        return None
    stage = _STAGE.search(revision)
    return (int(stage[1]) if stage else 0, int(step[1]))


def order_revisions(revisions: list[str], steps: dict[str, int] | None = None) -> list[str]:
    """Revisions sorted from the earliest training step to the final model.

    The position of a revision is ``steps[revision]`` when an explicit ``steps`` map is given
    (it must name every revision), otherwise the (stage, step) parsed by :func:`revision_step`,
    with ``main`` after every parsed step. Raises ValueError naming the revisions when the order
    cannot be established: a name without a step and not in the map, or two revisions at the
    same position.
    """
    keys: dict[str, tuple] = {}
    if steps:
        missing = [r for r in revisions if r not in steps]
        if missing:
            raise ValueError(f"revisions {missing} are not in the steps map (it names {sorted(steps)})")
        keys = {r: (0, int(steps[r])) for r in revisions}
    else:
        unknown = []
        for r in revisions:
            parsed = revision_step(r)
            if parsed is not None:
                keys[r] = (0, *parsed)
            elif r in FINAL_REVISIONS:
                keys[r] = (1,)
            else:
                unknown.append(r)
        if unknown:
            raise ValueError(
                f"cannot tell the training step of revisions {unknown} (names with 'stepN', e.g. "
                "'stage1-step1000-tokens2B' or 'step1000', or 'main' for the final model are understood)"
            )
    by_key: dict[tuple, list[str]] = {}
    for r, k in keys.items():
        by_key.setdefault(k, []).append(r)
    ties = [rs for rs in by_key.values() if len(rs) > 1]
    if ties:
        raise ValueError(f"revisions {ties[0]} are at the same training step; their order cannot be established")
    return sorted(revisions, key=lambda r: keys[r])
