"""The figure artifacts: the PNG + PDF pair of one figure (:class:`Figure`) and the render cache
(:class:`FigureCache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from resdyn import io
from resdyn.artifacts.base import Artifact
from resdyn.io import PathLike

__all__ = ["Figure", "FigureCache"]


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
    def write(
        cls, fig: Any, paths: Mapping[str, PathLike], dpi: int, metadata: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
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
                    # No engine at all, not the "none" placeholder: with any engine set, savefig runs a
                    # whole extra draw first (a third of the rest); the file is byte for byte the same.
                    # (None falls back to an rcParams layout where one is on: then the placeholder.)
                    fig.set_layout_engine(None)
                    if fig.get_layout_engine() is not None:
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
