"""The documentation's text for the tests that keep it equal to the code: the front page
(README.md) and the pages of the documentation site (docs/, mkdocs.yml), each read from the
file it lives in, so a check fails when its text moves without the test."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def path(name: str) -> Path:
    """``README.md`` or a page of the site by its path under docs/ (``reference/knobs.md``)."""
    return REPO / "README.md" if name == "README.md" else DOCS / name


def page(name: str) -> str:
    return path(name).read_text(encoding="utf-8")


def flat(name: str) -> str:
    """The page with every run of whitespace as one space (sentences wrapped across lines)."""
    return " ".join(page(name).split())


def site_pages() -> list:
    """Every Markdown page of the site, by its path under docs/."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
