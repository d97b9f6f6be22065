"""Provenance: what made each artifact, recorded beside it and walkable back to model and data.

Every output of every rule gets a sidecar ``<output>.prov.json`` with: rule, wildcards, params
(the config subset the rule uses), inputs with SHA-256, git commit and dirty flag, versions of
the scientific stack, the model checkpoint (id, revision, weights hash) and the samples hash
when the step used them, the device, the numerics of a job that runs a model (fp32 precision,
TF32 override variables, GPU model, torch/CUDA/cuDNN/cuBLAS versions: :meth:`Step.pin_numerics`),
and start/end times. Figures carry the same JSON in their PNG metadata and PDF Subject. The
sidecar also records the artifact's own SHA-256 (``artifact``; for a folder, a manifest of
per-file hashes), so an edit after the fact is visible.

A step hashes its inputs once, when it starts, and refuses an input whose content differs from
what the sidecar of the rule that wrote it records: a corrupted Jacobian stops the next job with
the file named instead of flowing into a new, self-consistent sidecar.

``chain`` follows the input sidecars recursively (``resdyn provenance``); ``audit`` re-hashes
every artifact and its inputs under a folder (``resdyn verify``, see docs/audit.md).
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

PACKAGES = (
    "resdyn",
    "torch",
    "transformers",
    "numpy",
    "scipy",
    "pandas",
    "h5py",
    "igraph",
    "leidenalg",
    "kneed",
    "statsmodels",
    "snakemake",
)
REPO_ROOT = Path(__file__).resolve().parents[2]


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
            return subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def hash_path(path: str | Path) -> str | None:
    """SHA-256 of a file, or of a folder's files (``io.sha256_tree``); None if missing."""
    return fingerprint(path)["sha256"]


def fingerprint(path: str | Path) -> dict[str, Any]:
    """``{"path", "sha256", "files"}`` of an artifact; ``files`` is the per-file manifest of a
    folder (None for a file); ``sha256`` is None when the path does not exist."""
    p = Path(path)
    if p.is_dir():
        files = io.manifest(p)
        return {"path": str(path), "sha256": io.tree_digest(files), "files": files}
    return {"path": str(path), "sha256": io.sha256_file(p) if p.is_file() else None, "files": None}


class SidecarError(ValueError):
    """A provenance sidecar exists but does not hold what a sidecar must (one line: the file and why)."""


#: Keys a sidecar may hold, with the JSON type each must have when present.
_SIDECAR_TYPES: dict[str, type | tuple[type, ...]] = {
    "rule": (str, type(None)),
    "wildcards": dict,
    "params": dict,
    "inputs": dict,
    "outputs": dict,
    "artifact": dict,
    "start": (str, type(None)),
    "end": (str, type(None)),
}


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_input_path(name: str, side: Path, root: Path | None = None) -> None:
    """Refuse an input path a sidecar lists that no rule could have read: a folder outside the run
    folder ``root`` that contains it or is a file-system root (hashing it would walk the disk).

    Inputs inside the run folder are artifacts or staged data; outside it, rules read source
    files (corpus text, local model files) and local data-set folders, never a parent of the run.
    """
    root = (root or Path.cwd()).resolve()
    target = Path(name) if Path(name).is_absolute() else root / name
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError) as err:
        raise SidecarError(f"sidecar {side}: input {name!r} cannot be resolved ({err})") from err
    if _inside(resolved, root):
        return
    if resolved.is_dir() and (_inside(root, resolved) or resolved == Path(resolved.anchor)):
        raise SidecarError(
            f"sidecar {side}: input {name!r} is a folder above the run folder {root} "
            "(no rule reads it): the sidecar was edited — delete the artifact and its sidecar "
            "and rerun snakemake"
        )


def load_sidecar(side: str | Path) -> dict:
    """A sidecar's record, checked: valid JSON, an object, each known key of its JSON type, inputs
    a map of confined paths to hashes (:func:`check_input_path`); else :class:`SidecarError`."""
    side = Path(side)
    try:
        rec = io.read_json(side)
    except (ValueError, UnicodeDecodeError) as err:
        raise SidecarError(f"sidecar {side}: not valid JSON ({err})") from err
    if not isinstance(rec, dict):
        raise SidecarError(f"sidecar {side}: holds a JSON {type(rec).__name__}, not an object")
    for key, kind in _SIDECAR_TYPES.items():
        if key in rec and not isinstance(rec[key], kind):
            raise SidecarError(
                f"sidecar {side}: '{key}' is a JSON {type(rec[key]).__name__}, not the "
                f"{'object' if kind is dict else 'string'} a sidecar holds"
            )
    art = rec.get("artifact")
    if art is not None and not isinstance(art.get("sha256"), (str, type(None))):
        raise SidecarError(f"sidecar {side}: 'artifact.sha256' is not a string")
    for name, digest in (rec.get("inputs") or {}).items():
        if not isinstance(digest, (str, type(None))):
            raise SidecarError(f"sidecar {side}: the hash of input {name!r} is not a string")
        check_input_path(name, side)
    return rec


def _recorded(path: str | Path) -> dict | None:
    """The ``artifact`` fingerprint the sidecar of ``path`` recorded when it was written; None only
    when there is no sidecar. A sidecar that exists but cannot be read, or records no hash of its
    artifact, raises :class:`SidecarError`: an unreadable sidecar must not switch the check off."""
    side = io.prov_path(path)
    if not side.is_file():
        return None
    art = load_sidecar(side).get("artifact")
    if not isinstance(art, dict) or not art.get("sha256"):
        raise SidecarError(
            f"sidecar {side}: records no hash of {path}, so its content cannot be checked — "
            f"delete {path} and its sidecar and rerun snakemake to rebuild it"
        )
    return art


def _diff(path: str | Path, was: dict, now: dict) -> str:
    """Which files of an artifact differ between two fingerprints (for messages)."""
    if now["sha256"] is None:
        return "missing"
    if was.get("files") is None or now["files"] is None:
        return f"sha256 {was['sha256'][:12]}… → {now['sha256'][:12]}…"
    old, new = was["files"], now["files"]
    changed = [f for f in sorted(set(old) & set(new)) if old[f] != new[f]]
    parts = [
        f"changed {', '.join(changed[:5])}" if changed else "",
        f"removed {', '.join(sorted(set(old) - set(new))[:5])}" if set(old) - set(new) else "",
        f"added {', '.join(sorted(set(new) - set(old))[:5])}" if set(new) - set(old) else "",
    ]
    return "; ".join(x for x in parts if x) or "file list differs"


class InputChanged(RuntimeError):
    """An input's content differs from what the rule that wrote it recorded (corrupt or edited)."""


def check_input(path: str | Path, now: dict | None = None) -> dict:
    """Fingerprint ``path`` and check it against its own sidecar; raise :class:`InputChanged`.

    Inputs without a sidecar (source files: corpus text, model folders) are only fingerprinted.
    """
    now = now or fingerprint(path)
    was = _recorded(path)
    if was is not None and now["sha256"] is not None and was["sha256"] != now["sha256"]:
        raise InputChanged(
            f"input {path} differs from what its rule wrote ({_diff(path, was, now)}): corrupted or edited "
            f"after it was made — delete {path} and rerun snakemake to rebuild it"
        )
    return now


def _upstream(inputs: list[str], key: str) -> Any:
    """The first ``key`` recorded by an input's sidecar (or a checkpoint record itself)."""
    for inp in inputs:
        if Path(inp).name == "checkpoint.json" and key == "checkpoint":
            rec = io.read_json(inp)
            return {
                k: rec.get(k)
                for k in (
                    "model",
                    "checkpoint",
                    "source",
                    "repo",
                    "revision",
                    "resolved_commit",
                    "folder",
                    "content_hash",
                    "tokenizer_hash",
                )
            }
        side = io.prov_path(inp)
        if side.is_file():
            value = load_sidecar(side).get(key)
            if value:
                return value
    return None


def record(
    rule: str,
    wildcards: dict,
    params: dict,
    inputs: list[str],
    outputs: list[str],
    start: str,
    extra: dict | None = None,
    input_hashes: dict[str, str | None] | None = None,
) -> dict:
    """The provenance record of one step (see module docstring for the fields).

    ``input_hashes`` are the inputs' hashes taken when the step started (hashed here if None);
    ``outputs`` maps each output to its hash, None until :meth:`Step.finish` fills it in.
    """
    # Only ask torch about the device if the step imported it (figure steps never do: importing
    # torch costs seconds per job).
    torch = sys.modules.get("torch")
    on_gpu = torch is not None and torch.cuda.is_available()
    return {
        "rule": rule,
        "wildcards": dict(wildcards),
        "params": params,
        "inputs": input_hashes if input_hashes is not None else {str(p): hash_path(p) for p in inputs},
        "outputs": {str(p): None for p in outputs},
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
        # Hashed once, before any work: the record names what was read, and a corrupt input
        # stops the job here with its file named.
        self.input_hashes = {str(p): check_input(p)["sha256"] for p in snakemake.input}

    def pin_numerics(self, device) -> dict[str, Any]:
        """Pin fp32 matmuls/convs to IEEE for this job on ``device`` and record the numerics
        (:func:`resdyn.numerics.precision.pin_ieee`) as the sidecar's ``numerics``; every GPU job
        calls it first."""
        from resdyn.numerics import precision

        record = self.extra["numerics"] = precision.pin_ieee(device)
        logging.getLogger(f"resdyn.rule.{self.sm.rule}").info("fp32 numerics pinned: %s", json.dumps(record))
        return record

    @property
    def params(self) -> dict:
        return {k: v for k, v in self.sm.params.items()}

    def provenance(self) -> dict:
        """The record so far (end time unset); figures embed this."""
        inputs = [str(p) for p in self.sm.input]
        return record(
            self.sm.rule,
            dict(self.sm.wildcards.items()),
            self.params,
            inputs,
            [str(p) for p in self.sm.output],
            self.start,
            self.extra,
            self.input_hashes,
        )

    def finish(self) -> None:
        """Write ``<output>.prov.json`` for every output (after the outputs exist), with the
        hashes of all outputs and this output's own fingerprint (a manifest for a folder)."""
        prov = self.provenance()
        prov["end"] = _now()
        prints = {str(out): fingerprint(out) for out in self.sm.output if Path(out).exists()}
        prov["outputs"] = {
            str(out): prints[str(out)]["sha256"] if str(out) in prints else None for out in self.sm.output
        }
        for out, art in prints.items():
            io.write_json({**prov, "artifact": art}, io.prov_path(out))


@contextlib.contextmanager
def step(snakemake) -> Iterator[Step]:
    """Context for a rule's script: log to ``snakemake.log[0]``, write provenance at the end.

    Everything the job prints (tqdm bars, warnings, logging) goes to its log file
    (:func:`resdyn.pipeline.joblog.job_log`), which opens with INFO lines on the rule, its inputs and
    threads and closes with its outputs, seconds, device and peak memory. Exceptions are logged
    with their traceback and re-raised, so Snakemake marks the job failed and (outputs being
    written atomically) nothing half-written remains.
    """
    from resdyn.pipeline import joblog

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
        jl.info(
            "rule %s, wildcards %s, threads %d, host %s, pid %d",
            snakemake.rule,
            dict(snakemake.wildcards.items()),
            threads,
            platform.node(),
            os.getpid(),
        )
        joblog.log_files(jl, "input", [str(p) for p in snakemake.input])
        with threadpool_limits(limits=threads):
            try:
                s = Step(snakemake)  # hashes and checks the inputs: a corrupt one stops here, logged
                yield s
            except Exception:
                jl.exception("rule %s failed after %s; peak memory %s", snakemake.rule, clock, joblog.peak_memory())
                raise
        s.finish()
        joblog.log_files(jl, "output", [str(p) for p in snakemake.output])
        torch = sys.modules.get("torch")
        device = s.extra.get("device") or (
            "cuda:" + torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else "cpu"
        )
        torch_threads = f", torch threads {torch.get_num_threads()}" if torch is not None else ""
        jl.info("done in %s; device %s%s; peak memory %s", clock, device, torch_threads, joblog.peak_memory())


# --- auditing ----------------------------------------------------------------------------------


def read(path: str | Path) -> dict:
    """The provenance of an artifact: its sidecar, or the JSON embedded in a PNG."""
    side = io.prov_path(path)
    if side.is_file():
        return load_sidecar(side)
    if str(path).endswith(".png"):
        from PIL import Image

        text = Image.open(path).text.get("resdyn_provenance")
        if text:
            return json.loads(text)
    raise FileNotFoundError(f"{path}: no provenance sidecar ({side.name}) and no embedded record")


def chain(path: str | Path, seen: set[str] | None = None) -> list[tuple[str, dict]]:
    """Artifacts from ``path`` back to its roots: [(path, provenance)] in depth-first order.

    Inputs that have no provenance of their own (source files: corpus text, local model folders;
    or an artifact whose sidecar was deleted) end the walk with a stub record ``{"rule": None,
    "source": True, "sha256": ...}`` instead of vanishing, so the chain always reaches its roots.
    """
    seen = set() if seen is None else seen
    if str(path) in seen:
        return []
    seen.add(str(path))
    try:
        prov = read(path)
    except FileNotFoundError:
        return [(str(path), {"rule": None, "source": True, "sha256": hash_path(path)})]
    out = [(str(path), prov)]
    for inp in prov.get("inputs", {}):
        out += chain(inp, seen)
    return out


WHAT_TO_DO = {
    "changed output": "restore it, or delete it and rerun snakemake to rebuild it",
    "changed input": "rerun snakemake: it rebuilds the artifact from the current input",
    "missing input": "rerun snakemake to rebuild the input and the artifacts made from it",
    "stale chain": "rerun snakemake to rebuild it from the current input",
    "missing sidecar": "its origin cannot be checked: delete it and rerun snakemake to rebuild it",
    "sidecar without artifact": "rerun snakemake to rebuild the artifact, or delete the sidecar",
    "unreadable sidecar": "delete the artifact and its sidecar and rerun snakemake",
    "no output hash": "made by an older resdyn: rebuild it (snakemake --forcerun RULE) to audit it",
    "not an artifact": "nothing to verify: name results/ or models/ (the default) or files in them",
}


def problem(kind: str, path: str | Path, detail: str, todo: str | None = None) -> str:
    """One report line: ``<kind>: <path>: <detail> — <what to do>``."""
    return f"{kind}: {path}: {detail} — {todo or WHAT_TO_DO[kind]}"


class Auditor:
    """Re-hashes artifacts and their inputs, each path at most once per audit."""

    def __init__(self) -> None:
        self._prints: dict[str, dict] = {}

    def fingerprint(self, path: str | Path) -> dict:
        key = str(path)
        if key not in self._prints:
            self._prints[key] = fingerprint(path)
        return self._prints[key]

    def verify(self, path: str | Path) -> list[str]:
        """Problems of one artifact: its own content against its sidecar, then every input.

        An input whose hash differs from the one recorded is a *stale chain* when the input's
        own sidecar vouches for its current content (it was rebuilt after this artifact was made),
        and a *changed input* otherwise (a source file edited, or an upstream artifact altered).
        """
        side = io.prov_path(path)
        try:
            prov = read(path)
        except FileNotFoundError:
            return [problem("missing sidecar", path, f"no provenance sidecar {side.name}")]
        except ValueError as err:
            return [problem("unreadable sidecar", path, str(err))]
        if not side.is_file():  # a PNG with embedded provenance but no sidecar
            return [
                problem(
                    "missing sidecar",
                    path,
                    f"no provenance sidecar {side.name} (the PNG's embedded record has no hash of the PNG itself)",
                )
            ]
        problems = []
        rule = prov.get("rule")
        art = prov.get("artifact")
        now = self.fingerprint(path)
        if not isinstance(art, dict) or not art.get("sha256"):
            problems.append(problem("no output hash", path, "its sidecar records no hash of the artifact"))
        elif art["sha256"] != now["sha256"]:
            problems.append(
                problem("changed output", path, f"differs from what rule {rule} wrote ({_diff(path, art, now)})")
            )
        for inp, digest in (prov.get("inputs") or {}).items():
            cur = self.fingerprint(inp)
            if cur["sha256"] is None:
                problems.append(problem("missing input", path, f"input {inp} no longer exists"))
            elif digest is not None and cur["sha256"] != digest:
                try:
                    up = _recorded(inp)
                except SidecarError as err:
                    problems.append(problem("unreadable sidecar", inp, str(err)))
                    continue
                if up is not None and up["sha256"] == cur["sha256"]:
                    problems.append(
                        problem(
                            "stale chain",
                            path,
                            f"made from a version of {inp} that no longer "
                            f"exists (it was rebuilt since by rule {read(inp).get('rule')})",
                        )
                    )
                elif up is not None:  # the input itself was altered: fixing it comes first
                    problems.append(
                        problem(
                            "changed input",
                            path,
                            f"input {inp} was altered after its rule wrote it (see its 'changed output' line)",
                            f"fix {inp} first (restore it, or delete it and rerun snakemake)",
                        )
                    )
                else:
                    problems.append(
                        problem(
                            "changed input",
                            path,
                            f"input {inp} changed since it was made (sha256 {digest[:12]}… → {cur['sha256'][:12]}…)",
                        )
                    )
        return problems


def verify(path: str | Path) -> list[str]:
    """Problems with one artifact: changed content, changed/missing inputs, stale chain."""
    return Auditor().verify(path)


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


#: Top-level folders of the workflow directory whose files rules write; logs/ and benchmarks/
#: are written by rules too but are records, not artifacts, and everything else is source.
ARTIFACT_ROOTS = ("results", "models")


def is_artifact_path(path: str | Path) -> bool:
    """Whether ``path`` lies under one of :data:`ARTIFACT_ROOTS` of the working directory
    (the workflow's folder, where Snakemake and ``resdyn verify`` run)."""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:  # outside the workflow's folder
        return False
    return bool(rel.parts) and rel.parts[0] in ARTIFACT_ROOTS


def audit(roots: list[str | Path]) -> tuple[int, list[str]]:
    """Audit every artifact under ``roots``: returns (artifacts checked, problem lines).

    Checks each sidecar's artifact and inputs (:meth:`Auditor.verify`), sidecars whose artifact
    is gone, and files that no sidecar covers (neither their own nor a folder output's above them).
    Hidden files (a running job's staging, Snakemake's timestamps) are not artifacts, and neither
    is anything outside :data:`ARTIFACT_ROOTS` (source files, logs): a root holding no artifact
    path is reported as "not an artifact", and files outside them are never called orphans.
    """
    auditor = Auditor()
    problems: list[str] = []
    checked = 0
    covered: set[Path] = set()
    referenced: set[str] = set()
    for root in map(Path, roots):
        inside = [Path.cwd() / r for r in ARTIFACT_ROOTS if (Path.cwd() / r).resolve().is_relative_to(root.resolve())]
        if root.exists() and not is_artifact_path(root) and not any(r.exists() for r in inside):
            problems.append(
                problem(
                    "not an artifact",
                    root,
                    "not an artifact of this pipeline (rules write "
                    f"only under {' and '.join(f'{r}/' for r in ARTIFACT_ROOTS)})",
                )
            )
            continue
        if root.is_file():
            sidecars = [io.prov_path(root)]
        else:
            sidecars = sorted(p for p in root.rglob("*.prov.json") if not _hidden(p, root))
        for side in sidecars:
            artifact = Path(str(side)[: -len(".prov.json")])
            if not side.is_file():
                problems.append(problem("missing sidecar", artifact, f"no provenance sidecar {side.name}"))
                continue
            try:  # what downstream sidecars name tells which folder a stray file belongs to
                referenced.update(str(Path(i)) for i in (load_sidecar(side).get("inputs") or {}))
            except SidecarError:
                pass  # reported by the artifact's own check below
            if not artifact.exists():
                problems.append(problem("sidecar without artifact", side, f"its artifact {artifact} is missing"))
                continue
            covered.add(artifact)
            checked += 1
            problems += auditor.verify(artifact)
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        orphans: set[Path] = set()
        for f in root.rglob("*"):
            if not f.is_file() or f.name.endswith(".prov.json") or _hidden(f, root) or not is_artifact_path(f):
                continue
            chain_up = [f, *[a for a in f.parents if a == root or root in a.parents]]
            if any(a in covered for a in chain_up):
                continue
            # Report a folder output once (the one downstream sidecars name), not each file in it.
            orphans.add(next((a for a in chain_up if str(a) in referenced), f))
        problems += [
            problem("missing sidecar", o, f"no provenance sidecar {io.prov_path(o).name}") for o in sorted(orphans)
        ]
    return checked, problems
