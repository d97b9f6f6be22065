"""The residual-stream activations: one HDF5 file per layer (:class:`Activations`: written whole or
streamed one sample at a time) and a lazy view of a folder of them (:class:`BoundaryView`).
h5py is imported inside the functions that read or write.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from resdyn import io
from resdyn.artifacts.base import CKPT_DIR, Artifact
from resdyn.io import PathLike

__all__ = ["Activations", "BoundaryView"]


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

    relpath = CKPT_DIR + "activations"
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
                raise ValueError(
                    f"{path}: holds layer {layer}, but it is file {i} of the folder (expected layers 0..n-1 in order)"
                )
            out.append((layer, path))
        return out

    @classmethod
    def _check_residual(cls, residual: str) -> None:
        if residual not in cls.RESIDUAL_KINDS:
            raise ValueError(f"residual={residual!r}: allowed are {cls.RESIDUAL_KINDS}")

    @classmethod
    def _write_index(
        cls,
        f: Any,
        layer: int,
        sample_ids: np.ndarray,
        positions: np.ndarray,
        skip_positions: int,
        residual: str,
        attrs: Mapping[str, Any],
    ) -> None:
        """The part of a layer file that is not the states: ids, positions and attributes."""
        f.create_dataset("sample_ids", data=sample_ids)
        f.create_dataset("positions", data=positions)
        f.attrs.update({"schema": cls.SCHEMA, "layer": layer, "skip_positions": skip_positions, "residual": residual})
        for k, v in attrs.items():
            f.attrs[k] = v if isinstance(v, (int, float, str)) else json.dumps(v)

    @classmethod
    def write(
        cls,
        states: np.ndarray,
        sample_ids: np.ndarray,
        skip_positions: int,
        out_dir: PathLike,
        dtype: str,
        attrs: Mapping[str, Any],
        residual: str = "sequential",
    ) -> list[Path]:
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
    def stream(
        cls,
        out_dir: PathLike,
        n_layers: int,
        n_samples: int,
        length: int,
        d: int,
        dtype: str,
        sample_ids: np.ndarray,
        skip_positions: int,
        attrs: Mapping[str, Any],
        residual: str = "sequential",
    ) -> Iterator[Any]:
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
