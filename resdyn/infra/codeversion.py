"""Code versions of rules, derived from what their scripts import (never listed by hand).

A rule's code version is a short SHA-256 over its script and over every ``resdyn`` module the
script reaches through imports, transitively. The imports are found statically with :mod:`ast`
(every ``import``/``from … import`` anywhere in a file, including ones inside functions), so
nothing is executed. Snakemake reruns a job when a ``params:`` value changes, so a rule that
passes :func:`script_code_version` as a param reruns exactly when its own code changed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = "resdyn"
PACKAGE_DIR = Path(__file__).resolve().parents[1]

__all__ = ["module_file", "imported_modules", "import_closure", "script_code_version"]


def module_file(name: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """Source file of module ``name`` (``resdyn`` or ``resdyn.a.b``), or None if it is not one.

    ``resdyn.a.b`` is ``<package_dir>/a/b.py`` or, for a subpackage, ``<package_dir>/a/b/__init__.py``.
    """
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = package_dir.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _parents(name: str) -> list[str]:
    """``resdyn.a.b`` -> [``resdyn``, ``resdyn.a``]: packages executed before the module."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported_modules(path: str | Path, module: str | None = None, package_dir: Path = PACKAGE_DIR) -> set[str]:
    """``resdyn`` modules that the file at ``path`` imports directly (packages included).

    ``module`` is the file's own dotted name (needed to resolve relative imports; None for a
    script outside the package). ``from resdyn import x`` counts ``resdyn.x`` when x is a module
    and ``resdyn`` itself otherwise; every import also counts the packages above it.
    """
    st = Path(path).stat()
    return set(_imported(str(path), st.st_mtime_ns, st.st_size, module, Path(package_dir)))


@functools.lru_cache(maxsize=4096)
def _imported(path: str, _mtime: int, _size: int, module: str | None, package_dir: Path) -> frozenset[str]:
    # cached per file version: snakemake asks for every rule, and scripts share modules
    tree = ast.parse(Path(path).read_bytes(), filename=path)
    is_pkg = Path(path).name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    continue
                # the package a relative import starts from: the module's own for __init__.py
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        else:
            continue
        for name in names:
            if module_file(name, package_dir) is not None:
                found.add(name)
                found.update(_parents(name))
    found.discard(module)
    return frozenset(found)


def import_closure(script: str | Path, package_dir: Path = PACKAGE_DIR) -> set[str]:
    """Every ``resdyn`` module reachable from ``script`` through imports (transitive closure)."""
    seen: set[str] = set()
    todo = sorted(imported_modules(script, None, package_dir))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imported_modules(module_file(name, package_dir), name, package_dir) - seen)
    return seen


def script_code_version(script: str | Path, package_dir: Path = PACKAGE_DIR) -> str:
    """Short hash of a rule's script and of every ``resdyn`` module it reaches (16 hex digits).

    Raises FileNotFoundError naming the script when it does not exist.
    """
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"rule script {script} does not exist (code version of a rule)")
    package_dir = Path(package_dir).resolve()
    h = hashlib.sha256(script.read_bytes())
    for name in sorted(import_closure(script, package_dir)):
        h.update(b"\0" + name.encode() + b"\0")
        h.update(module_file(name, package_dir).read_bytes())
    return h.hexdigest()[:16]
