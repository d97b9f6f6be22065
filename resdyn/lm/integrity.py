"""Checkpoint integrity: checkpoints of one model that are copies of each other, or that change
architecture along training.

Hub repositories with training-step branches can serve the same weights under several step
names; a trajectory through such branches would draw a line through copies of one model. Two
checkpoints are duplicates when their *weight files* (``*.safetensors``, ``*.bin``; not
``config.json``, whose metadata may differ) have the same SHA-256 digest
(:func:`weights_digest`). Their architectures are the family and shape keys of
:func:`resdyn.lm.hub.architecture`. :func:`check` compares one checkpoint with the checkpoints
before it in training order and either returns the marks (model key ``allow_duplicate_weights:
true``) or stops with one line naming both revisions and that key.
"""

from __future__ import annotations

from pathlib import Path

from resdyn import io
from resdyn.lm import hub

#: The files whose digest identifies a checkpoint's weights.
WEIGHT_ONLY_PATTERNS = ("*.safetensors", "*.bin")
#: The model key that lets duplicate (or architecture-changing) checkpoints through.
ALLOW_KEY = "allow_duplicate_weights"


def weights_digest(folder: str | Path, verify: int = 1) -> str:
    """SHA-256 tree digest of a checkpoint folder's weight files (:data:`WEIGHT_ONLY_PATTERNS`).

    ``io.tree_digest`` over ``{relative path: SHA-256 of the file}``; in the HF cache each file's
    SHA-256 is its blob's name (:func:`resdyn.lm.models.weights_manifest`, which re-hashes the
    ``verify`` smallest), so little is read; other files are hashed."""
    from resdyn.lm.models import weights_manifest

    return io.tree_digest(weights_manifest(Path(folder), WEIGHT_ONLY_PATTERNS, verify=verify))


def identity(ckpt: str, folder: str | Path) -> dict:
    """What :func:`check` compares of checkpoint ``ckpt`` whose weights are in ``folder``: its name,
    weights digest and architecture (family and shapes of its ``config.json``)."""
    folder = Path(folder)
    arch = hub.architecture(hub.read_config_json(folder / "config.json"), generic=True, source=str(folder))
    return {"ckpt": ckpt, "weights_sha256": weights_digest(folder), "architecture": arch}


def _arch_diff(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in keys)


def check(model: str, earlier: list[dict], this: dict, allow: bool) -> dict:
    """The integrity marks of checkpoint ``this`` against the ``earlier`` checkpoints of ``model``
    (identities of :func:`identity`, in training order).

    ``duplicate_of``: earlier checkpoints with the same weights digest; ``architecture_differs_from``:
    earlier ones whose architecture differs. Either one, unless ``allow``, raises ``ValueError``
    (one line naming both checkpoints and :data:`ALLOW_KEY`)."""
    dup = [e["ckpt"] for e in earlier if e["weights_sha256"] == this["weights_sha256"]]
    arch = [e["ckpt"] for e in earlier if e["architecture"] != this["architecture"]]
    if not allow and dup:
        raise ValueError(
            f"model {model!r}: checkpoints {dup[0]!r} and {this['ckpt']!r} have identical weights "
            f"(sha256 {this['weights_sha256'][:16]}…): a trajectory through them compares one model with itself; "
            f"drop one revision, or set `{ALLOW_KEY}: true` in the model's entry to keep both (marked)"
        )
    if not allow and arch:
        first = next(e for e in earlier if e["ckpt"] == arch[0])
        raise ValueError(
            f"model {model!r}: checkpoint {this['ckpt']!r} has another architecture than {arch[0]!r} "
            f"({_arch_diff(first['architecture'], this['architecture'])}); checkpoints of one model share "
            f"an architecture; set `{ALLOW_KEY}: true` in the model's entry to keep both (marked)"
        )
    return {**this, "duplicate_of": dup, "architecture_differs_from": arch, "allowed": bool(allow)}


def duplicate_groups(hashes: dict[str, str | None]) -> list[list[str]]:
    """Names that share a digest, as groups of two or more in the order of ``hashes`` (a name
    whose digest is None, unknown, is in no group)."""
    by: dict[str, list[str]] = {}
    for name, digest in hashes.items():
        if digest is not None:
            by.setdefault(digest, []).append(name)
    return [names for names in by.values() if len(names) > 1]


def marks(checks: dict[str, dict]) -> dict[str, str]:
    """Per checkpoint the mark its tables and figures carry: ``"duplicate of X"``, ``"architecture
    differs from X"`` (both, ``; `` joined), or ``""``."""
    out = {}
    for ckpt, c in checks.items():
        parts = [f"duplicate of {', '.join(c.get('duplicate_of') or [])}"] if c.get("duplicate_of") else []
        if c.get("architecture_differs_from"):
            parts.append(f"architecture differs from {', '.join(c['architecture_differs_from'])}")
        out[ckpt] = "; ".join(parts)
    return out
