"""Code versions derived from a script's import closure (resdyn.infra.codeversion).

The oracle for the real scripts is the standard library's ``modulefinder`` (bytecode analysis),
independent of the ``ast`` walk under test. A synthetic package covers the import forms.
"""

import modulefinder
import textwrap
from pathlib import Path

import pytest

from resdyn.infra import codeversion as cv

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
    _write(pkg, {
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
    })
    script = tmp_path / "script.py"
    script.write_text("import os\nfrom resdyn import a, f\nimport resdyn.a\n")
    return pkg, script


def test_closure_follows_every_import_form(fake):
    pkg, script = fake
    assert cv.import_closure(script, pkg) == {
        "resdyn", "resdyn.a", "resdyn.b", "resdyn.c", "resdyn.f", "resdyn.sub", "resdyn.sub.deep"}


def test_version_changes_exactly_with_the_closure(fake):
    pkg, script = fake
    before = cv.script_code_version(script, pkg)
    assert before == cv.script_code_version(script, pkg) and len(before) == 16
    for rel in ("d.py", "e.py", "unused.py"):  # not reached: same version
        (pkg / rel).write_text("# edited\n")
        assert cv.script_code_version(script, pkg) == before, rel
    for rel in ("sub/deep.py", "c.py", "__init__.py"):
        text = (pkg / rel).read_text()
        (pkg / rel).write_text(text + "# edited\n")
        assert cv.script_code_version(script, pkg) != before, rel
        (pkg / rel).write_text(text)
        assert cv.script_code_version(script, pkg) == before, rel
    script.write_text(script.read_text() + "# edited\n")
    assert cv.script_code_version(script, pkg) != before


def test_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        cv.script_code_version(tmp_path / "nope.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_closure_of_every_rule_script_matches_modulefinder(script):
    finder = modulefinder.ModuleFinder(path=[str(ROOT)])  # only resdyn is findable: fast
    finder.run_script(str(script))
    expected = {m for m in finder.modules if m == "resdyn" or m.startswith("resdyn.")}
    assert cv.import_closure(script) == expected
