"""README.md stays a five-minute read that points at every docs page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_is_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the details to docs/"


def test_the_readme_links_every_docs_page_and_only_pages_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), f"docs pages the README does not link: {sorted(pages - linked)}"
    assert linked - pages == set(), f"README links pages that do not exist: {sorted(linked - pages)}"
