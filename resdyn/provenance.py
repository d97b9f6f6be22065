"""Provenance: what made each artifact, recorded beside it and walkable back to model and data.

Every output of every rule gets a sidecar ``<output>.prov.json`` with: rule, wildcards, params
(the config subset the rule uses), inputs with SHA-256, git commit and dirty flag, versions of
the scientific stack, the model checkpoint (id, revision, weights hash) and the samples hash
when the step used them, the device, and start/end times. Figures carry the same JSON in their
PNG metadata and PDF Subject. ``chain`` follows the input sidecars recursively (``resdyn
provenance``); ``verify`` re-hashes recorded inputs (``resdyn verify``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resdyn import io

log = logging.getLogger(__name__)

PACKAGES = ("resdyn", "torch", "transformers", "numpy", "scipy", "pandas", "h5py", "igraph",
            "leidenalg", "kneed", "statsmodels", "snakemake")
REPO_ROOT = Path(__file__).resolve().parent.parent


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str | None]:
    """Installed versions of the packages results depend on (None when absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit of the code and whether the work tree has uncommitted changes."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  check=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def hash_path(path: str | Path) -> str | None:
    """SHA-256 of a file, or of a folder's files (``io.sha256_tree``); None if missing."""
    p = Path(path)
    if p.is_dir():
        return io.sha256_tree(p)
    if p.is_file():
        return io.sha256_file(p)
    return None


def _upstream(inputs: list[str], key: str) -> Any:
    """The first ``key`` recorded by an input's sidecar (or a checkpoint record itself)."""
    for inp in inputs:
        if Path(inp).name == "checkpoint.json" and key == "checkpoint":
            rec = io.read_json(inp)
            return {k: rec.get(k) for k in ("model", "checkpoint", "source", "repo", "revision",
                                            "resolved_commit", "folder", "content_hash")}
        side = io.prov_path(inp)
        if side.is_file():
            value = io.read_json(side).get(key)
            if value:
                return value
    return None


def record(rule: str, wildcards: dict, params: dict, inputs: list[str], outputs: list[str],
           start: str, extra: dict | None = None) -> dict:
    """The provenance record of one step (see module docstring for the fields)."""
    # Only ask torch about the device if the step imported it (figure steps never do: importing
    # torch costs seconds per job).
    torch = sys.modules.get("torch")
    on_gpu = torch is not None and torch.cuda.is_available()
    return {
        "rule": rule,
        "wildcards": dict(wildcards),
        "params": params,
        "inputs": {str(p): hash_path(p) for p in inputs},
        "outputs": [str(p) for p in outputs],
        "checkpoint": _upstream(inputs, "checkpoint"),
        "samples_hash": (extra or {}).get("samples_hash") or _upstream(inputs, "samples_hash"),
        "dataset": (extra or {}).get("dataset") or _upstream(inputs, "dataset"),
        "git": git_state(),
        "versions": versions(),
        "device": (extra or {}).get("device") or ("cuda:" + torch.cuda.get_device_name(0) if on_gpu else "cpu"),
        "host": platform.node(),
        "start": start,
        "end": None,
        **{k: v for k, v in (extra or {}).items() if k not in ("samples_hash", "dataset", "device")},
    }


class Step:
    """One rule execution seen from its script: logging, timing and provenance of its outputs."""

    def __init__(self, snakemake) -> None:
        self.sm = snakemake
        self.start = _now()
        self.extra: dict[str, Any] = {}

    @property
    def params(self) -> dict:
        return {k: v for k, v in self.sm.params.items()}

    def provenance(self) -> dict:
        """The record so far (end time unset); figures embed this."""
        inputs = [str(p) for p in self.sm.input]
        return record(self.sm.rule, dict(self.sm.wildcards.items()), self.params, inputs,
                      [str(p) for p in self.sm.output], self.start, self.extra)

    def finish(self) -> None:
        """Write ``<output>.prov.json`` for every output (after the outputs exist)."""
        prov = self.provenance()
        prov["end"] = _now()
        for out in self.sm.output:
            if Path(out).exists():
                io.write_json(prov, io.prov_path(out))


@contextlib.contextmanager
def step(snakemake) -> Iterator[Step]:
    """Context for a rule's script: log to ``snakemake.log[0]``, write provenance at the end.

    Everything the job prints (tqdm bars, warnings, logging) goes to its log file
    (:func:`resdyn.joblog.job_log`), which opens with INFO lines on the rule, its inputs and
    threads and closes with its outputs, seconds, device and peak memory. Exceptions are logged
    with their traceback and re-raised, so Snakemake marks the job failed and (outputs being
    written atomically) nothing half-written remains.
    """
    from resdyn import joblog

    log_file = snakemake.log[0] if len(snakemake.log) else None
    with joblog.job_log(log_file):
        jl = logging.getLogger(f"resdyn.rule.{snakemake.rule}")
        clock = joblog.JobClock()
        # BLAS and torch get exactly the job's threads: oversubscribed OpenBLAS made d=1024
        # eigendecompositions 5-12x slower on 2 loaded cores (benchmarks/spectral.py).
        from threadpoolctl import threadpool_limits

        threads = max(1, int(getattr(snakemake, "threads", 1) or 1))
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
        jl.info("rule %s, wildcards %s, threads %d, host %s, pid %d", snakemake.rule,
                dict(snakemake.wildcards.items()), threads, platform.node(), os.getpid())
        joblog.log_files(jl, "input", [str(p) for p in snakemake.input])
        s = Step(snakemake)
        with threadpool_limits(limits=threads):
            try:
                yield s
            except Exception:
                jl.exception("rule %s failed after %s; peak memory %s", snakemake.rule, clock,
                             joblog.peak_memory())
                raise
        s.finish()
        joblog.log_files(jl, "output", [str(p) for p in snakemake.output])
        torch = sys.modules.get("torch")
        device = s.extra.get("device") or (
            "cuda:" + torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else "cpu")
        torch_threads = f", torch threads {torch.get_num_threads()}" if torch is not None else ""
        jl.info("done in %s; device %s%s; peak memory %s", clock, device, torch_threads, joblog.peak_memory())


# --- auditing ----------------------------------------------------------------------------------


def read(path: str | Path) -> dict:
    """The provenance of an artifact: its sidecar, or the JSON embedded in a PNG."""
    side = io.prov_path(path)
    if side.is_file():
        return io.read_json(side)
    if str(path).endswith(".png"):
        from PIL import Image

        text = Image.open(path).text.get("resdyn_provenance")
        if text:
            return json.loads(text)
    raise FileNotFoundError(f"{path}: no provenance sidecar ({side.name}) and no embedded record")


def chain(path: str | Path, seen: set[str] | None = None) -> list[tuple[str, dict]]:
    """Artifacts from ``path`` back to its roots: [(path, provenance)] in depth-first order."""
    seen = set() if seen is None else seen
    if str(path) in seen:
        return []
    seen.add(str(path))
    try:
        prov = read(path)
    except FileNotFoundError:
        return []
    out = [(str(path), prov)]
    for inp in prov.get("inputs", {}):
        out += chain(inp, seen)
    return out


def verify(path: str | Path) -> list[str]:
    """Problems with an artifact's recorded inputs: missing, or content changed since it was made."""
    prov = read(path)
    problems = []
    for inp, digest in prov.get("inputs", {}).items():
        now = hash_path(inp)
        if now is None:
            problems.append(f"{path}: input {inp} is missing")
        elif digest is not None and now != digest:
            problems.append(f"{path}: input {inp} changed since it was made (sha256 {digest[:12]}… → {now[:12]}…)")
    return problems
