"""Time of ``resdyn collect`` / ``resdyn.load`` / ``resdyn compare`` on a finished run (docs/notebooks.md).

    python benchmarks/collect.py RESULTS [--repeat 3]

Prints one row per stage: collecting every table (sidecar checks, reading through the artifact
classes, identity columns), writing the parquet files and catalog, loading every table back
from them, and comparing the run with its collected copy; best of ``--repeat`` runs, with the
tables, rows and files involved.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from resdyn import compare, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a run's results/ folder (or the run folder)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    times: dict[str, float] = {}

    def timed(name, fn):
        best = float("inf")
        for _ in range(a.repeat):
            start = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - start)
        times[name] = best
        return out

    with tempfile.TemporaryDirectory() as out:
        got = timed("collect", lambda: results.collect(a.results))
        timed("write parquet + catalog", lambda: results.write_collected(got, out))
        timed("load every table (parquet)", lambda: {n: t for n, t in results.load(out).items()})
        cmp = timed("compare run vs collected", lambda: compare.compare_runs(a.results, out))
    rows = sum(len(t) for t in got.tables.values())
    files = sum(len(f) for f in got.files.values())
    print(f"{len(got.tables)} tables, {rows} rows, {files} files; compare: {len(cmp.differences)} differences")
    print(f"{'stage':<30} {'best s':>8}")
    for name, s in times.items():
        print(f"{name:<30} {s:>8.3f}")


if __name__ == "__main__":
    main()
