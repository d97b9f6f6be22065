"""Docs that resolve: every section reference ('see docs/slurm.md "Site settings"'), in-page
anchor and repository path named in the README, docs/, configs, profiles and the Makefile points
to something that exists, and every YAML config snippet in README/docs validates against the schema."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from resdyn.pipeline import config as rc

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILES = [
    *DOCS,
    ROOT / "config.yaml",
    *sorted((ROOT / "configs").glob("*.yaml")),
    *sorted((ROOT / "profiles").glob("*/config.yaml")),
    ROOT / "Makefile",
]

#: 'README "X"', 'README.md, "X"', 'docs/slurm.md "X"', 'hub.md section "X"'
SECTION_REF = re.compile(r"\b((?:docs/)?[\w.-]+\.md|README)[,:]?\s+(?:section\s+)?\"([^\"]+)\"")
#: a repository path: a top-level folder of the project, then a file or folder name
PATH_REF = re.compile(r"(?<![\w/.~$-])((?:docs|configs|profiles|benchmarks|tests|workflow|resdyn|envs)/[\w./-]*\w)")
GENERATED = ("benchmarks/out",)  # written by runs (Snakemake's benchmark: files), not in a checkout
ANCHOR_LINK = re.compile(r"\]\(([\w./-]*\.md)?#([\w-]+)\)")


def _headings(path: Path) -> list[str]:
    return [ln.lstrip("#").strip() for ln in path.read_text().splitlines() if re.match(r"#{1,6} ", ln)]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _target(page: Path, name: str) -> Path | None:
    for base in (page.parent, ROOT, ROOT / "docs"):
        if (base / name).is_file():
            return base / name
    return ROOT / "README.md" if name == "README" else None


def section_refs(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\s*\n\s*#?\s*", " ", path.read_text())  # a reference may wrap across comment lines
    return SECTION_REF.findall(text)


def test_section_refs_finds_quoted_headings():
    page = ROOT / "x.md"
    page_text = 'GPU users: see docs/slurm.md "Installing on a GPU cluster". See README.md, "Running\n# on SLURM", for'
    found = SECTION_REF.findall(re.sub(r"\s*\n\s*#?\s*", " ", page_text))
    assert found == [("docs/slurm.md", "Installing on a GPU cluster"), ("README.md", "Running on SLURM")]
    assert _target(page, "hub.md") == ROOT / "docs" / "hub.md" and _target(page, "nope.md") is None


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_points_to_something_that_exists(path):
    broken = []
    for name, section in section_refs(path):
        target = _target(path, name)
        plain = section.replace("`", "")
        if target is None:
            broken.append(f"{name!r} (referenced with section {section!r}) does not exist")
        elif not any(h.replace("`", "").startswith(plain) for h in _headings(target)):
            broken.append(f"{target.relative_to(ROOT)} has no section {section!r}")
    for ref in PATH_REF.findall(path.read_text()):
        ref = ref.rstrip(".")
        if not (ROOT / ref).exists() and not (path.parent / ref).exists() and not ref.startswith(GENERATED):
            broken.append(f"path {ref} does not exist")
    if path.suffix == ".md":
        for name, anchor in ANCHOR_LINK.findall(path.read_text()):
            target = (path.parent / name) if name else path
            if anchor not in {_slug(h) for h in _headings(target)}:
                broken.append(f"link #{anchor} has no heading in {target.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


# --- YAML snippets ------------------------------------------------------------------------------

_SCHEMA = rc.load_schema()
_TOP = set(_SCHEMA["properties"])
_BASE = {
    "datasets": {"wikitext": {"source": "embedded"}},
    "models": {
        "m": {
            "source": "train",
            "dataset": "wikitext",
            "family": "llama",
            "n_layers": 8,
            "d_model": 32,
            "n_heads": 4,
            "d_ff": 64,
        }
    },
}


def yaml_snippets(path: Path) -> list[tuple[str, object]]:
    """(where, parsed YAML) of the config snippets of a page: fenced ```yaml blocks, inline code
    whose first key is a top-level config key (`lens: {...}`), and model entries in code blocks
    (`name: {source: hf, ...}`)."""
    text = path.read_text()
    out = [(f"{path.name} yaml block", yaml.safe_load(b)) for b in re.findall(r"```ya?ml\n(.*?)```", text, re.S)]
    for span in re.findall(r"`([a-z_]+: [^`\n]+)`", text):
        if span.split(":", 1)[0] in _TOP:
            out.append((f"{path.name} `{span}`", yaml.safe_load(span)))
    for line in re.findall(r"^ {4,}([A-Za-z0-9_]+: \{source: .*\})$", text, re.M):
        out.append((f"{path.name} `{line}`", {"models": yaml.safe_load(line)}))
    return out


def _snippet_errors(snippet: object) -> list[str]:
    if not isinstance(snippet, dict):
        return [f"not a mapping: {snippet!r}"]
    cfg = copy.deepcopy(_BASE)
    for key, value in snippet.items():
        if key == "models" and isinstance(value, dict):
            for entry in value.values():
                if isinstance(entry, dict):
                    entry.setdefault("dataset", "wikitext")
        cfg[key] = value
    return rc._schema_errors(cfg, _SCHEMA)


def test_yaml_snippets_are_found():
    found = [where for page in DOCS for where, _ in yaml_snippets(page)]
    assert any("lens: {source: tuned_lens" in w for w in found) and any("olmo3_7b" in w for w in found), found
    assert _snippet_errors({"lens": {"source": "tuned_lens", "repo": "a/b"}})  # path is required: caught


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_yaml_snippet_validates_against_the_schema(page):
    bad = {where: errs for where, snippet in yaml_snippets(page) if (errs := _snippet_errors(snippet))}
    assert not bad, bad
