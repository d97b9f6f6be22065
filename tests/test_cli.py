"""The command-line shell: --version, help for every argument in plain text, exit codes, and one
line instead of a traceback for a missing or invalid file."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from resdyn import cli

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "resdyn.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_version_is_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"resdyn {version}"


def test_every_argument_has_help_and_help_is_plain_text():
    parser = cli._parser()
    parsers = {"resdyn": parser, **_subparsers(parser)}
    assert set(parsers) >= {"resdyn", "provenance", "verify", "plan"}
    for name, p in parsers.items():
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, f"{name}: {action.dest} has no help"
        text = p.format_help()
        assert "``" not in text and ":func:" not in text, f"{name} --help has RST markup:\n{text}"
        for code in ("0  success", "1  the command ran", "2  bad usage or bad input"):
            assert code in text, f"{name} --help does not document exit code {code!r}"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["plan", "/nonexistent.yaml"], "resdyn plan: error: /nonexistent.yaml: no such file or directory"),
        (["plan", "/"], "resdyn plan: error: /: is a directory, expected a file"),
        (["provenance", "/nonexistent.tsv"], "resdyn provenance: error: /nonexistent.tsv: no such file or directory"),
    ],
)
def test_missing_file_is_one_line_exit_2(args, needle):
    out = run(*args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == needle and "Traceback" not in out.stderr


def test_invalid_yaml_and_non_mapping_are_one_line_exit_2(tmp_path):
    (tmp_path / "bad.yaml").write_text("models: [1\n")
    (tmp_path / "list.yaml").write_text("- 1\n")
    for name, needle in (("bad.yaml", "not valid YAML (line 2, column 1: "), ("list.yaml", "expected a YAML mapping")):
        out = run("plan", str(tmp_path / name))
        assert out.returncode == 2 and "Traceback" not in out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and name in lines[0], out.stderr
        assert lines[0].startswith("resdyn plan: error: ")


def test_usage_error_exits_2_and_success_exits_0():
    assert run("no-such-command").returncode == 2
    assert run().returncode == 2
    assert run("plan", "configs/smoke.yaml").returncode == 0
