"""The installed package (``pip install .``, not editable) is complete: it validates a config and
plans a run from outside the repository, with the schema read from package data."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with resdyn installed from a copy of the sources (no network, no deps)."""
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "resdyn", src / "resdyn", ignore=shutil.ignore_patterns("__pycache__"))
    # Build the wheel with this environment's setuptools (offline), install it into a fresh venv.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        check=True,
        cwd=tmp,
        env=_clean_env(),
    )
    wheel = next((tmp / "dist").glob("resdyn-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    # The dependencies come from the test's own environment: a plain path in a .pth file does not
    # run that environment's .pth hooks, so its editable resdyn (if any) stays invisible and only
    # the installed copy is importable.
    purelib = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    deps = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    (purelib / "resdyn_test_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        check=True,
        cwd=tmp,
        env=_clean_env(),
    )
    shutil.rmtree(src)  # nothing may be read from the sources any more
    return venv


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_installed_package_validates_a_config_and_plans(installed, tmp_path):
    shutil.copy(ROOT / "configs" / "smoke.yaml", tmp_path / "smoke.yaml")
    py = installed / "bin" / "python"
    check = (
        "import resdyn, resdyn.pipeline.config as rc; "
        "print(resdyn.__file__); print(rc.SCHEMA_PATH); "
        "cfg = rc.load_config('smoke.yaml'); print(cfg['samples']['n'], cfg['jacobian']['positions'])"
    )
    out = subprocess.run([py, "-c", check], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    module, schema, values = out.stdout.splitlines()
    assert Path(module).is_relative_to(installed) and Path(schema).is_relative_to(installed)
    assert Path(schema).is_file() and values == "6 last"
    plan = subprocess.run(
        [installed / "bin" / "resdyn", "plan", "smoke.yaml"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 0, plan.stderr
    assert "jacobians" in plan.stdout and "total:" in plan.stdout
    (tmp_path / "bad.yaml").write_text((tmp_path / "smoke.yaml").read_text().replace("n: 6,", "n: -6,"))
    bad = subprocess.run(
        [installed / "bin" / "resdyn", "plan", "bad.yaml"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "samples.n" in bad.stderr and "-6" in bad.stderr
