"""Command line: ``resdyn provenance FILE``, ``resdyn verify [PATH]``, ``resdyn plan CONFIG``, ``resdyn calibrate RUN``.

Exit codes (also in ``--help``): 0 success; 1 the command ran and found problems (changed or
missing inputs, no provenance); 2 bad usage or bad input (missing/unreadable file, invalid
config), reported as one line ``resdyn <command>: error: ...`` without a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path


def _provenance(args: argparse.Namespace) -> int:
    from resdyn.provenance import sidecars

    if not Path(args.file).exists():
        raise FileNotFoundError(errno.ENOENT, "no such file", args.file)
    steps = sidecars.chain(args.file)
    if not steps:
        print(f"{args.file}: no provenance found", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"path": p, **prov} for p, prov in steps], indent=2))
        return 0
    for path, prov in steps:
        if prov.get("source"):
            digest = prov.get("sha256")
            made_here = Path(path).parts[:1] in (("results",), ("models",))
            what = (
                "NO PROVENANCE SIDECAR (deleted? run `resdyn verify`)"
                if made_here
                else "source (no provenance of its own)"
            )
            print(f"{path}\n  {what}: " + (f"sha256 {digest[:16]}…" if digest else "missing"))
            continue
        wc = ", ".join(f"{k}={v}" for k, v in prov.get("wildcards", {}).items())
        git = prov.get("git") or {}
        print(
            f"{path}\n  made by rule {prov.get('rule')} ({wc}) at {prov.get('end') or prov.get('start')}"
            f" — code {str(git.get('commit'))[:12]}{' (dirty)' if git.get('dirty') else ''}"
        )
        if prov.get("params"):
            print(f"  params: {json.dumps(prov['params'], sort_keys=True)}")
        ckpt = prov.get("checkpoint")
        if ckpt:
            print(
                f"  model: {ckpt.get('repo') or ckpt.get('folder')} @ {ckpt.get('revision') or ckpt.get('checkpoint')}"
                f" weights sha256 {str(ckpt.get('content_hash'))[:16]}…"
            )
        if prov.get("samples_hash"):
            print(f"  samples sha256 {prov['samples_hash'][:16]}…")
        if isinstance(prov.get("dataset"), dict):
            print(f"  dataset: {json.dumps(prov['dataset'], sort_keys=True)}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from resdyn.provenance import sidecars

    roots = args.path or [r for r in ("results", "models") if Path(r).exists()]
    missing = [r for r in roots if not Path(r).exists()]
    if missing or not roots:
        print(
            f"resdyn verify: error: {', '.join(missing) or 'results/ and models/'}: no such file or directory "
            "(run it in the workflow's folder, or name the folders to audit)",
            file=sys.stderr,
        )
        return 2
    checked, problems = sidecars.audit(roots)
    for line in problems:
        print(line)
    print(
        f"verified {checked} artifacts under {', '.join(map(str, roots))}: {len(problems)} problem(s)", file=sys.stderr
    )
    return 1 if problems else 0


def gpu_rates_default() -> Path:
    """Where ``resdyn calibrate`` writes by default: ``$RESDYN_GPU_RATES`` or ~/.config/resdyn/gpus.yaml."""
    import os

    from resdyn.cluster import gpu_kinds

    value = os.environ.get(gpu_kinds.RATES_ENV, "")
    return Path(value).expanduser() if value.strip().lower() not in ("", "none") else gpu_kinds.USER_RATES.expanduser()


def _calibrate(args: argparse.Namespace) -> int:
    """``resdyn calibrate RUN --configfile CONFIG``: measured vs planned per rule, and the rates file."""
    from resdyn.cluster import cost, gpu_kinds
    from resdyn.pipeline import calibrate
    from resdyn.pipeline import config as rc

    try:
        if args.gpu != calibrate.CPU_KIND:
            gpu_kinds.check_gpu_kind(args.gpu, "--gpu")
        run = Path(args.run)
        if not run.is_dir():
            raise calibrate.CalibrationError(f"{run}: no such run folder")
        cfg = rc.load_config(args.configfile)
        print(calibrate.run_command(run, cfg, args.gpu, Path(args.write), f"{run.resolve()} ({args.configfile})"))
    except (ValueError, rc.ConfigError, cost.ShapeError) as err:
        print(f"resdyn calibrate: error: {err}", file=sys.stderr)
        return 2
    return 0


def _plan(args: argparse.Namespace) -> int:
    from resdyn.cluster import cost, gpu_kinds
    from resdyn.pipeline import config as rc
    from resdyn.pipeline import plan

    gpu_kinds.check_gpu_kind(args.gpu, "--gpu")
    try:
        cfg = rc.load_config(args.config)
        for name in cfg["models"]:  # the order every table's step 0 / final labels follow
            order = rc.checkpoints(cfg, name)
            if len(order) > 1:
                print(f"{name}: checkpoints in training order: {' -> '.join(order)}")
        if args.changes:  # what a rerun of this config would run now, why, and its cost
            from resdyn.provenance import changes

            jobs = changes.parse_dry_run(changes.dry_run(args.config))
            print(changes.render_changes(cfg, jobs, device=args.gpu))
            return 0
        print(plan.render(cfg, device=args.gpu, gpus=args.gpus, cores=args.cores))
    except (rc.ConfigError, cost.ShapeError) as err:
        print(f"resdyn plan: error: {err}", file=sys.stderr)
        return 2
    return 0


def _collect(args: argparse.Namespace) -> int:
    import time

    from resdyn import results

    start = time.perf_counter()
    try:
        got = results.collect(args.results, allow_stale=args.allow_stale)
    except results.NotAResultsTree as err:
        print(f"resdyn collect: error: {err}", file=sys.stderr)
        return 2
    try:
        results.check_collect_target(got, args.out, args.force)
    except results.CollectRefused as err:
        print(f"resdyn collect: error: {err}", file=sys.stderr)
        return 2
    for line in got.skipped:
        print(line)
    catalog = results.write_collected(got, args.out, args.force)
    rows = sum(len(t) for t in got.tables.values())
    print(
        f"collected {len(got.tables)} tables ({rows} rows) from {got.run} into {catalog.parent} in "
        f"{time.perf_counter() - start:.1f} s; {len(got.skipped)} file(s) skipped",
        file=sys.stderr,
    )
    return 1 if got.skipped else 0


def _compare(args: argparse.Namespace) -> int:
    from resdyn import compare, results

    try:
        report = compare.compare_runs(args.run_a, args.run_b, rtol=args.rtol, atol=args.atol)
    except results.NotAResultsTree as err:
        print(f"resdyn compare: error: {err}", file=sys.stderr)
        return 2
    print(report.render())
    return 1 if report.differences else 0


DESCRIPTION = """\
resdyn: how perturbations travel through the residual stream of decoder-only transformers.
The pipeline itself runs with Snakemake (snakemake --cores N, or --profile slurm); these
commands inspect its artifacts and plan a configuration."""

EPILOG = """\
exit codes:
  0  success
  1  the command ran and found problems (verify: changed or missing inputs;
     provenance: the file has no provenance record; collect: tables skipped;
     compare: the runs differ)
  2  bad usage or bad input: a missing or unreadable file, an invalid config
     (one line "resdyn COMMAND: error: ..." on stderr, no traceback)

examples:
  resdyn plan configs/paper-a.yaml
  resdyn plan configs/paper-a.yaml --changes
  resdyn revisions allenai/Olmo-3-1025-7B --every 100000
  resdyn fetch configs/paper-a.yaml --run
  resdyn provenance results/figures/llama/step0/funnel.png
  resdyn verify results
  resdyn collect results -o tables/
  resdyn compare results /scratch/other-run/results"""


def _version() -> str:
    from resdyn import __version__

    return f"resdyn {__version__}"


def _error_line(command: str, err: BaseException) -> str:
    """One line naming the file and what is wrong with it (for bad input, instead of a traceback)."""
    if isinstance(err, FileNotFoundError):
        what = f"{err.filename}: no such file or directory"
    elif isinstance(err, IsADirectoryError):
        what = f"{err.filename}: is a directory, expected a file"
    elif isinstance(err, OSError) and err.filename:
        what = f"{err.filename}: {err.strerror or err}"
    else:
        what = str(err).strip() or type(err).__name__
    return f"resdyn {command}: error: {what}"


def _add_calibrate(sub) -> None:
    """Register ``resdyn calibrate`` on the CLI's subparsers."""
    ca = sub.add_parser(
        "calibrate",
        help="fit the cost model's rates to a finished run's benchmark files and write a user rates file",
    )
    ca.add_argument("run", help="the run's folder (where Snakemake ran: benchmarks/out/, logs/)")
    ca.add_argument("--configfile", required=True, help="the config the run used")
    ca.add_argument(
        "--gpu",
        default="h100",
        metavar="KIND",
        help="GPU kind the run's GPU jobs ran on (default h100), or cpu for a run whose GPU rules ran on CPUs",
    )
    ca.add_argument(
        "--write", default=str(gpu_rates_default()), metavar="PATH", help="rates file to write (default %(default)s)"
    )
    ca.set_defaults(func=_calibrate)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resdyn", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=_version(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("provenance", help="print the chain from an artifact back to model and data")
    p.add_argument("file", help="an artifact (table, HDF5 file, figure) with a .prov.json sidecar")
    p.add_argument("--json", action="store_true", help="the whole chain as JSON")
    p.set_defaults(func=_provenance)
    v = sub.add_parser(
        "verify",
        help="re-hash every artifact and its inputs; report changed outputs and inputs, "
        "stale chains, missing sidecars and sidecars without artifacts (see docs/audit.md)",
    )
    v.add_argument("path", nargs="*", help="folders or files to audit (default: results and models)")
    v.set_defaults(func=_verify)
    pl = sub.add_parser("plan", help="jobs, GPU/CPU-hours, memory, disk, critical path and wall time a config needs")
    pl.add_argument("config", help="a config YAML file (config.yaml or one of configs/*.yaml)")
    pl.add_argument("--gpu", default="h100", metavar="KIND", help="GPU kind of resdyn/data/gpus.yaml (default h100)")
    pl.add_argument("--gpus", type=int, default=1, help="GPUs available at once (default 1)")
    pl.add_argument("--cores", type=int, default=64, help="CPU cores available at once (default 64)")
    pl.add_argument(
        "--changes",
        action="store_true",
        help="only the jobs a rerun would run now (after `git pull` "
        "or a config edit), grouped by rule, with the reason (code symbol, param, input) and cost",
    )
    pl.set_defaults(func=_plan)
    _add_calibrate(sub)
    co = sub.add_parser(
        "collect",
        help="every table of a run as one tidy parquet per table kind, with model, "
        "checkpoint, step and provenance columns, and catalog.json (see docs/notebooks.md)",
    )
    co.add_argument("results", help="the run's results/ folder (or the run folder holding it)")
    co.add_argument("-o", "--out", required=True, help="folder for the parquet files and catalog.json")
    co.add_argument(
        "--force",
        action="store_true",
        help="overwrite same-named files in the output folder that no earlier resdyn collect wrote there",
    )
    co.add_argument(
        "--allow-stale",
        action="store_true",
        help="keep tables whose provenance sidecar is missing "
        "or does not match (their 'stale' column says why) instead of skipping them",
    )
    co.set_defaults(func=_collect)
    cm = sub.add_parser(
        "compare",
        help="compare two runs table by table within per-metric tolerances, with "
        "the provenance difference of each differing table (see docs/notebooks.md)",
    )
    cm.add_argument("run_a", help="a results folder, its run folder, or a folder written by resdyn collect")
    cm.add_argument("run_b", help="the same for the other run")
    cm.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance for every float column (default: per metric, listed in the output)",
    )
    cm.add_argument("--atol", type=float, default=None, help="absolute tolerance for every float column")
    cm.set_defaults(func=_compare)
    from resdyn.lm import revisions
    from resdyn.pipeline import fetch

    revisions.add_command(sub)
    fetch.add_command(sub)
    for name, action in sub.choices.items():  # every subcommand's help carries the exit codes too
        action.epilog = EPILOG.split("\n\nexamples:")[0]
        action.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (OSError, ValueError) as err:  # bad input files: one line, no traceback
        print(_error_line(args.command, err), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
