"""The Makefile's test targets: the tests write bytecode caches whatever the caller's environment
says (the suite starts hundreds of Python processes; without caches each compiles resdyn again)."""

from __future__ import annotations

import os
import subprocess

from conftest import ROOT


def test_make_test_targets_write_bytecode_caches():
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    db = subprocess.run(["make", "-pn", "test", "test-fast"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
    for target in ("test", "test-fast"):
        assert f"\n{target}: PYTHONDONTWRITEBYTECODE = \n" in db, target
