"""Training revisions of a hub repository: listed in step order, and training steps resolved to
branch names (``resdyn revisions``, and ``steps:`` / numeric ``revisions:`` in a model entry).

Branch names follow the training run's convention: OLMo ``stage1-step471000-tokens1976B``
(stage, step, tokens seen), Pythia ``step143000``; ``main`` is the final model. A config's
steps resolve from the local cache's ``refs/`` (the revisions already downloaded) when it has
them all, else from the hub (``HfApi.list_repo_refs``); ``resdyn revisions`` asks the hub first.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from resdyn.lm import hub

FINAL = "final"  # in a steps list: the final model, branch ``main``
_TOKENS = re.compile(r"(?:^|[-_/])tokens(\d+[KMBT]?)(?=$|[-_/])")


@dataclass(frozen=True)
class Revision:
    """One branch of a repository and its place in training (``step`` None for ``main``)."""

    name: str
    stage: int | None
    step: int | None
    tokens: str | None

    @classmethod
    def parse(cls, name: str) -> Revision | None:
        """The training position in a branch name (:func:`resdyn.lm.hub.revision_step`), or None
        for a name that is neither a training step nor ``main``."""
        pos = hub.revision_step(name)
        if pos is None:
            return cls(name, None, None, None) if name in hub.FINAL_REVISIONS else None
        tokens = _TOKENS.search(name)
        return cls(name, pos[0], pos[1], tokens[1] if tokens else None)


def cached_branches(repo: str, repo_type: str = "model") -> list[str]:
    """Branch names under ``refs/`` of ``repo`` in the local HF cache (pull-request refs excluded)."""
    refs = Path(hub.hub_cache_dir()) / f"{repo_type}s--{repo.replace('/', '--')}" / "refs"
    if not refs.is_dir():
        return []
    return sorted(
        str(p.relative_to(refs)) for p in refs.rglob("*") if p.is_file() and p.relative_to(refs).parts[0] != "pr"
    )


def branches(repo: str, repo_type: str = "model") -> tuple[list[str], str]:
    """(branch names, where they came from): the hub online, else (offline, or the hub unreachable)
    the cache. Raises :class:`resdyn.lm.hub.HubError` when neither knows the repository."""
    if not hub.hub_offline():
        try:
            from huggingface_hub import HfApi

            refs = HfApi().list_repo_refs(repo, repo_type=repo_type)
            return sorted(b.name for b in refs.branches), "the hub"
        except Exception as err:  # no network, unknown or gated repo: the cache may still know it
            online_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        else:  # pragma: no cover
            online_error = ""
    else:
        online_error = "HF_HUB_OFFLINE=1"
    names = cached_branches(repo, repo_type)
    if not names:
        raise hub.HubError(
            f"repository {repo!r}: no branches known ({online_error}; nothing in the cache "
            f"{hub.hub_cache_dir()}); list them online with `resdyn revisions {repo}`"
        )
    return names, f"the cache {hub.hub_cache_dir()} (only downloaded revisions)"


def training_order(names: list[str]) -> list[Revision]:
    """The branches that name a training step, sorted by (stage, step), then ``main``; other names
    (e.g. ``v1.0``) are left out."""
    revs = [r for r in map(Revision.parse, names) if r is not None]
    return sorted(revs, key=lambda r: (r.step is None, r.stage or 0, r.step or 0))


def resolve(model: str | None, repo: str, steps: list, names: list[str], where: str) -> list[str]:
    """Branch names of ``steps`` (training steps; ``"final"`` or ``"main"`` → ``main``; a string
    that is a branch is kept) among ``names``.

    Raises :class:`resdyn.lm.hub.HubError`, one line naming the model, the step and the
    candidates, when a step has no branch or more than one (stage 1 and stage 2 both at step N).
    """
    revs = training_order(names)
    trained = [r for r in revs if r.step is not None]
    who = f"model {model!r} ({repo})" if model else repo
    out = []
    for step in steps:
        if isinstance(step, str):
            name = "main" if step == FINAL else step
            if name not in names:
                raise hub.HubError(
                    f"{who}: revision {step!r} is not a branch in {where}; "
                    f"branches: {_some([r.name for r in revs] or names)}"
                )
            out.append(name)
            continue
        if not trained:
            raise hub.HubError(
                f"{who}: step {step} — the repository has no training revisions "
                f"(branches named stepN or stageK-stepN-tokensM) in {where}; branches: {_some(names)}"
            )
        hits = [r.name for r in trained if r.step == step]
        if len(hits) > 1:
            raise hub.HubError(
                f"{who}: step {step} is ambiguous, candidates {hits}; write the branch name in revisions"
            )
        if not hits:
            near = sorted(trained, key=lambda r: abs(r.step - step))[:3]
            raise hub.HubError(
                f"{who}: step {step} has no branch in {where}; nearest: "
                f"{[r.name for r in sorted(near, key=lambda r: (r.stage, r.step))]}"
            )
        out.append(hits[0])
    return out


def _some(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f", … ({len(names)} in all)" if len(names) > limit else "")


def resolve_model(model: str, entry: dict) -> None:
    """Turn a hub model entry's ``steps`` list (or numeric ``revisions``) into branch names in place.

    ``steps: [0, 471000, final]`` becomes ``revisions: [<branch at 0>, <branch at 471000>, main]``;
    names already written are kept. Raises HubError (one line) when a step does not resolve.
    """
    if isinstance(entry.get("steps"), list):
        if "revisions" in entry:
            raise hub.HubError("give either revisions or a steps list (training steps), not both")
        entry["revisions"] = entry.pop("steps")
    if "revisions" not in entry:
        raise hub.HubError("required but missing: give revisions (branch names) or steps (a list of training steps)")
    wanted = entry["revisions"]
    if all(isinstance(r, str) and r != FINAL for r in wanted):
        return  # branch names only: nothing to look up
    cached = cached_branches(entry["repo"])
    if cached:  # every Snakemake start (also of each cluster job) validates: no network once fetched
        try:
            entry["revisions"] = resolve(model, entry["repo"], wanted, cached, "the cache")
            return
        except hub.HubError:
            if hub.hub_offline():
                raise
    names, where = branches(entry["repo"])
    entry["revisions"] = resolve(model, entry["repo"], wanted, names, where)


# --- resdyn revisions REPO ------------------------------------------------------------------------


def add_command(sub) -> None:
    """Register ``resdyn revisions`` on the CLI's subparsers."""
    p = sub.add_parser("revisions", help="a hub repository's training revisions in step order (step, tokens, name)")
    p.add_argument("repo", help="hub id, e.g. allenai/Olmo-3-1025-7B or EleutherAI/pythia-160m-deduped")
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--every", type=int, metavar="N", help="only steps that are multiples of N (and main)")
    pick.add_argument(
        "--steps", nargs="+", metavar="STEP", help="resolve these training steps (integers, or 'final') to branch names"
    )
    pick.add_argument(
        "--check",
        action="store_true",
        help="list branches serving identical weights (hub file hashes; offline: the cache blobs); exit 1 if any",
    )
    p.set_defaults(func=command)


def _hub_weights_digest(repo: str, revision: str) -> str | None:
    """Weights digest of ``repo@revision`` from the hub's file metadata (LFS SHA-256 per weight
    file), the same :func:`resdyn.lm.integrity.weights_digest` the cache gives; None without one."""
    from fnmatch import fnmatch

    from huggingface_hub import HfApi

    from resdyn import io
    from resdyn.lm.integrity import WEIGHT_ONLY_PATTERNS

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    files = {}
    for f in info.siblings or []:
        if any(fnmatch(f.rfilename.rsplit("/", 1)[-1], pat) for pat in WEIGHT_ONLY_PATTERNS):
            if f.lfs is None:
                return None  # a weight file outside LFS has no SHA-256 in the metadata
            files[f.rfilename] = f.lfs.sha256 if hasattr(f.lfs, "sha256") else f.lfs["sha256"]
    return io.tree_digest(files) if files else None


def _cache_weights_digest(repo: str, revision: str) -> str | None:
    """Weights digest of the cached snapshot of ``repo@revision`` (blob names; None when not cached)."""
    from resdyn.lm.integrity import WEIGHT_ONLY_PATTERNS, weights_digest

    snap = hub.cached_snapshot(repo, revision)
    if snap is None or not any(p.is_file() for pat in WEIGHT_ONLY_PATTERNS for p in snap.rglob(pat)):
        return None
    return weights_digest(snap, verify=0)


def weight_hashes(repo: str, names: list[str], where: str) -> dict[str, str | None]:
    """Weights digest of each branch of ``names``: from the hub when the names came from it
    (``where`` "the hub"), else from the cache (None: not cached, or no weights)."""
    digest = _hub_weights_digest if where == "the hub" else _cache_weights_digest
    return {name: digest(repo, name) for name in names}


def check_command(repo: str, revs: list[Revision], where: str) -> int:
    """``resdyn revisions REPO --check``: one line per group of branches with identical weights;
    1 when there is one, else 0."""
    from resdyn.lm.integrity import duplicate_groups

    hashes = weight_hashes(repo, [r.name for r in revs], where)
    groups = duplicate_groups(hashes)
    print("weights_sha256\tbranches")
    for names in groups:
        print(f"{hashes[names[0]][:16]}\t{', '.join(names)}")
    unknown = [n for n, h in hashes.items() if h is None]
    print(
        f"{len(hashes) - len(unknown)} revisions of {repo} checked, from {where}: "
        f"{len(groups)} group(s) of identical weights"
        + (f"; no weights known for {_some(unknown)}" if unknown else ""),
        file=sys.stderr,
    )
    return 1 if groups else 0


def command(args: argparse.Namespace) -> int:
    """Print the table (or the resolved names); 2 with one line when the repository or a step is unknown."""
    try:
        names, where = branches(args.repo)
        if args.steps:
            steps = [s if s == FINAL else _int(s) for s in args.steps]
            for step, name in zip(args.steps, resolve(None, args.repo, steps, names, where), strict=True):
                print(f"{step}\t{name}")
            return 0
    except hub.HubError as err:
        print(f"resdyn revisions: error: {err}", file=sys.stderr)
        return 2
    revs = training_order(names)
    if getattr(args, "check", False):
        return check_command(args.repo, revs, where)
    if args.every:
        revs = [r for r in revs if r.step is None or r.step % args.every == 0]
    print("step\ttokens\tname")
    for r in revs:
        print(f"{'' if r.step is None else r.step}\t{r.tokens or ''}\t{r.name}")
    print(f"{sum(r.step is not None for r in revs)} training revisions of {args.repo}, from {where}", file=sys.stderr)
    return 0


def _int(text: str) -> int:
    if not text.isdigit():
        raise hub.HubError(f"step {text!r}: a training step is a non-negative integer or {FINAL!r}")
    return int(text)
