"""What a rerun would cost, before it is paid: ``resdyn plan CONFIG --changes``.

Snakemake's dry run (``snakemake -n``) decides which jobs run and why; this module reads its job
blocks (rule, output, wildcards, reason) and explains each reason in resdyn's terms:

* **code**: the code version param changed. The manifests of both versions (saved by
  :func:`resdyn.provenance.codeversion.cached_code_version` under ``.snakemake/resdyn/code``) name
  the functions, classes and constants that changed (``module:name``);
* **params**: the config values that changed, found by comparing the output's provenance record
  (the params of the run that made it) with Snakemake's list of old values;
* **input**: inputs updated by another job of this run (the job is a consumer of a rerun), inputs
  newer than the output, or a changed set of inputs;
* **new**: outputs that do not exist yet.

Each job is priced with the cost model (:func:`resdyn.pipeline.plan.job_row`): GPU-hours on the
chosen GPU kind, CPU core-hours; the tables-and-figures rules run on the submit host and are not
priced (:data:`resdyn.cluster.cost.LOCAL_UNPRICED_RULES`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from resdyn.cluster import cost as rcost
from resdyn.provenance import codeversion, sidecars

CODE_CACHE = Path(".snakemake/resdyn/code")  # as in workflow/rules/common.smk

__all__ = ["PlannedJob", "parse_dry_run", "explain", "dry_run", "render_changes"]


@dataclass
class PlannedJob:
    """One job of a dry run: its rule, wildcards, outputs and Snakemake's reason."""

    rule: str
    wildcards: dict[str, str]
    outputs: list[str]
    reason: str
    why: list[str] = field(default_factory=list)  # the reason in resdyn's terms (:func:`explain`)
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0


_FIELD = re.compile(r"^\s{4}(\w+): (.*)$")
_RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")


def parse_dry_run(text: str) -> list[PlannedJob]:
    """The job blocks of ``snakemake -n`` output (``rule NAME:`` then indented ``key: value``)."""
    jobs, current = [], None
    for line in text.splitlines():
        m = _RULE.match(line)
        if m:
            current = PlannedJob(m[1], {}, [], "")
            jobs.append(current)
            continue
        f = _FIELD.match(line) if current is not None else None
        if f is None:
            if current is not None and not line.startswith(" "):
                current = None
            continue
        key, value = f[1], f[2]
        if key == "output":
            current.outputs = [o.strip() for o in value.split(", ")]
        elif key == "wildcards":
            current.wildcards = dict(kv.split("=", 1) for kv in value.split(", ") if "=" in kv)
        elif key == "reason":
            current.reason = value
    return jobs


def _split_values(text: str) -> list[str]:
    """Snakemake's ``repr(value),repr(value),…`` split at the commas outside brackets and quotes."""
    out, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [v.strip() for v in out if v.strip()]


def _old_params(job: PlannedJob) -> dict:
    """The params of the run that made the job's outputs (their provenance record)."""
    for out in job.outputs:
        try:
            return sidecars.read(out).get("params", {})
        except FileNotFoundError:
            continue
    return {}


def _param_reason(job: PlannedJob, clause: str, cache: Path) -> list[str]:
    """'params: k1, k2' and 'code: module:name, …' for a "Params have changed" clause."""
    before, _, now = clause.partition(" now: ")
    before = set(_split_values(before.split("before: ", 1)[-1].strip()))
    old = _old_params(job)
    changed = [k for k, v in old.items() if repr(v) in before]
    out = []
    if "code" in changed:
        changed.remove("code")
        new_versions = re.findall(r"'([0-9a-f]{16})'", now)
        old_m = codeversion.stored_manifest(cache, old["code"])
        new_m = next((m for v in new_versions if (m := codeversion.stored_manifest(cache, v)) is not None), None)
        if old_m is not None and new_m is not None:
            symbols = codeversion.changed_symbols(old_m, new_m)
            shown = ", ".join(symbols[:6]) + (f" (+{len(symbols) - 6} more)" if len(symbols) > 6 else "")
            out.append(f"code: {shown}")
        else:
            out.append(f"code: version {old['code']} -> {new_versions[0] if new_versions else '?'}")
    if changed:
        out.append("params: " + ", ".join(changed))
    if not out:
        out.append("params changed")
    return out


def explain(job: PlannedJob, cache: Path = CODE_CACHE, producers: dict[str, str] | None = None) -> list[str]:
    """Snakemake's reason for ``job`` in resdyn's terms (module docstring); ``producers`` maps
    the outputs of the dry run's jobs to their rules, to name upstream reruns by rule."""
    out = []
    for clause in job.reason.split("; "):
        if clause.startswith("Missing output files"):
            out.append("new: output missing")
        elif clause.startswith("Input files updated by another job"):
            files = clause.split(": ", 1)[1].split(", ")
            rules = [(producers or {}).get(f) for f in files]
            if all(rules):
                counts = {r: rules.count(r) for r in dict.fromkeys(rules)}
                out.append("input: after " + ", ".join(f"{r} ×{n}" if n > 1 else r for r, n in counts.items()))
            else:
                out.append(f"input: rerun upstream ({', '.join(files[:3])}{', …' if len(files) > 3 else ''})")
        elif clause.startswith("Updated input files"):
            out.append(f"input: newer file ({clause.split(': ', 1)[1]})")
        elif clause.startswith("Set of input files has changed"):
            out.append("input: set of input files changed")
        elif clause.startswith("Params have changed"):
            out += _param_reason(job, clause, cache)
        elif clause:
            out.append(clause[0].lower() + clause[1:])
    return out


def dry_run(configfile: str, workdir: str | Path = ".", snakemake: str | None = None) -> str:
    """Stdout of ``snakemake -n --configfile CONFIG`` in ``workdir`` (raises with its last lines)."""
    beside = Path(sys.executable).with_name("snakemake")  # the one installed with resdyn
    exe = snakemake or (str(beside) if beside.is_file() else "snakemake")
    proc = subprocess.run([exe, "-n", "--configfile", str(configfile)], cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ValueError(f"snakemake -n --configfile {configfile} failed: {' | '.join(tail)}")
    return proc.stdout + proc.stderr


def price(config: dict, job: PlannedJob, device: str) -> None:
    """Fill the job's GPU- and CPU-hours from the cost model (0 for unpriced rules)."""
    from resdyn.pipeline import plan

    if job.rule in rcost.LOCAL_UNPRICED_RULES or job.rule == "all":
        return
    row = plan.job_row(config, job.rule, job.wildcards, device)
    hours = row["seconds"] / 3600
    if row["gpu"]:
        job.gpu_hours = hours
    else:
        job.cpu_hours = hours * row["threads"]


def render_changes(config: dict, jobs: list[PlannedJob], device: str = "h100", cache: Path = CODE_CACHE) -> str:
    """The text of ``resdyn plan --changes``: per rule its jobs, hours and each job's reason."""
    if not [j for j in jobs if j.rule != "all"]:
        return "nothing to rerun: every output is up to date with the code, params and inputs"
    by_rule: dict[str, list[PlannedJob]] = {}
    producers = {out: job.rule for job in jobs for out in job.outputs}
    for job in jobs:
        job.why = explain(job, cache, producers)
        price(config, job, device)
        by_rule.setdefault(job.rule, []).append(job)
    lines = []
    for rule, group in by_rule.items():
        if rule == "all":
            continue
        gpu, cpu = sum(j.gpu_hours for j in group), sum(j.cpu_hours for j in group)
        hours = "not priced" if rule in rcost.LOCAL_UNPRICED_RULES else f"{gpu:.3g} GPU-h, {cpu:.3g} CPU-h"
        lines.append(f"{rule}: {len(group)} job(s), {hours}")
        for job in sorted(group, key=lambda j: sorted(j.wildcards.items())):
            where = " ".join(f"{k}={v}" for k, v in job.wildcards.items()) or "-"
            lines.append(f"  {where}: {'; '.join(job.why)}")
    real = [j for j in jobs if j.rule != "all"]
    lines.append("")
    lines.append(
        f"total: {len(real)} jobs, {sum(j.gpu_hours for j in real):.3g} GPU-hours ({device}), "
        f"{sum(j.cpu_hours for j in real):.3g} CPU-hours; unpriced (submit host, seconds): "
        + (", ".join(sorted({j.rule for j in real if j.rule in rcost.LOCAL_UNPRICED_RULES})) or "none")
    )
    return "\n".join(lines)
