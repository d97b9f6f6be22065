"""Installs that work off this machine: the Makefile's CPU torch on this machine's pip config and on
plain PyPI, and envs/resdyn.yaml as `snakemake --sdm conda` uses it.

The plain-PyPI path is checked with real pip (``install --dry-run --report``) against two local
PEP 503 indexes standing in for PyPI (torch 2.13.0, the CUDA build) and the PyTorch CPU index
(torch 2.13.0+cpu): download.pytorch.org is not reachable from CI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent
TORCH_SPEC = re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)

#: conda-forge package -> PyPI distribution, where the names differ
CONDA_TO_PYPI = {"pytorch": "torch", "python-igraph": "igraph"}


def _torch_args(env: dict, **make_vars: str) -> str:
    """The extra pip arguments `make setup` uses for torch (Makefile target torch-args)."""
    args = ["make", "-s", "--no-print-directory", "torch-args", f"VENV={VENV}"]
    args += [f"{k}={v}" for k, v in make_vars.items()]
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _resolve(env: dict, *pip_args: str) -> dict:
    """What `pip install` would install for TORCH_SPEC: the --report entry (version, url)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--no-deps",
        "--ignore-installed",
        "--report",
        "-",
        *pip_args,
        TORCH_SPEC,
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    item = json.loads(out.stdout)["install"][0]
    return {"version": item["metadata"]["version"], "url": item["download_info"]["url"]}


def _fake_wheel(folder: Path, version: str) -> Path:
    """A minimal wheel of 'torch' at ``version`` (metadata only)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version.split('+')[0]}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def _simple_index(root: Path, version: str) -> str:
    """A PEP 503 file index at ``root`` holding one torch wheel; returns its file:// URL."""
    wheel = _fake_wheel(root / "files", version)
    (root / "torch").mkdir(parents=True, exist_ok=True)
    (root / "torch" / "index.html").write_text(f'<a href="../files/{wheel.name}">{wheel.name}</a>\n')
    return root.as_uri()


def test_this_machines_pip_config_gives_the_cpu_wheel():
    """Here pip's own configuration serves the CPU build (from disk): the Makefile adds nothing,
    and what it installs is a +cpu wheel. On a plain-PyPI machine the extra index is added."""
    env = dict(os.environ)
    args = _torch_args(env)
    assert args in ("", "--extra-index-url https://download.pytorch.org/whl/cpu"), args
    resolved = _resolve(env, *args.split())
    assert resolved["version"].endswith("+cpu"), resolved


def test_plain_pypi_gets_the_cpu_index(tmp_path):
    """Plain PyPI (no local config): pip alone would take the CUDA build; the Makefile detects that,
    adds the CPU index, and pip then resolves the +cpu build (a local version sorts higher)."""
    base = TORCH_SPEC.split("==")[1]
    pypi = _simple_index(tmp_path / "pypi", base)  # PyPI's Linux torch: the CUDA build
    cpu = _simple_index(tmp_path / "cpu", f"{base}+cpu")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=pypi, PIP_DISABLE_PIP_VERSION_CHECK="1")
    assert _resolve(env)["version"] == base  # the problem: plain PyPI gives the CUDA build
    args = _torch_args(env, TORCH_CPU_INDEX=cpu)
    assert args == f"--extra-index-url {cpu}"
    resolved = _resolve(env, *args.split())
    assert resolved["version"] == f"{base}+cpu" and resolved["url"].startswith(cpu), resolved


# --- envs/resdyn.yaml ------------------------------------------------------------------------------


def _env() -> dict:
    return yaml.safe_load((ROOT / "envs" / "resdyn.yaml").read_text())


def _requirement(text: str) -> tuple[str, str]:
    """(normalised name, specifier without spaces) of a requirement or conda spec."""
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*(#.*)?$", text)
    name = m.group(1).lower().replace("_", "-")
    return CONDA_TO_PYPI.get(name, name), m.group(2).replace(" ", "")


def test_env_file_parses_with_conda_forge_only():
    env = _env()
    assert env["name"] == "resdyn"
    assert env["channels"] == ["conda-forge"]  # no deprecated pytorch channel, no nvidia/defaults
    pips = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert len(pips) == 1 and list(pips[0]) == ["pip"] and "pip" in env["dependencies"]


def test_env_pip_paths_survive_snakemakes_copy():
    """Snakemake copies the env file to .snakemake/conda/<hash>.yaml, so any local path in the pip
    section must resolve from there; the file has none (resdyn comes from the workflow folder)."""
    pip = next(d for d in _env()["dependencies"] if isinstance(d, dict))["pip"]
    copied_to = ROOT / ".snakemake" / "conda"
    for entry in pip:
        if re.match(r"^(-e\s|\.|/|file:)", entry):
            target = entry.removeprefix("-e").strip().removeprefix("file:")
            assert (copied_to / target).resolve().is_dir(), f"{entry!r} does not resolve from {copied_to}"
    assert not any(e.startswith("-e") for e in pip), pip
    snakefile = (ROOT / "Snakefile").read_text()
    assert "sys.path.insert(0, workflow.basedir)" in snakefile  # how rules import resdyn there


def test_env_dependencies_equal_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    expected = dict(_requirement(r) for r in project)
    deps = _env()["dependencies"]
    conda = [d for d in deps if isinstance(d, str) and not re.match(r"^(python|pip)\b(?!-)", d)]
    pip = next(d for d in deps if isinstance(d, dict))["pip"]
    got = dict(_requirement(r) for r in conda + pip)
    assert got == expected
    assert any(re.fullmatch(r"python=3\.1[1-9]", d) for d in deps if isinstance(d, str))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("pytorch>=2.4", ("torch", ">=2.4")),
        ("transformers>=5.20,<6", ("transformers", ">=5.20,<6")),
        ("python-igraph>=0.11", ("igraph", ">=0.11")),
    ],
)
def test_requirement_names_map(text, expected):
    assert _requirement(text) == expected
