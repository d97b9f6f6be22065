"""Command line: ``resdyn provenance FILE``, ``resdyn verify [PATH]``, ``resdyn plan CONFIG``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from resdyn import io


def _provenance(args: argparse.Namespace) -> int:
    from resdyn import provenance

    steps = provenance.chain(args.file)
    if not steps:
        print(f"{args.file}: no provenance found", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"path": p, **prov} for p, prov in steps], indent=2))
        return 0
    for path, prov in steps:
        wc = ", ".join(f"{k}={v}" for k, v in prov.get("wildcards", {}).items())
        git = prov.get("git") or {}
        print(f"{path}\n  made by rule {prov.get('rule')} ({wc}) at {prov.get('end') or prov.get('start')}"
              f" — code {str(git.get('commit'))[:12]}{' (dirty)' if git.get('dirty') else ''}")
        if prov.get("params"):
            print(f"  params: {json.dumps(prov['params'], sort_keys=True)}")
        ckpt = prov.get("checkpoint")
        if ckpt:
            print(f"  model: {ckpt.get('repo') or ckpt.get('folder')} @ {ckpt.get('revision') or ckpt.get('checkpoint')}"
                  f" weights sha256 {str(ckpt.get('content_hash'))[:16]}…")
        if prov.get("samples_hash"):
            print(f"  samples sha256 {prov['samples_hash'][:16]}…")
        if isinstance(prov.get("dataset"), dict):
            print(f"  dataset: {json.dumps(prov['dataset'], sort_keys=True)}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from resdyn import provenance

    root = Path(args.path)
    sidecars = [io.prov_path(root)] if root.is_file() else sorted(root.rglob("*.prov.json"))
    problems, checked = [], 0
    for side in sidecars:
        artifact = Path(str(side)[: -len(".prov.json")])
        if not artifact.exists():
            problems.append(f"{artifact}: artifact missing (sidecar {side} remains)")
            continue
        checked += 1
        problems += provenance.verify(artifact)
    for line in problems:
        print(line)
    print(f"verified {checked} artifacts: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def _plan(args: argparse.Namespace) -> int:
    from resdyn import config as rc
    from resdyn import plan

    try:
        cfg = rc.load_config(args.config)
    except rc.ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    for name in cfg["models"]:  # the order every table's step 0 / final labels follow
        order = rc.checkpoints(cfg, name)
        if len(order) > 1:
            print(f"{name}: checkpoints in training order: {' -> '.join(order)}")
    table = plan.estimate(cfg, gpu_tflops=args.gpu_tflops, efficiency=args.efficiency)
    with_total = table.round(3)
    print(with_total.to_string(index=False))
    totals = table[["jobs", "gpu_hours", "disk_gb"]].sum()
    print(f"\ntotal: {int(totals.jobs)} GPU/CPU-heavy jobs, {totals.gpu_hours:.2f} GPU-hours at "
          f"{args.efficiency:.0%} of {args.gpu_tflops:g} TFLOP/s, {totals.disk_gb:.1f} GB on disk; "
          f"largest job memory {table.mem_gb.max():.1f} GB")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resdyn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("provenance", help="print the chain from an artifact back to model and data")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="the whole chain as JSON")
    p.set_defaults(func=_provenance)
    v = sub.add_parser("verify", help="re-hash recorded inputs; report artifacts whose inputs changed")
    v.add_argument("path", nargs="?", default="results")
    v.set_defaults(func=_verify)
    pl = sub.add_parser("plan", help="jobs, GPU-hours, memory and disk a config needs")
    pl.add_argument("config")
    pl.add_argument("--gpu-tflops", type=float, default=60.0, help="device fp32 TFLOP/s (default 60, H100/H200)")
    pl.add_argument("--efficiency", type=float, default=0.3, help="achieved share of it (default 0.3)")
    pl.set_defaults(func=_plan)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
