"""The docs' cross-references hold: every repository path they name exists, and every
`page.md#anchor` (in the docs and in the code's comments) is a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = {path.name: path for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]}
CODE = [*(REPO / "fleetd").rglob("*.py"), *(REPO / "workers").rglob("*.py")]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_repository_path_the_docs_name_exists() -> None:
    pattern = re.compile(r"(?<![\w/.-])((?:fleetd|workers|bench|tests|deploy|migrations|docs)/[\w/.-]*\w)")
    missing = sorted({f"{page}: {found}" for page, path in PAGES.items()
                      for found in pattern.findall(path.read_text()) if not (REPO / found).exists()})
    assert missing == []


def test_every_anchor_is_a_heading_of_its_page() -> None:
    anchors = {page: {_slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)} for page, path in PAGES.items()}
    wrong = []
    for source in [*PAGES.values(), *CODE]:
        for match in re.finditer(r"([\w-]+\.md)#([\w-]+)|\]\(#([\w-]+)\)", source.read_text()):
            page, anchor = (match.group(1), match.group(2)) if match.group(1) else (source.name, match.group(3))
            if anchor not in anchors.get(page, ()):
                wrong.append(f"{source.relative_to(REPO)}: {page}#{anchor}")
    assert sorted(set(wrong)) == []
