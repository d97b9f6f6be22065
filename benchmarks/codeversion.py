"""Cost of the rules' code versions at DAG build (docs/reruns.md): every workflow script, per
family where the rule passes one, as Snakemake computes them.

    python benchmarks/codeversion.py [--families llama olmo2]

Prints seconds for: a module-level hash (script + every module of its import closure, the baseline),
the symbol-level closure cold (every file parsed), warm in-process (parsed files cached), and
from the on-disk cache in a new process (only stat calls), and the symbols and modules reached.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

from resdyn.provenance import codeversion as cv

ROOT = Path(__file__).resolve().parents[1]
FAMILY_RULES = ("jacobians", "activations", "causal")  # code(..., family=model_family) in the rules


def module_level_version(script: Path) -> str:
    """A coarser version, for comparison: the script's bytes and every reached module's bytes."""
    h = hashlib.sha256(script.read_bytes())
    for name in sorted(cv.import_closure(script)):
        h.update(cv.module_file(name).read_bytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["llama", "olmo2"])
    a = ap.parse_args()
    scripts = sorted((ROOT / "workflow" / "scripts").glob("*.py"))
    jobs = [(s, None) for s in scripts] + [(s, f) for s in scripts if s.stem in FAMILY_RULES for f in a.families]
    rows = []
    t = time.perf_counter()
    for s in scripts:
        module_level_version(s)
    rows.append(("module-level hash (before)", time.perf_counter() - t))
    t = time.perf_counter()
    reached = [cv.code_manifest(s, family=f) for s, f in jobs]
    rows.append(("symbol closure, cold", time.perf_counter() - t))
    t = time.perf_counter()
    for s, f in jobs:
        cv.code_manifest(s, family=f)
    rows.append(("symbol closure, warm (in-process)", time.perf_counter() - t))
    with tempfile.TemporaryDirectory() as cache:
        for s, f in jobs:
            cv.cached_code_version(s, cache, f)
        cv.clear_caches()
        t = time.perf_counter()
        for s, f in jobs:
            cv.cached_code_version(s, cache, f)
        rows.append(("on-disk cache, new process", time.perf_counter() - t))
    print(f"{len(jobs)} code versions ({len(scripts)} scripts, families {a.families} for {FAMILY_RULES})")
    for label, secs in rows:
        print(f"{label:36s} {secs:7.3f} s")
    sizes = [len(m) for m in reached]
    print(f"pieces of code per version: min {min(sizes)}, median {sorted(sizes)[len(sizes) // 2]}, max {max(sizes)}")


if __name__ == "__main__":
    main()
