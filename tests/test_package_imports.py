"""No module reaches into another module's private names.

Shared helpers get a public name in the module that owns them (e.g. :mod:`resdyn.infra.linalg`);
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

# Known cross-module private uses (none left: bootstrap.py uses resdyn.infra.linalg.on_cuda).
ALLOWED: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for a chain of attributes on a name, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def private_uses(source: str, own_module: str = "") -> list[str]:
    """Every ``resdyn.X._name`` reference in ``source``, as ``"X._name"`` (X's last dotted part).

    ``own_module`` (e.g. ``"resdyn.study_a.spectral"``) is the module the source belongs to: its own
    private names are its business.
    """
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> resdyn module it is bound to
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "resdyn" or node.module.startswith("resdyn."):
                for a in node.names:
                    if _private(a.name):
                        if node.module != own_module:
                            found.append(f"{node.module.split('.')[-1]}.{a.name}")
                    else:  # a module (or a function: its private attributes are not ours to judge)
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
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
        elif isinstance(base, ast.Attribute) and _dotted(base).startswith("resdyn."):
            module = _dotted(base)  # resdyn.pkg.X._name after `import resdyn.pkg.X`
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
        ("from resdyn.study_a.spectral import _schur, svd_on\n", ["spectral._schur"]),
        ("from resdyn.study_a.spectral import (\n    check_chain,\n    _ordered,\n)\n", ["spectral._ordered"]),
        ("from resdyn.study_a import spectral as sp\nsp._svd(a, True)\n", ["spectral._svd"]),
        ("from resdyn.study_a import spectral\nx = spectral._on_cuda\n", ["spectral._on_cuda"]),
        ("import resdyn.study_a.spectral\nresdyn.study_a.spectral._svd(a)\n", ["spectral._svd"]),
        ("import resdyn.study_a.spectral as s\ns._svd(a)\n", ["spectral._svd"]),
        ("from resdyn import _secret\n", ["resdyn._secret"]),
        # not violations: public names, dunders, private attributes of objects, other packages
        ("from resdyn.infra.linalg import svd\nfrom resdyn.study_a import spectral\nspectral.__name__\n", []),
        ("lens = make()\nlens._params(0)\nimport numpy as np\nnp._NoValue\n", []),
    ],
)
def test_private_uses_finds_cross_module_access(source, want):
    assert private_uses(source) == want


def test_own_private_names_are_allowed():
    src = "from resdyn.study_a.spectral import _check_tol\nimport resdyn.study_a.spectral as me\nme._svd\n"
    assert private_uses(src, own_module="resdyn.study_a.spectral") == []
    assert private_uses(src, own_module="resdyn.study_a.schur") == ["spectral._check_tol", "spectral._svd"]


#: What each layer of the package may import (besides itself): imports only go downward, and the
#: two studies never import each other.
LAYERS = {
    "infra": {"infra"},
    "artifacts": {"infra"},
    "study_a": {"infra", "artifacts"},
    "study_b": {"infra", "artifacts"},
    "beyond": {"infra", "artifacts", "study_a", "study_b"},
    "plots": {"infra", "artifacts", "study_a", "study_b", "beyond"},
    "results": {"infra", "artifacts"},  # collect / load: the tables of a run
    "compare": {"infra", "artifacts", "results"},
    "cli": {"infra", "artifacts", "results", "compare"},
    "": {"results"},  # the package itself: resdyn.load
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_layers_import_only_downward():
    from resdyn.infra.codeversion import imported_modules

    files = sorted((REPO / "resdyn").rglob("*.py"))
    assert {_layer(_module_name(p)) for p in files} >= set(LAYERS) - {""}
    bad = []
    for path in files:
        module = _module_name(path).removesuffix(".__init__")
        own = _layer(module)
        for target in imported_modules(path, module):
            layer = _layer(target)
            if layer and layer != own and layer not in LAYERS.get(own, set()):
                bad.append(f"{module} imports {target}")
    assert not bad, "imports against the layering (see docs/design.md, Layout):\n" + "\n".join(sorted(bad))


def test_layer_check_sees_a_violation(tmp_path):
    pkg = tmp_path / "resdyn"
    (pkg / "study_a").mkdir(parents=True)
    (pkg / "study_b").mkdir()
    for f in ("__init__.py", "study_a/__init__.py", "study_b/__init__.py", "study_b/phases.py"):
        (pkg / f).write_text("")
    (pkg / "study_a" / "spectral.py").write_text("from resdyn.study_b import phases\n")
    from resdyn.infra.codeversion import imported_modules

    found = imported_modules(pkg / "study_a" / "spectral.py", "resdyn.study_a.spectral", package_dir=pkg)
    assert "resdyn.study_b.phases" in found and "study_b" not in LAYERS["study_a"]
