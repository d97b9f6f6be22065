"""Where outputs go: `snakemake --directory DIR` puts results, logs and benchmarks under DIR, the
repository elsewhere; a DIR without write access stops the run with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resdyn.cluster import site

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def _snakemake(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _untracked_or_changed() -> set[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return {line[3:] for line in out.splitlines()}


@pytest.mark.slow
def test_directory_puts_every_output_under_it(tmp_path):
    """From another folder, `--directory DIR`: the embedded config is found, the dry run plans every
    output under DIR, and a real job (the corpus) writes its output, log and benchmark there."""
    before = _untracked_or_changed()
    run = tmp_path / "scratch" / "run"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dry = _snakemake(
        "-n", "--cores", "2", "--directory", str(run), "--configfile", str(REPO / "configs/smoke.yaml"), cwd=elsewhere
    )
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "results/" in dry.stdout and "logs/" in dry.stdout
    assert str(REPO) not in "".join(line for line in dry.stdout.splitlines() if line.strip().startswith("output:"))
    done = _snakemake(
        "results/data/kjv/train.jsonl",
        "--cores",
        "1",
        "--directory",
        str(run),
        "--configfile",
        str(REPO / "configs/smoke.yaml"),
        cwd=elsewhere,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rel in (
        "results/data/kjv/train.jsonl",
        "results/data/kjv/heldout.jsonl",
        "logs/corpus/kjv.log",
        "benchmarks/out/corpus/kjv.tsv",
        ".snakemake",
    ):
        assert (run / rel).exists(), rel
    assert not any(elsewhere.iterdir())  # nothing where snakemake was started
    assert _untracked_or_changed() == before  # nor in the repository


def test_a_directory_without_write_access_is_one_line(tmp_path, monkeypatch):
    site.check_workdir(tmp_path)  # writable: nothing to say
    assert list(tmp_path.iterdir()) == []  # and the probe is gone

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    with pytest.raises(ValueError) as err:
        site.check_workdir("/scratch/run")
    assert str(err.value) == (
        "working directory (snakemake --directory) '/scratch/run' is not writable (Permission "
        "denied): results/, models/, logs/ and benchmarks/ go there; choose a folder you can "
        "write, e.g. on scratch"
    )


@pytest.mark.slow
def test_snakemake_stops_on_an_unwritable_directory(tmp_path):
    target = Path("/sys/kernel")  # read-only for every user, root included (sysfs)
    if not target.is_dir() or os.access(target, os.W_OK) and _probe(target):
        pytest.skip("no read-only directory to try")
    res = _snakemake("-n", "--cores", "1", "--directory", str(target), cwd=tmp_path)
    assert res.returncode != 0
    assert f"working directory (snakemake --directory) '{target}' is not writable" in res.stdout + res.stderr


def _probe(path: Path) -> bool:
    try:
        site.check_workdir(path)
        return True
    except ValueError:
        return False
