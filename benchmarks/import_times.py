"""Start-up cost of every workflow script: time of its top-level imports in a fresh process.

Each Snakemake job starts a Python process and runs its script's imports before any work; this
measures exactly those import statements (taken from the script's AST, top level only), each in
a fresh ``python -c`` child, ``--repeats`` times, and reports the median wall time plus whether
``torch`` / ``transformers`` ended up in ``sys.modules``. Prints a Markdown table; asserts nothing.

    python benchmarks/import_times.py               # all scripts, 3 repeats
    python benchmarks/import_times.py --repeats 5 spectra rss
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
HEAVY = ("torch", "transformers")


def script_imports(path: Path) -> str:
    """The script's top-level ``import`` / ``from ... import`` statements, as source lines."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(ast.unparse(n) for n in nodes)


def measure(imports: str) -> dict:
    """Run ``imports`` in a fresh interpreter; wall seconds and which heavy modules got loaded."""
    code = (
        "import time, sys, json\n"
        "t0 = time.perf_counter()\n"
        f"{imports}\n"
        "dt = time.perf_counter() - t0\n"
        f"print(json.dumps({{'s': dt, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scripts", nargs="*", help="script stems (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    paths = sorted(SCRIPTS.glob("*.py"))
    if args.scripts:
        paths = [p for p in paths if p.stem in set(args.scripts)]
    print("| script | import s (median) | heavy modules loaded |")
    print("|---|---:|---|")
    for path in paths:
        runs = [measure(script_imports(path)) for _ in range(args.repeats)]
        median = statistics.median(r["s"] for r in runs)
        print(f"| {path.stem} | {median:.2f} | {', '.join(runs[0]['heavy']) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
