"""Logs that last: each rule's ``log:`` file gets everything its script writes, on success too.

:func:`job_log` points file descriptors 1 and 2 of the job's process at the log file, so tqdm
bars, warnings and library messages (Python or C) land there, and configures :mod:`logging` to
write to it. :func:`describe` summarises a file for the INFO lines that open and close a job:
inputs and outputs with their sizes and shapes, threads, device, seconds and peak memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["job_log", "describe", "peak_memory", "JobClock"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Chatty libraries kept to warnings (matplotlib's PDF font subsetting logs every glyph at INFO).
QUIET = ("fontTools", "matplotlib", "PIL", "h5py", "urllib3", "filelock", "httpx", "huggingface_hub")


@contextlib.contextmanager
def job_log(path: str | Path | None) -> Iterator[None]:
    """Within the block, stdout, stderr and INFO logging go to ``path`` (truncated first).

    With ``path`` None everything stays on stderr. The descriptors are restored on exit, also
    when the block raises (the traceback is logged inside the block by the caller).
    """
    if path is None:
        _configure_logging()
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("")
    saved_streams = sys.stdout, sys.stderr
    for stream in saved_streams:
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    # One open file (append mode, line-buffered) behind Python's streams and descriptors 1 and 2:
    # Python and C writers share its offset, so nothing overwrites anything.
    with open(path, "a", buffering=1, encoding="utf-8", errors="replace") as log_file:
        try:
            for fd in (1, 2):
                os.dup2(log_file.fileno(), fd)
            sys.stdout = sys.stderr = log_file
            _configure_logging()
            yield
        finally:
            log_file.flush()
            sys.stdout, sys.stderr = saved_streams
            for fd, old in saved.items():
                os.dup2(old, fd)
                os.close(old)
            _configure_logging()  # logging back on the restored stderr


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, handlers=[logging.StreamHandler(sys.stderr)], force=True, format=LOG_FORMAT)
    # Off, then on: a warnings.catch_warnings block (a library, pytest) that ended since the last
    # call has put back its own showwarning, and captureWarnings(True) alone would not re-install.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def describe(path: str | Path) -> str:
    """One-line summary of an input/output: size, and the shape where cheap to read.

    TSV: rows × columns; HDF5: its datasets' shapes (first 4); folder: files and bytes; other
    files: bytes. Never raises (an unreadable file says so).
    """
    p = Path(path)
    try:
        if p.is_dir():
            files = [f for f in p.rglob("*") if f.is_file()]
            return f"{p}: folder, {len(files)} files, {_bytes(sum(f.stat().st_size for f in files))}"
        if not p.exists():
            return f"{p}: missing"
        size = _bytes(p.stat().st_size)
        if p.suffix == ".tsv":
            with open(p) as f:
                cols = len(f.readline().rstrip("\n").split("\t"))
                rows = sum(1 for _ in f)
            return f"{p}: {size}, {rows} rows x {cols} columns"
        if p.suffix == ".h5":
            import h5py

            shapes: list[str] = []
            with h5py.File(p, "r") as h5:
                h5.visititems(
                    lambda name, obj: (
                        shapes.append(f"{name} {obj.shape}")
                        if isinstance(obj, h5py.Dataset) and len(shapes) < 4
                        else None
                    )
                )
            return f"{p}: {size}, datasets {', '.join(shapes) or 'none'}"
        return f"{p}: {size}"
    except Exception as err:  # a summary must never fail the job
        return f"{p}: unreadable for the log ({type(err).__name__}: {err})"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def peak_memory() -> str:
    """Peak resident memory of this process, and of the GPU when torch used CUDA:
    ``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux), ``torch.cuda.max_memory_allocated``.

    Child processes are left out: a forked helper (``git``) reports its parent's pages as its own.
    """
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes
    text = f"host {_bytes(own * scale)}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        text += f", GPU {_bytes(torch.cuda.max_memory_allocated())} allocated"
    return text


class JobClock:
    """Wall and CPU seconds since construction."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.wall:.1f} s wall, {time.process_time() - self.cpu:.1f} s CPU"


def log_files(log: logging.Logger, what: str, paths: Iterable[str]) -> None:
    """One INFO line per file: ``<what>: <describe(path)>``."""
    for p in paths:
        log.info("%s %s", what, describe(p))
