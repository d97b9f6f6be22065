"""Import tuned lenses published in EleutherAI tuned-lens's format into a :class:`resdyn.study_b.lens.Lens`.

Format (tuned-lens 0.2.0 ``TunedLens.save``, the one :meth:`resdyn.study_b.lens.Lens.export_tuned_lens`
writes): a folder with ``config.json`` (``d_model``, ``num_hidden_layers``, ``bias``,
``unembed_hash``, ``base_model_name_or_path`` …) and ``params.pt``, the state dict of a
ModuleList of ``nn.Linear(d, d)``: keys ``"{i}.weight"`` (d, d) and ``"{i}.bias"`` (d,) for
i = 0..n−1 (a ``layer_translators.`` prefix, as in whole-lens state dicts, is accepted).
Translator i maps the stream entering layer i by ``h + W_i h + b_i`` — resdyn's ``T_L`` with
W_L = W_i, b_L = b_i, so the import is exact (no refitting).

Where the lens comes from: a local folder, or a hub repository (``repo``, ``repo_type`` —
published lenses live in the Space ``AlignmentResearch/tuned-lens`` under
``lens/<model name>/`` — and ``revision``), read from the Hugging Face cache (downloaded only
when ``HF_HUB_OFFLINE`` is unset and the network answers).

Checks before anything is imported: the files exist and parse; the translators cover layers
0..n−1 with (d, d) weights and (d,) biases; n and d equal the model's layer count and width;
the ``unembed_hash`` recorded by tuned-lens equals this model's
(:func:`resdyn.study_b.lens.tuned_lens_unembed_hash`), i.e. the lens was fitted through this model's
unembedding (tuned-lens itself only warns). Each failure is one ValueError naming the file, the
value and what was expected.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resdyn.artifacts import LensFolder
from resdyn.study_b import lens as lens_mod

CONFIG_FILE, PARAMS_FILE = LensFolder.TUNED_LENS_CONFIG, LensFolder.TUNED_LENS_PARAMS
REPO_TYPES = ("model", "space", "dataset")
_KEY = re.compile(r"^(?:layer_translators\.)?(\d+)\.(weight|bias)$")


def fetch_tuned_lens(path: str, repo: str | None = None, revision: str | None = None, repo_type: str = "space") -> Path:
    """The local folder holding ``config.json`` and ``params.pt`` of a tuned lens.

    Without ``repo``, ``path`` is that folder. With ``repo``, ``path`` is the folder inside the
    hub repository (e.g. ``lens/pythia-160m-deduped`` in the Space
    ``AlignmentResearch/tuned-lens``), read from the HF cache (downloading only if allowed).
    """
    if repo is None:
        folder = Path(path)
        missing = [name for name in (CONFIG_FILE, PARAMS_FILE) if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"tuned lens folder {folder}: no {', '.join(missing)} (expected config.json + params.pt)"
            )
        return folder
    if repo_type not in REPO_TYPES:
        raise ValueError(f"lens repo_type={repo_type!r}: allowed are {REPO_TYPES}")
    from huggingface_hub import hf_hub_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    files = []
    for name in (CONFIG_FILE, PARAMS_FILE):
        filename = f"{path.strip('/')}/{name}" if path.strip("/") else name
        kwargs = dict(repo_id=repo, filename=filename, revision=revision, repo_type=repo_type)
        try:
            files.append(Path(hf_hub_download(**kwargs, local_files_only=offline)))
        except Exception:  # network errors come in many types: fall back to the cache
            try:
                files.append(Path(hf_hub_download(**kwargs, local_files_only=True)))
            except Exception as err:
                raise FileNotFoundError(
                    f"tuned lens {repo}:{filename} ({repo_type}, revision {revision or 'main'}) is not in the local "
                    f"Hugging Face cache and cannot be downloaded ({type(err).__name__}); fetch it with "
                    f"`huggingface-cli download {repo} {filename} --repo-type {repo_type}` or use a local folder"
                ) from None
    return files[0].parent


def read_tuned_lens(folder: str | Path) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """(config, weight (n, d, d), bias (n, d)) float32 from a tuned-lens folder; biases are 0
    when the lens has none (``bias: false``)."""
    folder = Path(folder)
    cfg_path, params_path = folder / CONFIG_FILE, folder / PARAMS_FILE
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{cfg_path}: not a readable tuned-lens config ({err})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    try:
        state = torch.load(params_path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle, zip and OS errors alike
        raise ValueError(f"{params_path}: not a readable tuned-lens checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{params_path}: expected a state dict, got {type(state).__name__}")
    found: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        m = _KEY.match(str(key))
        if m is None or not isinstance(value, torch.Tensor):
            raise ValueError(f"{params_path}: unexpected entry {key!r}; allowed are '{{i}}.weight' and '{{i}}.bias'")
        found.setdefault(int(m.group(1)), {})[m.group(2)] = value
    n = len(found)
    if sorted(found) != list(range(n)) or n == 0:
        raise ValueError(f"{params_path}: translators for layers {sorted(found)}; expected 0..n-1 without gaps")
    declared = cfg.get("num_hidden_layers")
    if declared is not None and declared != n:
        raise ValueError(f"{cfg_path}: num_hidden_layers={declared} but {params_path.name} holds {n} translators")
    if any("weight" not in found[i] for i in range(n)):
        raise ValueError(
            f"{params_path}: a translator has no weight (layers {[i for i in range(n) if 'weight' not in found[i]]})"
        )
    d = found[0]["weight"].shape[-1]
    weight = torch.zeros(n, d, d)
    bias = torch.zeros(n, d)
    for i in range(n):
        w, b = found[i]["weight"], found[i].get("bias")
        if tuple(w.shape) != (d, d) or (b is not None and tuple(b.shape) != (d,)):
            raise ValueError(
                f"{params_path}: layer {i} has weight {tuple(w.shape)}, bias {None if b is None else tuple(b.shape)}; "
                f"expected ({d}, {d}) and ({d},)"
            )
        weight[i] = w.float()
        if b is not None:
            bias[i] = b.float()
    if cfg.get("d_model") is not None and cfg["d_model"] != d:
        raise ValueError(f"{cfg_path}: d_model={cfg['d_model']} but the translators are {d}×{d}")
    return cfg, weight, bias


def import_tuned_lens(
    folder: str | Path,
    model: nn.Module,
    *,
    source: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> lens_mod.Lens:
    """A :class:`resdyn.study_b.lens.Lens` bound to ``model`` from a tuned-lens folder.

    Raises ValueError when the lens's layer count or width differ from the model's, or when its
    recorded ``unembed_hash`` differs from the model's (it was fitted through another
    unembedding). ``source`` (where it came from) is kept as the lens's options, ``meta``
    (model id, revision, hash) as its metadata; ``stop_reason`` is "imported".
    """
    folder = Path(folder)
    cfg, weight, bias = read_tuned_lens(folder)
    info = lens_mod.model_info(model)
    n, d = weight.shape[0], weight.shape[-1]
    if (n, d) != (info["n_layers"], info["d_model"]):
        raise ValueError(
            f"tuned lens {folder}: {n} translators of width {d}, but the model has n_layers={info['n_layers']}, "
            f"d_model={info['d_model']} (is it the lens of another model? base_model_name_or_path="
            f"{cfg.get('base_model_name_or_path')!r})"
        )
    recorded, ours = cfg.get("unembed_hash"), lens_mod.tuned_lens_unembed_hash(model)
    if recorded and recorded != ours:
        raise ValueError(
            f"tuned lens {folder / CONFIG_FILE}: unembed_hash {str(recorded)[:16]}… does not match this model's "
            f"unembedding ({ours[:16]}…): the lens was fitted through another unembedding "
            f"(base_model_name_or_path={cfg.get('base_model_name_or_path')!r}, "
            f"base_model_revision={cfg.get('base_model_revision')!r})"
        )
    options = {
        "source": "tuned_lens",
        **(source or {}),
        "unembed_hash_checked": bool(recorded),
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
        "base_model_revision": cfg.get("base_model_revision"),
    }
    return lens_mod.Lens(model, weight, bias, options=options, meta={**(meta or {}), "stop_reason": "imported"})
