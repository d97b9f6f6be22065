"""Provenance records, the start-of-step input check and `audit` on a hand-made three-step chain.

source.txt ─► a.tsv (file) ─► b/ (folder output) ─► c.tsv; each step runs through
provenance.step with a stand-in for Snakemake's `snakemake` object, so the sidecars are the real
ones. Each tamper must give exactly the expected problem kind on the expected path.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from resdyn import io
from resdyn.provenance import sidecars


def _sm(rule: str, inputs: list[Path], outputs: list[Path], log: Path) -> SimpleNamespace:
    return SimpleNamespace(
        rule=rule,
        input=[str(p) for p in inputs],
        output=[str(p) for p in outputs],
        params={"x": 1},
        wildcards={},
        log=[str(log)],
        threads=1,
    )


def _run(rule, inputs, outputs, body, tmp):
    with sidecars.step(_sm(rule, inputs, outputs, tmp / "logs" / f"{rule}.log")):
        body()


@pytest.fixture
def chain(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src, a, b, c = Path("source.txt"), Path("results/a.tsv"), Path("results/b"), Path("results/c.tsv")
    src.write_text("hello\n")
    _run("make_a", [src], [a], lambda: io.write_tsv(__import__("pandas").DataFrame({"v": [1.0, 2.0]}), a), tmp_path)

    def make_b():
        b.mkdir(parents=True)
        (b / "layer000.txt").write_text(a.read_text() * 2)
        (b / "layer001.txt").write_text("x")

    _run("make_b", [a], [b], make_b, tmp_path)
    _run("make_c", [b], [c], lambda: c.write_text("c\n"), tmp_path)
    return src, a, b, c


def _problems(roots=("results",)) -> list[str]:
    return sidecars.audit(list(roots))[1]


def test_sidecar_records_outputs_and_a_folder_manifest(chain):
    _, a, b, _ = chain
    side_a = io.read_json(io.prov_path(a))
    assert side_a["artifact"]["sha256"] == hashlib.sha256(a.read_bytes()).hexdigest()
    assert side_a["outputs"] == {str(a): side_a["artifact"]["sha256"]}
    side_b = io.read_json(io.prov_path(b))
    files = side_b["artifact"]["files"]
    assert files == {
        "layer000.txt": hashlib.sha256((b / "layer000.txt").read_bytes()).hexdigest(),
        "layer001.txt": hashlib.sha256(b"x").hexdigest(),
    }
    # the folder digest is the documented one: sha256 over sorted (name, file hash)
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode())
        h.update(files[name].encode())
    assert side_b["artifact"]["sha256"] == h.hexdigest() == io.sha256_tree(b)
    assert side_b["inputs"] == {str(a): side_a["artifact"]["sha256"]}


def test_clean_chain_has_no_problem(chain):
    assert sidecars.audit(["results"]) == (3, [])


def test_hidden_files_are_not_part_of_an_artifact(chain):
    _, _, b, _ = chain
    (b / ".snakemake_timestamp").write_text("")
    assert _problems() == []


def test_edited_file_output(chain):
    _, a, b, _ = chain
    a.write_text("v\n9\n")
    lines = _problems()
    assert any(ln.startswith(f"changed input: {b}: input {a} was altered after its rule wrote it") for ln in lines)
    assert any(ln.startswith(f"changed output: {a}: differs from what rule make_a wrote") for ln in lines)


def test_file_changed_inside_a_folder_output_is_named(chain):
    _, _, b, c = chain
    (b / "layer001.txt").write_text("y")
    lines = _problems()
    assert f"changed output: {b}: differs from what rule make_b wrote (changed layer001.txt)" in lines[0]
    assert any(ln.startswith(f"changed input: {c}:") for ln in lines)


def test_changed_source_input(chain):
    src, a, _, _ = chain
    src.write_text("bye\n")
    assert _problems() == [
        sidecars.problem(
            "changed input",
            a,
            f"input {src} changed since it was made "
            f"(sha256 {hashlib.sha256(b'hello' + bytes([10])).hexdigest()[:12]}… → "
            f"{hashlib.sha256(b'bye' + bytes([10])).hexdigest()[:12]}…)",
        )
    ]


def test_stale_chain_when_an_input_was_rebuilt(chain, tmp_path):
    src, a, b, _ = chain
    src.write_text("bye\n")
    _run("make_a", [src], [a], lambda: io.write_tsv(__import__("pandas").DataFrame({"v": [3.0]}), a), tmp_path)
    lines = _problems()
    assert lines == [
        sidecars.problem(
            "stale chain", b, f"made from a version of {a} that no longer exists (it was rebuilt since by rule make_a)"
        )
    ]


def test_missing_sidecar_and_sidecar_without_artifact(chain):
    _, a, b, c = chain
    io.prov_path(b).unlink()
    c.unlink()
    lines = _problems()
    assert sidecars.problem("missing sidecar", b, "no provenance sidecar b.prov.json") in lines
    assert sidecars.problem("sidecar without artifact", io.prov_path(c), f"its artifact {c} is missing") in lines
    assert len(lines) == 2  # the folder is reported once, not once per file


def test_unreadable_sidecar(chain):
    _, a, _, _ = chain
    io.prov_path(a).write_text("{")
    assert any(ln.startswith(f"unreadable sidecar: {a}:") for ln in _problems())


def test_a_step_refuses_an_input_its_rule_did_not_write(chain, tmp_path):
    _, _, b, c = chain
    (b / "layer000.txt").write_text("corrupt")
    with pytest.raises(
        sidecars.InputChanged,
        match=r"input results/b differs from what its rule wrote "
        r"\(changed layer000.txt\)",
    ):
        _run("make_c", [b], [c], lambda: c.write_text("c2\n"), tmp_path)
    assert c.read_text() == "c\n"  # nothing rewritten, the old sidecar still names the good input
    assert json.loads(io.prov_path(c).read_text())["inputs"][str(b)] != io.sha256_tree(b)


def test_chain_ends_in_source_records(chain):
    src, a, b, c = chain
    steps = sidecars.chain(c)
    assert [p for p, _ in steps] == [str(c), str(b), str(a), str(src)]
    assert steps[-1][1] == {"rule": None, "source": True, "sha256": hashlib.sha256(b"hello\n").hexdigest()}


def test_source_files_and_logs_are_not_artifacts(chain, tmp_path):
    """`resdyn verify .` audits results/ and models/ only; a source file or a log named on the
    command line is "not an artifact" — never advice to delete it."""
    src, a, b, c = chain
    Path("README.md").write_text("# a workflow\n")
    (tmp_path / "logs" / "extra.log").write_text("x\n")
    assert sidecars.audit(["."]) == (3, [])
    for path in (src, Path("README.md"), Path("logs"), tmp_path / "logs" / "make_a.log"):
        checked, lines = sidecars.audit([path])
        assert checked == 0 and len(lines) == 1 and lines[0].startswith(f"not an artifact: {path}:"), lines
        assert "delete" not in lines[0]
    a.with_name("stray.tsv").write_text("x\n")  # a file under results/ without a sidecar is still found
    assert sidecars.audit(["."])[1] == [
        sidecars.problem("missing sidecar", Path("results/stray.tsv"), "no provenance sidecar stray.tsv.prov.json")
    ]
