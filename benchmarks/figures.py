"""Cost of drawing one scope instance's figures, split into plot, layout, PNG and PDF.

Reads a finished run folder (its artifacts under ``results/``) and draws every catalogue figure of
one checkpoint (scopes ``ckpt`` and ``lens``) in this process, the render cache off, as a figure
job does, writing to a temporary folder. Per figure, CPU seconds of: the plot function; the
constrained layout engine; the PNG without the layout its draw runs; the PDF (timed around
matplotlib's ``Figure.savefig``); median over ``--repeats``. Prints a table; asserts nothing.

    python benchmarks/figures.py RUN_DIR --model llama16 --ckpt step600
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from resdyn.plots import catalogue, render

_PLOT_FUNCTION = render.plot_function


def _timed(cost: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            cost[key] += time.process_time() - t0

    return wrapper


def figure_costs(run_dir: Path, model: str, ckpt: str, scopes: list[str], out: Path) -> dict[str, dict[str, float]]:
    """{figure: {plot, layout, png, pdf, total}} CPU seconds for one drawing of each figure."""
    costs: dict[str, dict[str, float]] = {}
    original_savefig, original_layout = Figure.savefig, ConstrainedLayoutEngine.execute
    for scope in scopes:
        for spec in catalogue.of_scope(scope):
            cost: dict[str, float] = defaultdict(float)
            inputs = {str(run_dir / p): None for p in catalogue.input_paths(spec, model=model, ckpt=ckpt)}
            if not all(Path(p).exists() for p in inputs):
                continue

            def savefig(fig, fname, *args, _cost=cost, **kwargs):
                fmt = kwargs.get("format") or Path(str(getattr(fname, "name", fname))).suffix.lstrip(".") or "png"
                return _timed(_cost, fmt, original_savefig)(fig, fname, *args, **kwargs)

            plot_fn = render.plot_function(spec.plot)
            Figure.savefig = savefig
            ConstrainedLayoutEngine.execute = _timed(cost, "layout", original_layout)
            render.plot_function = lambda plot, _f=plot_fn, _c=cost: _timed(_c, "plot", _f)
            t0 = time.process_time()
            try:
                render.render(
                    spec.name,
                    spec.plot,
                    inputs,
                    str(out / f"{spec.name}.png"),
                    str(out / f"{spec.name}.pdf"),
                    f"{model} · {ckpt} · {spec.name}",
                    spec.caption,
                    120,
                    "bench",
                    {"rule": f"figure_{scope}"},
                    None,
                )
            finally:
                Figure.savefig, ConstrainedLayoutEngine.execute = original_savefig, original_layout
                render.plot_function = _PLOT_FUNCTION
            cost["total"] = time.process_time() - t0
            cost["png"] -= cost["layout"]  # the PNG's draw runs the layout engine
            costs[spec.name] = dict(cost)
    return costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--model", default="llama16")
    ap.add_argument("--ckpt", default="step600")
    ap.add_argument("--scopes", nargs="+", default=["ckpt", "lens"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            runs.append(figure_costs(args.run_dir.resolve(), args.model, args.ckpt, args.scopes, Path(tmp)))
    names = list(runs[0])
    cols = ["plot", "layout", "png", "pdf", "total"]
    load = os.getloadavg()[0]
    print(
        f"{args.model}/{args.ckpt}, scopes {', '.join(args.scopes)}: CPU s per figure, median of {args.repeats}; "
        f"matplotlib {matplotlib.__version__}; load (1 min) {load:.2f}"
    )
    print("| figure | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    sums = defaultdict(float)
    for name in names:
        row = {c: statistics.median(r[name].get(c, 0.0) for r in runs) for c in cols}
        for c in cols:
            sums[c] += row[c]
        print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in cols) + " |")
    print("| **all** | " + " | ".join(f"**{sums[c]:.2f}**" for c in cols) + " |")


if __name__ == "__main__":
    main()
