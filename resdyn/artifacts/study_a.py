"""Study A's artifacts: the spectra (table and arrays), the bottleneck and Schur curves, the
communities, the coupling tests, and the per-model checkpoint, coupling-count and partition tables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from resdyn import io
from resdyn.artifacts.base import CKPT_DIR, Artifact, ArtifactError, TsvArtifact, kinds
from resdyn.io import PathLike

__all__ = [
    "SpectraTable",
    "BottleneckTable",
    "SchurCurves",
    "CouplingTable",
    "CommunitiesSummary",
    "CommunityPartitions",
    "CheckpointsTable",
    "CouplingLayers",
    "CouplingCounts",
    "PartitionSimilarity",
    "SpectraArrays",
]


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

    relpath = CKPT_DIR + "spectra.tsv"
    columns = kinds(
        "layer:int kind:str s:int d:int spectral_radius:float condition_number:float sigma_max:float "
        "sigma_min:float fro_J:float fro_minus_identity:float nonnormal_fro:float henrici:float "
        "henrici_JmI:float symmetry:float symmetry_minus_identity:float expansive_frac_eig:float "
        "expansive_frac_sv:float erank_J:float pr_J:float erank_JmI:float pr_JmI:float"
    )
    extra_columns = True
    units = {
        "expansive_frac_eig": "fraction",
        "expansive_frac_sv": "fraction",
        "erank_J": "dimensions",
        "pr_J": "dimensions",
        "erank_JmI": "dimensions",
        "pr_JmI": "dimensions",
    }


class BottleneckTable(TsvArtifact):
    """``results/{model}/{ckpt}/bottleneck.tsv``: cumulative products' effective rank by depth.

    One row per sublayer s (:func:`resdyn.study_a.spectral.bottleneck_table`): ``s`` int, ``layer`` int,
    ``kind`` str, ``d`` int, ``erank``, ``erank_energy`` (Roy–Vetterli on σ and on σ²),
    ``participation_ratio``, ``log10_fro`` (of the product J_s ⋯ J_0), ``erank_single``,
    ``pr_single`` (of J_s alone) float, all finite.
    """

    relpath = CKPT_DIR + "bottleneck.tsv"
    columns = kinds(
        "s:int layer:int kind:str d:int erank:float erank_energy:float participation_ratio:float log10_fro:float "
        "erank_single:float pr_single:float"
    )
    units = {
        "erank": "dimensions",
        "erank_energy": "dimensions",
        "participation_ratio": "dimensions",
        "erank_single": "dimensions",
        "pr_single": "dimensions",
        "log10_fro": "log10",
    }


class SchurCurves(TsvArtifact):
    """``results/{model}/{ckpt}/schur.tsv``: bottleneck curves of J(α) = Q(Λ + αN)Q*.

    One row per (alpha, s), sorted by alpha then s (:func:`resdyn.study_a.schur.schur_bottleneck`):
    ``alpha`` float, ``s``, ``layer`` int, ``kind`` str, ``erank``, ``pr``, ``log10_fro``,
    ``henrici_single`` float, all finite.
    """

    relpath = CKPT_DIR + "schur.tsv"
    columns = kinds("alpha:float s:int layer:int kind:str erank:float pr:float log10_fro:float henrici_single:float")


class CouplingTable(TsvArtifact):
    """``results/{model}/{ckpt}/coupling.tsv``: boundary-vs-interior gain per residual boundary.

    One row per (layer, boundary) (:func:`resdyn.study_a.topology.coupling_from_tables`): ``layer`` int,
    ``boundary`` str, ``kind`` str, ``s`` int, ``gain`` str, ``effect_log_median_ratio``,
    ``rank_biserial``, ``p_value`` float, ``n_boundary``, ``n_interior`` int,
    ``median_boundary``, ``median_interior`` float, ``reason`` str (why a row's test is empty;
    its numbers may then be NaN), ``henrici``, ``q_value`` float, ``significant`` bool.
    """

    relpath = CKPT_DIR + "coupling.tsv"
    columns = kinds(
        "layer:int boundary:str kind:str s:int gain:str effect_log_median_ratio:float "
        "rank_biserial:float p_value:float n_boundary:int n_interior:int median_boundary:float "
        "median_interior:float reason:str henrici:float q_value:float significant:bool"
    )


class CommunitiesSummary(TsvArtifact):
    """``results/{model}/{ckpt}/communities_summary.tsv``: one row per (layer, boundary).

    :func:`resdyn.study_a.topology.analyse_boundary`'s summary: ``layer`` int, ``boundary`` str,
    ``n_units``, ``n_communities`` int, ``sizes`` str (comma-separated community sizes),
    ``largest``, ``n_singletons`` int, ``quality``, ``resolution``, ``modularity`` float,
    ``n_edges``, ``n_negative_edges``, ``n_boundary``, ``n_tokens``, ``n_constant_units`` int.
    """

    relpath = CKPT_DIR + "communities_summary.tsv"
    columns = kinds(
        "layer:int boundary:str n_units:int n_communities:int sizes:str largest:int "
        "n_singletons:int quality:float resolution:float modularity:float n_edges:int "
        "n_negative_edges:int n_boundary:int n_tokens:int n_constant_units:int"
    )


class CommunityPartitions(TsvArtifact):
    """``results/{model}/{ckpt}/communities/layer{L:03d}.tsv``: the partition of each layer's units.

    A folder with one table per layer; columns ``unit`` int, ``community`` int,
    ``participation`` float, ``is_boundary`` bool, ``n_other_communities`` int (other communities
    among the unit's positive neighbours, :func:`resdyn.study_a.topology.other_communities`),
    ``layer`` int, ``boundary`` str (one block of rows per boundary of the layer).
    :meth:`read_folder` concatenates the layers in order.
    """

    relpath = CKPT_DIR + "communities"
    columns = kinds(
        "unit:int community:int participation:float is_boundary:bool n_other_communities:int layer:int boundary:str"
    )

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
    ``n_layers`` first, the boundary counts as detail; NaN for a checkpoint without coupling), and
    ``integrity`` str: the checkpoint's mark (:func:`resdyn.lm.integrity.marks`, e.g. ``duplicate of
    step1000``; empty for a checkpoint unlike those before it).
    """

    relpath = "results/{model}/checkpoints.tsv"
    columns = kinds("ckpt:str layer:int kind:str s:int")
    extra_columns = True


class CouplingLayers(TsvArtifact):
    """``results/{model}/{ckpt}/coupling_layers.tsv``: FDR-significant layers, study A's unit.

    One row per layer (:func:`resdyn.study_a.topology.layer_significance`): ``layer`` int,
    ``p_value`` (Simes over the layer's boundary tests), ``q_value`` (BH over the layers of the
    checkpoint) float, ``significant`` bool, ``n_boundaries_tested`` int, ``reason`` str (why a
    layer has no test; its numbers are then NaN).
    """

    relpath = CKPT_DIR + "coupling_layers.tsv"
    columns = kinds("layer:int p_value:float q_value:float significant:bool n_boundaries_tested:int reason:str")


class CouplingCounts(TsvArtifact):
    """``results/{model}/coupling_counts.tsv``: significant layers (and boundaries) per checkpoint.

    :func:`resdyn.study_a.topology.significant_counts` plus ``model``: ``ckpt`` str,
    ``n_significant_layers``, ``n_layers``, ``n_layers_tested`` int (the headline: layers, as
    study A counts them), ``n_significant_boundaries``, ``n_boundaries`` int (detail: BH over
    boundaries), ``sign_dependence_rho``, ``sign_dependence_p`` float (NaN when fewer than 3
    boundaries were tested or a side is constant), ``model`` str.
    """

    relpath = "results/{model}/coupling_counts.tsv"
    columns = kinds(
        "ckpt:str n_significant_layers:int n_layers:int n_layers_tested:int "
        "n_significant_boundaries:int n_boundaries:int sign_dependence_rho:float "
        "sign_dependence_p:float model:str"
    )
    allow_nan = ("sign_dependence_rho", "sign_dependence_p")


class PartitionSimilarity(TsvArtifact):
    """``results/{model}/partition_similarity.tsv``: each checkpoint's communities vs a reference's.

    One row per (ckpt, layer, boundary, reference) (:func:`resdyn.study_a.partitions.partition_similarity`):
    ``ckpt`` str, ``layer`` int, ``boundary`` str, ``reference_ckpt`` str, ``reference`` str
    (``final`` | ``first``), ``nmi``, ``ari`` (of the two partitions of the same units),
    ``nmi_null_q95``, ``nmi_p`` (the NMI's permutation null: its 95 % quantile and the one-sided
    p-value, :func:`resdyn.study_a.partitions.nmi_permutation_null`), ``modularity`` (signed, of
    ``ckpt``'s partition) float, ``reason`` str (why a comparison is missing; its numbers are then NaN).
    """

    relpath = "results/{model}/partition_similarity.tsv"
    columns = kinds(
        "ckpt:str layer:int boundary:str reference_ckpt:str reference:str nmi:float ari:float "
        "nmi_null_q95:float nmi_p:float modularity:float reason:str"
    )


class SpectraArrays(Artifact):
    """``results/{model}/{ckpt}/spectra.h5``: the spectra behind ``spectra.tsv`` (schema ``resdyn.spectra/1``).

    * root attrs: ``schema`` = "resdyn.spectra/1", plus provenance attrs (scalars as is,
      anything else JSON-encoded as a string);
    * one group per sublayer ``L{layer:03d}_{kind}`` (kind attn, mlp or layer) with attrs
      ``layer``, ``kind``, ``s`` (:func:`resdyn.study_a.spectral.sublayer_index`) and 1-D datasets of
      one length d: ``eigenvalues`` complex128 sorted by descending |λ|, ``singular_values``
      float64 and ``singular_values_JmI`` float64 (of J − I), both descending.
    """

    relpath = CKPT_DIR + "spectra.h5"
    SCHEMA = "resdyn.spectra/1"
    DATASETS: ClassVar[dict[str, Any]] = {
        "eigenvalues": np.complex128,
        "singular_values": np.float64,
        "singular_values_JmI": np.float64,
    }
    _GROUP = re.compile(r"^L(\d{3,})_(attn|mlp|layer)$")

    @staticmethod
    def depth_index(layer: int, kind: str) -> int:
        """The group attr ``s`` = 2·layer + (0 for attn, 1 for mlp or layer).

        :func:`resdyn.study_a.spectral.sublayer_index` (a test keeps the two equal); repeated here so
        that the artifacts package imports nothing of resdyn but io: every script imports it, and its
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
                raise ValueError(
                    f"{where}: arrays[{name!r}] datasets differ in length { {k: v.shape[0] for k, v in ds.items()} }"
                )
            checked[str(name)] = (int(m.group(1)), m.group(2), ds)
        return checked

    @classmethod
    def write(
        cls, arrays: Mapping[str, Mapping[str, Any]], path: PathLike, attrs: Mapping[str, Any] | None = None
    ) -> None:
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
                    raise ArtifactError(
                        f"{path}: {name}/{k} is {group[k].dtype} of shape {group[k].shape}, "
                        f"expected 1-D {np.dtype(dtype)}"
                    )
        return arrays, attrs
