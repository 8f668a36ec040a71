"""The documentation's links hold: every relative link in the README and docs/ reaches a file, and every
Markdown file the code cites exists in the repository (the design notes it used to cite lived outside it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CODE = [p for folder in ("fedaudit", "methods", "attacks", "reports", "tests", "scripts", "benchmarks")
        for p in sorted((ROOT / folder).rglob("*.py")) if p.name != "test_docs.py"]  # its own examples name missing files
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]*[A-Za-z]\.md)\b")


def broken_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` that reach no file (web addresses and same-page anchors skipped)."""
    return [target for target in LINK.findall(page.read_text(encoding="utf-8"))
            if not re.match(r"[a-z]+:", target) and not target.startswith("#")
            and not (page.parent / target.split("#", 1)[0]).exists()]


def missing_citations(path: Path, root: Path = ROOT) -> list[str]:
    """The Markdown files ``path`` names that exist nowhere under ``root`` (a bare name may sit in any folder)."""
    return [name for name in sorted(set(CITED.findall(path.read_text(encoding="utf-8"))))
            if not (root / name).exists() and not any(root.glob(f"**/{name}"))]


def test_every_relative_link_in_the_readme_and_docs_reaches_a_file():
    assert len(PAGES) >= 4 and (ROOT / "docs" / "architecture.md") in PAGES
    assert {str(page.relative_to(ROOT)): broken_links(page) for page in PAGES if broken_links(page)} == {}


def test_every_markdown_file_the_code_cites_exists():
    assert len(CODE) > 100
    assert {str(path.relative_to(ROOT)): missing_citations(path) for path in CODE if missing_citations(path)} == {}


def test_the_checks_catch_a_broken_link_and_a_missing_citation(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[self](page.md) [web](https://example.org) [gone](nowhere.md) [anchor](#x)", encoding="utf-8")
    assert broken_links(page) == ["nowhere.md"]
    code = tmp_path / "module.py"
    code.write_text('"""see ATTACKS.md, page.md and docs/attacks.md"""', encoding="utf-8")
    assert missing_citations(code, tmp_path) == ["ATTACKS.md", "docs/attacks.md"]
