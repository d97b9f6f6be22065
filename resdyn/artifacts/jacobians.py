"""The Jacobian layer files: their reader, their writer and a block job's resumable sums.

The validated reader (:class:`JacobianBlocks`) indexes the files into :class:`JacobianFiles`
with lazy loaders; :meth:`JacobianBlocks.write_layer` writes a layer's file; :class:`JacobianSums`
holds the partial sums of a running block job. h5py is imported inside the functions that read
or write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from resdyn import io
from resdyn.artifacts.base import CKPT_DIR, Artifact
from resdyn.io import PathLike

__all__ = ["Loaders", "JacobianFiles", "JacobianBlocks", "JacobianSums"]

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
        n_groups: B, the equal groups of consecutive samples whose means are stored (0 if none).
        group_means: {(layer, kind): loader → (B, d, d) float64}, same keys as ``means``; empty when B = 0.

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
    n_groups: int = 0
    group_means: Loaders = field(default_factory=dict)


def _jacobian_loader(path: Path, kind: str, name: str, shape: tuple[int, ...], average_positions: bool = False):
    def load() -> np.ndarray:
        import h5py

        with h5py.File(path, "r") as f:
            x = f[kind][name][()]
        if x.shape != shape:
            raise ValueError(
                f"{path}: {kind}/{name} has shape {x.shape}, expected {shape} (the file changed after it was indexed)"
            )
        x = x.astype(np.float64)
        if average_positions:
            x = x.mean(axis=1)  # (n, P, d, d) -> per-sample mean over positions
        bad = ~np.isfinite(x)
        if bad.any():
            raise FloatingPointError(f"{path}: {kind}/{name} has {int(bad.sum())} non-finite entries (NaN/Inf)")
        return x

    return load


def _offset_loader(deviations: Any, mean: Any) -> Any:
    """A loader of G_g = J̄ + Δ_g from loaders of the deviations Δ (B, d, d) and the mean J̄ (d, d)."""
    return lambda: deviations() + mean()[None]


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
        raise ValueError(
            f"{path}: {kind}/per_sample has shape {per_shape}; expected (n, P, {d}, {d}) with 1 <= n <= count = {count}"
        )
    group_shape = tuple(g["group_means"].shape) if "group_means" in g else None
    group_offset = g["group_means"].attrs.get("offset") if group_shape is not None else None
    if group_offset not in (None, "mean"):
        raise ValueError(f"{path}: {kind}/group_means has offset {group_offset!r}; allowed: none or 'mean'")
    if group_shape is not None and (
        len(group_shape) != 3 or group_shape[1:] != (d, d) or not 2 <= group_shape[0] <= count or count % group_shape[0]
    ):
        raise ValueError(
            f"{path}: {kind}/group_means has shape {group_shape}; expected (B, {d}, {d}) with B ≥ 2 dividing "
            f"count = {count}"
        )
    return {
        "d": d,
        "count": count,
        "ids": ids,
        "per_shape": per_shape,
        "group_shape": group_shape,
        "group_offset": group_offset,
    }


class _JacobianIndex:
    """The loaders :meth:`JacobianBlocks.read` collects, checked group by group against the first one.

    The first group added is the reference every later one must agree with: the same d, and for
    operator groups the same N (``count``), n (``per_sample``) and stored sample ids. Branch
    groups (``branch_kinds``) get a ``mean`` loader only.
    """

    def __init__(self, branch_kinds: tuple[str, ...]) -> None:
        self.branch_kinds = branch_kinds
        self.means: Loaders = {}
        self.per: Loaders = {}
        self.branches: Loaders = {}
        self.groups: Loaders = {}
        self.attrs: dict[str, Any] = {}
        self.ref: dict[str, Any] | None = None
        self.ref_where = ""

    def add(self, path: Path, layer: int, kind: str, g: dict[str, Any]) -> None:
        """Check group ``kind`` of layer ``layer`` (its index ``g``) and register its loaders."""
        where = f"{path}: {kind}"
        if self.ref is None:
            self.ref, self.ref_where = g, where
        ref, ref_where = self.ref, self.ref_where
        if g["d"] != ref["d"]:
            raise ValueError(
                f"{where}/mean is {g['d']}×{g['d']}, but {ref_where}/mean is {ref['d']}×{ref['d']}; "
                "all files must come from one model"
            )
        if kind in self.branch_kinds:
            self.branches[(layer, kind)] = _jacobian_loader(path, kind, "mean", (g["d"], g["d"]))
            return
        n = g["per_shape"][0] if g["per_shape"] else 0
        n_ref = ref["per_shape"][0] if ref["per_shape"] else 0
        if g["count"] != ref["count"] or n != n_ref or not np.array_equal(g["ids"][:n], ref["ids"][:n_ref]):
            raise ValueError(
                f"{where} holds {n} whole Jacobians of {g['count']} samples, but {ref_where} holds "
                f"{n_ref} of {ref['count']} (or other sample ids); all files must come from one run"
            )
        if g["group_shape"] != ref["group_shape"]:
            raise ValueError(
                f"{where} has group_means {g['group_shape']}, but {ref_where} has {ref['group_shape']}; "
                "all files must come from one run"
            )
        if (layer, kind) in self.means:
            raise ValueError(f"{where}: sublayer ({layer}, {kind!r}) appears in two files")
        mean = self.means[(layer, kind)] = _jacobian_loader(path, kind, "mean", (g["d"], g["d"]))
        if g["group_shape"]:
            groups = _jacobian_loader(path, kind, "group_means", g["group_shape"])
            self.groups[(layer, kind)] = _offset_loader(groups, mean) if g["group_offset"] == "mean" else groups
        if n:
            self.per[(layer, kind)] = _jacobian_loader(path, kind, "per_sample", g["per_shape"], average_positions=True)

    def finish(self, files: tuple[Path, ...]) -> JacobianFiles:
        """The :class:`JacobianFiles` of the groups added; ValueError when the layers have a gap."""
        layers = sorted({layer for layer, _ in self.means})
        if layers != list(range(len(layers))):
            raise ValueError(f"Jacobian files cover layers {layers}; expected 0..{len(layers) - 1} without gaps")
        assert self.ref is not None
        n_stored = self.ref["per_shape"][0] if self.ref["per_shape"] else 0
        return JacobianFiles(
            files=files,
            attrs=self.attrs,
            d=self.ref["d"],
            n_samples_total=self.ref["count"],
            n_stored=n_stored,
            sample_ids=self.ref["ids"][:n_stored],
            means=self.means,
            per_sample=self.per,
            branches=self.branches,
            n_groups=self.ref["group_shape"][0] if self.ref["group_shape"] else 0,
            group_means=self.groups,
        )


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
      group_means         (B, d, d) float32|float64, optional: the mean Jacobian of each of B equal
                          groups of consecutive samples (``jacobian.n_groups``; attr ``group_size``
                          N/B), so that ``mean`` = their average; chunked (1, d, d), gzip

    A parallel-residual layer's file holds the groups ``/layer/`` (the operator I + J_A + J_F),
    ``/attn_branch/`` and ``/mlp_branch/`` (J_A, J_F) with the same datasets.

    The one reader is :meth:`read` (validating schema, shapes and, on load, finiteness;
    :meth:`read_means`, :meth:`read_branches` and :meth:`read_per_sample` build on it): it needs
    h5py and numpy only, so the jobs that analyse the files start without torch. The resumable
    partial sums of a running job are :class:`JacobianSums`.
    """

    relpath = CKPT_DIR + "jacobians/{block}"
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
    def write_layer(
        cls,
        path: PathLike,
        layer: int,
        sums: JacobianSums,
        sample_ids: np.ndarray,
        positions: Sequence[int],
        store_dtype: str,
        attrs: Mapping[str, Any],
        family: str,
        spectral_norm_method: str,
        group_dtype: str | None = None,
    ) -> None:
        """Write layer ``layer``'s file from the finished ``sums`` atomically (schema above).

        ``mean`` = sum / (N·P) cast to ``store_dtype``; ``per_sample`` only when ``sums`` keeps
        whole Jacobians (n > 0); ``group_means`` (B, d, d), with attribute ``group_size`` N/B, only
        when ``sums`` has B > 0 groups: in ``group_dtype`` (default ``store_dtype``), or for
        ``float16`` as the deviations G_g − J̄ from the float64 mean (attribute ``offset`` =
        ``"mean"``), whose half-precision rounding is relative to the sampling spread, not to J.
        """
        import h5py

        n_samples, n_positions = len(sample_ids), len(positions)
        if sums.next_index != n_samples:
            raise ValueError(
                f"{path}: refusing to write layer {layer}: the sums cover {sums.next_index} of {n_samples} samples"
            )
        ids = (
            sample_ids.astype(np.int64)
            if sample_ids.dtype.kind in "iu"
            else np.array([str(s) for s in sample_ids], dtype=h5py.string_dtype("utf-8"))
        )
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
                mean = (sums.sums[(layer, kind)] / (n_samples * n_positions)).astype(store_dtype)
                g.create_dataset("mean", data=mean)
                g.create_dataset("count", data=np.int64(n_samples))
                g["count"].attrs["n_jacobians"] = n_samples * n_positions
                g.create_dataset("sample_ids", data=ids)
                for s in cls.SUMMARIES:
                    g.create_dataset(s, data=sums.per[(layer, kind, s)])
                first = sums.first[(layer, kind)]
                if first.shape[0]:
                    g.create_dataset("per_sample", data=first, chunks=(1, 1, d, d), compression="gzip")
                if sums.n_groups:
                    cls._write_group_means(g, path, layer, kind, sums, mean, group_dtype or store_dtype)

    @staticmethod
    def _write_group_means(
        g: Any, path: PathLike, layer: int, kind: str, sums: JacobianSums, mean: np.ndarray, dtype: str
    ) -> None:
        """Dataset ``group_means`` of one sublayer group ``g`` beside its stored ``mean`` (:meth:`write_layer`)."""
        groups = np.asarray(sums.groups[(layer, kind)], dtype=np.float64)
        offset = dtype == "float16"  # deviations from the stored mean: the reader adds it back exactly
        data = (groups - mean.astype(np.float64) if offset else groups).astype(dtype)
        if not np.isfinite(data).all():
            raise FloatingPointError(
                f"{path}: layer {layer} {kind}: group means overflow {dtype} (largest |value| "
                f"{float(np.abs(groups).max()):.3g}); set jacobian.group_dtype to float32"
            )
        g.create_dataset("group_means", data=data, chunks=(1, sums.d, sums.d), compression="gzip")
        g["group_means"].attrs["group_size"] = sums.group_size
        if offset:
            g["group_means"].attrs["offset"] = "mean"

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
        files = sorted(p for folder in folders for p in Path(folder).glob("layer*.h5"))
        if not files:
            raise FileNotFoundError(f"no layer*.h5 Jacobian files in {list(map(str, folders))}")
        index = _JacobianIndex(branch_kinds=cls.PARALLEL_KINDS[1:])
        for path in files:
            layer, file_attrs, groups = cls._index_file(path, with_attrs=not index.attrs)
            if not index.attrs:
                index.attrs = file_attrs
            for kind, g in groups.items():
                index.add(path, layer, kind, g)
        return index.finish(tuple(files))

    @classmethod
    def _index_file(cls, path: Path, with_attrs: bool) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]]]:
        """(layer, file attributes, {kind: group index}) of one layer file, operator groups first.

        The attributes (numpy arrays as lists) are read only when ``with_attrs``; branch groups
        ('attn_branch', 'mlp_branch') follow the operator groups when the file has them. A file
        that does not open or lacks its ``layer`` attribute or a group is one ValueError naming it.
        """
        import h5py

        try:
            with h5py.File(path, "r") as f:
                layer = int(f.attrs["layer"])
                attrs = {}
                if with_attrs:
                    attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
                kinds = ("layer",) if "layer" in f else cls.KINDS
                index = {kind: _jacobian_group_index(f, path, kind) for kind in kinds}
                branch_index = {
                    kind: _jacobian_group_index(f, path, kind) for kind in cls.PARALLEL_KINDS[1:] if kind in f
                }
        except (OSError, KeyError) as err:
            raise ValueError(f"{path}: not a readable Jacobian file ({err})") from err
        return layer, attrs, {**index, **branch_index}

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
        """Lazy loaders of the branch Jacobians of parallel-residual layers.

        {(layer, 'attn_branch' | 'mlp_branch'): callable → (d, d) float64}; empty for sequential models.
        """
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
    ``groups[(L, kind)]`` (B, d, d) float32 the mean Jacobian of each of B equal groups of
    consecutive samples (group g: samples g·N/B … (g+1)·N/B − 1; rows of unfinished groups are 0)
    and ``group_start[(L, kind)]`` (d, d) float64 the sum when the current group began;
    ``next_index`` the next sample to process.

    File (``.npz``, uncompressed, written atomically): ``next_index`` () int, ``fingerprint`` ()
    str (what the run must agree on to resume: inputs, options, attrs), ``sum_{L}_{kind}``,
    ``{summary}_{L}_{kind}``, ``per_sample_{L}_{kind}``, ``group_means_{L}_{kind}``,
    ``group_start_{L}_{kind}`` with the shapes and dtypes above.
    :meth:`resume` loads it only when the fingerprint, every name, shape and dtype fit and
    1 ≤ next_index ≤ N; otherwise it warns, naming the file and the fault, and starts afresh.
    """

    def __init__(
        self,
        layers: Sequence[int],
        n_samples: int,
        n_positions: int,
        d: int,
        first_n: int,
        kinds: Mapping[int, Sequence[str]] | None = None,
        n_groups: int = 0,
    ):
        if n_groups and n_samples % n_groups:
            raise ValueError(f"n_groups = {n_groups} does not divide the {n_samples} samples into equal groups")
        self.layers = list(layers)
        self.d = d
        self.n_positions = n_positions
        self.n_groups = n_groups
        self.group_size = n_samples // n_groups if n_groups else 0
        self.kinds = {L: tuple((kinds or {}).get(L, JacobianBlocks.KINDS)) for L in self.layers}
        self.next_index = 0
        keys = [(L, k) for L in self.layers for k in self.kinds[L]]
        self.sums = {key: np.zeros((d, d), np.float64) for key in keys}
        self.per = {
            (*key, s): np.full((n_samples, n_positions), np.nan) for key in keys for s in JacobianBlocks.SUMMARIES
        }
        self.first = {key: np.zeros((first_n, n_positions, d, d), np.float32) for key in keys}
        self.groups = {key: np.zeros((n_groups, d, d), np.float32) for key in keys}
        self.group_start = {key: np.zeros((d, d), np.float64) for key in keys}

    def close_group(self) -> None:
        """After sample ``next_index`` − 1: if it ends a group, store that group's mean Jacobian
        G_g = (Σ_{i in g} Σ_p J_ip) / (N/B · P) and start the next group's sum."""
        if not self.n_groups or self.next_index % self.group_size:
            return
        g = self.next_index // self.group_size - 1
        for key, total in self.sums.items():
            self.groups[key][g] = (total - self.group_start[key]) / (self.group_size * self.n_positions)
            self.group_start[key] = total.copy()

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
        for (L, k), a in self.groups.items():
            out[f"group_means_{L}_{k}"] = a
            out[f"group_start_{L}_{k}"] = self.group_start[(L, k)]
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
            self.groups[(L, k)] = arrays[f"group_means_{L}_{k}"].copy()
            self.group_start[(L, k)] = arrays[f"group_start_{L}_{k}"].copy()
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
        """``fresh()`` filled from the checkpoint at ``path`` when it exists and fits.

        What fits is in the class docstring; otherwise ``fresh()`` as is, with a warning naming the
        file and the fault when one existed.
        """
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
                generic = "it was written for other samples, layers, positions, options or attrs"
                raise ValueError(io.resume_mismatch(arrays["fingerprint"], fingerprint, generic))
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
