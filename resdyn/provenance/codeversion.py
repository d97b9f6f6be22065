"""Code versions of rules, derived from the code their scripts reach (never listed by hand).

A rule's code version is a short SHA-256 over the *normalised* code its script can run: the
script itself and every top-level function, class and module-level assignment of a ``resdyn``
module that the script reaches by name, transitively (a symbol-level closure over the import
graph). Normalised means :func:`ast.dump` of the statement with docstrings removed: comments,
docstrings, formatting and line numbers do not count. A symbol is reached when code already
reached names it: a plain name (a function, class or constant of the same module or imported
with ``from … import``), an attribute of an imported module (``mod.f``, ``pkg.mod.f``), a base
class, a decorator, a default argument. A class counts whole (every method). Type annotations
do not count (they change no number). Statements of a module that run on import and bind no
name (``if``/``try`` blocks, calls) count for every module the script loads.

Where static analysis cannot see which symbol is meant, the module counts whole (every symbol
of it is reached): a module used as a value rather than through an attribute (``f(mod)``),
``getattr(mod, name)`` with a computed name, ``globals()``/``vars()`` inside a reached symbol
(its own module), and ``importlib.import_module``/``__import__`` (every module under the
constant prefix of the name, e.g. ``f"resdyn.plots.{m}"`` → all of ``resdyn.plots``; without a
prefix, all of ``resdyn``). docs/design.md lists where this happens.

Model families: the tables in :data:`FAMILY_TABLES` map a family name to its entry, which names
its adapter class as a ``"resdyn.module:Class"`` string (resolved by :func:`pkgutil.resolve_name`).
Such strings are followed like imports of that name wherever reached code holds one. Given a
``family``, only that family's entries of these tables count, so adding or editing one family's
adapter changes no other family's code version. A module-level ``__getattr__`` (PEP 562) counts
for every name the module does not define.

Nothing is imported or executed; every file is parsed once per (mtime, size). A script or a
module whose closure cannot be computed (syntax error, an import of a ``resdyn`` module or name
that does not exist) raises :class:`CodeVersionError` with one line naming the file.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "resdyn"
PACKAGE_DIR = Path(__file__).resolve().parents[1]

#: (module, top-level dict) tables keyed by model family: only the job's family's entries count.
FAMILY_TABLES = frozenset(
    {
        ("resdyn.lm.families", "FAMILIES"),
        ("resdyn.lm.families", "REFUSED_FAMILIES"),
    }
)

#: A string naming a symbol as ``"resdyn.module:Name"`` (what :func:`pkgutil.resolve_name` takes; the
#: family table names each adapter so): the closure follows it like an import of that name.
_NAMED_SYMBOL = re.compile(r"(resdyn(?:\.\w+)*):(\w+)")

__all__ = [
    "CodeVersionError",
    "FAMILY_TABLES",
    "module_file",
    "imported_modules",
    "import_closure",
    "symbol_closure",
    "code_manifest",
    "script_code_version",
    "cached_code_version",
    "stored_manifest",
    "clear_caches",
    "version_of",
    "changed_symbols",
]


class CodeVersionError(ValueError):
    """The code a script reaches cannot be determined (one line, naming the file)."""


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


@functools.lru_cache(maxsize=4096)
def _module_file(name: str, package_dir: Path) -> Path | None:
    # within one DAG build files do not come and go; tests that add modules clear this cache
    return module_file(name, package_dir)


def _parents(name: str) -> list[str]:
    """``resdyn.a.b`` -> [``resdyn``, ``resdyn.a``]: packages executed before the module."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _parse(path: str) -> ast.Module:
    try:
        return ast.parse(Path(path).read_bytes(), filename=path)
    except SyntaxError as err:
        raise CodeVersionError(
            f"{path}:{err.lineno}: syntax error ({err.msg}); its code version cannot be computed"
        ) from None


def _import_base(node: ast.ImportFrom, module: str | None, is_pkg: bool) -> str | None:
    """The module a ``from … import`` starts from (relative imports resolved; None if unresolvable)."""
    if not node.level:
        return node.module or ""
    if module is None:
        return None
    parts = module.split(".")
    anchor = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
    return ".".join(anchor + ([node.module] if node.module else []))


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
    tree = _parse(path)
    is_pkg = Path(path).name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(node, module, is_pkg)
            if base is None:
                continue
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


# --- the symbol-level closure -----------------------------------------------------------------

#: A binding made by an import: (module, None) names a module, (module, attr) a name in it.
Binding = tuple[str, "str | None"]


_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(stmts, into_defs: bool = True):
    """Every statement in ``stmts`` and in the bodies nested in them (not into expressions;
    not into nested functions and classes unless ``into_defs``)."""
    for stmt in stmts:
        yield stmt
        if not into_defs and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in _BODIES:
            inner = getattr(stmt, name, None)
            if inner:
                yield from _statements(inner, into_defs)


def _strip_docstrings(node: ast.AST) -> ast.AST:
    """``node`` without the docstrings of its classes/functions (modified in place)."""
    for n in _statements([node]):
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = n.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                n.body = body[1:] or [ast.Pass()]
    return node


def _dump(stmt: ast.AST) -> str:
    """Normalised code: no docstrings, comments, formatting or line numbers."""
    return ast.dump(stmt, annotate_fields=False, include_attributes=False)


def _target_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _stored(args: ast.arguments, body: list[ast.stmt]) -> set[str]:
    """Names local to a function: its parameters and what its statements bind (assignment and
    loop targets, ``with … as``, ``except … as``, nested defs, imports). Statements only: a name
    bound inside an expression (``:=``) is missed, which can only add to what counts."""
    out = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
    for n in _statements(body, into_defs=False):  # a nested function's locals are its own
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                out |= _target_names(t)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            out |= _target_names(n.target)
        elif isinstance(n, (ast.With, ast.AsyncWith)):
            for item in n.items:
                if item.optional_vars is not None:
                    out |= _target_names(item.optional_vars)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return out


@dataclass
class _Refs:
    """What one top-level statement reaches: name chains (``("mod", "f")`` for ``mod.f``; a
    1-tuple is a name used as a value), imports made inside it, and the places static analysis
    cannot see through."""

    chains: set[tuple[str, ...]] = field(default_factory=set)
    imports: dict[str, Binding] = field(default_factory=dict)  # imports inside the statement
    loads: set[str] = field(default_factory=set)  # modules those imports load
    getattr_dynamic: set[str] = field(default_factory=set)  # getattr(NAME, computed name)
    own_module_whole: bool = False  # globals() / vars()
    dynamic_imports: set[str] = field(default_factory=set)  # constant prefixes of import_module names
    named: set[tuple[str, str]] = field(default_factory=set)  # "resdyn.mod:Name" strings (pkgutil.resolve_name)


class _RefVisitor(ast.NodeVisitor):
    """Collects :class:`_Refs`; names local to a function (parameters, assignments) shadow the
    module's; annotations are not followed (they change no number)."""

    def __init__(self, module: str | None, is_pkg: bool) -> None:
        self.refs = _Refs()
        self.module, self.is_pkg = module, is_pkg
        self.scopes: list[set[str]] = []

    def _local(self, name: str) -> bool:
        return name not in self.refs.imports and any(name in s for s in self.scopes)

    def _visit_args(self, args: ast.arguments) -> None:
        for d in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(d)

    def visit_FunctionDef(self, node) -> None:
        for d in node.decorator_list:
            self.visit(d)
        self._visit_args(node.args)
        self.scopes.append(_stored(node.args, node.body))
        for s in node.body:
            self.visit(s)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_args(node.args)
        self.scopes.append(_stored(node.args, []))
        self.visit(node.body)
        self.scopes.pop()

    def _visit_comprehension(self, node) -> None:
        self.scopes.append(set().union(*(_target_names(g.target) for g in node.generators)))
        self.generic_visit(node)
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension

    def visit_arg(self, node: ast.arg) -> None:
        pass  # annotations

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        if not isinstance(node.target, ast.Name):
            self.visit(node.target)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.refs.loads.add(alias.name)
            if alias.asname:
                self.refs.imports[alias.asname] = (alias.name, None)
            else:
                head = alias.name.split(".")[0]
                self.refs.imports[head] = (head, None)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _import_base(node, self.module, self.is_pkg)
        if base is None:
            return
        self.refs.loads.add(base)
        for alias in node.names:
            key = f"*{base}" if alias.name == "*" else alias.asname or alias.name
            self.refs.imports[key] = (base, None if alias.name == "*" else alias.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name):
            if isinstance(value.ctx, ast.Load) and not self._local(value.id):
                self.refs.chains.add((value.id, *reversed(chain)))
        else:
            self.visit(value)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and not self._local(node.id):
            self.refs.chains.add((node.id,))

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and (m := _NAMED_SYMBOL.fullmatch(node.value)):
            self.refs.named.add((m.group(1), m.group(2)))

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name in ("globals", "vars") and not node.args:
            self.refs.own_module_whole = True
        elif name == "getattr" and len(node.args) >= 2 and isinstance(node.args[0], ast.Name):
            target, attr = node.args[0].id, node.args[1]
            if not self._local(target):
                if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                    self.refs.chains.add((target, attr.value))
                    for a in node.args[2:]:
                        self.visit(a)
                    return
                self.refs.getattr_dynamic.add(target)
        elif name in ("import_module", "__import__") and node.args:
            self.refs.dynamic_imports.add(_constant_prefix(node.args[0]))
        self.generic_visit(node)


def _constant_prefix(arg: ast.expr) -> str:
    """The constant start of an imported module's name: ``"resdyn.plots."`` of ``f"resdyn.plots.{m}"``."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return ""


def _refs(stmt: ast.AST, module: str | None, is_pkg: bool) -> _Refs:
    v = _RefVisitor(module, is_pkg)
    v.visit(stmt)
    return v.refs


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a top-level statement binds in its module (defs inside if/try blocks included)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return sorted(out)


def _is_definition(stmt: ast.stmt) -> bool:
    """A statement that only binds names (it counts when a name is reached), not one run for effect."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(stmt, ast.Assign):
        return all(
            isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store, ast.Starred))
            for t in stmt.targets
            for n in ast.walk(t)
        )
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return isinstance(stmt.target, ast.Name)
    return False


@dataclass
class _Module:
    """One parsed file: its definitions, import bindings, effect statements and what it loads."""

    name: str | None  # None for a script
    path: str
    stmts: list[ast.stmt]  # top-level statements other than imports, docstrings stripped
    defs: dict[str, list[int]]  # name -> indices into stmts
    effects: list[int]  # statements run for effect on import (they bind no name that is used)
    imports: dict[str, Binding]  # top-level import bindings
    loads: list[str]  # modules its top-level imports load
    star: list[str]  # modules imported with *
    _dumps: dict[int, str] = field(default_factory=dict)
    _refs: dict[int, _Refs] = field(default_factory=dict)

    @property
    def is_pkg(self) -> bool:
        return self.path.endswith("__init__.py")

    # computed on first use: a closure reaches a fraction of the statements it parses
    def dump(self, i: int) -> str:
        if i not in self._dumps:
            self._dumps[i] = _dump(_strip_docstrings(self.stmts[i]))
        return self._dumps[i]

    def refs(self, i: int) -> _Refs:
        if i not in self._refs:
            self._refs[i] = _refs(self.stmts[i], self.name, self.is_pkg)
        return self._refs[i]


@functools.lru_cache(maxsize=1024)
def _load(path: str, _mtime: int, _size: int, module: str | None) -> _Module:
    tree = _parse(path)
    is_pkg = Path(path).name == "__init__.py"
    stmts, defs, effects, imports, loads, star = [], {}, [], {}, [], []
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the module docstring
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            r = _refs(stmt, module, is_pkg)
            loads += sorted(r.loads)
            for name, b in r.imports.items():
                if name.startswith("*"):
                    star.append(b[0])
                else:
                    imports[name] = b
            continue
        i = len(stmts)
        stmts.append(stmt)
        if not _is_definition(stmt):
            effects.append(i)
            for name, b in _refs(stmt, module, is_pkg).imports.items():  # `try:`/`if` imports bind too
                if not name.startswith("*"):
                    imports.setdefault(name, b)
        for name in _bound_names(stmt):
            defs.setdefault(name, []).append(i)
    return _Module(module, path, stmts, defs, effects, imports, loads, star)


def _family_table(mod: _Module, i: int, family: str) -> ast.stmt | None:
    """Statement ``i`` with only ``family``'s entries, if it is one of :data:`FAMILY_TABLES`."""
    stmt = mod.stmts[i]
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or not isinstance(stmt.value, ast.Dict):
        return None
    if not any((mod.name, n) in FAMILY_TABLES for n in _bound_names(stmt)):
        return None
    d = stmt.value
    keep = [j for j, k in enumerate(d.keys) if isinstance(k, ast.Constant) and k.value == family]
    new = ast.Dict(keys=[d.keys[j] for j in keep], values=[d.values[j] for j in keep])
    if isinstance(stmt, ast.Assign):
        return ast.Assign(targets=stmt.targets, value=new)
    return ast.AnnAssign(target=stmt.target, annotation=stmt.annotation, value=new, simple=stmt.simple)


class _Closure:
    """The symbol-level closure of one script (see the module docstring)."""

    def __init__(self, package_dir: Path, family: str | None) -> None:
        self.package_dir, self.family = package_dir, family
        self.items: dict[tuple[str, int], tuple[str, str]] = {}  # (module, stmt) -> (label, code)
        self.files: dict[str, tuple[int, int]] = {}  # every file read -> (mtime, size)
        self.whole: set[str] = set()
        self.loaded: set[str] = set()
        self.todo: list[tuple[_Module, int, _Refs]] = []

    def module(self, name: str, where: str) -> _Module:
        path = _module_file(name, self.package_dir)
        if path is None:
            raise CodeVersionError(f"{where}: imports {name}, which is not a module under {self.package_dir}")
        return self.file(str(path), name)

    def file(self, path: str, name: str | None) -> _Module:
        st = Path(path).stat()
        self.files[path] = (st.st_mtime_ns, st.st_size)
        return _load(path, st.st_mtime_ns, st.st_size, name)

    def is_module(self, name: str) -> bool:
        return name.split(".")[0] == PACKAGE and _module_file(name, self.package_dir) is not None

    @staticmethod
    def ours(name: str) -> bool:
        return name.split(".")[0] == PACKAGE

    def add(self, mod: _Module, i: int) -> None:
        key = (mod.name or "script", i)
        if key in self.items:
            return
        stmt = _family_table(mod, i, self.family) if self.family is not None else None
        if stmt is None:
            code, refs = mod.dump(i), mod.refs(i)
        else:
            code, refs = _dump(_strip_docstrings(stmt)), _refs(stmt, mod.name, mod.is_pkg)
        names = _bound_names(mod.stmts[i])
        if mod.name is None:
            label = f"script:{i}"
        elif i in mod.effects:  # by content, so that adding a definition before it changes nothing
            label = f"{mod.name}:<effect {hashlib.sha256(code.encode()).hexdigest()[:8]}>"
        else:
            label = f"{mod.name}:{','.join(names)}" + (f"#{i}" if any(len(mod.defs[n]) > 1 for n in names) else "")
        self.items[key] = (label, code)
        self.todo.append((mod, i, refs))

    def load(self, name: str, where: str) -> None:
        """Module ``name`` is imported: it, its packages and what they import run their effects."""
        todo = [*_parents(name), name]
        while todo:
            n = todo.pop(0)
            if n in self.loaded or not self.ours(n):
                continue
            if not self.is_module(n):
                if n == name:
                    raise CodeVersionError(f"{where}: imports {n}, which is not a module under {self.package_dir}")
                continue  # `from pkg import name`: pkg is the module
            self.loaded.add(n)
            m = self.module(n, where)
            for i in m.effects:
                self.add(m, i)
            todo += [x for p in m.loads for x in (*_parents(p), p)]

    def whole_module(self, name: str, where: str) -> None:
        if name in self.whole:
            return
        self.whole.add(name)
        self.load(name, where)
        m = self.module(name, where)
        for idx in m.defs.values():
            for i in idx:
                self.add(m, i)
        for b in m.imports.values():
            self.follow(b, (), bare=True, where=m.path)

    def symbol(self, module: str, attr: str, where: str) -> None:
        """``module.attr``: a submodule, a definition, or a name the module imports (re-export)."""
        self.load(module, where)
        m = self.module(module, where)
        if attr in m.defs:
            for i in m.defs[attr]:
                self.add(m, i)
        elif attr in m.imports:
            self.follow(m.imports[attr], (), bare=False, where=m.path)
        elif m.star:
            for base in m.star:
                if self.is_module(base):
                    self.whole_module(base, m.path)
        elif "__getattr__" in m.defs:  # a module-level __getattr__ (PEP 562) makes the name
            for i in m.defs["__getattr__"]:
                self.add(m, i)
        else:
            raise CodeVersionError(f"{where}: {module} has no name {attr!r}")

    def follow(self, binding: Binding, rest: tuple[str, ...], bare: bool, where: str) -> None:
        """Resolve ``binding.rest…``: walk submodules, stop at the first definition."""
        module, attr = binding
        if not self.ours(module):
            return  # third-party code: its versions are recorded in provenance
        if attr is not None:
            rest = (attr, *rest)
        if not self.is_module(module):
            raise CodeVersionError(f"{where}: imports {module}, which is not a module under {self.package_dir}")
        self.load(module, where)
        for part in rest:
            if self.is_module(f"{module}.{part}"):
                module = f"{module}.{part}"
                self.load(module, where)
                continue
            self.symbol(module, part, where)
            return  # attributes of a class or constant: the whole definition counts already
        if bare:
            self.whole_module(module, where)

    def resolve(self, mod: _Module, local: dict[str, Binding], chain: tuple[str, ...]) -> None:
        head, bare = chain[0], len(chain) == 1
        if head in local:
            self.follow(local[head], chain[1:], bare, mod.path)
        elif head in mod.defs:  # (and imported too, in a `try:` block: both may run)
            for i in mod.defs[head]:
                self.add(mod, i)
            if head in mod.imports:
                self.follow(mod.imports[head], chain[1:], bare, mod.path)
        elif head in mod.imports:
            self.follow(mod.imports[head], chain[1:], bare, mod.path)
        elif mod.star:
            for base in mod.star:
                if self.is_module(base):
                    self.whole_module(base, mod.path)

    def run(self) -> None:
        while self.todo:
            mod, i, r = self.todo.pop()
            local = {k: v for k, v in r.imports.items() if not k.startswith("*")}
            for name in sorted(r.loads):
                self.load(name, mod.path)
            for k, b in r.imports.items():
                if k.startswith("*") and self.is_module(b[0]):
                    self.whole_module(b[0], mod.path)
            for chain in sorted(r.chains):
                self.resolve(mod, local, chain)
            for module, name in sorted(r.named):
                self.symbol(module, name, mod.path)
            for name in sorted(r.getattr_dynamic):  # getattr(mod, computed): the module counts whole
                self.resolve(mod, local, (name,))
            if r.own_module_whole and mod.name is not None:
                self.whole_module(mod.name, mod.path)
            for prefix in sorted(r.dynamic_imports):
                if PACKAGE.startswith(prefix) or prefix.startswith(PACKAGE):
                    for name in self.modules_under(prefix):
                        self.whole_module(name, mod.path)

    def modules_under(self, prefix: str) -> list[str]:
        """Every ``resdyn`` module whose dotted name starts with ``prefix``."""
        names = []
        for p in sorted(self.package_dir.rglob("*.py")):
            parts = p.relative_to(self.package_dir).with_suffix("").parts
            names.append(".".join((PACKAGE, *parts)).removesuffix(".__init__"))
        return [n for n in names if n.startswith(prefix)]


def _checked(script: str | Path) -> Path:
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"rule script {script} does not exist (code version of a rule)")
    return script


def _closure(script: Path, package_dir: Path, family: str | None) -> _Closure:
    c = _Closure(package_dir, family)
    s = c.file(str(script), None)
    for name in s.loads:
        c.load(name, str(script))
    for b in s.imports.values():
        c.follow(b, (), bare=False, where=str(script))
    for base in s.star:
        if c.is_module(base):
            c.whole_module(base, str(script))
    for i in range(len(s.stmts)):  # the script runs whole
        c.add(s, i)
    c.run()
    return c


_MANIFESTS: dict[tuple[str, str, str | None], tuple[dict[str, tuple[int, int]], dict[str, str]]] = {}


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = Path(path).stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def code_manifest(script: str | Path, package_dir: Path = PACKAGE_DIR, family: str | None = None) -> dict[str, str]:
    """``label -> sha256`` (16 hex) of every piece of code ``script`` reaches: ``script:N`` for its
    statements, ``module:name`` for a definition, ``module:<effect …>`` for a statement a loaded
    module runs on import.

    Cached per (script, package, family) while none of the files read has changed.
    """
    script = _checked(script)
    package_dir = Path(package_dir).resolve()
    key = (str(script), str(package_dir), family)
    hit = _MANIFESTS.get(key)
    if hit is not None and all(_stamp(p) == s for p, s in hit[0].items()):
        return dict(hit[1])
    c = _closure(script, package_dir, family)
    manifest = {label: hashlib.sha256(code.encode()).hexdigest()[:16] for label, code in c.items.values()}
    manifest = dict(sorted(manifest.items()))
    _MANIFESTS[key] = (dict(c.files), manifest)
    return dict(manifest)


def clear_caches() -> None:
    """Forget every parsed file and computed manifest of this process (as a new process would)."""
    _MANIFESTS.clear()
    _load.cache_clear()
    _module_file.cache_clear()
    _imported.cache_clear()


def symbol_closure(script: str | Path, package_dir: Path = PACKAGE_DIR, family: str | None = None) -> set[str]:
    """``module:name`` of every definition ``script`` reaches (labels of :func:`code_manifest`
    without the script's own statements and without effects)."""
    return {
        k.split("#")[0]
        for k in code_manifest(script, package_dir, family)
        if not k.startswith("script:") and "<effect" not in k
    }


def version_of(manifest: dict[str, str]) -> str:
    """The code version (16 hex digits) of a :func:`code_manifest`."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def script_code_version(script: str | Path, package_dir: Path = PACKAGE_DIR, family: str | None = None) -> str:
    """Short hash (16 hex digits) of the normalised code ``script`` reaches (module docstring).

    Raises FileNotFoundError naming the script when it does not exist, :class:`CodeVersionError`
    (one line naming the file) when its closure cannot be computed.
    """
    return version_of(code_manifest(script, package_dir, family))


def changed_symbols(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Labels of two manifests that differ: edited, added (``+label``) or removed (``-label``)."""
    out = [k for k in sorted(set(old) & set(new)) if old[k] != new[k]]
    out += [f"+{k}" for k in sorted(set(new) - set(old))]
    out += [f"-{k}" for k in sorted(set(old) - set(new))]
    return out


def cached_code_version(
    script: str | Path, cache_dir: str | Path, family: str | None = None, package_dir: Path = PACKAGE_DIR
) -> str:
    """:func:`script_code_version`, remembered across processes (every ``snakemake`` call builds
    the DAG anew) while none of the files the closure read has changed (mtime and size).

    ``cache_dir/index/<key>.json`` holds the files read and the version; ``cache_dir/manifests/
    <version>.json`` the :func:`code_manifest`, which ``resdyn plan --changes`` compares with
    today's to name the symbols that changed.
    """
    from resdyn import io

    script, package_dir, cache_dir = _checked(script), Path(package_dir).resolve(), Path(cache_dir)
    key = hashlib.sha256(json.dumps([str(script), str(package_dir), family]).encode()).hexdigest()[:24]
    index = cache_dir / "index" / f"{key}.json"
    try:
        entry = json.loads(index.read_text())
        if all(_stamp(p) == tuple(s) for p, s in entry["files"].items()):
            return entry["version"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no entry yet, or a stale or unreadable one: compute
    manifest = code_manifest(script, package_dir, family)
    version = version_of(manifest)
    files = _MANIFESTS[(str(script), str(package_dir), family)][0]
    stored = cache_dir / "manifests" / f"{version}.json"
    if not stored.is_file():
        io.write_json(manifest, stored)
    io.write_json({"files": files, "version": version}, index)
    return version


def stored_manifest(cache_dir: str | Path, version: str) -> dict[str, str] | None:
    """The manifest of code version ``version`` saved by :func:`cached_code_version`, if any."""
    path = Path(cache_dir) / "manifests" / f"{version}.json"
    return json.loads(path.read_text()) if path.is_file() else None
