"""Checks of the report's evidence for an anonymity assessment (issue 60), shared by the report's tests and the
secure-aggregation ones (each holds a run of its own)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from pathlib import Path

from fedaudit.audit.attack_families import CAVEAT, anonymity_evidence
from fedaudit.reports.cells import row_anchor
from fedaudit.run.results import RunMetrics
from fedaudit.run.stored.anonymity import FAMILIES, TESTED, AnonymityEvidence


def text_of(fragment: str) -> str:
    """An HTML fragment's text, as a reader sees it."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def family_table(page: str) -> dict[str, list[tuple[str, str]]]:
    """The evidence table: holder → [(family, the line's cells as HTML)], in the page's order."""
    table = page.split('<table class="families">')[1].split("</table>")[0]
    out = {}
    for group in re.split(r'<th colspan="5" scope="rowgroup">', table)[1:]:
        holder, _, rest = group.partition("</th>")
        out[holder] = re.findall(r"<tr><td>([^<]+)</td>(.*?)</tr>", rest, re.DOTALL)
    return out


def check_evidence_section(run_dir: Path) -> AnonymityEvidence:
    """For the released model and for the protocol, a line per attack family the Opinion names, in order; every
    tested line shows its fact and links to verdict rows the page holds (its deciding row among them); every other
    line says what would test it; each measure's rows are rows of the page; the caveat appears once; metrics.json
    holds the same as the page, from the stored rows. Returns the stored evidence."""
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'<tr id="([^"]+)"', page))
    metrics = RunMetrics.from_json(json.loads((run_dir / "metrics.json").read_text(encoding="utf-8")))
    evidence = metrics.anonymity_evidence
    assert isinstance(evidence, AnonymityEvidence)
    assert evidence == anonymity_evidence(metrics, metrics.rows())  # what the report shows, from the stored rows
    table = family_table(page)
    assert list(table) == [evidence.released_model.holder, evidence.protocol.holder]
    for (_, obj), lines in zip(evidence.objects(), table.values(), strict=True):
        assert [family for family, _ in lines] == list(FAMILIES.values())
        for (family, line), (_, cells) in zip(obj.lines(), lines, strict=True):
            links = re.findall(r'href="#([^"]+)"', cells)
            assert set(links) <= ids, (family, links)
            if line.status == TESTED:
                assert line.tier and line.fact and row_anchor(line.deciding_row or "") in links, line
                assert line.fact in text_of(cells)
            else:
                assert line.status in cells and line.untested and line.untested in text_of(cells), line
    assert evidence.released_model.reconstruction.status == "not tested"  # fedaudit does not invert it
    assert {row_anchor(r) for m in evidence.measures for r in m.rows} <= ids
    assert text_of(page).count(CAVEAT) == 1
    return evidence


def check_family_columns(page: str, run_dirs: Sequence[Path]) -> None:
    """``fedaudit compare``: a column per attack family, a row per run, each cell the released model's and the
    protocol's tier (or status) as the run's evidence file holds them."""
    table = page.split("By attack family (released model · protocol)")[1].split("</table>")[0]
    assert re.findall(r"<th>([^<]+)</th>", table.split("</thead>")[0]) == ["run", *FAMILIES.values()]
    rows = re.findall(r'<tr><th scope="row">([^<]+)</th>(.*?)</tr>', table, re.DOTALL)
    assert len(rows) == len(run_dirs)
    for run_dir, (_, cells) in zip(run_dirs, rows, strict=True):
        evidence = RunMetrics.from_json(json.loads((run_dir / "metrics.json").read_text())).anonymity_evidence
        assert isinstance(evidence, AnonymityEvidence)
        for family, cell in zip(FAMILIES, re.findall(r"<td>([^<]*)</td>", cells), strict=True):
            for key, obj in evidence.objects():
                line = getattr(obj, family)
                said = line.tier.replace("_", " ") if line.tier else line.status
                assert f"{key.replace('_', ' ')}: {said}" in cell, (family, cell)
