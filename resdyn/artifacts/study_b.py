"""Study B's artifacts: the lens (metrics table, translator folder, resumable training state), the
RSS profile, resolution, phase cuts, layer geometry, phase metrics and the depth-scaling tables;
and the column lists of the tables the concept modules build (defined once, by the classes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from resdyn import io
from resdyn.artifacts.base import CKPT_DIR, Artifact, ArtifactError, TsvArtifact, kinds
from resdyn.io import PathLike

__all__ = [
    "LensMetrics",
    "LensFiles",
    "LensFolder",
    "LensCheckpoint",
    "RssProfile",
    "ResolutionTable",
    "PhaseCuts",
    "LayerGeometry",
    "PhaseMetrics",
    "ScalingWidths",
    "ScalingFits",
    "RSS_COLUMNS",
    "LENS_METRIC_COLUMNS",
]


class LensMetrics(TsvArtifact):
    """``results/{model}/{ckpt}/lens_metrics.tsv``: readout quality of the tuned and the logit lens.

    One row per (lens, layer) (:func:`resdyn.study_b.lens.lens_metrics`): ``lens`` str (tuned | logit),
    ``layer`` int, ``kl``, ``ce``, ``hit1``, ``hit5`` float, ``n_tokens`` int, ``converged``
    bool, ``steps``, ``converged_step`` int, ``final_heldout_kl`` float, ``reason`` str (why a
    row's numbers are empty, e.g. the logit lens has no training record).
    """

    relpath = CKPT_DIR + "lens_metrics.tsv"
    columns = kinds(
        "lens:str layer:int kl:float ce:float hit1:float hit5:float n_tokens:int converged:bool "
        "steps:int converged_step:int final_heldout_kl:float reason:str"
    )
    units = {
        "kl": "nats",
        "ce": "nats",
        "final_heldout_kl": "nats",
        "hit1": "fraction",
        "hit5": "fraction",
        "n_tokens": "tokens",
        "steps": "optimizer steps",
        "converged_step": "optimizer steps",
    }


#: pandas ≥ 3 parses floats round-trip exactly by default (and deprecates the option); 2.x needs it.
_ROUND_TRIP: dict[str, str] = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


@dataclass(frozen=True)
class LensFiles:
    """What :meth:`LensFolder.read` returns: ``weight`` (n, d, d) float32 = W_L stacked, ``bias``
    (n, d) float32 = b_L, ``curves`` (step, tokens_seen, layer, split, kl) and ``config`` (config.json)."""

    weight: np.ndarray
    bias: np.ndarray
    curves: pd.DataFrame
    config: dict[str, Any]


class LensFolder(Artifact):
    """``results/{model}/{ckpt}/lens/``: a checkpoint's tuned-lens translators (format ``resdyn.lens/1``).

    Files, each written atomically by :meth:`write`, config.json last (its presence marks a
    complete lens):

    * ``translators.safetensors``: ``weight`` (n, d, d) float32 = W_L stacked, ``bias`` (n, d)
      float32 = b_L (translator T_L(h) = h + W_L h + b_L); metadata ``format``;
    * ``curves.tsv``: ``step`` int, ``tokens_seen`` int (training tokens served before the eval),
      ``layer`` int, ``split`` (train | heldout), ``kl`` float64 written with 17 significant digits
      (read back exactly);
    * ``config.json``: ``format`` = "resdyn.lens/1", ``model_id``/``model_revision``/``model_hash``,
      ``d_model``, ``n_layers``, ``vocab_size``, ``unembed_hash``, ``softcap``, ``translator``,
      ``training`` (options), ``steps_trained``, ``stop_reason``, ``convergence`` (records of
      layer, converged, converged_step, steps, final_heldout_kl, rel_change; null for a number
      that is NaN: a lens trained without held-out batches), built by
      :meth:`resdyn.study_b.lens.Lens.config`;
    * ``tuned_lens/``: the same translators in EleutherAI tuned-lens's format
      (:meth:`write_tuned_lens`: ``params.pt`` + ``config.json``; read by :mod:`resdyn.study_b.lens_import`).

    :meth:`read` validates the folder on its own (format, shapes agree with config.json, curve
    columns); whether it fits a model (readout hash, sizes) is :meth:`resdyn.study_b.lens.Lens.load`'s
    check. :meth:`read_translator_matrices` reads the translators alone, without torch.
    """

    relpath = CKPT_DIR + "lens"
    FORMAT = "resdyn.lens/1"
    TRANSLATORS_FILE = "translators.safetensors"
    CONFIG_FILE = "config.json"
    CURVES_FILE = "curves.tsv"
    TUNED_LENS_DIR = "tuned_lens"
    #: The two files of tuned-lens's format (its ``TunedLens.save``).
    TUNED_LENS_CONFIG, TUNED_LENS_PARAMS = "config.json", "params.pt"
    CURVE_COLUMNS: ClassVar[list[str]] = ["step", "tokens_seen", "layer", "split", "kl"]
    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ("format", "d_model", "n_layers", "vocab_size", "unembed_hash")

    @classmethod
    def write(
        cls, directory: PathLike, weight: np.ndarray, bias: np.ndarray, curves: pd.DataFrame, config: Mapping[str, Any]
    ) -> Path:
        """Write the three files into ``directory`` (created if needed); returns the folder."""
        from safetensors.numpy import save_file

        directory = Path(directory)
        weight, bias = np.ascontiguousarray(weight, np.float32), np.ascontiguousarray(bias, np.float32)
        if weight.ndim != 3 or weight.shape[1] != weight.shape[2] or bias.shape != weight.shape[:2]:
            raise ArtifactError(
                f"{directory}: refusing to write translators of shapes {weight.shape}, {bias.shape}; "
                "expected (n, d, d) and (n, d)"
            )
        missing = [c for c in cls.CURVE_COLUMNS if c not in curves.columns]
        if missing or config.get("format") != cls.FORMAT:
            raise ArtifactError(
                f"{directory}: refusing to write a lens with curve columns {list(curves.columns)} "
                f"and format {config.get('format')!r} (need {cls.CURVE_COLUMNS}, {cls.FORMAT!r})"
            )
        directory.mkdir(parents=True, exist_ok=True)
        with io.atomic_path(directory / cls.TRANSLATORS_FILE) as tmp:
            save_file({"weight": weight, "bias": bias}, str(tmp), metadata={"format": cls.FORMAT})
        with io.atomic_path(directory / cls.CURVES_FILE) as tmp:
            # 17 significant digits: float64 round-trips exactly (read back with round_trip).
            curves.to_csv(tmp, sep="\t", index=False, float_format="%.17g")
        # a lens trained without held-out batches has no held-out KL: null in its convergence records
        io.write_json(dict(config), directory / cls.CONFIG_FILE, nan_as_null=("convergence",))
        return directory

    @classmethod
    def read_config(cls, directory: PathLike) -> dict[str, Any]:
        """config.json, checked: a JSON object of this format with the keys of :attr:`CONFIG_KEYS`."""
        path = Path(directory) / cls.CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no lens config (expected a folder written by Lens.save)")
        cfg = io.read_json(path)
        if not isinstance(cfg, dict) or cfg.get("format") != cls.FORMAT:
            got = cfg.get("format") if isinstance(cfg, dict) else type(cfg).__name__
            raise ValueError(f"{path}: format={got!r}; allowed: {cls.FORMAT!r}")
        missing = [k for k in cls.CONFIG_KEYS if k not in cfg]
        if missing:
            raise ArtifactError(f"{path}: lacks key(s) {missing} (a lens config has {list(cls.CONFIG_KEYS)})")
        return cfg

    @classmethod
    def _read_translators(cls, directory: PathLike) -> tuple[np.ndarray, np.ndarray]:
        from safetensors.numpy import load_file  # only the translator reader needs it

        path = Path(directory) / cls.TRANSLATORS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no translators (expected a folder written by Lens.save)")
        try:
            tensors = load_file(str(path))
        except Exception as err:  # safetensors raises its own error types for corrupt headers
            raise ValueError(f"{path}: not a readable safetensors file ({err})") from err
        weight, bias = tensors.get("weight"), tensors.get("bias")
        if weight is None or weight.ndim != 3 or weight.shape[1] != weight.shape[2] or 0 in weight.shape:
            shape = None if weight is None else weight.shape
            raise ValueError(f"{path}: 'weight' has shape {shape}; expected (n, d, d) translators")
        if bias is None or bias.shape != weight.shape[:2]:
            raise ValueError(
                f"{path}: 'bias' has shape {None if bias is None else bias.shape}; expected {weight.shape[:2]} (n, d)"
            )
        return weight, bias

    @classmethod
    def read(cls, directory: PathLike) -> LensFiles:
        """The validated folder; ValueError/ArtifactError naming the file and the fault."""
        directory = Path(directory)
        cfg = cls.read_config(directory)
        weight, bias = cls._read_translators(directory)
        if weight.shape[:2] != (cfg["n_layers"], cfg["d_model"]):
            raise ArtifactError(
                f"{directory / cls.TRANSLATORS_FILE}: translators of shape {weight.shape}, but "
                f"{cls.CONFIG_FILE} says n_layers={cfg['n_layers']}, d_model={cfg['d_model']}"
            )
        bad = [name for name, a in (("weight", weight), ("bias", bias)) if not np.isfinite(a).all()]
        if bad:
            raise ArtifactError(f"{directory / cls.TRANSLATORS_FILE}: {bad[0]} holds NaN/Inf")
        return LensFiles(weight=weight, bias=bias, curves=cls.read_curves(directory), config=cfg)

    @classmethod
    def read_curves(cls, directory: PathLike) -> pd.DataFrame:
        """``curves.tsv`` alone (the training log: KL per eval, layer and split against steps and
        tokens seen), read exactly, its columns checked; the lens figure reads only this."""
        path = Path(directory) / cls.CURVES_FILE
        try:
            curves = pd.read_csv(path, sep="\t", **_ROUND_TRIP)
        except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError) as err:
            raise ValueError(f"{path}: not a readable curves table ({err})") from err
        if list(curves.columns) != cls.CURVE_COLUMNS:
            raise ArtifactError(f"{path}: columns {list(curves.columns)}, expected {cls.CURVE_COLUMNS}")
        return curves

    @classmethod
    def read_translator_matrices(cls, directory: PathLike) -> list[np.ndarray]:
        """``[A_0, …, A_{n−1}]``, ``A_L = I + W_L`` float64 (d, d), from the translators file alone.

        Read with ``safetensors.numpy`` (no torch, no model): the float32 values widen exactly to
        float64, so the matrices are bit-equal to :meth:`resdyn.study_b.lens.Lens.translator_matrix`. The
        identity reference at index n is not included: it carries no readout subspace of its own.
        """
        weight, _ = cls._read_translators(directory)
        weight = weight.astype(np.float64)
        eye = np.eye(weight.shape[-1])
        return [eye + w for w in weight]

    @classmethod
    def write_tuned_lens(cls, directory: PathLike, state: Mapping[str, Any], config: Mapping[str, Any]) -> Path:
        """Write tuned-lens's ``params.pt`` (``state``, {"{i}.weight"/"{i}.bias": torch tensor},
        with ``torch.save``) and ``config.json`` into ``directory``, each atomically."""
        import torch  # only this writer needs it; the lens job has it loaded already

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # through a file object: torch then names the archive "archive", not after the temporary
        # file, so the bytes do not depend on the random temporary name
        with io.atomic_path(directory / cls.TUNED_LENS_PARAMS) as tmp, open(tmp, "wb") as f:
            torch.save(state, f)
        io.write_json(dict(config), directory / cls.TUNED_LENS_CONFIG)
        return directory


class LensCheckpoint(Artifact):
    """``.lens.partial.pt`` beside the lens folder: the resumable state of a lens training.

    A ``torch.save`` dict (loaded with ``weights_only=True``): ``format`` =
    "resdyn.lens-checkpoint/2", ``key`` (the fingerprint of everything the trajectory depends on,
    :func:`resdyn.study_b.lens.trainer._fingerprint`), and the training loop's state (translators, optimizer state,
    step, training tokens served, curve rows, held-out history, convergence counters, stream position
    and ``stream_source``, the training stream it belongs to;
    :func:`resdyn.study_b.lens.trainer._fit`). :meth:`load` returns None for a missing file and, with a warning
    naming the file and the fault, for one of another format or key or that does not load.
    """

    FORMAT = "resdyn.lens-checkpoint/2"

    @staticmethod
    def path(out: PathLike) -> Path:
        """The state file of the job whose declared output is ``out``: ``.{name}.partial.pt`` beside it
        (Snakemake clears the outputs of an incomplete job before rerunning it)."""
        out = Path(out)
        return out.with_name(f".{out.name}.partial.pt")

    @classmethod
    def save(cls, path: PathLike, key: str, state: Mapping[str, Any]) -> None:
        """Write ``state`` with ``format`` and ``key`` atomically."""
        import torch

        with io.atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: see write_tuned_lens
            torch.save({"format": cls.FORMAT, "key": key, **state}, f)

    @classmethod
    def load(cls, path: PathLike, key: str, stacklevel: int = 1) -> dict[str, Any] | None:
        """The saved state if ``path`` holds one of this format and ``key``; else None (see class).

        ``stacklevel``: the warning points at this many frames above the caller (1: the caller).
        """
        import logging
        import warnings

        import torch

        path = Path(path)
        if not path.exists():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != cls.FORMAT:
                raise ValueError(f"it is not a {cls.FORMAT} file")
            if state.get("key") != key:
                generic = "it was written for another model, other tokens or other options"
                raise ValueError(io.resume_mismatch(state.get("key"), key, generic))
        except Exception as err:  # noqa: BLE001 — a corrupt or foreign file must not stop training
            warnings.warn(f"ignoring lens checkpoint {path}: {err}", stacklevel=stacklevel + 1)
            logging.getLogger(__name__).warning("ignoring lens checkpoint %s: %s", path, err)
            return None
        return state

    @staticmethod
    def remove(path: PathLike) -> None:
        """Delete the state file (training finished), if it is there."""
        Path(path).unlink(missing_ok=True)


class RssProfile(TsvArtifact):
    """``results/{model}/{ckpt}/rss.tsv``: readout-subspace similarity of adjacent layers.

    One row per (layer, k) (:func:`resdyn.study_b.readout.rss_profile`), :data:`RSS_COLUMNS`: ``layer``
    int (L = 0 … n−2, the pair L, L+1), ``k`` int, ``k_fraction`` float (= k / d), ``d`` int (the
    hidden size, stored so readers need not reconstruct it), ``rss``, ``grassmann_distance``,
    ``energy`` float, all finite.
    """

    relpath = CKPT_DIR + "rss.tsv"
    columns = kinds("layer:int k:int k_fraction:float d:int rss:float grassmann_distance:float energy:float")
    units = {"grassmann_distance": "radians", "k_fraction": "fraction of d", "energy": "fraction"}


class ResolutionTable(TsvArtifact):
    """``results/{model}/{ckpt}/resolution.tsv``: energy vs visibility of each readout dimension.

    One row per configured fraction (:func:`resdyn.study_b.readout.resolution_table`): ``k_fraction``
    float, ``k`` int, ``energy``, ``mean_rss``, ``visibility`` float, ``pareto`` bool.
    """

    relpath = CKPT_DIR + "resolution.tsv"
    columns = kinds("k_fraction:float k:int energy:float mean_rss:float visibility:float pareto:bool")
    units = {"k_fraction": "fraction of d", "energy": "fraction"}


class PhaseCuts(Artifact):
    """``results/{model}/{ckpt}/phases.json``: the phase cut of the RSS profile.

    The JSON object of :meth:`resdyn.study_b.phases.Cutpoints.to_json` (keys and their meaning in the
    :class:`resdyn.study_b.phases.Cutpoints` docstring: ``b1``, ``b2``, ``peak``, ``b1_found``,
    ``b2_found``, ``reason``, ``spans``, ``widths``, ``n``, ``window``, ``method``,
    ``sensitivity``, ``notes``, ``profile``, ``smoothed``, ``stages``, optional ``k`` and
    ``k_fraction_requested``). :meth:`read` checks it is such an object; the full validation
    (types, 0 ≤ b1 ≤ peak ≤ b2 ≤ n−1, spans/widths agree) is
    ``phases.Cutpoints.from_json(PhaseCuts.read(path), source=path)``, kept in resdyn.study_b.phases so
    the artifacts package imports nothing of resdyn but io (its imports enter every rule's code version).
    """

    relpath = CKPT_DIR + "phases.json"
    KEYS = (
        "b1",
        "b2",
        "peak",
        "b1_found",
        "b2_found",
        "reason",
        "spans",
        "widths",
        "n",
        "window",
        "method",
        "sensitivity",
        "notes",
        "profile",
        "smoothed",
        "stages",
    )

    @classmethod
    def read(cls, path: PathLike) -> dict[str, Any]:
        """The JSON object; ArtifactError naming the file if it is not one or lacks keys."""
        obj = io.read_json(path)
        if not isinstance(obj, dict):
            raise ArtifactError(f"{path}: expected a JSON object of phase cut points, got {type(obj).__name__}")
        missing = [k for k in cls.KEYS if k not in obj]
        if missing:
            raise ArtifactError(f"{path}: lacks keys {missing} (a phases.json has {list(cls.KEYS)})")
        return obj

    @classmethod
    def write(cls, cuts: Any, path: PathLike) -> None:
        """Write a :class:`resdyn.study_b.phases.Cutpoints` (or its :meth:`to_json` object) atomically; NaN refused."""
        obj = cuts if isinstance(cuts, Mapping) else cuts.to_json()
        missing = [k for k in cls.KEYS if k not in obj]
        if missing:
            raise ArtifactError(f"{path}: refusing to write phase cut points without keys {missing}")
        io.write_json(obj, path)


class LayerGeometry(TsvArtifact):
    """``results/{model}/{ckpt}/geometry.tsv``: per-layer geometry of the residual stream.

    One row per state (:func:`resdyn.study_b.geometry.layer_geometry` + :func:`resdyn.study_b.geometry.with_lens_hits`):
    ``layer`` int, ``state`` str (h_L | output), ``n_tokens`` int, ``hidden_erank`` float,
    the update columns (:data:`resdyn.study_b.geometry.UPDATE_COLUMNS`: ``update_orthogonality``,
    ``attn_orthogonality``, ``mlp_orthogonality``, ``n_excluded``, ``norm_ratio``,
    ``norm_ratio_of_means``, ``relative_update_norm``, the absolute ``update_norm``,
    ``attn_update_norm``, ``mlp_update_norm`` and the updates' effective ranks ``update_erank``,
    ``attn_update_erank``, ``mlp_update_erank``; NaN on the ``output`` row, which has no update
    after it), then the lens hit rates ``{logit,tuned}_hit1``, ``_hit5`` and
    ``_hit5_over_hit1`` (NaN where the lens has no row for the layer, the ratio also where
    Hit@1 = 0).
    """

    relpath = CKPT_DIR + "geometry.tsv"
    columns = kinds(
        "layer:int state:str n_tokens:int hidden_erank:float update_orthogonality:float "
        "attn_orthogonality:float mlp_orthogonality:float n_excluded:int norm_ratio:float "
        "norm_ratio_of_means:float relative_update_norm:float update_norm:float attn_update_norm:float "
        "mlp_update_norm:float update_erank:float attn_update_erank:float mlp_update_erank:float "
        "logit_hit1:float logit_hit5:float tuned_hit1:float tuned_hit5:float "
        "logit_hit5_over_hit1:float tuned_hit5_over_hit1:float"
    )
    allow_nan = (
        "update_orthogonality",
        "attn_orthogonality",
        "mlp_orthogonality",
        "n_excluded",
        "norm_ratio",
        "norm_ratio_of_means",
        "relative_update_norm",
        "update_norm",
        "attn_update_norm",
        "mlp_update_norm",
        "update_erank",
        "attn_update_erank",
        "mlp_update_erank",
        "logit_hit1",
        "logit_hit5",
        "tuned_hit1",
        "tuned_hit5",
        "logit_hit5_over_hit1",
        "tuned_hit5_over_hit1",
    )
    extra_columns = True


class PhaseMetrics(TsvArtifact):
    """``results/{model}/{ckpt}/phase_metrics.tsv``: geometry summarised per phase.

    One row per (phase, metric) (:func:`resdyn.study_b.geometry.phase_table`): ``phase`` int (1–3),
    ``phase_name`` str, ``metric`` str, ``mean``, ``sd`` float, ``n_layers`` int, ``reason`` str (why
    ``sd`` or ``mean`` is empty: a phase of fewer than two layers).
    """

    relpath = CKPT_DIR + "phase_metrics.tsv"
    columns = kinds("phase:int phase_name:str metric:str mean:float sd:float n_layers:int reason:str")


class ScalingWidths(TsvArtifact):
    """``results/scaling/widths.tsv``: the width of each phase of each model.

    ``group``, ``model`` str, ``n_layers``, ``phase``, ``width`` int (one row per model and phase),
    ``fallback`` bool (the width rests on a Kneedle fallback cut,
    :func:`resdyn.study_b.geometry.fallback_widths`: left out of the fit).
    """

    relpath = "results/scaling/widths.tsv"
    columns = kinds("group:str model:str n_layers:int phase:int width:int fallback:bool")


class ScalingFits(TsvArtifact):
    """``results/scaling/phase_widths.tsv``: phase width vs depth fits per group and phase.

    :func:`resdyn.study_b.geometry.depth_scaling` plus ``group``: ``phase`` int, ``status`` str,
    ``slope``, ``intercept``, ``slope_ci_low``, ``slope_ci_high``, ``slope_se``, ``p_value``,
    ``r_squared`` float (NaN only in a row with a ``reason``), ``n_models``, ``n_depths``,
    ``n_obs`` int, ``reason`` str, ``group`` str.
    """

    relpath = "results/scaling/phase_widths.tsv"
    columns = kinds(
        "phase:int status:str slope:float intercept:float slope_ci_low:float slope_ci_high:float "
        "slope_se:float p_value:float r_squared:float n_models:int n_depths:int n_obs:int n_fallback:int reason:str "
        "group:str"
    )


# column lists of the tables that concept modules build (defined once, by the classes above)
RSS_COLUMNS = list(RssProfile.columns)
LENS_METRIC_COLUMNS = list(LensMetrics.columns)
