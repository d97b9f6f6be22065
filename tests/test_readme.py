"""The README is the front door: short, and every link in it resolves inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def local_links(text: str) -> list[str]:
    """Targets of markdown links and images that are not URLs or in-page anchors."""
    return [t.split("#", 1)[0] for t in LINK.findall(text) if not re.match(r"[a-z]+://|#", t)]


def test_local_links_finds_relative_targets_only():
    text = "[a](docs/x.md) ![b](img/y.png) [c](https://example.org) [d](#top) [e](docs/z.md#part)"
    assert local_links(text) == ["docs/x.md", "img/y.png", "docs/z.md"]


def test_readme_is_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines; move details into docs/"


def test_every_link_in_readme_and_docs_resolves_inside_the_repository():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in local_links(page.read_text()):
            path = (page.parent / target).resolve()
            if not path.exists() or ROOT not in path.parents:
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
    assert "../shared" not in README.read_text()
