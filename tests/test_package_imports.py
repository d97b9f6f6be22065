"""No module reaches into another module's private names.

Shared helpers get a public name in the module that owns them (e.g. :mod:`resdyn.numerics.linalg`);
a leading underscore means "only this module uses it". Checked statically on resdyn/, the
workflow scripts and the benchmarks: ``from resdyn.X import _name`` and ``X._name`` where X is
bound to a resdyn module by an import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("resdyn", "workflow/scripts", "benchmarks")

# Known cross-module private uses (none left: bootstrap.py uses resdyn.numerics.linalg.on_cuda).
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
        ("from resdyn.numerics.linalg import svd\nfrom resdyn.study_a import spectral\nspectral.__name__\n", []),
        ("lens = make()\nlens._params(0)\nimport numpy as np\nnp._NoValue\n", []),
    ],
)
def test_private_uses_finds_cross_module_access(source, want):
    assert private_uses(source) == want


def test_own_private_names_are_allowed():
    src = "from resdyn.study_a.spectral import _check_tol\nimport resdyn.study_a.spectral as me\nme._svd\n"
    assert private_uses(src, own_module="resdyn.study_a.spectral") == []
    assert private_uses(src, own_module="resdyn.study_a.schur") == ["spectral._check_tol", "spectral._svd"]


#: The package's layers, bottom first: a module may import its own package and the packages of
#: the layers below it that its row names (docs/design.md, "Layout"). The two studies never
#: import each other.
LAYERS = {
    "io": set(),
    "numerics": set(),
    "lm": {"io", "numerics"},
    "artifacts": {"io"},
    "cluster": {"io", "numerics", "lm"},
    "pipeline": {"io", "numerics", "lm", "cluster"},
    "provenance": {"io", "numerics", "lm", "cluster", "pipeline"},
    "study_a": {"io", "numerics", "lm", "artifacts"},
    "study_b": {"io", "numerics", "lm", "artifacts"},
    "beyond": {"io", "numerics", "lm", "artifacts", "cluster", "study_a", "study_b"},
    "plots": {"io", "numerics", "lm", "artifacts", "pipeline", "provenance", "study_a", "study_b", "beyond"},
    "results": {"io", "lm", "artifacts", "provenance"},  # collect / load: the tables of a run
    "compare": {"io", "artifacts", "results"},
    "cli": {"io", "lm", "artifacts", "cluster", "pipeline", "provenance", "results", "compare"},
    "api": {
        "io",
        "numerics",
        "lm",
        "artifacts",
        "cluster",
        "pipeline",
        "provenance",
        "study_a",
        "study_b",
        "beyond",
        "plots",
        "results",
        "compare",
    },  # the notebook API: everything but cli
    "": {"results", "api"},  # the package itself: resdyn.load, the API's names
}

#: A "package.module:Name" string (the family table's adapters): resolved at run time, so an
#: import edge like any other.
_NAMED_OBJECT = re.compile(r"resdyn(?:\.\w+)+(?=:\w+\Z)")


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_edges(package_dir: Path) -> dict[str, set[str]]:
    """module -> the resdyn modules it imports or names in a "module:Name" string.

    Imports count at any depth, function bodies included; packages count only through the
    modules they hold.
    """
    from resdyn.provenance.codeversion import imported_modules, module_file

    edges: dict[str, set[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        found = set(imported_modules(path, module, package_dir=package_dir))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                m = _NAMED_OBJECT.match(node.value)
                if m and module_file(m.group(0), package_dir) is not None:
                    found.add(m.group(0))
        edges[module] = {t for t in found if t != module and module_file(t, package_dir).name != "__init__.py"}
    return edges


def import_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the import graph as [a, b, ..., a], or [] when it has none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def layering_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in edges.items():
        own = _layer(module)
        for target in targets:
            layer = _layer(target)
            if layer != own and layer not in LAYERS.get(own, set()):
                bad.append(f"{module} imports {target}")
    return sorted(bad)


def test_layers_import_only_downward():
    edges = module_edges(REPO / "resdyn")
    assert {_layer(m) for m in edges} == set(LAYERS), "a package without a layer (add it to LAYERS and docs/design.md)"
    bad = layering_violations(edges)
    assert not bad, "imports against the layering (see docs/design.md, Layout):\n" + "\n".join(bad)


def test_no_import_cycles():
    edges = module_edges(REPO / "resdyn")
    assert edges["resdyn.lm.families"] >= {"resdyn.lm.sublayers", "resdyn.lm.adapters.qwen3"}  # the adapter strings
    cycle = import_cycle(edges)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "resdyn"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
        init = (pkg / rel).parent / "__init__.py"
        if not init.exists():
            init.write_text("")
    return pkg


def test_layer_check_sees_a_violation(tmp_path):
    pkg = _package(tmp_path, {"study_b/phases.py": "", "study_a/spectral.py": "from resdyn.study_b import phases\n"})
    assert layering_violations(module_edges(pkg)) == ["resdyn.study_a.spectral imports resdyn.study_b.phases"]


def test_cycle_check_sees_a_planted_cycle(tmp_path):
    """A cycle hidden in a function body, and one closed by a "module:Class" string."""
    pkg = _package(
        tmp_path,
        {
            "lm/a.py": "def f():\n    from resdyn.lm import b\n",
            "lm/b.py": "from resdyn.lm import a\n",
        },
    )
    assert import_cycle(module_edges(pkg)) == ["resdyn.lm.a", "resdyn.lm.b", "resdyn.lm.a"]
    pkg2 = _package(
        tmp_path / "two",
        {
            "lm/table.py": 'TABLE = {"x": "resdyn.lm.adapter:X"}\n',
            "lm/adapter.py": "from resdyn.lm.table import TABLE\n\nclass X:\n    pass\n",
        },
    )
    assert import_cycle(module_edges(pkg2)) == ["resdyn.lm.adapter", "resdyn.lm.table", "resdyn.lm.adapter"]
    (pkg2 / "lm" / "adapter.py").write_text("class X:\n    pass\n")
    assert import_cycle(module_edges(pkg2)) == []


#: The longest a function in resdyn/ may be (lines from ``def`` to its last line, docstring
#: included) unless its docstring says why with :data:`LONG_REASON` (docs/design.md).
MAX_FUNCTION_LINES = 80
LONG_REASON = "Long because"


def long_functions(source: str, max_lines: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function or method in ``source`` that is too long.

    Too long: over ``max_lines`` lines with a docstring that lacks :data:`LONG_REASON`.
    """
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > max_lines and LONG_REASON not in (ast.get_docstring(child) or ""):
                        found.append((name, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_no_function_is_long_without_a_reason():
    found = {
        f"{path.relative_to(REPO)}: {name}": lines
        for path in sorted((REPO / "resdyn").rglob("*.py"))
        for name, lines in long_functions(path.read_text())
    }
    bad = [f"{key} ({lines} lines)" for key, lines in found.items()]
    assert not bad, (
        f"functions over {MAX_FUNCTION_LINES} lines: split them into named steps or say why in the "
        f"docstring ({LONG_REASON!r}):\n" + "\n".join(bad)
    )


def test_long_functions_counts_lines_and_honours_the_reason():
    lines = [f"    x{i} = {i}\n" for i in range(80)]
    body = "".join(lines)
    plain = f'def f():\n    """Sum."""\n{body}'
    kept = f'def f():\n    """Sum.\n\n    Long because it is one loop.\n    """\n{body}'
    method = f'class C:\n    def g(self):\n        """Sum."""\n{body.replace("    ", "        ")}'
    assert long_functions(plain) == [("f", 82)]
    assert long_functions(kept) == []
    assert long_functions(method) == [("C.g", 82)]
    assert long_functions('def f():\n    """Sum."""\n' + "".join(lines[:-2])) == []  # 80 lines
