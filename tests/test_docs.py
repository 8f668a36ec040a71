"""The documentation's links hold: every relative link in the README and docs/ reaches a file and, where it
names a section (``page.md#section``, ``#section``), a heading of that page; every docs/ page is linked from the
README; and every Markdown file the code cites exists in the repository (the design notes it used to cite lived
outside it)."""

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
    """The relative link targets of ``page`` that reach no file, or name a section the page it reaches does not
    have (web addresses skipped)."""
    out = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, section = target.partition("#")
        reached = page if not file else page.parent / file
        if not reached.exists() or (section and reached.suffix == ".md" and section not in sections(reached)):
            out.append(target)
    return out


def sections(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub makes them (lower case, punctuation dropped,
    spaces to hyphens)."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def missing_citations(path: Path, root: Path = ROOT) -> list[str]:
    """The Markdown files ``path`` names that exist nowhere under ``root`` (a bare name may sit in any folder)."""
    return [name for name in sorted(set(CITED.findall(path.read_text(encoding="utf-8"))))
            if not (root / name).exists() and not any(root.glob(f"**/{name}"))]


def test_every_relative_link_in_the_readme_and_docs_reaches_a_file():
    assert len(PAGES) >= 4 and (ROOT / "docs" / "architecture.md") in PAGES
    assert {str(page.relative_to(ROOT)): broken_links(page) for page in PAGES if broken_links(page)} == {}


def test_every_docs_page_is_linked_from_the_readme():
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in LINK.findall(readme.read_text(encoding="utf-8"))
              if not re.match(r"[a-z]+:", t)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert {str(p.relative_to(ROOT)) for p in pages - linked} == set()


def test_every_markdown_file_the_code_cites_exists():
    assert len(CODE) > 100
    assert {str(path.relative_to(ROOT)): missing_citations(path) for path in CODE if missing_citations(path)} == {}


def test_the_checks_catch_a_broken_link_and_a_missing_citation(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[self](page.md) [web](https://example.org) [gone](nowhere.md) [anchor](#x) "
                    "[here](#a-title) [there](page.md#a-title) [lost](page.md#no-such-part)", encoding="utf-8")
    assert broken_links(page) == ["nowhere.md", "#x", "page.md#no-such-part"]
    code = tmp_path / "module.py"
    code.write_text('"""see ATTACKS.md, page.md and docs/attacks.md"""', encoding="utf-8")
    assert missing_citations(code, tmp_path) == ["ATTACKS.md", "docs/attacks.md"]


# The header scripts/results_page.py writes: the command (a script in the repository) and its provenance.
RESULT_HEADER = re.compile(r"^Written by `python ((?:scripts|benchmarks)/[\w.]+\.py)[^`]*` \(commit [0-9a-f]{7,}"
                           r".*?\b20\d\d-\d\d-\d\d \d\d:\d\d UTC", re.M)


def unproven_results(folder: Path) -> list[str]:
    """The pages under ``folder`` whose numbers do not carry the command and provenance that produced them: no
    ``Written by`` header with a commit and a date, or one naming a script that is not in the repository."""
    out = []
    for page in sorted(folder.glob("*.md")):
        header = RESULT_HEADER.search(page.read_text(encoding="utf-8"))
        if not header or not (ROOT / header.group(1)).exists():
            out.append(page.name)
    return out


def test_every_measured_table_carries_its_command_and_provenance():
    assert len(list((ROOT / "docs" / "results").glob("*.md"))) >= 5
    assert unproven_results(ROOT / "docs" / "results") == []


SCHEMA_STAMP = re.compile(r"\(commit [0-9a-f]{7,}[^,]*, (?:metrics schema (\d+)|(reads no run's metrics)),")


def stale_results(folder: Path) -> list[str]:
    """The pages whose runs were written under an older metrics schema than fedaudit's (or that do not say which):
    their verdict rows and the fields they read may mean something else now."""
    from fedaudit.run.results import SCHEMA_VERSION

    out = []
    for page in sorted(folder.glob("*.md")):
        stamp = SCHEMA_STAMP.search(page.read_text(encoding="utf-8"))
        if stamp is None or (stamp.group(1) is not None and int(stamp.group(1)) < SCHEMA_VERSION):
            out.append(page.name)
    return out


def test_every_results_page_was_measured_under_the_current_metrics_schema(tmp_path, monkeypatch):
    """Issue 56: pages measured under schema 2 still showed mixed-level rows and the pre-release "deployed model".
    Each page states the metrics schema of its runs (or that it reads none); an older one fails here: run its
    script again."""
    assert stale_results(ROOT / "docs" / "results") == []
    import sys

    from fedaudit.run import results

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import results_page
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    results_page.write("now", "A table", "| a |", path=tmp_path / "now.md", echo=False)
    results_page.write("none", "A table", "| a |", path=tmp_path / "none.md", echo=False, reads_runs=False)
    assert stale_results(tmp_path) == []
    monkeypatch.setattr(results, "SCHEMA_VERSION", results.SCHEMA_VERSION + 1)  # a schema bump dates the first only
    assert stale_results(tmp_path) == ["now.md"]


def test_a_results_page_written_by_the_scripts_passes_and_a_hand_edited_one_does_not(tmp_path, monkeypatch):
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import results_page
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "scripts" / "mia_table.py"), "--only", "fedavg"])
    results_page.write("table", "A table", "| a |\n|---|\n| 1 |", "What the rows are.", path=tmp_path / "table.md")
    text = (tmp_path / "table.md").read_text(encoding="utf-8")
    assert "`python scripts/mia_table.py --only fedavg`" in text and "| 1 |" in text
    (tmp_path / "edited.md").write_text("# A table\n\nMeasured last week.\n\n| a |\n|---|\n| 2 |\n", encoding="utf-8")
    (tmp_path / "gone.md").write_text(text.replace("mia_table.py", "no_such_script.py"), encoding="utf-8")
    assert unproven_results(tmp_path) == ["edited.md", "gone.md"]
