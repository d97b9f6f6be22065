"""The artifacts layer: one small class per file the pipeline writes, with its one reader and writer.

Each class owns its path relative to the run folder (:meth:`path`), the layout of its file
(TSV columns and their kinds, HDF5 groups/attributes; the schema is in the class docstring),
its writer (atomic, via :mod:`resdyn.io`, with the provenance sidecar where the step asks for
one) and its reader, which validates what it reads and names the file and what is wrong
(a missing column, a wrong kind, a non-finite number where none is allowed, a wrong shape).

Concept modules (spectral, schur, topology, readout, phases, …) compute on arrays and tables;
the scripts under ``workflow/scripts`` read through these classes, compute, and write through
them; the engines that stream or resume (Jacobians, activations, lens training, figures) hand
their arrays to the writer classes here (:class:`JacobianSums`, :meth:`Activations.stream`,
:class:`LensCheckpoint`, :class:`Figure`). Only light imports here (numpy, pandas; h5py and
safetensors inside the methods that need them; torch only inside the writers/readers of torch's
own formats, which only the lens job calls) so a job that reads an artifact does not pay for
torch or scipy at start-up.

TSV column kinds: ``int`` (integer values; a float column of integral values where NaN is
allowed), ``float`` (any number), ``bool`` (True/False), ``str`` (a label: any cell). A
numeric cell may be NaN/Inf only in a column listed in ``allow_nan`` or in a row whose
``reason`` column is non-empty — the same rule :func:`resdyn.io.write_tsv` applies on write.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from resdyn import io
from resdyn.io import PathLike

__all__ = [
    "Artifact",
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
    "CouplingLayers",
    "PartitionSimilarity",
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
    "TrainingCurve",
    "Corpus",
    "Samples",
    "CheckpointRecord",
    "Activations",
    "BoundaryView",
    "JacobianBlocks",
    "JacobianSums",
    "Figure",
    "FigureCache",
    "artifact_classes",
    "by_relpath",
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


class Artifact:
    """Base of every artifact: ``relpath`` is its file (or folder) relative to the run folder."""

    relpath: ClassVar[str] = ""

    @classmethod
    def path(cls, run: PathLike = ".", **wildcards: Any) -> Path:
        """The file (or folder) of this artifact under the run folder ``run`` (wildcards fill ``relpath``)."""
        return Path(run) / cls.relpath.format(**wildcards)


class TsvArtifact(Artifact):
    """Base of a TSV table artifact (tab-separated, header row, written by :func:`resdyn.io.write_tsv`).

    Subclasses set ``relpath`` (a template relative to the run folder, e.g.
    ``results/{model}/{ckpt}/spectra.tsv``), ``columns`` ({name: kind}, the columns every file
    has), ``allow_nan`` (columns whose numbers may be NaN) and ``extra_columns`` (whether
    further columns may follow; their cells are not checked for kind); ``units`` ({column:
    unit}) only where a column has a physical unit (``resdyn collect``'s catalog reports them).
    """

    columns: ClassVar[Mapping[str, str]] = {}
    units: ClassVar[Mapping[str, str]] = {}
    allow_nan: ClassVar[tuple[str, ...]] = ()
    extra_columns: ClassVar[bool] = False

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

    One row per sublayer in depth order (:func:`resdyn.study_a.spectral.spectra_table`). Columns:
    ``layer`` int, ``kind`` str (attn | mlp | layer), ``s`` int (sublayer index), ``d`` int,
    ``spectral_radius``, ``condition_number``, ``sigma_max``, ``sigma_min``, ``fro_J``,
    ``fro_minus_identity``, ``nonnormal_fro``, ``henrici``, ``henrici_JmI``, ``symmetry``,
    ``symmetry_minus_identity`` (‖J − Jᵀ‖_F over ‖J‖_F, ‖J − I‖_F), ``expansive_frac_eig``,
    ``expansive_frac_sv``, ``erank_J``, ``pr_J``, ``erank_JmI``, ``pr_JmI`` float; then one
    ``complex_frac_J_tol…`` / ``complex_frac_JmI_tol…`` column per configured tolerance and the
    self-alignment columns (extra columns, all finite).
    """

    relpath = _CKPT + "spectra.tsv"
    columns = _cols(
        "layer:int kind:str s:int d:int spectral_radius:float condition_number:float sigma_max:float "
        "sigma_min:float fro_J:float fro_minus_identity:float nonnormal_fro:float henrici:float "
        "henrici_JmI:float symmetry:float symmetry_minus_identity:float expansive_frac_eig:float "
        "expansive_frac_sv:float erank_J:float pr_J:float erank_JmI:float pr_JmI:float")
    extra_columns = True
    units = {"expansive_frac_eig": "fraction", "expansive_frac_sv": "fraction", "erank_J": "dimensions",
             "pr_J": "dimensions", "erank_JmI": "dimensions", "pr_JmI": "dimensions"}


class BottleneckTable(TsvArtifact):
    """``results/{model}/{ckpt}/bottleneck.tsv``: cumulative products' effective rank by depth.

    One row per sublayer s (:func:`resdyn.study_a.spectral.bottleneck_table`): ``s`` int, ``layer`` int,
    ``kind`` str, ``d`` int, ``erank``, ``participation_ratio``, ``log10_fro`` (of the product
    J_s ⋯ J_0), ``erank_single``, ``pr_single`` (of J_s alone) float, all finite.
    """

    relpath = _CKPT + "bottleneck.tsv"
    columns = _cols("s:int layer:int kind:str d:int erank:float participation_ratio:float log10_fro:float "
                    "erank_single:float pr_single:float")
    units = {"erank": "dimensions", "participation_ratio": "dimensions", "erank_single": "dimensions",
             "pr_single": "dimensions", "log10_fro": "log10"}


class SchurCurves(TsvArtifact):
    """``results/{model}/{ckpt}/schur.tsv``: bottleneck curves of J(α) = Q(Λ + αN)Q*.

    One row per (alpha, s), sorted by alpha then s (:func:`resdyn.study_a.schur.schur_bottleneck`):
    ``alpha`` float, ``s``, ``layer`` int, ``kind`` str, ``erank``, ``pr``, ``log10_fro``,
    ``henrici_single`` float, all finite.
    """

    relpath = _CKPT + "schur.tsv"
    columns = _cols("alpha:float s:int layer:int kind:str erank:float pr:float log10_fro:float henrici_single:float")


class CouplingTable(TsvArtifact):
    """``results/{model}/{ckpt}/coupling.tsv``: boundary-vs-interior gain per residual boundary.

    One row per (layer, boundary) (:func:`resdyn.study_a.topology.coupling_from_tables`): ``layer`` int,
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

    :func:`resdyn.study_a.topology.analyse_boundary`'s summary: ``layer`` int, ``boundary`` str,
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

    :func:`resdyn.study_a.spectral.checkpoint_table` merged with :func:`resdyn.study_a.topology.significant_counts`:
    ``ckpt`` str, ``layer`` int, ``kind`` str, ``s`` int, metric columns (float, extra), and the
    per-checkpoint coupling counts (the :class:`CouplingCounts` columns: ``n_significant_layers`` of
    ``n_layers`` first, the boundary counts as detail; NaN for a checkpoint without coupling).
    """

    relpath = "results/{model}/checkpoints.tsv"
    columns = _cols("ckpt:str layer:int kind:str s:int")
    extra_columns = True


class CouplingLayers(TsvArtifact):
    """``results/{model}/{ckpt}/coupling_layers.tsv``: FDR-significant layers, study A's unit.

    One row per layer (:func:`resdyn.study_a.topology.layer_significance`): ``layer`` int,
    ``p_value`` (Simes over the layer's boundary tests), ``q_value`` (BH over the layers of the
    checkpoint) float, ``significant`` bool, ``n_boundaries_tested`` int, ``reason`` str (why a
    layer has no test; its numbers are then NaN).
    """

    relpath = _CKPT + "coupling_layers.tsv"
    columns = _cols("layer:int p_value:float q_value:float significant:bool n_boundaries_tested:int reason:str")


class CouplingCounts(TsvArtifact):
    """``results/{model}/coupling_counts.tsv``: significant layers (and boundaries) per checkpoint.

    :func:`resdyn.study_a.topology.significant_counts` plus ``model``: ``ckpt`` str,
    ``n_significant_layers``, ``n_layers``, ``n_layers_tested`` int (the headline: layers, as
    study A counts them), ``n_significant_boundaries``, ``n_boundaries`` int (detail: BH over
    boundaries), ``sign_dependence_rho``, ``sign_dependence_p`` float (NaN when fewer than 3
    boundaries were tested or a side is constant), ``model`` str.
    """

    relpath = "results/{model}/coupling_counts.tsv"
    columns = _cols("ckpt:str n_significant_layers:int n_layers:int n_layers_tested:int "
                    "n_significant_boundaries:int n_boundaries:int sign_dependence_rho:float "
                    "sign_dependence_p:float model:str")
    allow_nan = ("sign_dependence_rho", "sign_dependence_p")


class PartitionSimilarity(TsvArtifact):
    """``results/{model}/partition_similarity.tsv``: each checkpoint's communities vs a reference's.

    One row per (ckpt, layer, boundary, reference) (:func:`resdyn.study_a.partitions.partition_similarity`):
    ``ckpt`` str, ``layer`` int, ``boundary`` str, ``reference_ckpt`` str, ``reference`` str
    (``final`` | ``first``), ``nmi``, ``ari`` (of the two partitions of the same units),
    ``modularity`` (signed, of ``ckpt``'s partition) float, ``reason`` str (why a comparison is
    missing; its numbers are then NaN).
    """

    relpath = "results/{model}/partition_similarity.tsv"
    columns = _cols("ckpt:str layer:int boundary:str reference_ckpt:str reference:str nmi:float ari:float "
                    "modularity:float reason:str")


class SpectraArrays(Artifact):
    """``results/{model}/{ckpt}/spectra.h5``: the spectra behind ``spectra.tsv`` (schema ``resdyn.spectra/1``).

    * root attrs: ``schema`` = "resdyn.spectra/1", plus provenance attrs (scalars as is,
      anything else JSON-encoded as a string);
    * one group per sublayer ``L{layer:03d}_{kind}`` (kind attn, mlp or layer) with attrs
      ``layer``, ``kind``, ``s`` (:func:`resdyn.study_a.spectral.sublayer_index`) and 1-D datasets of
      one length d: ``eigenvalues`` complex128 sorted by descending |λ|, ``singular_values``
      float64 and ``singular_values_JmI`` float64 (of J − I), both descending.
    """

    relpath = _CKPT + "spectra.h5"
    SCHEMA = "resdyn.spectra/1"
    DATASETS: ClassVar[dict[str, Any]] = {"eigenvalues": np.complex128, "singular_values": np.float64,
                                          "singular_values_JmI": np.float64}
    _GROUP = re.compile(r"^L(\d{3,})_(attn|mlp|layer)$")

    @staticmethod
    def depth_index(layer: int, kind: str) -> int:
        """The group attr ``s`` = 2·layer + (0 for attn, 1 for mlp or layer).

        :func:`resdyn.study_a.spectral.sublayer_index` (a test keeps the two equal); repeated here so
        that this module imports nothing of resdyn but io: every script imports it, and its
        imports enter every rule's code version.
        """
        return 2 * int(layer) + (0 if kind == "attn" else 1)

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
        """Write ``arrays`` ({group: {dataset: array}}, :func:`resdyn.study_a.spectral.spectra_table`) atomically."""
        import h5py

        checked = cls._checked(arrays, path)
        with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            for k, v in (attrs or {}).items():
                f.attrs[str(k)] = cls._attr_value(v)
            f.attrs["schema"] = cls.SCHEMA  # last: provenance attrs may carry an upstream schema
            for name, (layer, kind, ds) in checked.items():
                g = f.create_group(name)
                g.attrs["layer"] = layer
                g.attrs["kind"] = kind
                g.attrs["s"] = cls.depth_index(layer, kind)
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

    One row per (layer, intervention) (:func:`resdyn.beyond.causal.causal_table`), :data:`CAUSAL_COLUMNS`:
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
    units = {"kl": "nats", "random_kl_mean": "nats", "random_kl_sd": "nats", "flip_rate": "fraction",
             "random_flip_mean": "fraction", "random_flip_sd": "fraction", "n_tokens": "tokens"}


class BridgeTable(TsvArtifact):
    """``results/{model}/{ckpt}/bridge.tsv``: subspace transport next to Jacobian and RSS profiles.

    One row per layer L = 0 … n−1 (:func:`resdyn.beyond.bridge.bridge_tables`): :data:`TRANSPORT_COLUMNS`
    (``layer``, ``k``, ``d`` int, ``transport``, ``random_mean``, ``random_sd``, ``random_p``
    float, ``n_random`` int, ``chance`` float), then the Jacobian profiles (extra float columns
    such as ``complex_frac_attn``, ``henrici_mlp``, ``cum_erank``), ``rss``, ``rss_k`` and
    ``phase``; a row whose numbers are empty (the last layer) says why in ``reason``. For
    parallel-residual models the attn/mlp profile columns are NaN (one operator per layer:
    ``complex_frac_layer``, ``henrici_layer``).
    """

    relpath = _CKPT + "bridge.tsv"
    allow_nan = ("complex_frac_attn", "complex_frac_mlp", "henrici_attn", "henrici_mlp")
    columns = _cols("layer:int k:int d:int transport:float random_mean:float random_sd:float random_p:float "
                    "n_random:int chance:float rss:float rss_k:int phase:int")
    extra_columns = True


class BridgeAlignment(TsvArtifact):
    """``results/{model}/{ckpt}/bridge_alignment.tsv``: where each Jacobian profile changes vs the phase cuts.

    One row per profile (:func:`resdyn.beyond.bridge.alignment_table`), :data:`ALIGNMENT_COLUMNS`:
    ``profile`` str, ``change_layer`` int, ``delta`` float, ``b1``, ``b2`` int, ``b1_found``,
    ``b2_found`` bool, ``dist_b1``, ``dist_b2``, ``dist_nearest`` int, ``chance_dist_nearest``
    float, ``n_positions`` int.
    """

    relpath = _CKPT + "bridge_alignment.tsv"
    columns = _cols("profile:str change_layer:int delta:float b1:int b2:int b1_found:bool b2_found:bool "
                    "dist_b1:int dist_b2:int dist_nearest:int chance_dist_nearest:float n_positions:int")


class BootstrapTable(TsvArtifact):
    """``results/{model}/{ckpt}/bootstrap.tsv``: bootstrap intervals over samples.

    :data:`BOOTSTRAP_COLUMNS` (:func:`resdyn.beyond.bootstrap.jacobian_bootstrap` +
    :func:`resdyn.beyond.bootstrap.not_bootstrapped_rows`): ``metric`` str, ``layer`` int, ``kind`` str,
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

    :data:`SCORECARD_COLUMNS` (:func:`resdyn.beyond.scorecard.scorecard`): ``claim_id``, ``claim``,
    ``statistic`` str, ``value``, ``ci_low``, ``ci_high`` float (NaN only in a row with a
    ``reason``), ``ci_source``, ``study_value``, ``verdict``, ``reason``, ``detail``, ``ckpts`` str.
    """

    relpath = "results/{model}/scorecard.tsv"
    columns = _cols("claim_id:str claim:str statistic:str value:float ci_low:float ci_high:float ci_source:str "
                    "study_value:str verdict:str reason:str detail:str ckpts:str")



class ClaimsTable(TsvArtifact):
    """``resdyn/data/claims.tsv`` (package data, not a run output): the studies' stated figures.

    One row per figure (docs/claims.md): ``claim_id`` (unique), ``study`` (A | B),
    ``study_model``, ``study_ckpt``, ``stated_value`` (the figure as the study states it, text),
    ``unit``, ``statement`` and ``our_output`` (where a run's comparable number lives), all str.
    The scorecard's ``study_value`` and ``paper_comparison.tsv``'s ``stated_value`` quote it.
    """

    relpath = ""  # shipped with the package: :meth:`packaged`, read with :meth:`load`
    columns = _cols("claim_id:str study:str study_model:str study_ckpt:str stated_value:str unit:str "
                    "statement:str our_output:str")

    @staticmethod
    def packaged() -> Path:
        """The table shipped in the package."""
        return Path(__file__).resolve().parent / "data" / "claims.tsv"

    @classmethod
    def load(cls, path: PathLike | None = None) -> pd.DataFrame:
        """The claims (the packaged table by default), checked: unique ids, study A or B, a figure each."""
        path = cls.packaged() if path is None else path
        table = cls.read(path).fillna("")
        dup = table["claim_id"][table["claim_id"].duplicated()].tolist()
        bad = table.loc[~table["study"].isin(["A", "B"]) | (table["stated_value"].str.strip() == ""), "claim_id"]
        if dup or len(bad):
            raise ArtifactError(f"{path}: claim ids must be unique (repeated: {dup}) and each needs study A or B "
                                f"and a stated value (bad: {bad.tolist()})")
        return table


class PaperComparison(TsvArtifact):
    """``results/paper_comparison.tsv``: each stated figure of the studies next to this run's number.

    One row per (claim, model, checkpoint, measure) (:func:`resdyn.beyond.paper.paper_comparison`):
    ``claim`` (a :class:`ClaimsTable` id), ``study``, ``model``, ``ckpt``, ``measure`` (what
    ``run_value`` is), ``stated_value`` (the study's figure as text, with its model), str;
    ``run_value``, ``ci_low``, ``ci_high`` float (the interval NaN where none exists);
    ``unit``, ``source_table``, ``reason`` str (why ``run_value`` is empty: a study switched
    off, a table without the metric, a claim the comparison does not know).
    """

    relpath = "results/paper_comparison.tsv"
    columns = _cols("claim:str study:str model:str ckpt:str measure:str stated_value:str run_value:float "
                    "ci_low:float ci_high:float unit:str source_table:str reason:str")
    allow_nan = ("ci_low", "ci_high")


# --------------------------------------------------------------------------------------------
# Study B: lens metrics, RSS profile, resolution, phase cuts, phase metrics, scaling


class LensMetrics(TsvArtifact):
    """``results/{model}/{ckpt}/lens_metrics.tsv``: readout quality of the tuned and the logit lens.

    One row per (lens, layer) (:func:`resdyn.study_b.lens.lens_metrics`): ``lens`` str (tuned | logit),
    ``layer`` int, ``kl``, ``ce``, ``hit1``, ``hit5`` float, ``n_tokens`` int, ``converged``
    bool, ``steps``, ``converged_step`` int, ``final_heldout_kl`` float, ``reason`` str (why a
    row's numbers are empty, e.g. the logit lens has no training record).
    """

    relpath = _CKPT + "lens_metrics.tsv"
    columns = _cols("lens:str layer:int kl:float ce:float hit1:float hit5:float n_tokens:int converged:bool "
                    "steps:int converged_step:int final_heldout_kl:float reason:str")
    units = {"kl": "nats", "ce": "nats", "final_heldout_kl": "nats", "hit1": "fraction", "hit5": "fraction",
             "n_tokens": "tokens", "steps": "optimizer steps", "converged_step": "optimizer steps"}


#: pandas ≥ 3 parses floats round-trip exactly by default (and deprecates the option); 2.x needs it.
_ROUND_TRIP: dict[str, str] = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


@dataclass(frozen=True)
class LensFiles:
    """What :meth:`LensFolder.read` returns: ``weight`` (n, d, d) float32 = W_L stacked, ``bias``
    (n, d) float32 = b_L, ``curves`` (step, layer, split, kl) and ``config`` (config.json)."""

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
    * ``curves.tsv``: ``step`` int, ``layer`` int, ``split`` (train | heldout), ``kl`` float64
      written with 17 significant digits (read back exactly);
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

    relpath = _CKPT + "lens"
    FORMAT = "resdyn.lens/1"
    TRANSLATORS_FILE = "translators.safetensors"
    CONFIG_FILE = "config.json"
    CURVES_FILE = "curves.tsv"
    TUNED_LENS_DIR = "tuned_lens"
    #: The two files of tuned-lens's format (its ``TunedLens.save``).
    TUNED_LENS_CONFIG, TUNED_LENS_PARAMS = "config.json", "params.pt"
    CURVE_COLUMNS: ClassVar[list[str]] = ["step", "layer", "split", "kl"]
    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ("format", "d_model", "n_layers", "vocab_size", "unembed_hash")

    @classmethod
    def write(cls, directory: PathLike, weight: np.ndarray, bias: np.ndarray, curves: pd.DataFrame,
              config: Mapping[str, Any]) -> Path:
        """Write the three files into ``directory`` (created if needed); returns the folder."""
        from safetensors.numpy import save_file

        directory = Path(directory)
        weight, bias = np.ascontiguousarray(weight, np.float32), np.ascontiguousarray(bias, np.float32)
        if weight.ndim != 3 or weight.shape[1] != weight.shape[2] or bias.shape != weight.shape[:2]:
            raise ArtifactError(f"{directory}: refusing to write translators of shapes {weight.shape}, {bias.shape}; "
                                "expected (n, d, d) and (n, d)")
        missing = [c for c in cls.CURVE_COLUMNS if c not in curves.columns]
        if missing or config.get("format") != cls.FORMAT:
            raise ArtifactError(f"{directory}: refusing to write a lens with curve columns {list(curves.columns)} "
                                f"and format {config.get('format')!r} (need {cls.CURVE_COLUMNS}, {cls.FORMAT!r})")
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
            raise ValueError(f"{path}: 'bias' has shape {None if bias is None else bias.shape}; "
                             f"expected {weight.shape[:2]} (n, d)")
        return weight, bias

    @classmethod
    def read(cls, directory: PathLike) -> LensFiles:
        """The validated folder; ValueError/ArtifactError naming the file and the fault."""
        directory = Path(directory)
        cfg = cls.read_config(directory)
        weight, bias = cls._read_translators(directory)
        if weight.shape[:2] != (cfg["n_layers"], cfg["d_model"]):
            raise ArtifactError(f"{directory / cls.TRANSLATORS_FILE}: translators of shape {weight.shape}, but "
                                f"{cls.CONFIG_FILE} says n_layers={cfg['n_layers']}, d_model={cfg['d_model']}")
        bad = [name for name, a in (("weight", weight), ("bias", bias)) if not np.isfinite(a).all()]
        if bad:
            raise ArtifactError(f"{directory / cls.TRANSLATORS_FILE}: {bad[0]} holds NaN/Inf")
        path = directory / cls.CURVES_FILE
        try:
            curves = pd.read_csv(path, sep="\t", **_ROUND_TRIP)
        except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError) as err:
            raise ValueError(f"{path}: not a readable curves table ({err})") from err
        if list(curves.columns) != cls.CURVE_COLUMNS:
            raise ArtifactError(f"{path}: columns {list(curves.columns)}, expected {cls.CURVE_COLUMNS}")
        return LensFiles(weight=weight, bias=bias, curves=curves, config=cfg)

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
    "resdyn.lens-checkpoint/1", ``key`` (the fingerprint of everything the trajectory depends on,
    :func:`resdyn.study_b.lens.trainer._fingerprint`), and the training loop's state (translators, optimizer state,
    step, curve rows, held-out history, convergence counters, stream position;
    :func:`resdyn.study_b.lens.trainer._fit`). :meth:`load` returns None for a missing file and, with a warning
    naming the file and the fault, for one of another format or key or that does not load.
    """

    FORMAT = "resdyn.lens-checkpoint/1"

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
            if not isinstance(state, dict) or state.get("format") != cls.FORMAT or state.get("key") != key:
                raise ValueError("it was written for another model, other tokens or other options")
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

    relpath = _CKPT + "rss.tsv"
    columns = _cols("layer:int k:int k_fraction:float d:int rss:float grassmann_distance:float energy:float")
    units = {"grassmann_distance": "radians", "k_fraction": "fraction of d", "energy": "fraction"}


class ResolutionTable(TsvArtifact):
    """``results/{model}/{ckpt}/resolution.tsv``: energy vs visibility of each readout dimension.

    One row per configured fraction (:func:`resdyn.study_b.readout.resolution_table`): ``k_fraction``
    float, ``k`` int, ``energy``, ``mean_rss``, ``visibility`` float, ``pareto`` bool.
    """

    relpath = _CKPT + "resolution.tsv"
    columns = _cols("k_fraction:float k:int energy:float mean_rss:float visibility:float pareto:bool")
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
    this module imports nothing of resdyn but io (its imports enter every rule's code version).
    """

    relpath = _CKPT + "phases.json"
    KEYS = ("b1", "b2", "peak", "b1_found", "b2_found", "reason", "spans", "widths", "n", "window", "method",
            "sensitivity", "notes", "profile", "smoothed", "stages")

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

    relpath = _CKPT + "geometry.tsv"
    columns = _cols("layer:int state:str n_tokens:int hidden_erank:float update_orthogonality:float "
                    "attn_orthogonality:float mlp_orthogonality:float n_excluded:int norm_ratio:float "
                    "norm_ratio_of_means:float relative_update_norm:float update_norm:float attn_update_norm:float "
                    "mlp_update_norm:float update_erank:float attn_update_erank:float mlp_update_erank:float "
                    "logit_hit1:float logit_hit5:float tuned_hit1:float tuned_hit5:float "
                    "logit_hit5_over_hit1:float tuned_hit5_over_hit1:float")
    allow_nan = ("update_orthogonality", "attn_orthogonality", "mlp_orthogonality", "n_excluded", "norm_ratio",
                 "norm_ratio_of_means", "relative_update_norm", "update_norm", "attn_update_norm",
                 "mlp_update_norm", "update_erank", "attn_update_erank", "mlp_update_erank", "logit_hit1",
                 "logit_hit5", "tuned_hit1", "tuned_hit5", "logit_hit5_over_hit1", "tuned_hit5_over_hit1")
    extra_columns = True


class PhaseMetrics(TsvArtifact):
    """``results/{model}/{ckpt}/phase_metrics.tsv``: geometry summarised per phase.

    One row per (phase, metric) (:func:`resdyn.study_b.geometry.phase_table`): ``phase`` int (1–3),
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

    :func:`resdyn.study_b.geometry.depth_scaling` plus ``group``: ``phase`` int, ``status`` str,
    ``slope``, ``intercept``, ``slope_ci_low``, ``slope_ci_high``, ``slope_se``, ``p_value``,
    ``r_squared`` float (NaN only in a row with a ``reason``), ``n_models``, ``n_depths``,
    ``n_obs`` int, ``reason`` str, ``group`` str.
    """

    relpath = "results/scaling/phase_widths.tsv"
    columns = _cols("phase:int status:str slope:float intercept:float slope_ci_low:float slope_ci_high:float "
                    "slope_se:float p_value:float r_squared:float n_models:int n_depths:int n_obs:int reason:str "
                    "group:str")



# --------------------------------------------------------------------------------------------
# data side: corpus, samples, checkpoint record, activations, Jacobians


class TrainingCurve(TsvArtifact):
    """``models/{model}/training.tsv``: the loss curve of a zoo model's training.

    One row per evaluation (:func:`resdyn.lm.zoo.train_zoo_model`): ``step``, ``lr`` float,
    ``train_loss`` (NaN at step 0, whose ``reason`` says there was no batch yet),
    ``heldout_loss``, ``unigram_loss`` (the held-out loss of the unigram baseline) float,
    ``reason`` str.
    """

    relpath = "models/{model}/training.tsv"
    columns = _cols("step:int lr:float train_loss:float heldout_loss:float unigram_loss:float reason:str")
    units = {"step": "optimizer steps", "train_loss": "nats/token", "heldout_loss": "nats/token",
             "unigram_loss": "nats/token"}


class Corpus(Artifact):
    """``results/data/{dataset}/{split}.jsonl`` (split train | heldout): the documents of a corpus split.

    UTF-8 JSON lines, one object ``{"text": str}`` per document, in corpus order.
    """

    relpath = "results/data/{dataset}/{split}.jsonl"

    @staticmethod
    def write(docs: Sequence[str], path: PathLike) -> None:
        """Write the documents atomically, one JSON line each."""
        with io.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")

    @staticmethod
    def read(path: PathLike) -> list[str]:
        """The documents; ValueError naming file and line for a line that is not ``{"text": str}``."""
        docs = []
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    raise ValueError(f"{path}:{i}: not a document line ({err})") from err
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{i}: not a document line (text is a {type(text).__name__}, not a string)")
                docs.append(text)
        return docs


class Samples(Artifact):
    """``results/{model}/samples.h5`` (and ``lens_tokens.h5``): the token blocks every analysis reads.

    HDF5 datasets ``input_ids`` (N, T) integer token ids and ``sample_ids`` (N,) integer (the
    block's start offset in its token stream); root attrs: the caller's (dataset, split file,
    seed, …; dicts/lists as JSON strings) and ``samples_hash`` = SHA-256 of both arrays
    (:func:`resdyn.io.sha256_array`), re-checked on read.
    """

    relpath = "results/{model}/samples.h5"

    @staticmethod
    def write(path: PathLike, input_ids: np.ndarray, sample_ids: np.ndarray, attrs: Mapping[str, Any]) -> str:
        """Write the samples atomically; returns their ``samples_hash``."""
        import h5py

        digest = io.sha256_array(input_ids, sample_ids)
        with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("input_ids", data=input_ids)
            f.create_dataset("sample_ids", data=sample_ids)
            for k, v in {**attrs, "samples_hash": digest}.items():
                f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
        return digest

    @staticmethod
    def read(path: PathLike) -> tuple[np.ndarray, np.ndarray, dict]:
        """(input_ids, sample_ids, attrs), validated: shapes, integer dtypes and the content hash."""
        import h5py

        try:
            with h5py.File(path, "r") as f:
                ids, sids = f["input_ids"][()], f["sample_ids"][()]
                attrs = dict(f.attrs)
        except (OSError, KeyError) as err:
            raise ValueError(f"{path}: not a readable samples file ({err})") from err
        if ids.ndim != 2 or sids.shape != (ids.shape[0],):
            raise ArtifactError(f"{path}: input_ids must be (N, T) and sample_ids (N,), got {ids.shape} and {sids.shape}")
        if ids.dtype.kind not in "iu" or sids.dtype.kind not in "iu":
            raise ArtifactError(f"{path}: input_ids and sample_ids must be integers, got {ids.dtype} and {sids.dtype}")
        if attrs.get("samples_hash") != io.sha256_array(ids, sids):
            raise ValueError(f"{path}: content does not match its recorded samples_hash (corrupted?)")
        return ids, sids, attrs


class CheckpointRecord(Artifact):
    """``models/{model}/{ckpt}/checkpoint.json``: where one checkpoint's weights are, and their hash.

    The JSON object of :func:`resdyn.lm.models.resolve_checkpoint`: the checkpoint's config entry
    (``model``, ``checkpoint``, ``source``, ``dtype``, ``repo``/``revision`` or ``path``, …) plus
    ``folder`` (absolute path of the weights), ``resolved_commit`` (hub commit or null),
    ``weight_files`` (list of names), ``content_hash`` and ``tokenizer_hash`` (SHA-256 hex of the
    weight and tokenizer files, :func:`resdyn.io.sha256_tree`).
    """

    relpath = "models/{model}/{ckpt}/checkpoint.json"
    REQUIRED: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "model": str, "checkpoint": str, "source": str, "folder": str, "weight_files": list,
        "content_hash": str, "tokenizer_hash": str,
    }

    @classmethod
    def validate(cls, record: Any, where: PathLike) -> dict:
        """The record if it has every required key with the right type; ArtifactError naming ``where``."""
        if not isinstance(record, dict):
            raise ArtifactError(f"{where}: expected a JSON object (checkpoint record), got {type(record).__name__}")
        missing = [k for k in cls.REQUIRED if k not in record]
        if missing:
            raise ArtifactError(f"{where}: lacks key(s) {missing} (a checkpoint record has {list(cls.REQUIRED)})")
        for k, t in cls.REQUIRED.items():
            if not isinstance(record[k], t):
                raise ArtifactError(f"{where}: {k} must be a {t.__name__}, got {record[k]!r:.80}")
        for k in ("content_hash", "tokenizer_hash"):
            if not re.fullmatch(r"[0-9a-f]{64}", record[k]):
                raise ArtifactError(f"{where}: {k} must be a SHA-256 hex digest, got {record[k]!r:.80}")
        return record

    @classmethod
    def write(cls, record: dict, path: PathLike) -> None:
        """Write the record atomically (validated first)."""
        io.write_json(cls.validate(record, path), path)

    @classmethod
    def read(cls, path: PathLike) -> dict:
        """The validated record."""
        return cls.validate(io.read_json(path), path)


class Activations(Artifact):
    """``results/{model}/{ckpt}/activations/layer{L:03d}.h5``: residual states at every boundary.

    Schema ``resdyn.activations/1``: datasets ``pre_attn`` (N, T', d) = h_L and ``pre_mlp``
    (N, T', d) = m_L (the last layer's file also ``output``, its raw output before the final
    norm), ``sample_ids`` (N,), ``positions`` (T',); attrs ``schema``, ``layer``,
    ``skip_positions``, ``residual`` (sequential | parallel; for a parallel layer ``pre_mlp`` is
    not a boundary) and the checkpoint and samples provenance (dicts/lists as JSON strings).
    Writers: :meth:`write` (all states in memory) and :meth:`stream` (one sample at a time, the
    same datasets and attributes); both atomic. Readers: :meth:`layers`, :meth:`boundaries`, :meth:`read_boundary`,
    :meth:`read_all_boundaries`, :meth:`view`.
    """

    relpath = _CKPT + "activations"
    SCHEMA = "resdyn.activations/1"
    RESIDUAL_KINDS: ClassVar[tuple[str, str]] = ("sequential", "parallel")

    @staticmethod
    def layer_file(folder: PathLike, layer: int) -> Path:
        """The file of one layer inside the folder."""
        return Path(folder) / f"layer{int(layer):03d}.h5"

    @staticmethod
    def layer_files(folder: PathLike) -> list[Path]:
        """The layer files of the folder, in layer order."""
        return sorted(Path(folder).glob("layer*.h5"))

    @classmethod
    def layers(cls, folder: PathLike) -> list[tuple[int, Path]]:
        """(layer, file) of every layer file, the layer read from the file's own ``layer`` attr.

        ValueError naming the file when it cannot be read, has no ``layer`` or the layers are not
        0 … n−1 in file order.
        """
        import h5py

        out = []
        for i, path in enumerate(cls.layer_files(folder)):
            try:
                with h5py.File(path, "r") as f:
                    layer = int(f.attrs["layer"])
            except (OSError, KeyError) as err:
                raise ValueError(f"{path}: cannot read the activation file's layer attribute ({err})") from err
            if layer != i:
                raise ValueError(f"{path}: holds layer {layer}, but it is file {i} of the folder (expected layers "
                                 "0..n-1 in order)")
            out.append((layer, path))
        return out

    @classmethod
    def _check_residual(cls, residual: str) -> None:
        if residual not in cls.RESIDUAL_KINDS:
            raise ValueError(f"residual={residual!r}: allowed are {cls.RESIDUAL_KINDS}")

    @classmethod
    def _write_index(cls, f: Any, layer: int, sample_ids: np.ndarray, positions: np.ndarray, skip_positions: int,
                     residual: str, attrs: Mapping[str, Any]) -> None:
        """The part of a layer file that is not the states: ids, positions and attributes."""
        f.create_dataset("sample_ids", data=sample_ids)
        f.create_dataset("positions", data=positions)
        f.attrs.update({"schema": cls.SCHEMA, "layer": layer, "skip_positions": skip_positions, "residual": residual})
        for k, v in attrs.items():
            f.attrs[k] = v if isinstance(v, (int, float, str)) else json.dumps(v)

    @classmethod
    def write(cls, states: np.ndarray, sample_ids: np.ndarray, skip_positions: int, out_dir: PathLike,
              dtype: str, attrs: Mapping[str, Any], residual: str = "sequential") -> list[Path]:
        """Write one ``layer{L:03d}.h5`` per layer of ``states`` (N, 2·n_layers + 1, T', d) atomically.

        ``residual`` (sequential | parallel) is stored as a file attribute: for "parallel" layers
        ``pre_mlp`` holds the virtual state h_L + A (not a boundary) and :meth:`boundaries` lists
        ``pre_attn`` only.
        """
        import h5py

        cls._check_residual(residual)
        n_layers = (states.shape[1] - 1) // 2
        positions = np.arange(skip_positions, skip_positions + states.shape[2])
        paths = []
        for layer in range(n_layers):
            path = cls.layer_file(out_dir, layer)
            with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
                f.create_dataset("pre_attn", data=states[:, 2 * layer].astype(dtype))
                f.create_dataset("pre_mlp", data=states[:, 2 * layer + 1].astype(dtype))
                if layer == n_layers - 1:
                    f.create_dataset("output", data=states[:, -1].astype(dtype))
                cls._write_index(f, layer, sample_ids, positions, skip_positions, residual, attrs)
            paths.append(path)
        return paths

    @classmethod
    @contextlib.contextmanager
    def stream(cls, out_dir: PathLike, n_layers: int, n_samples: int, length: int, d: int, dtype: str,
               sample_ids: np.ndarray, skip_positions: int, attrs: Mapping[str, Any],
               residual: str = "sequential") -> Iterator[Any]:
        """Open every layer file for writing and yield ``put(i, states)``, which stores sample i's
        (2·n_layers + 1, T', d) states; the files are renamed into place only when the block ends
        without an exception (datasets and attributes equal :meth:`write`'s). Host memory: one sample."""
        import h5py

        cls._check_residual(residual)
        positions = np.arange(skip_positions, skip_positions + length)
        with contextlib.ExitStack() as stack:
            files = []
            for layer in range(n_layers):
                tmp = stack.enter_context(io.atomic_path(cls.layer_file(out_dir, layer)))
                f = stack.enter_context(h5py.File(tmp, "w"))
                names = ["pre_attn", "pre_mlp"] + (["output"] if layer == n_layers - 1 else [])
                for name in names:
                    f.create_dataset(name, shape=(n_samples, length, d), dtype=dtype)
                cls._write_index(f, layer, sample_ids, positions, skip_positions, residual, attrs)
                files.append(f)

            def put(i: int, x: np.ndarray) -> None:
                for layer, f in enumerate(files):
                    f["pre_attn"][i] = x[2 * layer].astype(dtype)
                    f["pre_mlp"][i] = x[2 * layer + 1].astype(dtype)
                    if layer == n_layers - 1:
                        f["output"][i] = x[-1].astype(dtype)

            yield put

    @staticmethod
    def boundaries(path: PathLike) -> tuple[str, ...]:
        """The residual boundaries of a layer file: ("pre_attn", "pre_mlp"), or ("pre_attn",) for a
        parallel-residual layer (its one boundary h_L; attr ``residual``, absent = sequential)."""
        import h5py

        try:
            with h5py.File(path, "r") as f:
                residual = f.attrs.get("residual", "sequential")
        except OSError as err:
            raise ValueError(f"{path}: cannot read activations ({err})") from err
        return ("pre_attn",) if residual == "parallel" else ("pre_attn", "pre_mlp")

    @staticmethod
    def read_boundary(path: PathLike, boundary: str) -> np.ndarray:
        """One boundary's states of a layer file, (N, T', d) as float32; names file and key on error."""
        import h5py

        try:
            with h5py.File(path, "r") as f:
                return f[boundary][()].astype(np.float32)
        except (OSError, KeyError) as err:
            raise ValueError(f"{path}: cannot read activations '{boundary}' ({err})") from err

    @classmethod
    def read_all_boundaries(cls, folder: PathLike) -> np.ndarray:
        """Reassemble (N, 2·n_layers + 1, T', d) boundary states from a folder of layer files."""
        files = cls.layer_files(folder)
        if not files:
            raise FileNotFoundError(f"no layer*.h5 activation files in {folder}")
        parts = []
        for path in files:
            parts += [cls.read_boundary(path, "pre_attn"), cls.read_boundary(path, "pre_mlp")]
        parts.append(cls.read_boundary(files[-1], "output"))
        return np.stack(parts, axis=1)

    @staticmethod
    def view(folder: PathLike) -> BoundaryView:
        """Every state of the folder, read lazily (:class:`BoundaryView`)."""
        return BoundaryView(folder)


class BoundaryView:
    """:meth:`Activations.read_all_boundaries` without reading: a lazy (N, 2·n_layers + 1, T', d)
    float32 view of a folder of layer files for :func:`resdyn.study_b.geometry.layer_geometry`, which
    indexes it as ``view[samples, state, positions, units]`` (an int state, slices elsewhere) one
    state and one chunk of samples at a time — host memory is a chunk, not N·(2n+1)·T'·d·4 bytes
    (140 GB at Llama-3.1-8B shapes with N = 1000, T = 128)."""

    def __init__(self, folder: PathLike):
        import h5py

        self.files = Activations.layer_files(folder)
        if not self.files:
            raise FileNotFoundError(f"no layer*.h5 activation files in {folder}")
        try:
            with h5py.File(self.files[0], "r") as f:
                n, t, d = f["pre_attn"].shape
        except (OSError, KeyError) as err:
            raise ValueError(f"{self.files[0]}: cannot read activations 'pre_attn' ({err})") from err
        self.shape = (int(n), 2 * len(self.files) + 1, int(t), int(d))

    def _where(self, state: int) -> tuple[Path, str]:
        n_states = self.shape[1]
        if not -n_states <= state < n_states:
            raise IndexError(f"state {state} outside 0..{n_states - 1}")
        state %= n_states
        if state == n_states - 1:
            return self.files[-1], "output"
        return self.files[state // 2], ("pre_attn", "pre_mlp")[state % 2]

    def __getitem__(self, key: tuple) -> np.ndarray:
        import h5py

        if not (isinstance(key, tuple) and len(key) == 4 and isinstance(key[1], (int, np.integer))):
            raise TypeError(f"index as view[samples, state, positions, units] with an int state, got {key!r}")
        samples, state, positions, units = key
        path, name = self._where(int(state))
        try:
            with h5py.File(path, "r") as f:
                return f[name][samples, positions, units].astype(np.float32)
        except (OSError, KeyError) as err:
            raise ValueError(f"{path}: cannot read activations '{name}' ({err})") from err


# Jacobian layer files: the validated reader (h5py inside the functions, like every HDF5 method here)

#: (layer, kind) → a zero-argument callable returning one matrix (or stack) as float64.
Loaders = dict[tuple[int, str], Any]


@dataclass(frozen=True)
class JacobianFiles:
    """The validated index of a run's ``layer*.h5`` files (schema: :class:`JacobianBlocks`), with lazy loaders.

    Attributes:
        files: the files, sorted by name.
        attrs: file attributes of the first file (numpy arrays as lists).
        d: the hidden size (every ``mean`` is d × d).
        n_samples_total: N, the samples every mean averages (``count``; equal in every group).
        n_stored: n, the samples whose whole Jacobians are stored (``per_sample``; 0 if none).
        sample_ids: (n,) ids of the stored samples (the first n of ``sample_ids``).
        means: {(layer, kind): loader → (d, d) float64 mean Jacobian} for the operators of the
            sublayer chain: 'attn' and 'mlp' per sequential layer, 'layer' (I + J_A + J_F) per
            parallel-residual layer; layers 0 … L−1 without gaps.
        per_sample: {(layer, kind): loader → (n, d, d) float64}, each stored sample's Jacobian
            averaged over its P positions, same keys as ``means``; empty when n = 0.
        branches: {(layer, 'attn_branch' | 'mlp_branch'): loader → (d, d) float64} of
            parallel-residual layers; empty for sequential models.

    Loaders read one dataset when called (a model's matrices are never all in memory) and
    raise FloatingPointError naming the file and dataset if it holds NaN/Inf, ValueError if its
    shape is no longer the indexed one.
    """

    files: tuple[Path, ...]
    attrs: dict[str, Any]
    d: int
    n_samples_total: int
    n_stored: int
    sample_ids: np.ndarray
    means: Loaders
    per_sample: Loaders
    branches: Loaders


def _jacobian_loader(path: Path, kind: str, name: str, shape: tuple[int, ...], average_positions: bool = False):
    def load() -> np.ndarray:
        import h5py

        with h5py.File(path, "r") as f:
            x = f[kind][name][()]
        if x.shape != shape:
            raise ValueError(f"{path}: {kind}/{name} has shape {x.shape}, expected {shape} "
                             "(the file changed after it was indexed)")
        x = x.astype(np.float64)
        if average_positions:
            x = x.mean(axis=1)  # (n, P, d, d) -> per-sample mean over positions
        bad = ~np.isfinite(x)
        if bad.any():
            raise FloatingPointError(f"{path}: {kind}/{name} has {int(bad.sum())} non-finite entries (NaN/Inf)")
        return x

    return load


def _jacobian_group_index(f: Any, path: Path, kind: str) -> dict[str, Any]:
    """Shapes and sample bookkeeping of one group, validated (ValueError naming file and group)."""
    import h5py

    if kind not in f or not isinstance(f[kind], h5py.Group):
        raise ValueError(f"{path}: not a readable Jacobian file (no group {kind!r})")
    g = f[kind]
    missing = [name for name in ("mean", "count", "sample_ids") if name not in g]
    if missing:
        raise ValueError(f"{path}: group {kind!r} lacks dataset {missing[0]!r}")
    mean_shape = tuple(g["mean"].shape)
    if len(mean_shape) != 2 or mean_shape[0] != mean_shape[1] or mean_shape[0] == 0:
        raise ValueError(f"{path}: {kind}/mean has shape {mean_shape}; expected a square (d, d) matrix")
    d = mean_shape[0]
    count = int(g["count"][()])
    ids = np.asarray(g["sample_ids"][()])
    if ids.shape != (count,):
        raise ValueError(f"{path}: {kind}/sample_ids has shape {ids.shape}, but count = {count}")
    per_shape = tuple(g["per_sample"].shape) if "per_sample" in g else None
    if per_shape is not None and (len(per_shape) != 4 or per_shape[2:] != (d, d) or not 1 <= per_shape[0] <= count):
        raise ValueError(f"{path}: {kind}/per_sample has shape {per_shape}; expected (n, P, {d}, {d}) "
                         f"with 1 <= n <= count = {count}")
    return {"d": d, "count": count, "ids": ids, "per_shape": per_shape}


class JacobianBlocks(Artifact):
    """``results/{model}/{ckpt}/jacobians/{block}/layer{L:03d}.h5``: per-layer mean and per-sample Jacobians.

    Schema ``resdyn.jacobian/1`` (one file per layer, written by :meth:`write_layer` from the
    sums of :func:`resdyn.study_a.jacobian.write_layer_block`); N samples, P positions per sample
    (default P = 1: the last token), d = hidden size:

    file attrs      the caller's ``attrs`` (model id, revision, content hash, dtype, samples hash,
                    code version, ...; dicts/lists as JSON strings), plus ``layer`` (int),
                    ``family`` (str), ``residual`` (sequential | parallel), ``d_model`` (int),
                    ``positions`` (int array, P), ``n_samples`` (int N), ``store_dtype`` (str),
                    ``spectral_norm_method`` (str), ``schema`` (str, "resdyn.jacobian/1").
    /positions      (P,) int64       token positions the Jacobians are taken at
    /sample_ids     (N,) int64 or utf-8 str   the samples, in processing order
    /attn/, /mlp/   one group per sublayer kind, each with
      mean                (d, d) float32|float64   Σ_{samples, positions} J / (N·P), summed in float64
      count               () int64     number of samples N (attr ``n_jacobians`` = N·P)
      sample_ids          (N,)         same as /sample_ids (kept per group for self-contained reads)
      fro_minus_identity  (N, P) float64   ‖J − I‖_F per sample and position
      trace               (N, P) float64   tr J
      spectral_norm       (N, P) float64   σ_max(J) (method in the file attr)
      per_sample          (n, P, d, d) float32, optional: the first n = ``store_first_n`` samples'
                          Jacobians, chunked (1, 1, d, d) and gzip-compressed

    A parallel-residual layer's file holds the groups ``/layer/`` (the operator I + J_A + J_F),
    ``/attn_branch/`` and ``/mlp_branch/`` (J_A, J_F) with the same datasets.

    The one reader is :meth:`read` (validating schema, shapes and, on load, finiteness;
    :meth:`read_means`, :meth:`read_branches` and :meth:`read_per_sample` build on it): it needs
    h5py and numpy only, so the jobs that analyse the files start without torch. The resumable
    partial sums of a running job are :class:`JacobianSums`.
    """

    relpath = _CKPT + "jacobians/{block}"
    KINDS: ClassVar[tuple[str, str]] = ("attn", "mlp")
    #: Groups of a parallel-residual layer's file: the operator ``layer`` = I + J_A + J_F first,
    #: then the two branch Jacobians J_A, J_F (without the identity) stored beside it.
    PARALLEL_KINDS: ClassVar[tuple[str, str, str]] = ("layer", "attn_branch", "mlp_branch")
    #: The kinds that are operators of the sublayer chain (what :meth:`read_means` returns).
    OPERATOR_KINDS: ClassVar[tuple[str, str, str]] = ("attn", "mlp", "layer")
    SCHEMA = "resdyn.jacobian/1"
    #: Per-sample, per-position scalars stored in every group (float64 (N, P)).
    SUMMARIES: ClassVar[tuple[str, str, str]] = ("fro_minus_identity", "trace", "spectral_norm")

    @staticmethod
    def layer_file(folder: PathLike, layer: int) -> Path:
        """The file of one layer inside a block folder."""
        return Path(folder) / f"layer{int(layer):03d}.h5"

    @staticmethod
    def staging(out: PathLike) -> Path:
        """The folder a block job writes into (files and partial sums) before :meth:`publish`.

        It lies beside the declared output ``out``: Snakemake clears the outputs of an incomplete
        job before rerunning it, which would discard the partial sums.
        """
        out = Path(out)
        return out.with_name(f".{out.name}.staging")

    @staticmethod
    def publish(staging: PathLike, out: PathLike) -> None:
        """Move the finished staging folder onto the block folder ``out`` (replacing what is there)."""
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        Path(staging).rename(out)

    @staticmethod
    def _attr(value: Any) -> Any:
        """A value h5py can store as an attribute: scalars/strings/numeric arrays as is, else JSON."""
        if isinstance(value, (str, bool, int, float, np.generic)):
            return value
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            return value
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
            return np.asarray(value)
        return json.dumps(value, sort_keys=True, default=str)

    @classmethod
    def write_layer(cls, path: PathLike, layer: int, sums: JacobianSums, sample_ids: np.ndarray,
                    positions: Sequence[int], store_dtype: str, attrs: Mapping[str, Any], family: str,
                    spectral_norm_method: str) -> None:
        """Write layer ``layer``'s file from the finished ``sums`` atomically (schema above).

        ``mean`` = sum / (N·P) cast to ``store_dtype``; ``per_sample`` only when ``sums`` keeps
        whole Jacobians (n > 0).
        """
        import h5py

        n_samples, n_positions = len(sample_ids), len(positions)
        if sums.next_index != n_samples:
            raise ValueError(f"{path}: refusing to write layer {layer}: the sums cover {sums.next_index} of "
                             f"{n_samples} samples")
        ids = (sample_ids.astype(np.int64) if sample_ids.dtype.kind in "iu"
               else np.array([str(s) for s in sample_ids], dtype=h5py.string_dtype("utf-8")))
        kinds = sums.kinds[layer]
        d = sums.d
        with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            for key, value in attrs.items():
                f.attrs[key] = cls._attr(value)
            f.attrs.update(
                {
                    "layer": layer,
                    "family": family,
                    "residual": "parallel" if tuple(kinds) == cls.PARALLEL_KINDS else "sequential",
                    "d_model": d,
                    "positions": np.asarray(positions, np.int64),
                    "n_samples": n_samples,
                    "store_dtype": store_dtype,
                    "spectral_norm_method": spectral_norm_method,
                    "schema": cls.SCHEMA,
                }
            )
            f.create_dataset("positions", data=np.asarray(positions, np.int64))
            f.create_dataset("sample_ids", data=ids)
            for kind in kinds:
                g = f.create_group(kind)
                g.create_dataset("mean", data=(sums.sums[(layer, kind)] / (n_samples * n_positions)).astype(store_dtype))
                g.create_dataset("count", data=np.int64(n_samples))
                g["count"].attrs["n_jacobians"] = n_samples * n_positions
                g.create_dataset("sample_ids", data=ids)
                for s in cls.SUMMARIES:
                    g.create_dataset(s, data=sums.per[(layer, kind, s)])
                first = sums.first[(layer, kind)]
                if first.shape[0]:
                    g.create_dataset("per_sample", data=first, chunks=(1, 1, d, d), compression="gzip")

    @classmethod
    def read(cls, folders: Sequence[PathLike]) -> JacobianFiles:
        """Index and validate the ``layer*.h5`` files of block folders: the single Jacobian reader.

        Checks, before any matrix is loaded, naming the file and what is wrong: every file opens
        and has a ``layer`` attribute; it has the groups of its residual type ('attn' and 'mlp',
        or 'layer'); each group has ``mean`` (d × d, the same d everywhere), ``count`` and
        ``sample_ids`` (count of them), and if present ``per_sample`` of shape (n, P, d, d); every
        group agrees on N (``count``), on whether ``per_sample`` is stored, its n and the stored
        samples' ids; no (layer, kind) appears twice; layers are 0 … L−1 without gaps. Values are
        checked for NaN/Inf when a loader reads them (:class:`JacobianFiles`).

        Raises:
            FileNotFoundError: no ``layer*.h5`` in the folders.
            ValueError: any of the problems above, naming the file (and group).
        """
        import h5py

        files = sorted(p for folder in folders for p in Path(folder).glob("layer*.h5"))
        if not files:
            raise FileNotFoundError(f"no layer*.h5 Jacobian files in {list(map(str, folders))}")
        means: Loaders = {}
        per: Loaders = {}
        branches: Loaders = {}
        attrs: dict[str, Any] = {}
        ref: dict[str, Any] | None = None  # the first operator group: what every other must agree with
        ref_where = ""
        for path in files:
            try:
                with h5py.File(path, "r") as f:
                    layer = int(f.attrs["layer"])
                    if not attrs:
                        attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
                    kinds = ("layer",) if "layer" in f else cls.KINDS
                    index = {kind: _jacobian_group_index(f, path, kind) for kind in kinds}
                    branch_index = {kind: _jacobian_group_index(f, path, kind) for kind in cls.PARALLEL_KINDS[1:] if kind in f}
            except (OSError, KeyError) as err:
                raise ValueError(f"{path}: not a readable Jacobian file ({err})") from err
            for kind, g in {**index, **branch_index}.items():
                where = f"{path}: {kind}"
                if ref is None:
                    ref, ref_where = g, where
                if g["d"] != ref["d"]:
                    raise ValueError(f"{where}/mean is {g['d']}×{g['d']}, but {ref_where}/mean is {ref['d']}×{ref['d']}; "
                                     "all files must come from one model")
                if kind in cls.PARALLEL_KINDS[1:]:
                    branches[(layer, kind)] = _jacobian_loader(path, kind, "mean", (g["d"], g["d"]))
                    continue
                n = g["per_shape"][0] if g["per_shape"] else 0
                n_ref = ref["per_shape"][0] if ref["per_shape"] else 0
                if g["count"] != ref["count"] or n != n_ref or not np.array_equal(g["ids"][:n], ref["ids"][:n_ref]):
                    raise ValueError(
                        f"{where} holds {n} whole Jacobians of {g['count']} samples, but {ref_where} holds "
                        f"{n_ref} of {ref['count']} (or other sample ids); all files must come from one run"
                    )
                if (layer, kind) in means:
                    raise ValueError(f"{where}: sublayer ({layer}, {kind!r}) appears in two files")
                means[(layer, kind)] = _jacobian_loader(path, kind, "mean", (g["d"], g["d"]))
                if n:
                    per[(layer, kind)] = _jacobian_loader(path, kind, "per_sample", g["per_shape"], average_positions=True)
        layers = sorted({layer for layer, _ in means})
        if layers != list(range(len(layers))):
            raise ValueError(f"Jacobian files cover layers {layers}; expected 0..{len(layers) - 1} without gaps")
        assert ref is not None
        n_stored = ref["per_shape"][0] if ref["per_shape"] else 0
        return JacobianFiles(files=tuple(files), attrs=attrs, d=ref["d"], n_samples_total=ref["count"],
                             n_stored=n_stored, sample_ids=ref["ids"][:n_stored], means=means, per_sample=per,
                             branches=branches)

    @classmethod
    def read_means(cls, folders: Sequence[PathLike]) -> tuple[Loaders, dict[str, Any]]:
        """Lazy loaders of every sublayer's mean Jacobian from block folders of ``layer*.h5`` files.

        Returns ({(layer, kind): zero-argument callable → (d, d) float64}, attrs of the first file):
        the operators of the sublayer chain (:attr:`JacobianFiles.means`), validated by
        :meth:`read`; branch Jacobians: :meth:`read_branches`.
        """
        jf = cls.read(folders)
        return jf.means, jf.attrs

    @classmethod
    def read_branches(cls, folders: Sequence[PathLike]) -> Loaders:
        """Lazy loaders of the branch Jacobians of parallel-residual layers, {(layer, 'attn_branch'
        | 'mlp_branch'): callable → (d, d) float64}; empty for sequential models."""
        return cls.read(folders).branches

    @classmethod
    def read_per_sample(cls, folders: Sequence[PathLike]) -> tuple[Loaders, Loaders, dict[str, Any]]:
        """Loaders of every sublayer's per-sample Jacobians and all-sample mean (for the bootstrap).

        Returns ``(per_sample, means, info)`` (:class:`JacobianFiles`): ``per_sample[(layer, kind)]()``
        → (n, d, d) float64 (each stored sample's Jacobians averaged over its positions);
        ``means[(layer, kind)]()`` → (d, d); ``info`` = {``n_bootstrap_samples`` n,
        ``n_samples_total`` N, ``sample_ids`` (n,)}. Raises ValueError naming a file when no
        ``per_sample`` is stored (``jacobian.store_first_n`` = 0), besides :meth:`read`'s checks.
        """
        jf = cls.read(folders)
        if jf.n_stored == 0:
            raise ValueError(
                f"{jf.files[0]}: no per_sample dataset — the bootstrap needs whole per-sample Jacobians; "
                "set jacobian.store_first_n ≥ 2 and rerun the jacobians rule"
            )
        info = {"n_bootstrap_samples": jf.n_stored, "n_samples_total": jf.n_samples_total, "sample_ids": jf.sample_ids}
        return jf.per_sample, jf.means, info



class JacobianSums:
    """The partial sums of a Jacobian block job, and their resumable file ``.{first output}.partial.npz``.

    Host-memory (numpy) state for the layers of one block: ``sums[(L, kind)]`` (d, d) float64
    Σ J over the samples done so far (and their positions); ``per[(L, kind, s)]`` (N, P) float64
    the summaries :attr:`JacobianBlocks.SUMMARIES` (NaN where not yet computed);
    ``first[(L, kind)]`` (n, P, d, d) float32 the first n samples' whole Jacobians;
    ``next_index`` the next sample to process.

    File (``.npz``, uncompressed, written atomically): ``next_index`` () int, ``fingerprint`` ()
    str (what the run must agree on to resume: inputs, options, attrs), ``sum_{L}_{kind}``,
    ``{summary}_{L}_{kind}``, ``per_sample_{L}_{kind}`` with the shapes and dtypes above.
    :meth:`resume` loads it only when the fingerprint, every name, shape and dtype fit and
    1 ≤ next_index ≤ N; otherwise it warns, naming the file and the fault, and starts afresh.
    """

    def __init__(self, layers: Sequence[int], n_samples: int, n_positions: int, d: int, first_n: int,
                 kinds: Mapping[int, Sequence[str]] | None = None):
        self.layers = list(layers)
        self.d = d
        self.kinds = {L: tuple((kinds or {}).get(L, JacobianBlocks.KINDS)) for L in self.layers}
        self.next_index = 0
        keys = [(L, k) for L in self.layers for k in self.kinds[L]]
        self.sums = {key: np.zeros((d, d), np.float64) for key in keys}
        self.per = {(*key, s): np.full((n_samples, n_positions), np.nan) for key in keys for s in JacobianBlocks.SUMMARIES}
        self.first = {key: np.zeros((first_n, n_positions, d, d), np.float32) for key in keys}

    @staticmethod
    def path(out_paths: Mapping[int, PathLike], layers: Sequence[int]) -> Path:
        """``.{name}.partial.npz`` next to the block's first output file."""
        first = Path(out_paths[layers[0]])
        return first.parent / f".{first.name}.partial.npz"

    def arrays(self) -> dict[str, np.ndarray]:
        """The state as the file's named arrays (without the fingerprint)."""
        out: dict[str, np.ndarray] = {"next_index": np.array(self.next_index)}
        for (L, k), a in self.sums.items():
            out[f"sum_{L}_{k}"] = a
        for (L, k, s), a in self.per.items():
            out[f"{s}_{L}_{k}"] = a
        for (L, k), a in self.first.items():
            out[f"per_sample_{L}_{k}"] = a
        return out

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Fill from a file's arrays; KeyError/ValueError (naming the array) if they do not fit."""
        for name, target in self.arrays().items():
            if name == "next_index":
                continue
            source = arrays[name]
            if source.shape != target.shape or source.dtype != target.dtype:
                raise ValueError(f"{name}: {source.dtype}{source.shape}, expected {target.dtype}{target.shape}")
        for L, k in self.sums:
            self.sums[(L, k)] = arrays[f"sum_{L}_{k}"].copy()
            self.first[(L, k)] = arrays[f"per_sample_{L}_{k}"].copy()
            for s in JacobianBlocks.SUMMARIES:
                self.per[(L, k, s)] = arrays[f"{s}_{L}_{k}"].copy()
        self.next_index = int(arrays["next_index"])

    def save(self, path: PathLike, fingerprint: str) -> None:
        """Write the state and ``fingerprint`` to ``path`` atomically."""
        arrays = self.arrays()
        arrays["fingerprint"] = np.array(fingerprint)
        with io.atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def resume(cls, path: PathLike, fresh: Any, fingerprint: str, n_samples: int) -> JacobianSums:
        """``fresh()`` filled from the file at ``path`` if it exists and fits (class docstring),
        else ``fresh()`` as is (with a warning naming the file and the fault when one existed)."""
        import logging
        import warnings

        path = Path(path)
        acc = fresh()
        if not path.exists():
            return acc
        log = logging.getLogger(__name__)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            if str(arrays["fingerprint"]) != fingerprint:
                raise ValueError("it was written for other samples, layers, positions, options or attrs")
            if not 0 < int(arrays["next_index"]) <= n_samples:
                raise ValueError(f"next sample index {int(arrays['next_index'])} outside 1..{n_samples}")
            acc.load(arrays)
        except (OSError, KeyError, ValueError) as err:
            warnings.warn(f"ignoring checkpoint {path}: {err}", stacklevel=3)
            log.warning("ignoring checkpoint %s: %s", path, err)
            return fresh()
        log.info("resuming from %s at sample %d of %d", path, acc.next_index, n_samples)
        return acc

    @staticmethod
    def remove(path: PathLike) -> None:
        """Delete the file (a finished job's), if it is there."""
        Path(path).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# figures: the PNG + PDF pair and the render cache


class Figure(Artifact):
    """``results/figures/…/{name}.png`` and ``.pdf``: one figure in two formats (catalogue:
    :mod:`resdyn.plots.catalogue`).

    :meth:`write` saves a matplotlib figure in every format of ``paths`` with the given
    ``metadata`` per format (the provenance record, :func:`resdyn.plots.common.save_figure`),
    each to a temporary name first: the files are renamed into place only after all were
    saved, so a failure leaves none of them (and no temporary file) behind. The formats after
    the first reuse its layout (the figure's layout engine is off while they are saved).
    """

    FORMATS: ClassVar[tuple[str, str]] = ("png", "pdf")

    @classmethod
    def write(cls, fig: Any, paths: Mapping[str, PathLike], dpi: int,
              metadata: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Save ``fig`` as ``{format: path}`` (formats of :attr:`FORMATS`) at ``dpi``."""
        unknown = [f for f in paths if f not in cls.FORMATS]
        if unknown:
            raise ValueError(f"figure formats {unknown} not supported; allowed: {list(cls.FORMATS)}")
        resolved = [Path(p).resolve() for p in paths.values()]
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"figure formats {list(paths)} share one file: {[str(p) for p in paths.values()]}")
        with contextlib.ExitStack() as stack:
            tmps = {fmt: stack.enter_context(io.atomic_path(path)) for fmt, path in paths.items()}
            engine = None
            for i, (fmt, tmp) in enumerate(tmps.items()):
                if i == 1 and (engine := fig.get_layout_engine()) is not None:
                    # Later formats keep the first one's layout: a layout engine would lay the figure
                    # out again for their renderer (a third of a PDF's save time), moving axes by < 1 %.
                    fig.set_layout_engine("none")
                    stack.callback(fig.set_layout_engine, engine)
                fig.savefig(tmp, format=fmt, dpi=dpi, metadata=dict((metadata or {}).get(fmt, {})))


class FigureCache(Artifact):
    """A folder of drawn figures kept under a content key (:mod:`resdyn.plots.render`; the pipeline's
    is ``results/figures/.cache``, set by the figure rules).

    The entry of output ``out`` under ``key`` is ``<cache>/<out's folder>/<stem>.<key[:16]><suffix>``
    (the folder taken relative to the cache's parent when ``out`` lies under it), with its SHA-256
    in ``<entry>.sha256``. :meth:`store` keeps one entry per output file (older keys are removed);
    :meth:`restore` copies entries back byte for byte only when every one is present and still has
    its recorded SHA-256 (otherwise nothing is written and the figure is drawn again).
    """

    def __init__(self, folder: PathLike):
        self.folder = Path(folder)

    def entry(self, out: PathLike, key: str) -> Path:
        """The cache file of output ``out`` under ``key``."""
        out, base = Path(out).absolute(), self.folder.absolute().parent
        rel = out.parent.relative_to(base) if out.parent.is_relative_to(base) else out.parent.relative_to(out.anchor)
        return self.folder / rel / f"{out.stem}.{key[:16]}{out.suffix}"

    @staticmethod
    def _digest_file(entry: Path) -> Path:
        return entry.with_name(entry.name + ".sha256")

    @staticmethod
    def _copy(src: Path, dst: PathLike) -> None:
        import shutil

        with io.atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)

    def restore(self, outputs: Sequence[PathLike], key: str) -> bool:
        """Copy the entries of ``key`` onto ``outputs``; False (nothing written) if any is missing
        or no longer has the SHA-256 recorded when it was stored."""
        entries = [self.entry(o, key) for o in outputs]
        for e in entries:
            digest = self._digest_file(e)
            if not (e.is_file() and digest.is_file() and digest.read_text().strip() == io.sha256_file(e)):
                return False
        for e, o in zip(entries, outputs):
            self._copy(e, o)
        return True

    def store(self, outputs: Sequence[PathLike], key: str) -> None:
        """Put ``outputs`` into the cache under ``key`` (with their SHA-256), dropping the file's
        entries of other keys."""
        for o in outputs:
            e = self.entry(o, key)
            for old in e.parent.glob(f"{Path(o).stem}.*{Path(o).suffix}*"):
                if not old.name.startswith(e.name) and old.name.split(".")[0] == Path(o).stem:
                    old.unlink(missing_ok=True)
            self._copy(Path(o), e)
            with io.atomic_path(self._digest_file(e)) as tmp:
                tmp.write_text(io.sha256_file(e) + "\n")


def artifact_classes() -> list[type[Artifact]]:
    """Every artifact class of this module that has a path (``relpath``)."""
    return [c for c in globals().values() if isinstance(c, type) and issubclass(c, Artifact) and c.relpath]


def by_relpath(template: str) -> type[Artifact]:
    """The artifact class whose ``relpath`` is ``template`` (e.g. ``results/{model}/{ckpt}/rss.tsv``,
    as the figure catalogue writes its inputs); ValueError naming the template otherwise."""
    found = [c for c in artifact_classes() if c.relpath == template]
    if len(found) != 1:
        raise ValueError(f"no artifact class has the path {template!r}" if not found else
                         f"artifact path {template!r} is claimed by {[c.__name__ for c in found]}")
    return found[0]


# column lists of the tables that concept modules build (defined once, by the classes above)
BOOTSTRAP_COLUMNS = list(BootstrapTable.columns)
REPLICATE_COLUMNS = list(BootstrapReplicates.columns)
CAUSAL_COLUMNS = list(CausalTable.columns)
ALIGNMENT_COLUMNS = list(BridgeAlignment.columns)
SCORECARD_COLUMNS = list(ScorecardTable.columns)
RSS_COLUMNS = list(RssProfile.columns)
LENS_METRIC_COLUMNS = list(LensMetrics.columns)
