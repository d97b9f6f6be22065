"""The artifacts layer: one small class per file the pipeline writes, with its one reader and writer.

Each class owns its path relative to the run folder (:meth:`path`), the layout of its file
(TSV columns and their kinds, HDF5 groups/attributes; the schema is in the class docstring),
its writer (atomic, via :mod:`resdyn.io`, with the provenance sidecar where the step asks for
one) and its reader, which validates what it reads and names the file and what is wrong
(a missing column, a wrong kind, a non-finite number where none is allowed, a wrong shape).

Concept modules (spectral, schur, topology, readout, phases, …) compute on arrays and tables;
the scripts under ``workflow/scripts`` read through these classes, compute, and write through
them. Only light imports here (numpy, pandas; h5py inside the HDF5 methods) so a job that reads
an artifact does not pay for torch or scipy at start-up.

TSV column kinds: ``int`` (integer values; a float column of integral values where NaN is
allowed), ``float`` (any number), ``bool`` (True/False), ``str`` (a label: any cell). A
numeric cell may be NaN/Inf only in a column listed in ``allow_nan`` or in a row whose
``reason`` column is non-empty — the same rule :func:`resdyn.io.write_tsv` applies on write.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from resdyn import io
from resdyn.io import PathLike

__all__ = [
    "ArtifactError",
    "TsvArtifact",
    "SpectraTable",
    "SpectraArrays",
    "BottleneckTable",
    "SchurCurves",
    "CouplingTable",
    "CommunitiesSummary",
    "CommunityPartitions",
    "CheckpointsTable",
    "CouplingCounts",
    "CausalTable",
    "BridgeTable",
    "BridgeAlignment",
    "BootstrapTable",
    "BootstrapReplicates",
    "ScorecardTable",
    "BOOTSTRAP_COLUMNS",
    "REPLICATE_COLUMNS",
    "CAUSAL_COLUMNS",
    "ALIGNMENT_COLUMNS",
    "SCORECARD_COLUMNS",
    "RSS_COLUMNS",
    "LENS_METRIC_COLUMNS",
    "LensMetrics",
    "RssProfile",
    "ResolutionTable",
    "PhaseCuts",
    "LayerGeometry",
    "PhaseMetrics",
    "ScalingWidths",
    "ScalingFits",
]


class ArtifactError(ValueError):
    """An artifact on disk does not have the layout its class declares (the message names the file)."""


# --------------------------------------------------------------------------------------------
# TSV tables

_KINDS = ("int", "float", "bool", "str")


def _is_integral(values: pd.Series) -> bool:
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    v = v[np.isfinite(v)]
    return bool(np.all(v == np.round(v)))


class TsvArtifact:
    """Base of a TSV table artifact (tab-separated, header row, written by :func:`resdyn.io.write_tsv`).

    Subclasses set ``relpath`` (a template relative to the run folder, e.g.
    ``results/{model}/{ckpt}/spectra.tsv``), ``columns`` ({name: kind}, the columns every file
    has), ``allow_nan`` (columns whose numbers may be NaN) and ``extra_columns`` (whether
    further columns may follow; their cells are not checked for kind).
    """

    relpath: ClassVar[str] = ""
    columns: ClassVar[Mapping[str, str]] = {}
    allow_nan: ClassVar[tuple[str, ...]] = ()
    extra_columns: ClassVar[bool] = False

    @classmethod
    def path(cls, run: PathLike = ".", **wildcards: Any) -> Path:
        """The file of this artifact under the run folder ``run`` (wildcards fill ``relpath``)."""
        return Path(run) / cls.relpath.format(**wildcards)

    @classmethod
    def validate(cls, table: pd.DataFrame, where: PathLike) -> pd.DataFrame:
        """Check ``table`` against the schema; ArtifactError naming ``where`` and the problem."""
        missing = [c for c in cls.columns if c not in table.columns]
        if missing:
            raise ArtifactError(f"{where}: lacks column(s) {missing} ({cls.__name__} has {list(cls.columns)})")
        extra = [c for c in table.columns if c not in cls.columns]
        if extra and not cls.extra_columns:
            raise ArtifactError(f"{where}: unexpected column(s) {extra} ({cls.__name__} has {list(cls.columns)})")
        for name, kind in cls.columns.items():
            col = table[name]
            if kind == "str" or col.isna().all():
                continue
            numeric = pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)
            if kind == "bool":
                ok = pd.api.types.is_bool_dtype(col) or set(col.dropna().astype(str)) <= {"True", "False"}
            elif kind == "int":
                ok = numeric and _is_integral(col)
            else:
                ok = numeric
            if not ok:
                bad = col.dropna().iloc[0]
                raise ArtifactError(f"{where}: column {name!r} must hold {kind} values, got dtype {col.dtype} "
                                    f"(e.g. {bad!r})")
        cls._check_finite(table, where)
        return table

    @classmethod
    def _check_finite(cls, table: pd.DataFrame, where: PathLike) -> None:
        numeric = [c for c, k in cls.columns.items() if k in ("int", "float") and c not in cls.allow_nan]
        if not numeric or table.empty:
            return
        values = table[numeric].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        bad = ~np.isfinite(values)
        if "reason" in table.columns:
            reason = table["reason"].astype(object).where(table["reason"].notna(), "")
            bad[reason.astype(str).str.strip().to_numpy() != "", :] = False
        if bad.any():
            row, col = (int(x[0]) for x in np.nonzero(bad))
            raise ArtifactError(f"{where}: column {numeric[col]!r} row {row} is {values[row, col]}; "
                                f"{cls.__name__} allows NaN only in {list(cls.allow_nan)} or in rows with a reason")

    @classmethod
    def read(cls, path: PathLike) -> pd.DataFrame:
        """Read and validate the table at ``path`` (pandas' dtypes, as written)."""
        return cls.validate(io.read_tsv(path), path)

    @classmethod
    def write(cls, table: pd.DataFrame, path: PathLike, provenance: dict | None = None) -> None:
        """Write ``table`` atomically after checking its columns (:func:`resdyn.io.write_tsv`)."""
        missing = [c for c in cls.columns if c not in table.columns]
        if missing:
            raise ArtifactError(f"{path}: refusing to write a {cls.__name__} without column(s) {missing}")
        io.write_tsv(table, path, provenance, allow_nan=cls.allow_nan)


def _cols(spec: str) -> dict[str, str]:
    """``"layer:int kind:str"`` → {"layer": "int", "kind": "str"} (kinds checked)."""
    out = {}
    for item in spec.split():
        name, kind = item.split(":")
        assert kind in _KINDS, kind
        out[name] = kind
    return out


# --------------------------------------------------------------------------------------------
# Study A: spectra, bottleneck, Schur, communities, coupling, checkpoints

_CKPT = "results/{model}/{ckpt}/"


class SpectraTable(TsvArtifact):
    """``results/{model}/{ckpt}/spectra.tsv``: operator metrics of each sublayer's mean Jacobian.

    One row per sublayer in depth order (:func:`resdyn.spectral.spectra_table`). Columns:
    ``layer`` int, ``kind`` str (attn | mlp | layer), ``s`` int (sublayer index), ``d`` int,
    ``spectral_radius``, ``condition_number``, ``sigma_max``, ``sigma_min``, ``fro_J``,
    ``fro_minus_identity``, ``nonnormal_fro``, ``henrici``, ``henrici_JmI``,
    ``expansive_frac_eig``, ``expansive_frac_sv``, ``erank_J``, ``pr_J``, ``erank_JmI``,
    ``pr_JmI`` float; then one ``complex_frac_J_tol…`` / ``complex_frac_JmI_tol…`` column per
    configured tolerance and the self-alignment columns (extra columns, all finite).
    """

    relpath = _CKPT + "spectra.tsv"
    columns = _cols(
        "layer:int kind:str s:int d:int spectral_radius:float condition_number:float sigma_max:float "
        "sigma_min:float fro_J:float fro_minus_identity:float nonnormal_fro:float henrici:float "
        "henrici_JmI:float expansive_frac_eig:float expansive_frac_sv:float erank_J:float pr_J:float "
        "erank_JmI:float pr_JmI:float")
    extra_columns = True


class BottleneckTable(TsvArtifact):
    """``results/{model}/{ckpt}/bottleneck.tsv``: cumulative products' effective rank by depth.

    One row per sublayer s (:func:`resdyn.spectral.bottleneck_table`): ``s`` int, ``layer`` int,
    ``kind`` str, ``d`` int, ``erank``, ``participation_ratio``, ``log10_fro`` (of the product
    J_s ⋯ J_0), ``erank_single``, ``pr_single`` (of J_s alone) float, all finite.
    """

    relpath = _CKPT + "bottleneck.tsv"
    columns = _cols("s:int layer:int kind:str d:int erank:float participation_ratio:float log10_fro:float "
                    "erank_single:float pr_single:float")


class SchurCurves(TsvArtifact):
    """``results/{model}/{ckpt}/schur.tsv``: bottleneck curves of J(α) = Q(Λ + αN)Q*.

    One row per (alpha, s), sorted by alpha then s (:func:`resdyn.schur.schur_bottleneck`):
    ``alpha`` float, ``s``, ``layer`` int, ``kind`` str, ``erank``, ``pr``, ``log10_fro``,
    ``henrici_single`` float, all finite.
    """

    relpath = _CKPT + "schur.tsv"
    columns = _cols("alpha:float s:int layer:int kind:str erank:float pr:float log10_fro:float henrici_single:float")


class CouplingTable(TsvArtifact):
    """``results/{model}/{ckpt}/coupling.tsv``: boundary-vs-interior gain per residual boundary.

    One row per (layer, boundary) (:func:`resdyn.topology.coupling_from_tables`): ``layer`` int,
    ``boundary`` str, ``kind`` str, ``s`` int, ``gain`` str, ``effect_log_median_ratio``,
    ``rank_biserial``, ``p_value`` float, ``n_boundary``, ``n_interior`` int,
    ``median_boundary``, ``median_interior`` float, ``reason`` str (why a row's test is empty;
    its numbers may then be NaN), ``henrici``, ``q_value`` float, ``significant`` bool.
    """

    relpath = _CKPT + "coupling.tsv"
    columns = _cols("layer:int boundary:str kind:str s:int gain:str effect_log_median_ratio:float "
                    "rank_biserial:float p_value:float n_boundary:int n_interior:int median_boundary:float "
                    "median_interior:float reason:str henrici:float q_value:float significant:bool")


class CommunitiesSummary(TsvArtifact):
    """``results/{model}/{ckpt}/communities_summary.tsv``: one row per (layer, boundary).

    :func:`resdyn.topology.analyse_boundary`'s summary: ``layer`` int, ``boundary`` str,
    ``n_units``, ``n_communities`` int, ``sizes`` str (comma-separated community sizes),
    ``largest``, ``n_singletons`` int, ``quality``, ``resolution``, ``modularity`` float,
    ``n_edges``, ``n_negative_edges``, ``n_boundary``, ``n_tokens``, ``n_constant_units`` int.
    """

    relpath = _CKPT + "communities_summary.tsv"
    columns = _cols("layer:int boundary:str n_units:int n_communities:int sizes:str largest:int "
                    "n_singletons:int quality:float resolution:float modularity:float n_edges:int "
                    "n_negative_edges:int n_boundary:int n_tokens:int n_constant_units:int")


class CommunityPartitions(TsvArtifact):
    """``results/{model}/{ckpt}/communities/layer{L:03d}.tsv``: the partition of each layer's units.

    A folder with one table per layer; columns ``unit`` int, ``community`` int,
    ``participation`` float, ``is_boundary`` bool, ``layer`` int, ``boundary`` str (one block
    of rows per boundary of the layer). :meth:`read_folder` concatenates the layers in order.
    """

    relpath = _CKPT + "communities"
    columns = _cols("unit:int community:int participation:float is_boundary:bool layer:int boundary:str")

    @staticmethod
    def layer_file(folder: PathLike, layer: int) -> Path:
        """The table of one layer inside the folder."""
        return Path(folder) / f"layer{int(layer):03d}.tsv"

    @classmethod
    def read_folder(cls, folder: PathLike) -> pd.DataFrame:
        """All layers' partitions (validated), concatenated in file order."""
        files = sorted(Path(folder).glob("layer*.tsv"))
        if not files:
            raise FileNotFoundError(f"no layer*.tsv community tables in {folder}")
        return pd.concat([cls.read(f) for f in files], ignore_index=True)


class CheckpointsTable(TsvArtifact):
    """``results/{model}/checkpoints.tsv``: per-sublayer metrics of every checkpoint side by side.

    :func:`resdyn.spectral.checkpoint_table` merged with :func:`resdyn.topology.significant_counts`:
    ``ckpt`` str, ``layer`` int, ``kind`` str, ``s`` int, metric columns (float, extra), and the
    per-checkpoint coupling counts ``n_significant``, ``n_boundaries`` (NaN for a checkpoint
    without coupling), ``sign_dependence_rho``, ``sign_dependence_p`` (NaN when undefined).
    """

    relpath = "results/{model}/checkpoints.tsv"
    columns = _cols("ckpt:str layer:int kind:str s:int")
    extra_columns = True


class CouplingCounts(TsvArtifact):
    """``results/{model}/coupling_counts.tsv``: significant boundaries per checkpoint.

    :func:`resdyn.topology.significant_counts` plus ``model``: ``ckpt`` str, ``n_significant``,
    ``n_boundaries`` int, ``sign_dependence_rho``, ``sign_dependence_p`` float, ``model`` str.
    """

    relpath = "results/{model}/coupling_counts.tsv"
    columns = _cols("ckpt:str n_significant:int n_boundaries:int sign_dependence_rho:float "
                    "sign_dependence_p:float model:str")


class SpectraArrays:
    """``results/{model}/{ckpt}/spectra.h5``: the spectra behind ``spectra.tsv`` (schema ``resdyn.spectra/1``).

    * root attrs: ``schema`` = "resdyn.spectra/1", plus provenance attrs (scalars as is,
      anything else JSON-encoded as a string);
    * one group per sublayer ``L{layer:03d}_{kind}`` (kind attn, mlp or layer) with attrs
      ``layer``, ``kind``, ``s`` (:func:`resdyn.spectral.sublayer_index`) and 1-D datasets of
      one length d: ``eigenvalues`` complex128 sorted by descending |λ|, ``singular_values``
      float64 and ``singular_values_JmI`` float64 (of J − I), both descending.
    """

    relpath = _CKPT + "spectra.h5"
    SCHEMA = "resdyn.spectra/1"
    DATASETS: ClassVar[dict[str, Any]] = {"eigenvalues": np.complex128, "singular_values": np.float64,
                                          "singular_values_JmI": np.float64}
    _GROUP = re.compile(r"^L(\d{3,})_(attn|mlp|layer)$")

    @classmethod
    def path(cls, run: PathLike = ".", **wildcards: Any) -> Path:
        """The file under the run folder."""
        return Path(run) / cls.relpath.format(**wildcards)

    @staticmethod
    def _attr_value(v: Any) -> Any:
        if isinstance(v, (str, bytes, bool, int, float, np.integer, np.floating, np.bool_)):
            return v
        if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
            return v
        return json.dumps(v, default=str)

    @classmethod
    def _checked(cls, arrays: Mapping[str, Mapping[str, Any]], where: PathLike) -> dict:
        if not isinstance(arrays, Mapping) or len(arrays) == 0:
            raise ValueError(f"{where}: arrays must be a non-empty mapping {{'L000_attn': {{dataset: array}}, ...}}")
        checked = {}
        for name, group in arrays.items():
            m = cls._GROUP.match(str(name))
            if not m:
                raise ValueError(f"{where}: group name {name!r} is not of the form L{{layer:03d}}_{{attn|mlp|layer}}")
            missing = [k for k in cls.DATASETS if k not in group]
            if missing:
                raise ValueError(f"{where}: arrays[{name!r}] lacks datasets {missing}; required: {list(cls.DATASETS)}")
            ds = {}
            for k, dtype in cls.DATASETS.items():
                v = np.asarray(group[k])
                if v.ndim != 1:
                    raise ValueError(f"{where}: arrays[{name!r}][{k!r}] must be 1-D, got shape {v.shape}")
                ds[k] = v.astype(dtype)
            if len({v.shape for v in ds.values()}) != 1:
                raise ValueError(f"{where}: arrays[{name!r}] datasets differ in length "
                                 f"{ {k: v.shape[0] for k, v in ds.items()} }")
            checked[str(name)] = (int(m.group(1)), m.group(2), ds)
        return checked

    @classmethod
    def write(cls, arrays: Mapping[str, Mapping[str, Any]], path: PathLike,
              attrs: Mapping[str, Any] | None = None) -> None:
        """Write ``arrays`` ({group: {dataset: array}}, :func:`resdyn.spectral.spectra_table`) atomically."""
        import h5py

        from resdyn.spectral import sublayer_index

        checked = cls._checked(arrays, path)
        with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            for k, v in (attrs or {}).items():
                f.attrs[str(k)] = cls._attr_value(v)
            f.attrs["schema"] = cls.SCHEMA  # last: provenance attrs may carry an upstream schema
            for name, (layer, kind, ds) in checked.items():
                g = f.create_group(name)
                g.attrs["layer"] = layer
                g.attrs["kind"] = kind
                g.attrs["s"] = sublayer_index(layer, kind)
                for k, v in ds.items():
                    g.create_dataset(k, data=v)

    @classmethod
    def read(cls, path: PathLike) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """(arrays, attrs): {group: {dataset: array}} as written, and the root attributes.

        Raises ArtifactError naming the file: not HDF5, another ``schema``, a group or dataset
        missing, of the wrong dtype or shape.
        """
        import h5py

        try:
            f = h5py.File(path, "r")
        except (OSError, FileNotFoundError) as err:
            raise ArtifactError(f"{path}: cannot open as HDF5 ({err})") from err
        with f:
            schema = f.attrs.get("schema")
            if isinstance(schema, bytes):
                schema = schema.decode()
            if schema != cls.SCHEMA:
                raise ArtifactError(f"{path}: schema {schema!r}, expected {cls.SCHEMA!r}")
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            arrays = {name: {k: g[k][()] for k in g} for name, g in f.items()}
        for name, group in arrays.items():
            if not cls._GROUP.match(name):
                raise ArtifactError(f"{path}: group {name!r} is not of the form L{{layer:03d}}_{{attn|mlp|layer}}")
            for k, dtype in cls.DATASETS.items():
                if k not in group:
                    raise ArtifactError(f"{path}: group {name!r} lacks dataset {k!r}")
                if group[k].dtype != dtype or group[k].ndim != 1:
                    raise ArtifactError(f"{path}: {name}/{k} is {group[k].dtype} of shape {group[k].shape}, "
                                        f"expected 1-D {np.dtype(dtype)}")
        return arrays, attrs


# --------------------------------------------------------------------------------------------
# the bridge, causal tests, bootstrap and the scorecard


class CausalTable(TsvArtifact):
    """``results/{model}/{ckpt}/causal.tsv``: readout-subspace interventions per layer.

    One row per (layer, intervention) (:func:`resdyn.causal.causal_table`), :data:`CAUSAL_COLUMNS`:
    ``layer`` int, ``intervention`` str (project | patch), ``k``, ``d`` int, ``kl``, ``flip_rate``,
    ``random_kl_mean``, ``random_kl_sd``, ``random_flip_mean``, ``random_flip_sd``, ``kl_z``,
    ``kl_p`` float, ``n_random``, ``n_samples``, ``n_tokens`` int, ``phase`` int (NaN for the
    last layer, outside the cut RSS profile).
    """

    relpath = _CKPT + "causal.tsv"
    columns = _cols("layer:int intervention:str k:int d:int kl:float flip_rate:float random_kl_mean:float "
                    "random_kl_sd:float random_flip_mean:float random_flip_sd:float kl_z:float kl_p:float "
                    "n_random:int n_samples:int n_tokens:int phase:int")
    allow_nan = ("phase",)


class BridgeTable(TsvArtifact):
    """``results/{model}/{ckpt}/bridge.tsv``: subspace transport next to Jacobian and RSS profiles.

    One row per layer L = 0 … n−1 (:func:`resdyn.bridge.bridge_tables`): :data:`TRANSPORT_COLUMNS`
    (``layer``, ``k``, ``d`` int, ``transport``, ``random_mean``, ``random_sd``, ``random_p``
    float, ``n_random`` int, ``chance`` float), then the Jacobian profiles (extra float columns
    such as ``complex_frac_attn``, ``henrici_mlp``, ``cum_erank``), ``rss``, ``rss_k`` and
    ``phase``; a row whose numbers are empty (the last layer) says why in ``reason``.
    """

    relpath = _CKPT + "bridge.tsv"
    columns = _cols("layer:int k:int d:int transport:float random_mean:float random_sd:float random_p:float "
                    "n_random:int chance:float rss:float rss_k:int phase:int")
    extra_columns = True


class BridgeAlignment(TsvArtifact):
    """``results/{model}/{ckpt}/bridge_alignment.tsv``: where each Jacobian profile changes vs the phase cuts.

    One row per profile (:func:`resdyn.bridge.alignment_table`), :data:`ALIGNMENT_COLUMNS`:
    ``profile`` str, ``change_layer`` int, ``delta`` float, ``b1``, ``b2`` int, ``b1_found``,
    ``b2_found`` bool, ``dist_b1``, ``dist_b2``, ``dist_nearest`` int, ``chance_dist_nearest``
    float, ``n_positions`` int.
    """

    relpath = _CKPT + "bridge_alignment.tsv"
    columns = _cols("profile:str change_layer:int delta:float b1:int b2:int b1_found:bool b2_found:bool "
                    "dist_b1:int dist_b2:int dist_nearest:int chance_dist_nearest:float n_positions:int")


class BootstrapTable(TsvArtifact):
    """``results/{model}/{ckpt}/bootstrap.tsv``: bootstrap intervals over samples.

    :data:`BOOTSTRAP_COLUMNS` (:func:`resdyn.bootstrap.jacobian_bootstrap` +
    :func:`resdyn.bootstrap.not_bootstrapped_rows`): ``metric`` str, ``layer`` int, ``kind`` str,
    ``s`` int (NaN for whole-model rows), ``estimate``, ``ci_low``, ``ci_high``, ``level`` float,
    ``n_resamples``, ``n_bootstrap_samples``, ``n_samples_total`` int, ``estimate_all_samples``
    float, ``seed`` int, ``bootstrapped`` bool, ``note`` str, ``reason`` str (non-empty where the
    row was not bootstrapped; its numbers are then NaN), ``method``, ``interval`` str.
    """

    relpath = _CKPT + "bootstrap.tsv"
    columns = _cols("metric:str layer:int kind:str s:int estimate:float ci_low:float ci_high:float level:float "
                    "n_resamples:int n_bootstrap_samples:int n_samples_total:int estimate_all_samples:float "
                    "seed:int bootstrapped:bool note:str reason:str method:str interval:str")
    allow_nan = ("layer", "s")


class BootstrapReplicates(TsvArtifact):
    """``results/{model}/{ckpt}/bootstrap_replicates.tsv``: replicate values of the whole-model statistics.

    :data:`REPLICATE_COLUMNS`: ``replicate`` int, ``metric`` str, ``value`` float (finite).
    """

    relpath = _CKPT + "bootstrap_replicates.tsv"
    columns = _cols("replicate:int metric:str value:float")


class ScorecardTable(TsvArtifact):
    """``results/{model}/scorecard.tsv``: one row per claim with its verdict.

    :data:`SCORECARD_COLUMNS` (:func:`resdyn.scorecard.scorecard`): ``claim_id``, ``claim``,
    ``statistic`` str, ``value``, ``ci_low``, ``ci_high`` float (NaN only in a row with a
    ``reason``), ``ci_source``, ``study_value``, ``verdict``, ``reason``, ``detail``, ``ckpts`` str.
    """

    relpath = "results/{model}/scorecard.tsv"
    columns = _cols("claim_id:str claim:str statistic:str value:float ci_low:float ci_high:float ci_source:str "
                    "study_value:str verdict:str reason:str detail:str ckpts:str")



# --------------------------------------------------------------------------------------------
# Study B: lens metrics, RSS profile, resolution, phase cuts, phase metrics, scaling


class LensMetrics(TsvArtifact):
    """``results/{model}/{ckpt}/lens_metrics.tsv``: readout quality of the tuned and the logit lens.

    One row per (lens, layer) (:func:`resdyn.lens.lens_metrics`): ``lens`` str (tuned | logit),
    ``layer`` int, ``kl``, ``ce``, ``hit1``, ``hit5`` float, ``n_tokens`` int, ``converged``
    bool, ``steps``, ``converged_step`` int, ``final_heldout_kl`` float, ``reason`` str (why a
    row's numbers are empty, e.g. the logit lens has no training record).
    """

    relpath = _CKPT + "lens_metrics.tsv"
    columns = _cols("lens:str layer:int kl:float ce:float hit1:float hit5:float n_tokens:int converged:bool "
                    "steps:int converged_step:int final_heldout_kl:float reason:str")


class RssProfile(TsvArtifact):
    """``results/{model}/{ckpt}/rss.tsv``: readout-subspace similarity of adjacent layers.

    One row per (layer, k) (:func:`resdyn.readout.rss_profile`), :data:`RSS_COLUMNS`: ``layer``
    int (L = 0 … n−2, the pair L, L+1), ``k`` int, ``k_fraction`` float (= k / d), ``d`` int (the
    hidden size, stored so readers need not reconstruct it), ``rss``, ``grassmann_distance``,
    ``energy`` float, all finite.
    """

    relpath = _CKPT + "rss.tsv"
    columns = _cols("layer:int k:int k_fraction:float d:int rss:float grassmann_distance:float energy:float")


class ResolutionTable(TsvArtifact):
    """``results/{model}/{ckpt}/resolution.tsv``: energy vs visibility of each readout dimension.

    One row per configured fraction (:func:`resdyn.readout.resolution_table`): ``k_fraction``
    float, ``k`` int, ``energy``, ``mean_rss``, ``visibility`` float, ``pareto`` bool.
    """

    relpath = _CKPT + "resolution.tsv"
    columns = _cols("k_fraction:float k:int energy:float mean_rss:float visibility:float pareto:bool")


class PhaseCuts:
    """``results/{model}/{ckpt}/phases.json``: the phase cut of the RSS profile.

    The JSON object of :meth:`resdyn.phases.Cutpoints.to_json` (keys and their meaning in the
    :class:`resdyn.phases.Cutpoints` docstring: ``b1``, ``b2``, ``peak``, ``b1_found``,
    ``b2_found``, ``reason``, ``spans``, ``widths``, ``n``, ``window``, ``method``,
    ``sensitivity``, ``notes``, ``profile``, ``smoothed``, ``stages``, ``k``,
    ``k_fraction_requested``). Read back validated by :meth:`resdyn.phases.Cutpoints.from_json`.
    """

    relpath = _CKPT + "phases.json"

    @classmethod
    def path(cls, run: PathLike = ".", **wildcards: Any) -> Path:
        """The file under the run folder."""
        return Path(run) / cls.relpath.format(**wildcards)

    @classmethod
    def read(cls, path: PathLike):
        """The :class:`resdyn.phases.Cutpoints` in the file (ValueError naming the file if invalid)."""
        from resdyn.phases import Cutpoints

        return Cutpoints.from_json(io.read_json(path), source=str(path))

    @classmethod
    def write(cls, cuts, path: PathLike) -> None:
        """Write a :class:`resdyn.phases.Cutpoints` atomically as JSON (no NaN: refused)."""
        io.write_json(cuts.to_json(), path)


class LayerGeometry(TsvArtifact):
    """``results/{model}/{ckpt}/geometry.tsv``: per-layer geometry of the residual stream.

    One row per state (:func:`resdyn.geometry.layer_geometry` + :func:`resdyn.geometry.with_lens_hits`):
    ``layer`` int, ``state`` str (h_L | output), ``n_tokens`` int, ``hidden_erank`` float,
    the update columns (:data:`resdyn.geometry.UPDATE_COLUMNS`: ``update_orthogonality``,
    ``attn_orthogonality``, ``mlp_orthogonality``, ``n_excluded``, ``norm_ratio``,
    ``norm_ratio_of_means``, ``relative_update_norm``; NaN on the ``output`` row, which has no
    update after it), then the lens hit rates (extra float columns, e.g. ``tuned_hit1``).
    """

    relpath = _CKPT + "geometry.tsv"
    columns = _cols("layer:int state:str n_tokens:int hidden_erank:float update_orthogonality:float "
                    "attn_orthogonality:float mlp_orthogonality:float n_excluded:int norm_ratio:float "
                    "norm_ratio_of_means:float relative_update_norm:float")
    allow_nan = ("update_orthogonality", "attn_orthogonality", "mlp_orthogonality", "n_excluded", "norm_ratio",
                 "norm_ratio_of_means", "relative_update_norm")
    extra_columns = True


class PhaseMetrics(TsvArtifact):
    """``results/{model}/{ckpt}/phase_metrics.tsv``: geometry summarised per phase.

    One row per (phase, metric) (:func:`resdyn.geometry.phase_table`): ``phase`` int (1–3),
    ``phase_name`` str, ``metric`` str, ``mean``, ``sd`` float, ``n_layers`` int, ``reason`` str (why
    ``sd`` or ``mean`` is empty: a phase of fewer than two layers).
    """

    relpath = _CKPT + "phase_metrics.tsv"
    columns = _cols("phase:int phase_name:str metric:str mean:float sd:float n_layers:int reason:str")


class ScalingWidths(TsvArtifact):
    """``results/scaling/widths.tsv``: the width of each phase of each model.

    ``group``, ``model`` str, ``n_layers``, ``phase``, ``width`` int (one row per model and phase).
    """

    relpath = "results/scaling/widths.tsv"
    columns = _cols("group:str model:str n_layers:int phase:int width:int")


class ScalingFits(TsvArtifact):
    """``results/scaling/phase_widths.tsv``: phase width vs depth fits per group and phase.

    :func:`resdyn.geometry.depth_scaling` plus ``group``: ``phase`` int, ``status`` str,
    ``slope``, ``intercept``, ``slope_ci_low``, ``slope_ci_high``, ``slope_se``, ``p_value``,
    ``r_squared`` float (NaN only in a row with a ``reason``), ``n_models``, ``n_depths``,
    ``n_obs`` int, ``reason`` str, ``group`` str.
    """

    relpath = "results/scaling/phase_widths.tsv"
    columns = _cols("phase:int status:str slope:float intercept:float slope_ci_low:float slope_ci_high:float "
                    "slope_se:float p_value:float r_squared:float n_models:int n_depths:int n_obs:int reason:str "
                    "group:str")


# column lists of the tables that concept modules build (defined once, by the classes above)
BOOTSTRAP_COLUMNS = list(BootstrapTable.columns)
REPLICATE_COLUMNS = list(BootstrapReplicates.columns)
CAUSAL_COLUMNS = list(CausalTable.columns)
ALIGNMENT_COLUMNS = list(BridgeAlignment.columns)
SCORECARD_COLUMNS = list(ScorecardTable.columns)
RSS_COLUMNS = list(RssProfile.columns)
LENS_METRIC_COLUMNS = list(LensMetrics.columns)
