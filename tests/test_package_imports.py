"""No module reaches into another module's private names.

Shared helpers get a public name in the module that owns them (e.g. :mod:`resdyn.linalg`);
a leading underscore means "only this module uses it". Checked statically on resdyn/, the
workflow scripts and the benchmarks: ``from resdyn.X import _name`` and ``X._name`` where X is
bound to a resdyn module by an import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("resdyn", "workflow/scripts", "benchmarks")

# Known cross-module private uses (none left: bootstrap.py uses resdyn.linalg.on_cuda).
ALLOWED: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, own_module: str = "") -> list[str]:
    """Every ``resdyn.X._name`` reference in ``source``, as ``"X._name"`` (X's last dotted part).

    ``own_module`` (e.g. ``"resdyn.spectral"``) is the module the source belongs to: its own
    private names are its business.
    """
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> resdyn module it is bound to
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "resdyn":
                for a in node.names:
                    if _private(a.name):
                        found.append(f"resdyn.{a.name}")
                    else:
                        aliases[a.asname or a.name] = f"resdyn.{a.name}"
            elif node.module.startswith("resdyn.") and node.module != own_module:
                found += [f"{node.module.split('.')[-1]}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("resdyn.") and a.asname:
                    aliases[a.asname] = a.name
                elif a.name.startswith("resdyn"):
                    aliases["resdyn"] = "resdyn"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in aliases:
            module = aliases[base.id]
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "resdyn":
            module = f"resdyn.{base.attr}"  # resdyn.X._name after `import resdyn.X`
        else:
            continue
        if module != own_module:
            found.append(f"{module.split('.')[-1]}.{node.attr}")
    return found


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    return ".".join(rel.parts) if rel.parts[0] == "resdyn" else ""


def _scanned_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (REPO / d).rglob("*.py"))


def test_no_module_uses_another_modules_private_names():
    files = _scanned_files()
    assert any(p.name == "linalg.py" for p in files) and len(files) > 40
    bad = []
    for path in files:
        rel = str(path.relative_to(REPO))
        for use in private_uses(path.read_text(), _module_name(path)):
            if (rel, use) not in ALLOWED:
                bad.append(f"{rel}: {use}")
    assert not bad, "private names used across modules (give them a public name in their owner):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source, want",
    [
        ("from resdyn.spectral import _schur, svd_on\n", ["spectral._schur"]),
        ("from resdyn.spectral import (\n    check_chain,\n    _ordered,\n)\n", ["spectral._ordered"]),
        ("from resdyn import spectral as sp\nsp._svd(a, True)\n", ["spectral._svd"]),
        ("from resdyn import spectral\nx = spectral._on_cuda\n", ["spectral._on_cuda"]),
        ("import resdyn.spectral\nresdyn.spectral._svd(a)\n", ["spectral._svd"]),
        ("import resdyn.spectral as s\ns._svd(a)\n", ["spectral._svd"]),
        ("from resdyn import _secret\n", ["resdyn._secret"]),
        # not violations: public names, dunders, private attributes of objects, other packages
        ("from resdyn.linalg import svd\nfrom resdyn import spectral\nspectral.__name__\n", []),
        ("lens = make()\nlens._params(0)\nimport numpy as np\nnp._NoValue\n", []),
    ],
)
def test_private_uses_finds_cross_module_access(source, want):
    assert private_uses(source) == want


def test_own_private_names_are_allowed():
    src = "from resdyn.spectral import _check_tol\nimport resdyn.spectral as me\nme._svd\n"
    assert private_uses(src, own_module="resdyn.spectral") == []
    assert private_uses(src, own_module="resdyn.schur") == ["spectral._check_tol", "spectral._svd"]
