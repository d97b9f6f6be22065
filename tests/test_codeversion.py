"""Code versions from the code a script reaches, symbol by symbol (resdyn.provenance.codeversion).

Oracles independent of the ``ast`` walk under test:

* the standard library's ``modulefinder`` (bytecode analysis): the modules a script imports,
  a superset of the modules whose symbols its closure may hold;
* execution: every ``resdyn`` function that runs while the Jacobians of a tiny model of each
  family are computed (traced with :func:`sys.settrace`) must be in the static closure of
  ``workflow/scripts/jacobians.py`` for that family, and no other family's adapter may be.

A synthetic package covers the import forms, the edits that must not change a version and those
that must, the places static analysis cannot see through, and bad input.
"""

import modulefinder
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from resdyn.lm.families import FAMILIES
from resdyn.provenance import codeversion as cv

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "workflow" / "scripts").glob("*.py"))


def _write(base: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(textwrap.dedent(text))


@pytest.fixture
def fake(tmp_path):
    """A package named resdyn with every import form, and a script using part of it."""
    pkg = tmp_path / "resdyn"
    _write(
        pkg,
        {
            "__init__.py": "",
            "a.py": "from resdyn import b as bee\nVALUE = 1\n",
            "b.py": "def f():\n    from . import c  # lazy, relative\n    return c\n",
            "c.py": "import numpy\nfrom resdyn.sub.deep import thing\n",
            "d.py": "from resdyn import e\n",  # not reached by the script
            "e.py": "",
            "f.py": "from resdyn.a import VALUE\n",  # an attribute of a module: counts the module
            "sub/__init__.py": "from .deep import thing\n",
            "sub/deep.py": "thing = 1\n",
            "unused.py": "",
        },
    )
    script = tmp_path / "script.py"
    script.write_text("import os\nfrom resdyn import a, f\nimport resdyn.a\n")
    return pkg, script


def test_import_closure_follows_every_import_form(fake):
    pkg, script = fake
    assert cv.import_closure(script, pkg) == {
        "resdyn",
        "resdyn.a",
        "resdyn.b",
        "resdyn.c",
        "resdyn.f",
        "resdyn.sub",
        "resdyn.sub.deep",
    }


def test_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        cv.script_code_version(tmp_path / "nope.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_closure_of_every_rule_script_matches_modulefinder(script):
    finder = modulefinder.ModuleFinder(path=[str(ROOT)])  # only resdyn is findable: fast
    finder.run_script(str(script))
    expected = {m for m in finder.modules if m == "resdyn" or m.startswith("resdyn.")}
    assert cv.import_closure(script) == expected
    # the symbol closure lies inside the modules the script imports, plus (for a script that
    # reaches the family table) the adapter modules its "module:Class" strings name and theirs
    named = {
        m
        for label in cv.symbol_closure(script)
        if label.startswith("resdyn.lm.families:")
        for m in (fam.adapter.partition(":")[0] for fam in FAMILIES.values())
    }
    for module in sorted(named):
        finder.run_script(str(cv.module_file(module)))
    reachable = {m for m in finder.modules if m == "resdyn" or m.startswith("resdyn.")} | named
    assert {label.split(":")[0] for label in cv.symbol_closure(script)} <= reachable


# --- the symbol-level closure on a synthetic package ------------------------------------------

PACKAGE = {
    "__init__.py": "",
    "util.py": '''
        """Helpers."""
        import math

        SCALE = 2.0


        def used(x):
            """Used by the script, through core.f."""
            return x * SCALE


        def unused(x):
            return x + 1


        def deco(fn):
            return fn
        ''',
    "core.py": """
        from resdyn import util
        from resdyn.util import deco
        from resdyn.types import Shape

        DEFAULT = 3
        OTHER = 4


        @deco
        def f(x, k=DEFAULT) -> Shape:
            return util.used(x) + k


        class Model:
            def run(self):
                return helper()


        def helper():
            return 1


        def g():
            return OTHER
        """,
    "types.py": "class Shape:\n    pass\n",  # only an annotation: does not count
    "lm/__init__.py": "",
    "lm/families.py": (
        'FAMILIES = {"llama": (("llama",), "resdyn.lm.sublayers:_Llama"),\n'
        '            "olmo2": (("olmo2",), "resdyn.lm.sublayers:_Olmo")}\n'
    ),
    "lm/sublayers.py": """
        import pkgutil

        from resdyn.lm.families import FAMILIES


        class Base:
            pass


        class _Llama(Base):
            def go(self):
                return 1


        class _Olmo(Base):
            def go(self):
                return 2


        def adapter(fam):
            return pkgutil.resolve_name(FAMILIES[fam][1])
        """,
    "dyn.py": """
        import importlib


        def by_name(name):
            return globals()[name]


        def plugin(name):
            return importlib.import_module(f"resdyn.plug.{name}")


        def spare():
            return 0
        """,
    "plug/__init__.py": "",
    "plug/one.py": "def draw():\n    return 1\n",
    "plug/two.py": "def draw():\n    return 2\n",
    "effects.py": "import os\nREGISTRY = []\nREGISTRY.append(os.sep)\n\n\ndef unrelated():\n    return 0\n",
}

SCRIPT = """
from resdyn import core
from resdyn.lm import sublayers

print(core.f(1), core.Model().run(), sublayers.adapter("llama"))
"""


@pytest.fixture
def pkg(tmp_path):
    base = tmp_path / "resdyn"
    _write(base, PACKAGE)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return base, script


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_symbol_closure_is_what_the_script_names(pkg):
    base, script = pkg
    got = cv.symbol_closure(script, base)
    assert got == {
        "resdyn.core:f",
        "resdyn.core:DEFAULT",
        "resdyn.core:Model",
        "resdyn.core:helper",
        "resdyn.util:used",
        "resdyn.util:SCALE",
        "resdyn.util:deco",
        "resdyn.lm.sublayers:adapter",
        "resdyn.lm.sublayers:Base",
        "resdyn.lm.sublayers:_Llama",
        "resdyn.lm.sublayers:_Olmo",
        "resdyn.lm.families:FAMILIES",
    }
    fam = cv.symbol_closure(script, base, family="llama")
    assert "resdyn.lm.sublayers:_Llama" in fam and "resdyn.lm.sublayers:_Olmo" not in fam


NO_CHANGE = {
    "docstring": ("util.py", '"""Used by the script, through core.f."""', '"""Reworded."""'),
    "comment": ("core.py", "DEFAULT = 3\n", "DEFAULT = 3  # a comment\n# another\n"),
    "formatting": ("core.py", "return util.used(x) + k", "return (util.used(x)\n            + k)"),
    "unused helper body": ("util.py", "return x + 1", "return x + 2"),
    "new helper": ("util.py", "def deco(fn):", "def new_helper():\n    return 5\n\n\ndef deco(fn):"),
    "new class": ("core.py", "class Model:", "class Artifact:\n    path = 'x'\n\n\nclass Model:"),
    "unreached constant": ("core.py", "OTHER = 4", "OTHER = 5"),
    "annotation type": ("types.py", "pass", "x: int = 0"),
    "other family": ("lm/sublayers.py", "return 2", "return 3"),
    "new family": (
        "lm/families.py",
        '"resdyn.lm.sublayers:_Olmo")}',
        '"resdyn.lm.sublayers:_Olmo"), "gpt2": (("gpt2",), "resdyn.lm.sublayers:_Olmo")}',
    ),
    "unloaded module": ("dyn.py", "return 0", "return 1"),
}

CHANGE = {
    "reached body": ("util.py", "return x * SCALE", "return x * SCALE * 1"),
    "reached constant": ("util.py", "SCALE = 2.0", "SCALE = 3.0"),
    "default argument": ("core.py", "DEFAULT = 3", "DEFAULT = 4"),
    "decorator": ("util.py", "    return fn", "    return fn or None"),
    "method of a used class": ("core.py", "return helper()", "return helper() + 0"),
    "callee of a method": ("core.py", "def helper():\n    return 1", "def helper():\n    return 2"),
    "own family": ("lm/sublayers.py", "return 1", "return 5"),
    "shared base class": ("lm/sublayers.py", "class Base:\n    pass", "class Base:\n    x = 1"),
    "family table entry": ("lm/families.py", '("llama",)', '("llama", "llama2")'),
}


@pytest.mark.parametrize("edit", NO_CHANGE, ids=str)
def test_edits_that_change_no_reached_code_keep_the_version(pkg, edit):
    base, script = pkg
    before = cv.script_code_version(script, base, family="llama")
    _edit(base / NO_CHANGE[edit][0], *NO_CHANGE[edit][1:])
    assert cv.script_code_version(script, base, family="llama") == before


@pytest.mark.parametrize("edit", CHANGE, ids=str)
def test_edits_of_reached_code_change_the_version(pkg, edit):
    base, script = pkg
    before = cv.code_manifest(script, base, family="llama")
    _edit(base / CHANGE[edit][0], *CHANGE[edit][1:])
    after = cv.code_manifest(script, base, family="llama")
    assert cv.version_of(after) != cv.version_of(before)
    assert len(cv.changed_symbols(before, after)) == 1  # and the manifest names the one symbol


def test_script_edits(pkg):
    base, script = pkg
    before = cv.script_code_version(script, base)
    script.write_text(SCRIPT + "# a comment\n")
    assert cv.script_code_version(script, base) == before
    script.write_text(SCRIPT.replace('"llama"', '"olmo2"'))
    assert cv.script_code_version(script, base) != before


def test_where_static_analysis_cannot_see_the_module_counts_whole(pkg):
    base, script = pkg
    script.write_text("from resdyn import dyn\n\ndyn.by_name('spare')\n")
    assert {"resdyn.dyn:spare", "resdyn.dyn:plugin"} <= cv.symbol_closure(script, base)  # globals()
    script.write_text("from resdyn import dyn\n\ndyn.plugin('one')\n")
    got = cv.symbol_closure(script, base)
    assert {"resdyn.plug.one:draw", "resdyn.plug.two:draw"} <= got  # import_module(f"resdyn.plug.{x}")
    assert "resdyn.dyn:spare" not in got
    script.write_text("from resdyn import util\n\nprint(getattr(util, input()))\n")
    assert "resdyn.util:unused" in cv.symbol_closure(script, base)  # getattr with a computed name
    script.write_text("from resdyn import util\n\nprint(vars(util))\n")
    assert "resdyn.util:unused" in cv.symbol_closure(script, base)  # a module used as a value


def test_statements_run_on_import_count(pkg):
    base, script = pkg
    script.write_text("from resdyn import effects  # noqa\n")
    before = cv.code_manifest(script, base)
    assert [k for k in before if "<effect" in k] and "resdyn.effects:unrelated" not in before
    _edit(base / "effects.py", "REGISTRY.append(os.sep)", "REGISTRY.append(os.linesep)")
    assert cv.version_of(cv.code_manifest(script, base)) != cv.version_of(before)


@pytest.mark.parametrize(
    "case, text, match",
    [
        ("syntax", "from resdyn import broken\n", r"broken\.py:1: syntax error"),
        ("module", "from resdyn import nowhere\n", r"script\.py: resdyn has no name 'nowhere'"),
        ("dotted", "import resdyn.nowhere.deep\n", r"script\.py: imports resdyn\.nowhere\.deep, which is not a module"),
        ("name", "from resdyn.util import nothing\n", r"script\.py: resdyn\.util has no name 'nothing'"),
    ],
)
def test_closure_that_cannot_be_computed_names_the_file(pkg, case, text, match):
    base, script = pkg
    (base / "broken.py").write_text("def f(:\n")
    script.write_text(text)
    with pytest.raises(cv.CodeVersionError, match=match) as err:
        cv.script_code_version(script, base)
    assert "\n" not in str(err.value)


def test_cached_version_survives_processes_and_sees_edits(pkg, tmp_path, monkeypatch):
    base, script = pkg
    cache = tmp_path / "cache"
    v1 = cv.cached_code_version(script, cache, package_dir=base)
    assert v1 == cv.script_code_version(script, base)
    assert cv.stored_manifest(cache, v1) == cv.code_manifest(script, base)
    cv.clear_caches()  # as a new process: the index answers, nothing is computed
    with monkeypatch.context() as m:
        m.setattr(cv, "code_manifest", lambda *a, **k: pytest.fail("recomputed although nothing changed"))
        assert cv.cached_code_version(script, cache, package_dir=base) == v1
    _edit(base / "util.py", "SCALE = 2.0", "SCALE = 2.5")
    v2 = cv.cached_code_version(script, cache, package_dir=base)
    assert v2 != v1
    assert cv.changed_symbols(cv.stored_manifest(cache, v1), cv.stored_manifest(cache, v2)) == ["resdyn.util:SCALE"]


# --- oracle by execution: what runs is in the static closure ----------------------------------


def _traced_symbols(fn) -> set[str]:
    """``module:top-level name`` of every resdyn function that runs during ``fn()``."""
    seen: set[tuple[str, str]] = set()
    package = str(cv.PACKAGE_DIR) + "/"

    def trace(frame, event, arg):  # Python calls only; no line events (returns None)
        if frame.f_code.co_filename.startswith(package):
            seen.add((frame.f_code.co_filename, frame.f_code.co_qualname))

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    out = set()
    for filename, qualname in seen:
        top = qualname.split(".")[0]
        if top.startswith("<"):
            continue  # module body, lambdas and comprehensions at module level
        parts = Path(filename).relative_to(cv.PACKAGE_DIR).with_suffix("").parts
        module = ".".join(("resdyn", *parts)).removesuffix(".__init__")
        out.add(f"{module}:{top}")
    return out


def test_what_runs_for_each_family_is_in_its_jacobian_closure(tmp_path):
    torch = pytest.importorskip("torch")
    from resdyn.lm import decompose
    from resdyn.study_a import jacobian

    from helpers.tiny_models import FAMILIES, FAMILY_OF, make_model, sample_ids

    script = ROOT / "workflow" / "scripts" / "jacobians.py"
    from resdyn.lm.families import FAMILIES as TABLE

    def symbols(cls):  # the adapter and its bases defined by resdyn, as closure labels
        return {f"{c.__module__}:{c.__name__}" for c in cls.__mro__ if c.__module__.startswith("resdyn.")}

    adapters = set().union(*(symbols(decompose.adapter_class(f)) for f in TABLE))
    torch.set_num_threads(1)
    for name in FAMILIES:
        family = FAMILY_OF[name]
        model = make_model(name)
        samples = np.stack([sample_ids(seed=10 + i).numpy() for i in range(2)])
        paths = {1: tmp_path / f"{name}.h5"}

        def run():
            jacobian.write_layer_block(
                model,
                samples,
                np.arange(2),
                [1],
                paths,
                positions=[-1],
                store_first_n=1,
                checkpoint_every=1,
                attrs={"model_id": name},
                progress=False,
            )

        ran = _traced_symbols(run)
        closure = cv.symbol_closure(script, family=family)
        assert "resdyn.study_a.jacobian:attn_jacobian" in ran  # the trace sees the work
        assert ran <= closure, f"{name}: ran but not in the closure: {sorted(ran - closure)}"
        own = symbols(decompose.adapter_class(family))
        assert adapters & closure == own & adapters, name


def test_imports_inside_top_level_blocks_bind_names(pkg):
    base, script = pkg
    (base / "guarded.py").write_text(
        "try:\n    from resdyn.util import used\nexcept ImportError:\n    used = None\n\n\n"
        "def f():\n    return used(1)\n"
    )
    script.write_text("from resdyn.guarded import f\n\nf()\n")
    assert "resdyn.util:used" in cv.symbol_closure(script, base)


def test_figure_rules_reach_every_plot_function_named_in_the_catalogue():
    """render.plot_function imports plot modules by name: the figure script's closure must still
    hold every figure's function (import_module with a constant prefix counts resdyn.plots whole)."""
    from resdyn.plots import catalogue

    closure = cv.symbol_closure(ROOT / "workflow" / "scripts" / "figure.py")
    missing = {f"{spec.module}:{spec.function}" for spec in catalogue.FIGURES} - closure
    assert not missing
