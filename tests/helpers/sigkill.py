"""Shared by the resume tests: run a job in a subprocess, SIGKILL it while it is held at its first checkpoint.

A runner script starts with :data:`RUNNER_HEADER` (formatted with ``tests=``, the tests/ folder, so
that the runner imports ``from helpers import ...`` as the tests do), which sets ``out`` (the output
folder) and ``held`` (whether to hold the job at its first checkpoint with
:func:`helpers.hold.hold_at_first_save`, so that the kill lands after a checkpoint and before the end
on a CPU of any speed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import hold

REPO = Path(__file__).resolve().parents[2]

RUNNER_HEADER = """\
import logging, sys, time
import numpy as np, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from helpers import hold, sigkill
out, held = sys.argv[1], sys.argv[2] == "held"
"""


def start(script: Path, out: Path, mode: str) -> subprocess.Popen:
    """The runner ``script`` on ``out`` in ``mode`` ("held" or "free"), with this repo's resdyn."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(script), str(out), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_once_checkpointed(proc: subprocess.Popen, out: Path, checkpoint: Path) -> None:
    """Wait until the held ``proc`` has saved ``checkpoint`` (its marker in ``out``), SIGKILL it,
    and check that it died of it."""
    hold.wait_for(Path(out) / hold.MARKER, proc, "the held run")
    assert checkpoint.exists(), checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
