"""The :class:`Lens` object: trained (or loaded) translators bound to a model, their persistence
(``resdyn.lens/1``, :class:`resdyn.artifacts.LensFolder`) and the tuned-lens export."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from resdyn.artifacts import LensFolder
from resdyn.study_b.lens.readout import (
    apply_translator,
    check_layer,
    lens_readout,
    model_device,
    model_info,
    softcap,
    tuned_lens_unembed_hash,
    unembed_hash,
)

FORMAT = LensFolder.FORMAT


CURVE_COLUMNS = LensFolder.CURVE_COLUMNS


CONVERGENCE_COLUMNS = ["layer", "converged", "converged_step", "steps", "final_heldout_kl", "rel_change"]


class Lens:
    """Trained (or loaded) translators bound to the model whose readout they use.

    ``weight (n, d, d)``, ``bias (n, d)``: float32 W_L, b_L on the model's device.
    ``curves``: DataFrame(step, tokens_seen, layer, split ∈ {train, heldout}, kl); train KL is that of the
    step's own training batch (before its update), held-out KL that of the held-out set after it. ``convergence``:
    DataFrame(layer, converged,
    converged_step, steps, final_heldout_kl, rel_change) — see :mod:`resdyn.study_b.lens`.
    """

    def __init__(
        self,
        model: nn.Module,
        weight: torch.Tensor,
        bias: torch.Tensor,
        *,
        options: dict[str, Any] | None = None,
        curves: pd.DataFrame | None = None,
        convergence: pd.DataFrame | None = None,
        meta: dict[str, Any] | None = None,
    ):
        info = model_info(model)
        n, d = info["n_layers"], info["d_model"]
        if tuple(weight.shape) != (n, d, d) or tuple(bias.shape) != (n, d):
            raise ValueError(
                f"translator shapes {tuple(weight.shape)}, {tuple(bias.shape)} do not fit the model: expected "
                f"({n}, {d}, {d}), ({n}, {d})"
            )
        device = model_device(model)
        self.model = model
        self.weight = weight.detach().to(device, torch.float32)
        self.bias = bias.detach().to(device, torch.float32)
        self.n_layers, self.d_model, self.vocab_size = n, d, info["vocab_size"]
        self.options = dict(options or {})
        self.curves = curves if curves is not None else pd.DataFrame(columns=CURVE_COLUMNS)
        self.convergence = convergence if convergence is not None else pd.DataFrame(columns=CONVERGENCE_COLUMNS)
        self.meta = dict(meta or {})

    # --- the translators -------------------------------------------------------------------

    def translator_params(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        check_layer(layer, self.n_layers, allow_reference=True)
        if layer == self.n_layers:  # reference: the model's own output, identity translator
            return None, None
        return self.weight[layer], self.bias[layer]

    def translator_matrix(self, layer: int) -> np.ndarray:
        """``A_L = I + W_L`` as float64 (d, d); the identity at the reference index n."""
        w, _ = self.translator_params(layer)
        eye = np.eye(self.d_model)
        return eye if w is None else eye + w.detach().cpu().double().numpy()

    def translator_bias(self, layer: int) -> np.ndarray:
        """``b_L`` as float64 (d,); zeros at the reference index n."""
        _, b = self.translator_params(layer)
        return np.zeros(self.d_model) if b is None else b.detach().cpu().double().numpy()

    def transform(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """``T_L(h) = h + W_L h + b_L`` of ``hidden (..., d)``, the stream entering layer L."""
        return apply_translator(hidden, *self.translator_params(layer))

    def logits(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """Tuned-lens logits (..., V): the translator, then the model's own readout."""
        return lens_readout(self.model, hidden, *self.translator_params(layer))

    # --- persistence -----------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The content of config.json."""
        return {
            "format": FORMAT,
            "model_id": self.meta.get("model_id"),
            "model_revision": self.meta.get("model_revision"),
            "model_hash": self.meta.get("model_hash"),
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "vocab_size": self.vocab_size,
            "unembed_hash": unembed_hash(self.model),
            "softcap": softcap(self.model),
            "translator": "T_L(h) = h + W_L h + b_L for L in 0..n_layers-1; index n_layers is the identity",
            "training": self.options,
            "steps_trained": self.meta.get("steps_trained"),
            "stop_reason": self.meta.get("stop_reason"),
            # NaN (too few evals for the convergence window) as JSON null; load reads it back as NaN
            "convergence": self.convergence.astype(object)
            .where(self.convergence.notna(), None)
            .to_dict(orient="records"),
        }

    def save(self, directory: str | Path) -> Path:
        """Write the lens folder (:class:`resdyn.artifacts.LensFolder`): translators.safetensors,
        curves.tsv and (last) config.json, each atomically."""
        return LensFolder.write(
            directory,
            self.weight.detach().cpu().contiguous().numpy(),
            self.bias.detach().cpu().contiguous().numpy(),
            self.curves,
            self.config(),
        )

    @classmethod
    def load(cls, directory: str | Path, model: nn.Module) -> Lens:
        """Load a saved lens (validated by :meth:`resdyn.artifacts.LensFolder.read`) and bind it to ``model``.

        Raises ValueError when the model's readout hash (:func:`unembed_hash`), layer count or
        width differ from those the lens was trained with.
        """
        cfg_path = Path(directory) / LensFolder.CONFIG_FILE
        cfg = LensFolder.read_config(directory)  # first: a lens of another model fails before its translators load
        info = model_info(model)
        for key in ("n_layers", "d_model", "vocab_size"):
            if cfg[key] != info[key]:
                raise ValueError(f"{cfg_path}: lens has {key}={cfg[key]} but the model has {key}={info[key]}")
        got = unembed_hash(model)
        if cfg["unembed_hash"] != got:
            raise ValueError(
                f"{cfg_path}: unembed_hash mismatch — the lens was trained through a readout with hash "
                f"{cfg['unembed_hash'][:16]}…, this model's readout (head, final norm, softcap) hashes to "
                f"{got[:16]}…; load it with the model it was trained on (model_id={cfg.get('model_id')!r})"
            )
        files = LensFolder.read(directory)
        convergence = pd.DataFrame(cfg.get("convergence") or [], columns=CONVERGENCE_COLUMNS)
        # null (NaN when saved: no held-out batches, or fewer evals than the window) back to NaN
        convergence[["final_heldout_kl", "rel_change"]] = convergence[["final_heldout_kl", "rel_change"]].astype(float)
        meta = {k: cfg.get(k) for k in ("model_id", "model_revision", "model_hash", "steps_trained", "stop_reason")}
        return cls(
            model,
            torch.from_numpy(files.weight.copy()),
            torch.from_numpy(files.bias.copy()),
            options=cfg.get("training"),
            curves=files.curves,
            convergence=convergence,
            meta=meta,
        )

    def export_tuned_lens(self, directory: str | Path) -> Path:
        """Write the lens in EleutherAI tuned-lens's format: ``params.pt`` + ``config.json``.

        Matches tuned-lens 0.2.0 (PyPI) and its GitHub head (commit b26b0c3, same format):
        ``TunedLens.save`` stores ``layer_translators.state_dict()`` — a ModuleList of
        ``nn.Linear(d, d)`` — so the keys are ``"{i}.weight"`` (d, d) and ``"{i}.bias"`` (d,)
        for i = 0..n−1 (no ``layer_translators.`` prefix; ``from_unembed_and_pretrained`` loads
        them with ``layer_translators.load_state_dict``), and ``transform_hidden`` computes
        ``h + Linear_i(h) = h + W_i h + b_i`` — our translator exactly. config.json holds the
        ``TunedLensConfig`` fields only (unknown keys are dropped with a warning there).

        Loading: ``TunedLens.from_model_and_pretrained(model, <dir>)`` works for the families
        tuned-lens knows (Llama, GPT-NeoX, …). For any family (OLMo 2, Gemma, …) and to keep
        Gemma's final softcap, which tuned-lens's own ``Unembed`` omits, use
        ``TunedLens.from_unembed_and_pretrained(TunedLensReadout(model), <dir>)``.
        """
        state: OrderedDict[str, torch.Tensor] = OrderedDict()
        for i in range(self.n_layers):
            state[f"{i}.weight"] = self.weight[i].detach().cpu().clone()
            state[f"{i}.bias"] = self.bias[i].detach().cpu().clone()
        config = {
            "base_model_name_or_path": self.meta.get("model_id")
            or getattr(self.model.config, "name_or_path", "")
            or "",
            "d_model": self.d_model,
            "num_hidden_layers": self.n_layers,
            "bias": True,
            "base_model_revision": self.meta.get("model_revision"),
            "unembed_hash": tuned_lens_unembed_hash(self.model),
            "lens_type": "linear_tuned_lens",
        }
        return LensFolder.write_tuned_lens(directory, state, config)
