"""File access lives in the artifacts layer, the scripts and the model/data loaders, nowhere else.

An AST scan of every ``resdyn`` module for calls that open, read, write, list or move files.
Modules allowed to touch files are listed in ``ALLOWED``; modules that still do although they
should not are listed, with what remains, in ``EXCEPTIONS``. The test fails when a new module
starts touching files and when an exception is no longer needed, so the list can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "resdyn"

#: Calls by name (``open(...)``) and by attribute (``x.to_csv(...)``) that touch the filesystem.
FILE_FUNCTIONS = frozenset({"open"})
FILE_METHODS = frozenset(
    {
        "read_csv",
        "to_csv",
        "read_text",
        "write_text",
        "read_bytes",
        "write_bytes",
        "glob",
        "rglob",
        "iterdir",
        "unlink",
        "mkdir",
        "rmtree",
        "File",
        "savez",
        "savez_compressed",
        "save",
        "load",
        "dump",
        "read_tsv",
        "write_tsv",
        "read_json",
        "write_json",
        "atomic_path",
        "load_file",
        "save_file",
        "savefig",
    }
)
#: ``json.load``/``np.load``/``torch.load`` are file reads; ``json.loads`` is not, and neither is
#: ``dict.save``-like user code on other receivers: these receivers make ``load``/``save``/``dump`` count.
_RECEIVER_ONLY = {
    "load": {"np", "numpy", "torch", "json", "pickle"},
    "save": {"np", "numpy", "torch"},
    "dump": {"json", "pickle"},
    "File": {"h5py"},
}

#: Infrastructure and the model/data loaders: file access is their job.
ALLOWED = frozenset(
    {
        # the artifacts layer: its modules that call file functions (beyond.py's tables go through base.TsvArtifact)
        "artifacts.base",
        "artifacts.study_a",
        "artifacts.study_b",
        "artifacts.zoo_data",
        "artifacts.activations",
        "artifacts.jacobians",
        "artifacts.figures",
        "cli",
        "io",
        "provenance.sidecars",
        "pipeline.config",
        "provenance.codeversion",
        "pipeline.joblog",
        "lm.models",
        "lm.hub",
        "lm.corpus",
        "lm.zoo",
        "study_b.lens_import",  # the loaders
        "plots.catalogue",  # reads figure source code to hash it (a code version, like codeversion)
        "pipeline.fetch",
        "lm.revisions",  # read the HF cache's layout (refs, snapshots), like lm.hub
        "cluster.site",
        "cluster.gpu_kinds",  # site settings (a constraint YAML, the workdir write probe); the GPU table
        "pipeline.calibrate",  # a finished run's Snakemake benchmark files and job logs; writes the user rates file
        "results",  # the results-out layer: reads every table through its artifact class, writes parquet
    }
)
#: Modules that still read or write files; each entry says what remains. Remove an entry when done.
EXCEPTIONS: dict[str, str] = {}


def file_access(source: str) -> list[tuple[int, str]]:
    """(line, call) of every file-touching call or ``import h5py`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] == "h5py" for n in names):
                found.append((node.lineno, "import h5py"))
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in FILE_FUNCTIONS:
            found.append((node.lineno, f.id))
        elif isinstance(f, ast.Attribute) and f.attr in FILE_METHODS:
            receiver = f.value.id if isinstance(f.value, ast.Name) else None
            if f.attr in _RECEIVER_ONLY and receiver not in _RECEIVER_ONLY[f.attr]:
                continue
            found.append((node.lineno, f"{receiver + '.' if receiver else '.'}{f.attr}"))
    return found


def test_checker_known_answers():
    src = (
        "import json\nimport h5py\n"
        "def f(p, t):\n"
        "    with open(p) as fh:\n"  # 4
        "        json.load(fh)\n"  # 5
        "    t.to_csv(p)\n"  # 6
        "    json.loads('{}'); json.dumps({})\n"  # 7: strings, not files
        "    model.load(p)\n"  # 8: some other object's load: not counted
        "    np.save(p, t); io.write_tsv(t, p)\n"  # 9
    )
    assert sorted(file_access(src)) == [
        (2, "import h5py"),
        (4, "open"),
        (5, "json.load"),
        (6, "t.to_csv"),
        (9, "io.write_tsv"),
        (9, "np.save"),
    ]
    assert file_access("x = pd.DataFrame({'a': [1]})\ny = x.sum()\n") == []


def _scan() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        hits = file_access(path.read_text())
        if hits:
            out[".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")] = hits
    return out


def test_file_access_only_where_allowed():
    found = _scan()
    stray = {m: hits[:5] for m, hits in found.items() if m not in ALLOWED and m not in EXCEPTIONS}
    assert not stray, f"file access outside the artifacts layer (move it to resdyn.artifacts): {stray}"


@pytest.mark.parametrize("module", sorted(EXCEPTIONS))
def test_exceptions_are_still_needed(module):
    assert module in _scan(), f"resdyn/{module}.py no longer touches files: remove it from EXCEPTIONS"
