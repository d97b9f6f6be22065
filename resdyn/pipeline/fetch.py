"""``resdyn fetch CONFIG``: the exact ``hf download`` commands that put everything a config reads
from the hub into the local cache — each model revision, each hub dataset, each imported lens —
restricted to the files the pipeline reads, with their size, skipping what is cached already.

Run it on a node with internet (a login node); the jobs then run with ``HF_HUB_OFFLINE=1``.
Online, the hub's file list gives sizes and tells a revision that has only ``*.bin`` weights
(early Pythia steps) from one with safetensors; offline the commands assume safetensors.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from resdyn.lm import hub, models

#: what a model job reads besides its weights: config.json and the tokenizer (resdyn.lm.models)
MODEL_FILES = ("config.json", *models.TOKENIZER_PATTERNS)
SAFETENSORS = ("*.safetensors", "*.safetensors.index.json")
PICKLED = ("*.bin", "*.bin.index.json")  # only where a revision has no safetensors


@dataclass
class Download:
    """One ``hf download``: what it is for, the repository and the files it fetches."""

    what: str
    repo: str
    repo_type: str
    revision: str | None
    include: tuple[str, ...]
    cached: bool = False
    size: int | None = None  # bytes of the included files (online only)

    def printable(self) -> bool:
        """Whether every value of the command is printable (a newline in a revision, say, is not:
        even quoted it would split the script's one-command-per-line layout)."""
        return all(v.isprintable() for v in (self.repo, self.repo_type, self.revision or "", *self.include))

    def command(self) -> str:
        """The ``hf download`` command line (shell-quoted)."""
        args = ["hf", "download", self.repo]
        if self.repo_type != "model":
            args += ["--repo-type", self.repo_type]
        if self.revision:
            args += ["--revision", self.revision]
        for pattern in self.include:
            args += ["--include", pattern]
        return shlex.join(args)


def plan(config: dict) -> list[Download]:
    """The downloads of a config (validated by :func:`resdyn.pipeline.config.validate_schema`):
    models at every revision, hub datasets given by name, and tuned lenses in a hub repository."""
    from resdyn.pipeline import config as rc

    out: list[Download] = []
    for key, m in config["models"].items():
        if m["source"] != "hf":
            continue
        for rev in m["revisions"]:
            out.append(Download(f"model {key} @ {rev}", m["repo"], "model", rev, (*MODEL_FILES, *SAFETENSORS)))
    for key, ds in config["datasets"].items():
        if ds["source"] == "hf" and "name" in ds:
            include = (f"{ds['config']}/*", "README.md") if ds.get("config") else ()
            out.append(Download(f"dataset {key}", ds["name"], "dataset", ds.get("revision"), include))
    lenses: dict[tuple, Download] = {}
    for key in config["models"]:
        for ckpt in rc.lens_checkpoints(config, key):
            spec = rc.lens_import_spec(config, key, ckpt)
            if spec is None or not spec["repo"]:
                continue
            d = lenses.setdefault(
                (spec["repo"], spec["repo_type"], spec["revision"]),
                Download("tuned lenses", spec["repo"], spec["repo_type"], spec["revision"], ()),
            )
            for name in ("config.json", "params.pt"):
                if f"{spec['path']}/{name}" not in d.include:
                    d.include += (f"{spec['path']}/{name}",)
    return out + list(lenses.values())


def mark_cached(downloads: list[Download]) -> None:
    """Set ``cached`` where the local cache holds what the download fetches: a model revision's
    config.json and complete weights, or every included pattern of a dataset/lens."""
    for d in downloads:
        snap = hub.cached_snapshot(d.repo, d.revision, d.repo_type)
        if snap is not None:
            d.cached = (
                _weights_complete(snap) if d.what.startswith("model ") else all(any(snap.glob(p)) for p in d.include)
            )


def _weights_complete(snap: Path) -> bool:
    """config.json and weights present; for sharded weights, every shard the index names."""
    if not (snap / "config.json").is_file():
        return False
    for index in [*snap.glob("*.safetensors.index.json"), *snap.glob("*.bin.index.json")]:
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        return all((snap / s).is_file() for s in shards)
    return any(snap.glob("*.safetensors")) or any(snap.glob("*.bin"))


def add_sizes(downloads: list[Download]) -> None:
    """Online: the bytes each download fetches, from the hub's file list; a model revision without
    safetensors fetches its ``*.bin`` weights instead. Leaves ``size`` None when the hub is unreachable."""
    from huggingface_hub import HfApi

    api = HfApi()
    reached = False
    for d in downloads:
        if d.cached:
            continue
        try:
            files = {
                f.path: getattr(f, "size", 0) or 0
                for f in api.list_repo_tree(d.repo, revision=d.revision, repo_type=d.repo_type, recursive=True)
            }
            reached = True
        except Exception:  # gated or unknown: the command still says what to fetch
            if not reached:
                break  # the hub is not reachable: no sizes at all, not one retry series per download
            continue
        if d.repo_type == "model" and not any(fnmatch.fnmatch(f, "*.safetensors") for f in files):
            d.include = tuple(p for p in d.include if p not in SAFETENSORS) + PICKLED
        wanted = d.include or ("*",)
        d.size = sum(s for f, s in files.items() if any(fnmatch.fnmatch(f, p) for p in wanted))


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown (hub not reached)"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    return ""  # pragma: no cover


def comment(text: str) -> str:
    """A shell comment line holding ``text``: control characters (a newline would end the comment
    and start a command) are written as escapes."""
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render(downloads: list[Download]) -> str:
    """A shell script: one comment (what, size) and one command per download still needed. Every
    value from the config or the hub is quoted in commands and escaped in comments, so the script
    runs exactly the downloads it lists whatever the names hold."""
    lines = []
    todo = [d for d in downloads if not d.cached]
    for d in downloads:
        if d.cached:
            lines.append(comment(f"cached already: {d.what} ({d.repo}{'@' + d.revision if d.revision else ''})"))
    for d in todo:
        if not d.printable():
            lines.append(comment(f"refused: {d.what}: a name holds a control character ({d.repo!r} @ {d.revision!r})"))
            continue
        lines.append(comment(f"{d.what}: {_size(d.size)}"))
        lines.append(d.command())
    known = [d.size for d in todo if d.size is not None]
    total = _size(sum(known) if known else None) + (" + unknown" if known and len(known) < len(todo) else "")
    lines.append(comment(f"{len(todo)} download(s), {total}; then export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"))
    return "\n".join(lines)


# --- resdyn fetch CONFIG --------------------------------------------------------------------------


def add_command(sub) -> None:
    """Register ``resdyn fetch`` on the CLI's subparsers."""
    p = sub.add_parser(
        "fetch",
        help="print (or --run) the hf download commands for every model revision, dataset "
        "and lens a config reads, restricted to the files the pipeline uses",
    )
    p.add_argument("config", help="a config YAML file (one of configs/*.yaml)")
    p.add_argument("--run", action="store_true", help="run the commands (on a node with internet)")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from resdyn.pipeline import config as rc

    try:
        cfg = rc.read_yaml(args.config)
        unresolved = _resolve_steps(cfg)
        cfg = rc.validate_schema(cfg)
    except rc.ConfigError as err:
        print(f"resdyn fetch: error: {err}", file=sys.stderr)
        return 2
    downloads = plan(cfg)
    mark_cached(downloads)
    if not hub.hub_offline():
        add_sizes(downloads)
    print(render(downloads))
    for line in unresolved:
        print(f"resdyn fetch: error: {line}", file=sys.stderr)
    if not args.run:
        return 1 if unresolved else 0
    for d in downloads:
        if not d.cached and not d.printable():
            print(f"resdyn fetch: error: {d.what}: a name holds a control character", file=sys.stderr)
            return 1
    for d in downloads:
        if not d.cached:
            print(f"+ {d.command()}", file=sys.stderr)
            if subprocess.run(shlex.split(d.command())).returncode != 0:
                print(f"resdyn fetch: error: {d.what}: `{d.command()}` failed", file=sys.stderr)
                return 1
    return 1 if unresolved else 0


def _resolve_steps(config) -> list[str]:
    """Resolve every hub model's training steps; a model whose steps do not resolve (no network
    and not cached, or a bad step) is left out of the config, its one-line reason returned, so the
    rest of the config is still fetched."""
    from resdyn.lm import revisions

    models_ = config.get("models") if isinstance(config, dict) else None
    out = []
    for key, m in list((models_ or {}).items()):
        if isinstance(m, dict) and m.get("source") == "hf" and "repo" in m:
            try:
                revisions.resolve_model(key, m)
            except hub.HubError as err:
                out.append(f"model {key}: {err}")
                del models_[key]
    return out
