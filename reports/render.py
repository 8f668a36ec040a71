"""The HTML leakage report and ``compare``: one self-contained page per run (or per set of runs).

The page is rendered from a run directory's stored files only
(:mod:`fedaudit.reports.load`); it formats and explains numbers, it never
recomputes one. Sections, always all present, in order: notice, verdict, side by side, what crossed the wire,
reconstructions, membership, accuracy and cost over rounds, provenance;
``compare`` adds a privacy–utility scatter after "side by side".

Every run × target is one *unit* and one column of every table: a single run
has one unit, a ``target_domain=all`` run one per target (with the root's
stored means beside them), ``compare`` the units of every run given.

Rooms: this module holds the entry points, the page's assembly and the verdict, side-by-side, ledger, rounds and
provenance sections; :mod:`~fedaudit.reports.leakage_sections` the leakage, canary, DP-curve and scatter figures;
:mod:`~fedaudit.reports.attack_sections` the reconstructions and membership sections;
:mod:`~fedaudit.reports.cells` the table type and how numbers are written.

Safety: Jinja2 autoescapes everything; the only markup passed through is the
SVG matplotlib wrote (its text XML-escaped, see :mod:`fedaudit.reports.plots`).
Images are data URIs; under ``--redact`` they are blurred before encoding, so
the page never carries the sharp bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from fedaudit.audit.verdict import NOT_ASSESSED, RiskThresholds, judge_rows, load_thresholds
from fedaudit.audit.attack_families import CAVEAT, SOURCES, anonymity_evidence
from fedaudit.errors import FedauditError
from fedaudit.reports.attack_sections import image_uri, membership, reconstructions
from fedaudit.reports.cells import (Context, Table, aligned, ci_text, config_rows, f3, is_finite, p_fmt, row_anchor)
from fedaudit.reports.leakage_sections import dp_curve_section, dp_of, leakage_table, scatter_section
from fedaudit.reports.load import Run, Unit, load_run, run_config
from fedaudit.reports.run_tables import (accuracy_table, communication_table, mean_note, privacy_table,
                                         provenance_table, rounds_section, wire_table)
from fedaudit.reports.summary import dpia, family_table, first_screen
from fedaudit.run import run_directory
from fedaudit.run.audited_run import AuditedRun
from fedaudit.run.results import SCHEMA_VERSION, VerdictRow

log = logging.getLogger("fedaudit")

REPORT_NAME = "report.html"
REDACTED_REPORT_NAME = "report-redacted.html"


# -- public entry points --------------------------------------------------------


def write_report(run_dir: str | Path, out: str | Path | None = None, *, redact: bool = False,
                 thresholds: str | Path | RiskThresholds | None = None) -> Path:
    """Render ``run_dir`` into ``out`` (default ``run_dir/report.html``, or ``report-redacted.html`` with
    ``redact``: the sharp report and the run's ``images/`` stay, so a redacted copy never replaces them);
    returns the file written.

    The verdict is the one the run stored; ``thresholds`` re-judges the stored evidence with other
    thresholds (the page says so)."""
    tiers = _thresholds(thresholds)  # a bad thresholds file fails before any run is read
    run = load_run(run_dir)
    html = render([run], redact=redact, thresholds=tiers, compare=False)
    path = (Path(out).expanduser() if out is not None
            else run.run_dir / (REDACTED_REPORT_NAME if redact else REPORT_NAME))
    run_directory.write_text(path, html)
    return path


def write_compare(run_dirs: Sequence[str | Path], out: str | Path, *, redact: bool = False,
                  thresholds: str | Path | RiskThresholds | None = None) -> Path:
    """The same sections across runs side by side, plus the privacy–utility scatter."""
    tiers = _thresholds(thresholds)
    if not run_dirs:
        raise FedauditError("compare needs at least one run directory: fedaudit compare RUN_DIR... -o FILE")
    loaded = [load_run(d) for d in run_dirs]
    for what, values in comparability(loaded).items():
        log.warning("the compared runs differ in %s (%s): their numbers are not measured on the same question",
                    what, ", ".join(values))
    html = render(loaded, redact=redact, thresholds=tiers, compare=True)
    path = Path(out).expanduser()
    run_directory.write_text(path, html)
    return path


def comparability(loaded: Sequence[Run]) -> dict[str, list[str]]:
    """What the runs differ in among dataset, unseen target and profile: {field: the distinct values}."""
    out = {}
    for key, label in (("dataset", "dataset"), ("target_domain", "unseen target"), ("profile", "profile")):
        values = list(dict.fromkeys(str(run_config(r.config).get(key, r.metrics.get(key, "?"))) for r in loaded))
        if len(values) > 1:
            out[label] = values
    return out


def unscored_notes(units: Sequence[Unit]) -> list[Context]:
    """Units audited without the clients' records: why nothing is scored, what needs the data, what was left out."""
    out = []
    for u in units:
        data = u.stored.auditor_data
        if data is not None and data.status == "none":
            out.append({"label": u.label, "why": data.why or "", "needs": list(data.needs_data),
                        "left_out": [f"{k}: {v}" for k, v in data.left_out.items()]})
    return out


def render(run_list: Sequence[Run], *, redact: bool, thresholds: RiskThresholds | None, compare: bool) -> str:
    """``thresholds`` None: every unit's stored verdict; otherwise the stored evidence re-judged with them."""
    from fedaudit import __version__

    units = [u for r in run_list for u in r.units]
    _label_units(units, compare)
    shown = [verdict_rows(u, thresholds) for u in units]  # judged once per unit: the table, first screen and DPIA
    evidence = [anonymity_evidence(u.stored, rows) for u, (rows, _) in zip(units, shown)]  # as the run stored it
    summaries, reviews = ([], []) if compare else (
        [first_screen(u, rows) for u, (rows, _) in zip(units, shown)],
        [dpia(u, rows, e) for u, (rows, _), e in zip(units, shown, evidence)])  # one run's page: what a reviewer signs
    verdict, verdict_note = verdict_table(shown, thresholds)
    recon = [(u.label, reconstructions(u, redact)) for u in units]
    ctx = {
        "compare": compare,
        "redact": redact,
        "title": _title(run_list, compare),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "version": __version__,
        "runs": [{"dir": r.run_dir.name, "method": r.stored.method, "dataset": r.stored.dataset,
                  "target": r.stored.target_domain} for r in run_list],
        "labels": [u.label for u in units],
        "thresholds": _stored_thresholds(units, thresholds).describe(),
        "verdict": verdict,
        "verdict_note": verdict_note,
        "accuracy": accuracy_table(units),
        "means": [mean_note(r) for r in run_list if r.multi_target],
        "communication": communication_table(units),
        "privacy": privacy_table(units),
        "dp_curve": dp_curve_section(units) if compare else None,
        "leakage": leakage_table(units),
        "scatter": scatter_section(units) if compare else None,
        "wire": [(u.label, wire_table(u)) for u in units],
        "reconstructions": recon,
        "has_images": any(section["items"] for _, section in recon),
        "differences": comparability(run_list) if compare else {},
        "unscored": unscored_notes(units),
        "summaries": summaries,
        "dpia": reviews,
        "caveat": CAVEAT,
        "sources": SOURCES,
        "families": family_table(units, evidence) if compare else None,
        "membership": [(u.label, membership(u)) for u in units],
        "rounds": rounds_section(units),
        "provenance": provenance_table(units),
        "config": aligned(units, lambda u: config_rows(_config(u))),
    }
    return _environment().get_template("report.html.j2").render(**ctx)


def _thresholds(value: str | Path | RiskThresholds | None) -> RiskThresholds | None:
    return value if isinstance(value, RiskThresholds) or value is None else load_thresholds(value)


def _stored_thresholds(units: Sequence[Unit], given: RiskThresholds | None) -> RiskThresholds:
    """The thresholds the shown verdict used: the given ones, else those the (first) run stored."""
    if given is not None:
        return given
    for u in units:
        stored = u.stored.verdict_thresholds
        if isinstance(stored, dict):
            try:
                return RiskThresholds(**stored)
            except TypeError:
                break
    return RiskThresholds()


def _environment():
    import jinja2

    # autoescape on for every template; StrictUndefined: a renamed key fails the tests, not the reader
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["anchor"] = row_anchor
    return env


def _title(run_list: Sequence[Run], compare: bool) -> str:
    if compare:
        return f"fedaudit comparison of {len(run_list)} runs"
    m = run_list[0].stored
    return f"fedaudit leakage report: {m.method} on {m.dataset}, unseen domain {m.target_domain}"


def _label_units(units: list[Unit], compare: bool) -> None:
    any_dp = any(dp_of(u) for u in units)
    for i, u in enumerate(units, 1):
        # with DP in any run, every label says its ε: the runs may differ only in it
        dp = dp_of(u)
        value = dp.label_epsilon if dp else None  # a recorded deployment's ε is accounted, not targeted
        eps = (f" · ε {value:.3g}" if isinstance(value, (int, float)) else " · ε ?") if dp else (" · no DP" if any_dp else "")
        if compare:
            u.label = f"{i}. {u.method} · {u.dataset} · target {u.target}{eps}"
        else:
            u.label = f"target {u.target}{eps}"


# -- 1. verdict ------------------------------------------------------------------


def verdict_table(shown: Sequence[tuple[list[VerdictRow], bool]], t: RiskThresholds | None
                  ) -> tuple[list[tuple[str, str, str, list[dict | None]]], str]:
    """Rows: both questions for every shared (kind, direction) any unit declares, then the released model and the
    canary audit; each with the observer it was judged for; cells: each unit's stored verdict row (or None where
    the unit does not share that artifact), and its anchor (the evidence section links to it). And a note on where
    the verdict came from. ``shown``: each unit's
    rows and whether they were judged now (:func:`verdict_rows`)."""
    per_unit: list[dict[str, VerdictRow]] = []
    judged = 0
    for rows, rejudged in shown:
        judged += rejudged
        per_unit.append({r.row: r for r in rows})
    keys: list[str] = []
    for rows in per_unit:
        keys += [k for k in rows if k not in keys]
    table = []
    for key in keys:
        first = next(r[key] for r in per_unit if key in r)
        table.append((first.title, first.observer, row_anchor(key), [None if key not in rows else {
            "tier": tier_label(rows[key].tier), "reason": rows[key].reason, "evidence": verdict_evidence(rows[key])}
            for rows in per_unit]))
    if t is not None:
        note = "Re-judged at report time from the stored evidence with the thresholds below (--risk-thresholds)."
    elif judged:
        note = (f"{judged} run(s) stored no verdict in this version's rows (made before metrics schema {SCHEMA_VERSION}): "
                "judged at report time from their stored evidence with the default thresholds; evidence those runs "
                "did not store counts against them.")
    else:
        note = "The verdict each run stored (metrics.json → verdict), with the thresholds below."
    return table, note


def verdict_rows(u: Unit, t: RiskThresholds | None) -> tuple[list[VerdictRow], bool]:
    """The unit's verdict rows as the page shows them, and whether they were judged now: the stored rows, or the
    stored evidence re-judged (other thresholds, or a run stored before this schema's rows)."""
    # re-judged: other thresholds, a run stored before this schema's rows, or one that stored no rows
    if t is not None or not isinstance(u.metrics.get("verdict"), list) or u.schema < SCHEMA_VERSION:
        return judge_rows(AuditedRun.of_run(u.stored, str(_config(u).get("attacker") or "server")), t), True
    return u.stored.rows(), False


def verdict_evidence(row: VerdictRow, limit: int = 4) -> list[str]:
    """The tests that decided a row, one short line each, deciding ones first."""
    order = {"high": 0, "medium": 1, "low": 2}
    items = sorted(row.evidence, key=lambda e: (order.get(e.tier, 3), -(e.effect or 0.0) if is_finite(e.effect) else 0))
    out = []
    for e in items[:limit]:
        base = f" vs {e.baseline_name or '?'} {f3(e.baseline)}" if is_finite(e.baseline) else ""
        ci = f" {ci_text(e.interval)}" if e.interval else ""
        pw = "" if e.power is None else " · power reached" if e.power.reached else " · power not reached"
        out.append(f"{e.test} ({e.source}): {f3(e.value)}{ci}{base}; p {p_fmt(e.p_value)}, "
                   f"adjusted {p_fmt(e.p_adjusted)}{pw}")
    if len(items) > limit:
        out.append(f"… and {len(items) - limit} more test(s) in metrics.json → verdict")
    return out


def tier_label(tier: Any) -> str:
    return str(tier or NOT_ASSESSED).replace("_", " ")


def _config(u: Unit) -> Mapping[str, object]:
    """The run's resolved configuration: config.json's, else the one metrics.json's provenance recorded."""
    return run_config(u.config) or u.stored.provenance.config or {}


# -- formatting ---------------------------------------------------------------------------


__all__ = ["REPORT_NAME", "Table", "image_uri", "render", "write_compare", "write_report"]
