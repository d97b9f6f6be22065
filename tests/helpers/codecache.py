"""Warm code-version caches for the workflow runs of the tests (a speed-up only, never a result).

Every `snakemake` call builds the DAG anew, and each rule's code version (the normalised code its
script reaches, resdyn.provenance.codeversion) costs ~2-3 s of CPU to compute for a whole DAG;
`cached_code_version` remembers it in the workdir's ``.snakemake/resdyn/code`` while none of the
files it read has changed (mtime and size). That cache is keyed by absolute paths, so a fresh
workdir, or a copy of a finished run at another path, starts cold. The tests make hundreds of such
calls, so they start them warm:

- :func:`seed` computes the versions of every rule script of this checkout, for no family and for
  each family (``code_cache_seed`` in tests/conftest.py, once per session), and :func:`warm` copies
  them into a workdir that runs this checkout's Snakefile (``--directory``/``-d`` elsewhere);
- :func:`carry` re-keys a run's cache (or the seed) for a copy of the workflow made with its mtimes
  kept (``shutil.copytree``), so the copy's first `snakemake` call finds its code versions.

An entry is used only if every file it lists still has the recorded mtime and size (the product's
own check), so a test that edits a module in its copy gets that rule's version recomputed; an entry
these helpers cannot re-key is left out, which only costs the computation.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(".snakemake") / "resdyn" / "code"


def _key(script: Path, package_dir: Path, family: str | None) -> str:
    # resdyn.provenance.codeversion.cached_code_version's file name for an index entry
    return hashlib.sha256(json.dumps([str(script), str(package_dir), family]).encode()).hexdigest()[:24]


def _families() -> list[str | None]:
    from resdyn.lm.families import FAMILIES

    return [None, *FAMILIES]


def seed(dest: Path, root: Path = ROOT) -> Path:
    """``dest`` (a cache folder) holding the code version of every script of ``root``'s workflow,
    for no family and for each family (with ``root``'s resdyn on the path, as the tests run it)."""
    from resdyn.provenance import codeversion

    for script in sorted((root / "workflow" / "scripts").glob("*.py")):
        for family in _families():
            codeversion.cached_code_version(script, dest, family, package_dir=root / "resdyn")
    codeversion.clear_caches()  # this process's tests start from nothing parsed, as before
    return dest


def warm(workdir: Path, cache: Path) -> Path:
    """Copy the cache folder ``cache`` (from :func:`seed`) into ``workdir``'s; returns ``workdir``."""
    shutil.copytree(cache, workdir / CACHE, dirs_exist_ok=True)
    return workdir


def carry(src: Path, dest: Path, cache: Path | None = None) -> Path:
    """Add to ``dest``'s cache (``dest``: a copy of the workflow or run in ``src``, its mtimes kept)
    the entries of ``cache`` (default: ``src``'s own) re-keyed to ``dest``'s paths; returns ``dest``."""
    src, dest = src.resolve(), dest.resolve()
    cache = src / CACHE if cache is None else cache
    index = cache / "index"
    if not index.is_dir():
        return dest
    keys = {}
    for script in (src / "workflow" / "scripts").glob("*.py"):
        for family in _families():
            keys[_key(script, src / "resdyn", family)] = (script, family)
    out = dest / CACHE / "index"
    out.mkdir(parents=True, exist_ok=True)
    for entry in index.glob("*.json"):
        if entry.stem not in keys:
            continue  # not this checkout's scripts and families (or another format): left out
        script, family = keys[entry.stem]
        data = json.loads(entry.read_text())
        files = {}
        for path, stamp in data["files"].items():
            rel = Path(path).relative_to(src) if Path(path).is_relative_to(src) else None
            files[str(dest / rel) if rel is not None else path] = stamp
        new = _key(dest / script.relative_to(src), dest / "resdyn", family)
        (out / f"{new}.json").write_text(json.dumps({"files": files, "version": data["version"]}))
    manifests = cache / "manifests"
    if manifests.is_dir():
        shutil.copytree(manifests, dest / CACHE / "manifests", dirs_exist_ok=True)
    return dest
