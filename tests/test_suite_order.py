"""The suite's file order for xdist (tests/conftest.py): workflow files first, then by test count,
each file's tests together and in their own order; and the Makefile's test targets keep xdist from
reordering it and write bytecode caches whatever the caller's environment says."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from conftest import ROOT, pytest_collection_modifyitems


def _item(path: str, name: str, mark: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        path=Path(path), name=name, get_closest_marker=lambda m, mark=mark: object() if m == mark else None
    )


def test_workflow_files_come_first_then_files_by_test_count():
    items = [
        _item("a.py", "a1"),
        _item("b.py", "b1"),
        _item("b.py", "b2"),
        _item("b.py", "b3"),
        _item("s.py", "s1", "slurm"),
        _item("u.py", "u1"),
        _item("u.py", "u2", "slow"),
        _item("z.py", "z1"),
        _item("z.py", "z2"),
        _item("z.py", "z3"),
    ]
    pytest_collection_modifyitems(None, items)
    # heavy files by test count (u 2, s 1), then b and z (3 each: collection order), then a
    assert [i.name for i in items] == ["u1", "u2", "s1", "b1", "b2", "b3", "z1", "z2", "z3", "a1"]


def test_make_test_targets_keep_the_suites_order():
    lines = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if "pytest" in ln and "--dist loadfile" in ln]
    assert len(lines) == 2 and all("--no-loadscope-reorder" in ln for ln in lines), lines


def test_make_test_targets_write_bytecode_caches():
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    db = subprocess.run(["make", "-pn", "test", "test-fast"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
    for target in ("test", "test-fast"):
        assert f"\n{target}: PYTHONDONTWRITEBYTECODE = \n" in db, target
