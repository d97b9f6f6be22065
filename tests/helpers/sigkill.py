"""Shared by the resume tests: run a job in a subprocess, SIGKILL it once its checkpoint exists.

A runner script starts with :data:`RUNNER_HEADER` (formatted with ``tests=``, the tests/ folder, so
that the runner imports ``from helpers import ...`` as the tests do), which sets ``out`` (the output
folder) and ``slow`` (whether to slow the job down so that it can be killed between checkpoints,
with :func:`slow_down`).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUNNER_HEADER = """\
import logging, sys, time
import numpy as np, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from helpers import sigkill
out, slow = sys.argv[1], sys.argv[2] == "slow"
"""


def slow_down(owner, name: str, seconds: float) -> None:
    """Test-only: every call of ``owner.name`` sleeps ``seconds`` first."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def slowed(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)

    setattr(owner, name, slowed)


def start(script: Path, out: Path, mode: str) -> subprocess.Popen:
    """The runner ``script`` on ``out`` in ``mode`` ("slow" or "fast"), with this repo's resdyn."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(script), str(out), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_once_checkpointed(proc: subprocess.Popen, checkpoint: Path, timeout_s: float) -> None:
    """Wait for ``checkpoint`` to appear, then SIGKILL ``proc`` and check that it died of it."""
    deadline = time.monotonic() + timeout_s
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert checkpoint.exists(), proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
