"""Hold a job at its first checkpoint until the test says go: tests synchronise on events, not speed.

A job script written by a test (a SLURM job, a SIGKILL runner) calls :func:`hold_at_first_save` on
the function that writes its checkpoint (``LensCheckpoint.save``, ``JacobianSums.save``). After the
first save has returned, the wrapper writes ``<folder>/checkpointed`` and blocks until
``<folder>/release`` exists, so the test acts (requeues, kills) while the job can neither finish nor
move on, on a CPU of any speed. The test side: :func:`wait_for` the marker, act, :func:`release`.

Knob for checking that nothing else depends on speed: ``RESDYN_TEST_SAVE_DELAY_S`` (seconds, default
0) makes every wrapped save sleep that long first, i.e. a job artificially slow between checkpoints.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import time
from pathlib import Path

MARKER, RELEASE = "checkpointed", "release"
DELAY_ENV = "RESDYN_TEST_SAVE_DELAY_S"
#: a guard against a hang, not an assumption about speed: a held job never gets near it
GUARD_S = 1800.0


def hold_at_first_save(owner, name: str, folder: str | Path, hold: bool = True) -> None:
    """Wrap ``owner.name`` (a function, method, classmethod or staticmethod): after its first call
    returns, write ``folder/checkpointed`` and wait for ``folder/release``; later calls pass through.
    ``hold`` False: only the :data:`DELAY_ENV` delay (a resumed job that must not be held again)."""
    folder = Path(folder)
    raw = inspect.getattr_static(owner, name)
    kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    inner = raw.__func__ if kind else raw
    delay = float(os.environ.get(DELAY_ENV, "0") or 0)
    calls = []

    def held(*args, **kwargs):
        if delay:
            time.sleep(delay)
        out = inner(*args, **kwargs)
        calls.append(1)
        if hold and len(calls) == 1:
            (folder / MARKER).write_text(f"{os.getpid()}\n")
            while not (folder / RELEASE).exists():
                time.sleep(0.05)
        return out

    setattr(owner, name, kind(held) if kind else held)


def wait_for(path: Path, proc: subprocess.Popen | None = None, what: str = "", log: Path | None = None) -> None:
    """Block until ``path`` exists; fail at once if ``proc`` ended first, with its output (its pipes,
    or the file ``log`` it writes to) in the message."""
    start = time.monotonic()
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            out = log.read_text() if log is not None else "\n".join(filter(None, proc.communicate()))
            raise AssertionError(f"{what or 'the job'} ended before {path.name} appeared:\n{out[-3000:]}")
        if time.monotonic() - start > GUARD_S:
            raise AssertionError(f"{path} not there after {GUARD_S:.0f} s: the job hangs")
        time.sleep(0.05)


def release(folder: str | Path) -> None:
    """Let a held job go on."""
    (Path(folder) / RELEASE).write_text("go\n")
