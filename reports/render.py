"""The HTML leakage report and ``compare``: one self-contained page per run (or per set of runs).

The page is rendered from a run directory's stored files only
(:mod:`fedaudit.reports.load`); it formats and explains numbers, it never
recomputes one. Sections, always all present, in order: notice, verdict, side by side, what crossed the wire,
reconstructions, membership, accuracy and cost over rounds, provenance;
``compare`` adds a privacy–utility scatter after "side by side".

Every run × target is one *unit* and one column of every table: a single run
has one unit, a ``target_domain=all`` run one per target (with the root's
stored means beside them), ``compare`` the units of every run given.

Safety: Jinja2 autoescapes everything; the only markup passed through is the
SVG matplotlib wrote (its text XML-escaped, see :mod:`fedaudit.reports.plots`).
Images are data URIs; under ``--redact`` they are blurred before encoding, so
the page never carries the sharp bytes.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.reports import plots
from fedaudit.reports.load import Run, Unit, load_run
from fedaudit.run import run_directory
from fedaudit.audit.verdict import (ARTIFACT, BOOKKEEPING, CANARY, CANARY_GRADIENT, MIA, NOT_ASSESSED, NOT_RECONSTRUCTIONS,
                                    RiskThresholds, advice, judge, load_thresholds, mia_level)

log = logging.getLogger("fedaudit")

REPORT_NAME = "report.html"
REDACTED_REPORT_NAME = "report-redacted.html"
MAX_IMAGE_SIDE = 900  # px; the stored grids are ~200×660, this only bounds a larger --image-size
REDACT_BLUR = 0.06  # Gaussian radius as a fraction of the grid's short side: a 64-px digit cell becomes a smudge
MISSING = "—"
NOT_SECTIONS = BOOKKEEPING
LEVELS = (0.001, 0.01, 0.1)
RESOLVE_PER_LEVEL = 10  # non-members per unit of FPR needed to resolve a level (docs/attacks.md: 10/FPR)


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple[str, list[str]]] = field(default_factory=list)


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
        values = list(dict.fromkeys(str((r.config.get("config") or {}).get(key, r.metrics.get(key, "?")))
                                    for r in loaded))
        if len(values) > 1:
            out[label] = values
    return out


def unscored_notes(units: Sequence[Unit]) -> list[dict[str, Any]]:
    """Units audited without the clients' records: why nothing is scored, what needs the data, what was left out."""
    out = []
    for u in units:
        data = u.metrics.get("auditor_data") or {}
        if data.get("status") == "none":
            out.append({"label": u.label, "why": str(data.get("why", "")), "needs": [str(x) for x in data.get("needs_data") or []],
                        "left_out": [f"{k}: {v}" for k, v in (data.get("left_out") or {}).items()]})
    return out


def render(run_list: Sequence[Run], *, redact: bool, thresholds: RiskThresholds | None, compare: bool) -> str:
    """``thresholds`` None: every unit's stored verdict; otherwise the stored evidence re-judged with them."""
    from fedaudit import __version__

    units = [u for r in run_list for u in r.units]
    _label_units(units, compare)
    verdict, verdict_note = verdict_table(units, thresholds)
    recon = [(u.label, reconstructions(u, redact)) for u in units]
    ctx = {
        "compare": compare,
        "redact": redact,
        "title": _title(run_list, compare),
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "version": __version__,
        "runs": [{"dir": r.run_dir.name, "method": r.metrics.get("method", "?"), "dataset": r.metrics.get("dataset", "?"),
                  "target": r.metrics.get("target_domain", "?")} for r in run_list],
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
        "membership": [(u.label, membership(u)) for u in units],
        "rounds": rounds_section(units),
        "provenance": provenance_table(units),
        "config": _aligned(units, lambda u: _config_rows(_config(u))),
    }
    return _environment().get_template("report.html.j2").render(**ctx)


def _thresholds(value: str | Path | RiskThresholds | None) -> RiskThresholds | None:
    return value if isinstance(value, RiskThresholds) or value is None else load_thresholds(value)


def _stored_thresholds(units: Sequence[Unit], given: RiskThresholds | None) -> RiskThresholds:
    """The thresholds the shown verdict used: the given ones, else those the (first) run stored."""
    if given is not None:
        return given
    for u in units:
        stored = u.metrics.get("verdict_thresholds")
        if isinstance(stored, dict):
            try:
                return RiskThresholds(**stored)
            except TypeError:
                break
    return RiskThresholds()


def _environment():
    import jinja2

    # autoescape on for every template; StrictUndefined: a renamed key fails the tests, not the reader
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                              autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _title(run_list: Sequence[Run], compare: bool) -> str:
    if compare:
        return f"fedaudit comparison of {len(run_list)} runs"
    m = run_list[0].metrics
    return f"fedaudit leakage report: {m.get('method', '?')} on {m.get('dataset', '?')}, unseen domain {m.get('target_domain', '?')}"


def _label_units(units: list[Unit], compare: bool) -> None:
    any_dp = any(_dp(u) for u in units)
    for i, u in enumerate(units, 1):
        # with DP in any run, every label says its ε: the runs may differ only in it
        dp = _dp(u) or {}
        value = dp.get("epsilon_target", dp.get("epsilon"))  # a recorded deployment's ε is accounted, not targeted
        eps = (f" · ε {value:.3g}" if isinstance(value, (int, float)) else " · ε ?") if dp else (" · no DP" if any_dp else "")
        if compare:
            u.label = f"{i}. {u.method} · {u.dataset} · target {u.target}{eps}"
        else:
            u.label = f"target {u.target}{eps}"


def _aligned(units: Sequence[Unit], cells: Callable[[Unit], list[tuple[str, str]]]) -> Table:
    """One row per label seen in any unit (first-seen order), one column per unit; absent cells say so."""
    per_unit = [dict(cells(u)) for u in units]
    order: list[str] = []
    for d in per_unit:
        order += [k for k in d if k not in order]
    return Table([u.label for u in units], [(k, [d.get(k, MISSING) for d in per_unit]) for k in order])


# -- 1. verdict ------------------------------------------------------------------


def verdict_table(units: Sequence[Unit], t: RiskThresholds | None
                  ) -> tuple[list[tuple[str, str, list[dict | None]]], str]:
    """Rows: both questions for every shared (kind, direction) any unit declares, then the released model and the
    canary audit; each with the observer it was judged for; cells: each unit's stored verdict row (or None where
    the unit does not share that artifact). And a note on where the verdict came from."""
    per_unit: list[dict[str, dict]] = []
    judged = 0
    for u in units:
        stored = u.metrics.get("verdict")
        if t is not None or not isinstance(stored, list):
            stored = judge(u.metrics, _config(u), t)
            judged += 1
        per_unit.append({r["row"]: r for r in stored if isinstance(r, dict) and "row" in r})
    keys: list[str] = []
    for rows in per_unit:
        keys += [k for k in rows if k not in keys]
    table = []
    for key in keys:
        first = next(r[key] for r in per_unit if key in r)
        table.append((first["title"], str(first.get("observer") or ""), [None if key not in rows else {"tier": tier_label(rows[key].get("tier")),
                                                             "reason": rows[key].get("reason", ""),
                                                             "evidence": verdict_evidence(rows[key])}
                              for rows in per_unit]))
    if t is not None:
        note = "Re-judged at report time from the stored evidence with the thresholds below (--risk-thresholds)."
    elif judged:
        note = (f"{judged} run(s) stored no verdict (made before verdicts were stored): judged at report time from their "
                "stored evidence with the default thresholds; evidence those runs did not store counts against them.")
    else:
        note = "The verdict each run stored (metrics.json → verdict), with the thresholds below."
    return table, note


def verdict_evidence(row: dict[str, Any], limit: int = 4) -> list[str]:
    """The tests that decided a row, one short line each, deciding ones first."""
    order = {"high": 0, "medium": 1, "low": 2}
    items = sorted((e for e in row.get("evidence") or [] if isinstance(e, dict)),
                   key=lambda e: (order.get(e.get("tier"), 3), -(e.get("effect") or 0.0) if _finite(e.get("effect")) else 0))
    out = []
    for e in items[:limit]:
        base = (f" vs {e.get('baseline_name', '?')} {_f3(e.get('baseline'))}" if _finite(e.get("baseline")) else "")
        ci = f" {_ci(e.get('interval'))}" if e.get("interval") else ""
        power = e.get("power")
        pw = "" if not isinstance(power, dict) else (" · power reached" if power.get("reached") else " · power not reached")
        out.append(f"{e.get('test')} ({e.get('source')}): {_f3(e.get('value'))}{ci}{base}; p {_pfmt(e.get('p_value'))}, "
                   f"adjusted {_pfmt(e.get('p_adjusted'))}{pw}")
    if len(items) > limit:
        out.append(f"… and {len(items) - limit} more test(s) in metrics.json → verdict")
    return out


def tier_label(tier: Any) -> str:
    return str(tier or NOT_ASSESSED).replace("_", " ")


def _config(u: Unit) -> dict[str, Any]:
    return u.config.get("config") or (u.metrics.get("provenance") or {}).get("config") or {}


# -- 2. side by side -------------------------------------------------------------------


def accuracy_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        acc = u.metrics.get("accuracy") or {}
        out = [("unseen-domain accuracy (selected round)", _f3(acc.get("unseen_domain"))),
               ("selected round (best source validation)", _text(acc.get("selected_round")))]
        final = acc.get("final_round") or {}
        if final:
            out.append(("unseen-domain accuracy at the final round", f"{_f3(final.get('unseen_domain'))} (round {_text(final.get('round'))})"))
        undeployed = acc.get("rounds_without_deployed_model")
        if undeployed:
            out.append(("rounds with no deployable model (not scored, never selected)", _rounds(undeployed)))
        val = acc.get("source_val") or {}
        out.append(("source validation accuracy, mean", _f3(val.get("mean"))))
        for domain, v in (val.get("per_domain") or {}).items():
            out.append((f"source validation accuracy, {domain}", _f3(v)))
        for k, v in (acc.get("method_specific") or {}).items():
            out.append((f"method-specific: {k}", _value(v)))
        twin = acc.get("without_canaries")
        if isinstance(twin, dict):
            change = twin.get("change_with_canaries") or {}
            out.append(("the same run without the canary audit's canaries: unseen-domain / source validation",
                        f"{_f3(twin.get('unseen_domain'))} / {_f3((twin.get('source_val') or {}).get('mean'))} (the "
                        f"canaries changed them by {_signed(change.get('unseen_domain'))} / "
                        f"{_signed(change.get('source_val_mean'))})"))
        return out

    return _aligned(units, cells)


def mean_note(run: Run) -> str:
    acc = run.metrics.get("accuracy") or {}
    n = len(run.units)
    return (f"{run.run_dir.name}: mean over its {n} targets as stored in metrics.json — unseen-domain accuracy "
            f"{_f3(acc.get('unseen_domain'))}, source validation {_f3((acc.get('source_val') or {}).get('mean'))}.")


def communication_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        c = u.metrics.get("communication") or {}
        out = [("shares (declared by the method)", ", ".join(c.get("declared") or []) or MISSING),
               ("rounds × clients", f"{_text(c.get('rounds'))} × {_text(c.get('clients'))}"),
               ("MB up per round (clients → server)", _f3(c.get("mb_up_per_round"))),
               ("MB down per round (server → clients)", _f3(c.get("mb_down_per_round"))),
               ("total up", _size(c.get("bytes_up"))),
               ("total down", _size(c.get("bytes_down")))]
        for kind, d in (c.get("by_kind") or {}).items():
            for direction, arrow in (("up", "↑"), ("down", "↓")):
                if (d or {}).get(direction):
                    out.append((f"total, {kind} {arrow}", _size(d[direction])))
        return out

    return _aligned(units, cells)


def _dp(u: Unit) -> dict[str, Any] | None:
    return (u.metrics.get("privacy") or {}).get("dp")


def privacy_table(units: Sequence[Unit]) -> Table:
    """The defense in force: DP-SGD's ε per client (the tight accountant's, RDP's beside it), and for every artifact the
    method shares whether that ε covers it — an ε says nothing about what it does not cover."""
    def cells(u: Unit) -> list[tuple[str, str]]:
        privacy = u.metrics.get("privacy")
        if privacy is None:
            return [("defense", "not recorded (a run from before fedaudit recorded defenses)")]
        dp = privacy.get("dp")
        if not dp:
            out = [("defense", "none: clients train with plain SGD; no artifact is covered by a privacy guarantee")]
        elif dp.get("recorded"):  # the deployment's own mechanism, read from its recording
            out = [("defense", f"{_text(dp.get('mechanism'))} ({_text(dp.get('source'))}): {_text(dp.get('clipping'))}, "
                               f"the server adds Gaussian noise of std {_num_text(dp.get('noise_std_on_sum'))} to the sum "
                               f"of {_text(dp.get('num_sampled_clients'))} sampled updates (noise multiplier "
                               f"{_num_text(dp.get('noise_multiplier'))}, clipping norm {_num_text(dp.get('clipping_norm'))}); "
                               f"unit: {_text(dp.get('unit'))}; neighbours: {_text(dp.get('neighbours'))}"),
                   ("ε", f"{_f3(dp.get('epsilon'))} at δ {_num_text(dp.get('delta'))} over {_text(dp.get('rounds'))} "
                         f"rounds ({_text(dp.get('accountant'))} accountant"
                         + (f"; RDP's bound {_f3(dp['epsilon_rdp'])}" if _finite(dp.get("epsilon_rdp")) else "")
                         + f"; {_text(dp.get('sampling'))})")]
            if dp.get("weaker_rounds"):
                out.append(("noise per client", _text(dp["weaker_rounds"])))
            check = dp.get("clipping_check") or {}
            if check.get("status") in ("held", "violated"):
                out.append(("clipping on the wire", f"{check['status']}: {_text(check.get('over_norm'))} of "
                                                    f"{_text(check.get('updates'))} recorded updates over the clipping "
                                                    f"norm; largest {_f3(check.get('max_ratio'))}× it ({_text(check.get('worst'))})"))
            else:
                out.append(("clipping on the wire", f"{_text(check.get('status'))}: {_text(check.get('why'))}"))
            if dp.get("claim"):
                out.append(("claim", _text(dp["claim"])))
        else:
            out = [("defense", f"DP-SGD (Opacus), target ε {_num_text(dp.get('epsilon_target'))} per client over all rounds, "
                               f"δ {_num_text(dp.get('delta'))}, clipping norm {_num_text(dp.get('max_grad_norm'))}, "
                               f"{_text(dp.get('accountant'))} accountant; unit: {_text(dp.get('unit'))}"
                               + ("; noise from torch's PRNG, not a cryptographic one" if dp.get("secure_rng") is False else ""))]
            if "trained_parameters" in dp:  # runs from before the DP recipe did not record it
                out.append(("DP-SGD recipe", f"{_text(dp.get('augmentations'))} augmented view(s) per record; trains "
                                             f"{_text(dp.get('trained'))} ({_text(dp.get('trained_parameters'))} parameters, "
                                             f"{_text(dp.get('frozen_parameters'))} frozen at their initialisation)"))
            for domain, c in (dp.get("clients") or {}).items():
                ratio = c.get("noise_to_signal")
                rdp = (f"; RDP's bound on the same noise {_f3(c['epsilon_rdp'])}" if _finite(c.get("epsilon_rdp")) else "")
                out.append((f"ε spent, {domain}", f"{_f3(c.get('epsilon_spent'))}"
                                                   + (f" by {_text(c['accountant'])}" if c.get("accountant") else "")
                                                   + f" (noise multiplier {_f3(c.get('noise_multiplier'))}, "
                                                   f"sampling rate {_f3(c.get('sample_rate'))}, {_text(c.get('steps'))} steps, "
                                                   f"{_text(c.get('records'))} records"
                                                   + (f", batch {_text(c['batch_size'])}" if "batch_size" in c else "")
                                                   + (f", {_text(c['step_factor'])}× the method's local steps"
                                                      if c.get("step_factor", 1) != 1 else "")
                                                   + (f"; noise-to-signal per step {_f3(ratio)}" if _finite(ratio) else "")
                                                   + rdp + ")"))
        for row in privacy.get("coverage") or []:
            arrow = "↑" if row.get("direction") == "up" else "↓"
            verdict = "covered" if row.get("covered") else "NOT covered"
            out.append((f"covered by ε? {_text(row.get('artifact'))} {arrow}", f"{verdict}: {_text(row.get('why'))}"))
        return out

    return _aligned(units, cells)


def _num_text(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else _text(x)


def dp_curve_section(units: Sequence[Unit]) -> dict[str, Any] | None:
    """Privacy–utility curve over the DP ε of runs that differ only in it (``--dp-sweep``): accuracy and every
    leakage metric measured in all of them, against ε (∞ = no DP, at the right); and a table with one row
    per point: the ε claimed and spent beside the canary audit's lower bound (when the run has one)."""
    eps = [(_dp(u) or {}).get("epsilon_target") for u in units]
    if len(set(eps)) < 2 or len({(u.method, u.dataset, u.target) for u in units}) != 1:
        return None
    per_unit = [_scatter_metrics(u) for u in units]
    common = [k for k in per_unit[0] if all(k in d for d in per_unit)]
    series = [(label, [_accuracy(u, key) for u in units], None)
              for label, key in (("source-val accuracy", "source_val"), ("unseen-domain accuracy", "unseen_domain"))]
    for name in common:
        controls = [d[name][1] for d in per_unit]
        series.append((name, [d[name][0] for d in per_unit],
                       controls if all(isinstance(c, (int, float)) for c in controls) else None))
    table = Table(["ε spent (accountant, max over clients)", "canary ε lower bound", "source-val accuracy",
                   "source-val at the last round (no round chosen on it)", "unseen-domain accuracy", "run"])
    for e, u in sorted(zip(eps, units), key=lambda pair: math.inf if pair[0] is None else pair[0]):
        spent = [c.get("epsilon_spent") for c in ((_dp(u) or {}).get("clients") or {}).values()]
        spent_text = "no DP" if e is None else _f3(max(spent)) if spent and all(_finite(x) for x in spent) else MISSING
        bounds = ([f"{victim}: {text}" for victim, text in _canary_bounds(u)]
                  + [f"{victim} (gradient canaries): {text}" for victim, text in _gradient_bounds(u)])
        table.rows.append((f"ε {'∞ (no DP)' if e is None else f'{e:g}'}",
                           [spent_text, "; ".join(bounds) or "no canary audit in this run (add canary to --attack)",
                            _f3(_accuracy(u, "source_val")), _f3(_last_round_source_val(u)),
                            _f3(_accuracy(u, "unseen_domain")), u.run_dir.name]))
    return {"svg": plots.epsilon_plot(eps, series, f"{units[0].method} on {units[0].dataset}: utility and leakage against ε"),
            "table": table}


def _last_round_source_val(u: Unit) -> float | None:
    """The sources' validation accuracy of the last round's model: under DP the round source-val selects is
    the best of many noisy rounds, so the curve shows both."""
    value = ((u.metrics.get("accuracy") or {}).get("final_round") or {}).get("source_val_mean")
    return float(value) if _finite(value) else None  # runs from before it was recorded


def _accuracy(u: Unit, key: str) -> float:
    value = (u.metrics.get("accuracy") or {}).get(key)
    value = value.get("mean") if isinstance(value, dict) else value
    return float(value) if _finite(value) else float("nan")


def leakage_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for attack, sec in u.leakage.items():
            if attack in NOT_RECONSTRUCTIONS or not isinstance(sec, dict):
                continue
            summary = sec.get("summary") or {}
            for key, victims in sec.items():
                if key in NOT_SECTIONS or not isinstance(victims, dict):
                    continue
                head = f"{attack} · {key}"
                s = summary.get(key) or {}
                macro = (s.get("domain_attribution") or {}).get("macro")
                if macro:
                    out.append((f"{head} · domain attribution (macro over victims)", _with_control(macro)))
                if s.get("class_fidelity"):
                    out.append((f"{head} · class fidelity (mean over victims)", _with_control(s["class_fidelity"])))
                statuses = []
                for victim, e in victims.items():
                    if not isinstance(e, dict):
                        continue
                    m = e.get("metrics")
                    if e.get("status") != "attacked" or not isinstance(m, dict):
                        statuses.append(f"{victim}: {e.get('status', 'unknown')} — {e.get('reason', 'no reason stored')}")
                        continue
                    if m.get("status") == "unavailable":
                        statuses.append(f"{victim}: not scored — {m.get('reason', 'no reason stored')}")
                        continue
                    out += [(f"{head} · {victim} · {label}", text) for label, text in _victim_metrics(e)]
                if statuses:
                    out.append((f"{head} · not attacked", "; ".join(statuses)))
            judges = sec.get("auditor") or {}
            lpips = judges.get("lpips")
            if isinstance(lpips, dict) and lpips.get("status") != "available":
                out.append((f"{attack} · LPIPS", f"{lpips.get('status', '?')}: looked for {lpips.get('looked_for', '?')}; "
                                                 f"{lpips.get('fix', '')}".strip("; ")))
            dom = judges.get("domain_classifier") or {}
            if dom:
                out.append((f"{attack} · judge: domain classifier accuracy", f"{_f3(dom.get('accuracy_on_members'))} "
                            f"on members (trained on {dom.get('trained_on', '?')})"))
            for victim, j in (judges.get("class_classifier") or {}).items():
                out.append((f"{attack} · judge: class classifier accuracy, {victim}", f"{_f3(j.get('accuracy_on_members'))} on members"))
        for variant, target, victim, e in _mia_entries(u):
            if "status" in e and "advantage" not in e:
                out.append((f"mia · {variant} · {target} · {victim}", f"{e['status']} — {e.get('reason', 'no reason stored')}"))
                continue
            level = mia_level(e, 0.01) or {}
            out.append((f"mia · {variant} · {target} · {victim}",
                        f"AUC {_f3(e.get('auc'))} · advantage {_f3(e.get('advantage'))} · "
                        f"TPR@1%FPR {_f3(level.get('tpr'))} {_ci(mia_tpr_ci(level))}"))
        out += _canary_cells(u)
        if not out:
            out.append(("leakage", "no attack ran in this run; run with --attack deepinversion, gradinv or mia"))
        return out

    return _aligned(units, cells)


def _canary_cells(u: Unit) -> list[tuple[str, str]]:
    return ([(f"canary · {victim} · ε lower bound", text) for victim, text in _canary_bounds(u)]
            + [(f"gradient canaries · {victim} · ε lower bound", text) for victim, text in _gradient_bounds(u)])


def _audits(u: Unit, section_key: str, describe: Callable[[dict[str, Any]], str]) -> list[tuple[str, str]]:
    """(victim, sentence) for each audit of a canary section: ``describe`` for a bound, else why there is none."""
    out = []
    section = u.leakage.get(section_key)
    for victim, e in (section.items() if isinstance(section, dict) else ()):
        if not isinstance(e, dict):
            continue
        if "epsilon_lower_bound" not in e:
            out.append((victim, f"{e.get('status', 'unknown')} — {e.get('reason', 'no reason stored')}"))
            continue
        conf = e.get("confidence")
        bound = (f"ε ≥ {_f3(e.get('epsilon_lower_bound'))}"
                 + (f" at {conf:.0%} confidence, δ {e.get('delta')}" if _finite(conf) else ""))
        out.append((victim, bound + _fdp_bound(e) + describe(e)))
    return out


def _fdp_bound(e: dict[str, Any]) -> str:
    """The f-DP bound beside Steinke et al.'s, and the test of the accountant's claimed curve."""
    gdp = e.get("gdp") if isinstance(e.get("gdp"), dict) else {}
    text = ""
    if _finite(gdp.get("mu_lower_bound")):
        text += (f" · f-DP bound: μ ≥ {_f3(gdp['mu_lower_bound'])} (ε ≥ {_f3(gdp.get('epsilon_if_gaussian'))} if the "
                 f"curve is Gaussian; at most μ {_f3(gdp.get('mu_max_certifiable'))} certifiable)")
    claim = e.get("claim") if isinstance(e.get("claim"), dict) else {}
    if _finite(e.get("p_claim")):
        curve = (f"μ-GDP, μ {_f3(claim.get('mu'))}" if claim.get("curve") == "gaussian" else
                 f"(ε {_f3(claim.get('epsilon'))}, δ {_text(claim.get('delta'))})")
        text += f" · test of the accountant's claim ({curve}): p {_pfmt(e['p_claim'])} (before correction across audits)"
    return text


def _gradient_bounds(u: Unit) -> list[tuple[str, str]]:
    """The white-box audit per victim: the bound with its confidence, what a mechanism spending exactly the
    accountant's ε would give the same canaries, the audit's ceiling, and the one-shot estimate (not a bound)."""
    def describe(e: dict[str, Any]) -> str:
        text = (f" · {_text(e.get('correct'))}/{_text(e.get('guesses'))} correct guesses on {_text(e.get('canaries'))} "
                f"gradient canaries over {_text(e.get('rounds'))} rounds of updates")
        spent = e.get("epsilon_spent")
        if _finite(spent):
            text += f" · accountant's ε {_f3(spent)}"
            if _finite(e.get("ideal_bound")):
                text += f" · a mechanism spending exactly that would show about ε ≥ {_f3(e['ideal_bound'])} here"
        text += f" · at most {_f3(e.get('epsilon_max_certifiable'))} certifiable"
        estimate = (e.get("estimate") or {}).get("epsilon")
        if _finite(estimate):
            text += f" · one-shot estimate (not a bound) ε ≈ {_f3(estimate)}"
        return text + (" · EXCEEDS THE CLAIM" if e.get("exceeds_claimed") else "")

    return _audits(u, CANARY_GRADIENT, describe)


def _canary_bounds(u: Unit) -> list[tuple[str, str]]:
    """The one-run audit per victim: the ε lower bound beside its power and the accountant's ε."""
    def describe(e: dict[str, Any]) -> str:
        text = (f" · {_text(e.get('correct'))}/{_text(e.get('guesses'))} correct guesses on {_text(e.get('canaries'))} "
                f"canaries ({_text(e.get('target'))}) · at most {_f3(e.get('epsilon_max_certifiable'))} certifiable")
        spent = e.get("epsilon_spent")
        text += " · no DP: nothing claimed" if spent is None else f" · accountant's ε {_f3(spent)}"
        if e.get("exceeds_claimed"):
            text += f" · EXCEEDS THE CLAIM: {_text(e.get('warning'))}"
        elif e.get("can_refute_claim") is False:
            text += " · too few canaries to test the claim"
        return text

    return _audits(u, CANARY, describe)


def _victim_metrics(e: dict[str, Any]) -> list[tuple[str, str]]:
    """One victim's scores, each beside every null that ran, then its power."""
    m = e.get("metrics") or {}
    out = []
    ident = m.get("identifiability")
    if isinstance(ident, dict):
        nulls = " · ".join(f"{name} {_f3(ident.get(key))}" for key, name in NULL_LABELS if key in ident)
        out.append(("identifiability (balanced; chance measured)",
                    f"attack {_f3(ident.get('attack'))} {_ci(ident.get('attack_ci95'))}, permutation p "
                    f"{_pfmt(ident.get('attack_p_value'))} · chance {_f3(ident.get('chance'))} · {nulls} · "
                    f"n {_text(ident.get('n'))}"))
    for key, label in (("domain_attribution", "domain attribution"), ("class_fidelity", "class fidelity"),
                       ("psnr_mean", "PSNR to nearest member, mean (dB)"), ("ssim_mean", "SSIM to nearest member, mean"),
                       ("lpips_mean", "LPIPS to nearest member, mean")):
        v = m.get(key)
        if isinstance(v, dict) and "attack" in v:
            out.append((label, _with_control(v)))
        elif isinstance(v, dict):  # e.g. LPIPS without its backbone: the status is shown once per attack
            out.append((label, str(v.get("status", "unavailable"))))
    matched = m.get("matched")  # batch inversions (gradinv): each reconstruction paired with a distinct member
    if isinstance(matched, dict) and "attack" in matched and "control" in matched:
        for key, label in (("psnr_mean", "PSNR to its Hungarian-matched member, mean (dB)"),
                           ("ssim_mean", "SSIM to its Hungarian-matched member, mean"),
                           ("psnr_best", "PSNR to its Hungarian-matched member, best (dB)")):
            out.append((label, _with_control({"attack": matched["attack"].get(key), "control": matched["control"].get(key)})))
    power = e.get("power")
    if isinstance(power, dict):
        if power.get("status") == "measured":
            sizes = []
            for k, v in (power.get("sizes") or {}).items():
                if "p_reveals" not in v:
                    continue
                parts = [f"{m.replace('_', ' ')} {_f3(v[m].get('attack'))} vs prior-only {_f3(v[m].get('prior_only'))} "
                         f"(p {_pfmt(v[m].get('p_value'))})" for m in ("domain_attribution", "class_fidelity") if m in v]
                parts.append(f"identifiability {_f3(v.get('identifiability'))} (p {_pfmt(v.get('p_value'))})")
                sizes.append(f"{k}/class ({v.get('images')} images): " + ", ".join(parts))
            verdict = "reached" if power.get("reached") else "NOT reached"
            verdict += ", record-level" if power.get("record_level") else ", not record-level"
            verdict += f" (p {_pfmt(power.get('p_value'))})"
            out.append(("power (positive control)", f"{verdict} — " + "; ".join(sizes)))
        else:
            out.append(("power (positive control)", f"{power.get('status', '?')}: {power.get('reason', '')}"))
    twin = e.get("twin")
    if isinstance(twin, dict) and twin.get("status") != "scored":
        out.append(("holdout twin", f"{twin.get('status', '?')}: {twin.get('reason', '')}"))
    return out


NULL_LABELS = (("control", "untrained control"), ("prior_only", "prior-only control"), ("twin", "holdout twin"))


def _with_control(d: dict[str, Any]) -> str:
    text = f"attack {_f3(d.get('attack'))}"
    text += "".join(f" · {name} {_f3(d.get(key))}" for key, name in NULL_LABELS if key in d)
    return text + (f" · chance {_f3(d['chance'])}" if "chance" in d else "")


# -- privacy–utility scatter (compare) ---------------------------------------------------


def scatter_section(units: Sequence[Unit]) -> dict[str, Any]:
    """One plot per leakage metric every unit has: x = the metric (and its control), y = unseen accuracy.

    Reconstruction metrics are per artifact and methods share different
    artifacts, so each unit contributes its most-leaking shared artifact (the
    highest stored attack value); the artifact is named beside its point.
    """
    per_unit = [_scatter_metrics(u) for u in units]
    common = [k for k in per_unit[0] if all(k in d for d in per_unit)] if per_unit else []
    everywhere = {k for d in per_unit for k in d}
    methods = [u.method for u in units]
    plots_out = []
    for name in common:
        pts = []
        for u, d in zip(units, per_unit):
            attack, control, where = d[name]
            label = u.method if methods.count(u.method) == 1 else f"{u.method}/{u.target}"
            pts.append((f"{label} ({where})" if where else label, attack, control,
                        float((u.metrics.get("accuracy") or {}).get("unseen_domain") or float("nan"))))
        plots_out.append({"name": name, "svg": plots.scatter_plot(name, pts, name.split(": ", 1)[-1])})
    missing = sorted(everywhere - set(common))
    why = None
    if not plots_out:
        why = ("no leakage metric was measured in every run" + (f" (measured in some only: {', '.join(missing)})" if missing else
               "; run them with --attack deepinversion, gradinv or mia"))
    return {"plots": plots_out, "why": why, "partial": missing if plots_out else []}


def _scatter_metrics(u: Unit) -> dict[str, tuple[float, float | None, str]]:
    out: dict[str, tuple[float, float | None, str]] = {}
    for attack, sec in u.leakage.items():
        if attack in NOT_RECONSTRUCTIONS or not isinstance(sec, dict):
            continue
        for key, s in (sec.get("summary") or {}).items():
            for name, d in ((f"{attack}: domain attribution (macro)", (s.get("domain_attribution") or {}).get("macro")),
                            (f"{attack}: class fidelity", s.get("class_fidelity"))):
                if isinstance(d, dict) and _finite(d.get("attack")) and (name not in out or d["attack"] > out[name][0]):
                    out[name] = (float(d["attack"]), d.get("control"), key)
    for variant, target, victim, e in _mia_entries(u):
        name = f"mia {variant} on {target}: AUC"
        if _finite(e.get("auc")) and (name not in out or e["auc"] > out[name][0]):
            out[name] = (float(e["auc"]), 0.5, victim)
    return out


def _artifact_controls(e: dict[str, Any]) -> str:
    """The artifact test's twin (must sit in the chance band) and positive control (its power), in one cell."""
    if isinstance(e.get("controls"), str):
        return e["controls"]
    parts = []
    for case, label in (("twin", "twin"), ("power", "positive control")):
        c = e.get(case)
        if not isinstance(c, dict):
            parts.append(f"{label}: not run")
        elif "auc" in c:
            parts.append(f"{label} AUC {_f3(c.get('auc'))} (KS p {_pfmt(c.get('advantage_p_value'))}"
                         + (f", {c['records']} records" if isinstance(c.get("records"), int) else "") + ")")
        else:
            parts.append(f"{label}: {c.get('status', 'not run')} — {c.get('reason', '')}")
    return " · ".join(parts)


def _mia_entries(u: Unit) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Every stored (variant, target, victim, entry) of the membership attack, bookkeeping keys skipped."""
    mia = u.leakage.get(MIA)
    if not isinstance(mia, dict):
        return []
    return [(variant, target, victim, e) for variant, by_target in mia.items()
            if variant not in BOOKKEEPING and isinstance(by_target, dict)
            for target, by_victim in by_target.items() if isinstance(by_victim, dict)
            for victim, e in by_victim.items() if isinstance(e, dict)]


# -- 3. the ledger ----------------------------------------------------------------------


def wire_table(u: Unit) -> Table | str:
    """Rounds × (kind, direction): MB and message count, from wire.jsonl."""
    if not u.wire:
        return "wire.jsonl is empty or missing: this run recorded no messages"
    cols: list[tuple[str, str]] = []
    cells: dict[tuple[int, str, str], list[int]] = {}
    for row in u.wire:
        key = (str(row.get("kind", "?")), str(row.get("direction", "?")))
        if key not in cols:
            cols.append(key)
        slot = cells.setdefault((int(row.get("round", -1)), *key), [0, 0])
        slot[0] += int(row.get("bytes", 0))
        slot[1] += 1
    table = Table([f"{k} {'↑' if d == 'up' else '↓' if d == 'down' else d}" for k, d in cols])
    for rnd in sorted({r for r, _, _ in cells}):
        row = []
        for k, d in cols:
            b = cells.get((rnd, k, d))
            row.append(f"{_size(b[0])} · {b[1]} msg" if b else MISSING)
        table.rows.append((f"round {rnd}", row))
    totals = [sum(v[0] for (r, k, d), v in cells.items() if (k, d) == col) for col in cols]
    counts = [sum(v[1] for (r, k, d), v in cells.items() if (k, d) == col) for col in cols]
    table.rows.append(("all rounds", [f"{_size(b)} · {n} msg" for b, n in zip(totals, counts)]))
    return table


# -- 4. reconstructions ------------------------------------------------------------------


def reconstructions(u: Unit, redact: bool) -> dict[str, Any]:
    items, notes = [], []
    attacks = {a: s for a, s in u.leakage.items() if a not in NOT_RECONSTRUCTIONS and isinstance(s, dict)}
    for attack, sec in attacks.items():
        for key, victims in sec.items():
            if key in NOT_SECTIONS or not isinstance(victims, dict):
                continue
            for victim, e in victims.items():
                if not isinstance(e, dict):
                    continue
                head = f"{attack} · {key} · victim {victim}"
                rel = e.get("image_grid")
                if e.get("status") != "attacked":
                    notes.append(f"{head}: {e.get('status', 'unknown')} — {e.get('reason', 'no reason stored')}")
                elif rel is None and (e.get("metrics") or {}).get("status") == "unscored":
                    notes.append(f"{head}: attacked in latent space (no images to show), not scored — "
                                 f"{e['metrics'].get('reason', 'no reason stored')}")
                elif rel is None:
                    notes.append(f"{head}: attacked in latent space (no images to show); its scores are in “Side by side”")
                elif rel not in u.images:
                    notes.append(f"{head}: the image {rel} is missing from the run directory")
                else:
                    items.append({"title": head, "uri": image_uri(u.images[rel], redact),
                                  "columns": ", ".join(e.get("grid_columns") or ["real nearest member", "reconstruction",
                                                                                 "untrained-model control"]),
                                  "scores": " · ".join(f"{label}: {text}" for label, text in _victim_metrics(e)[:2])})
    why = None
    if not attacks:
        why = "no reconstruction attack ran in this run; run with --attack deepinversion"
    elif not items:
        why = "no attack in this run produced images (see the notes below)"
    return {"items": items, "notes": notes, "why": why}


def image_uri(png: bytes, redact: bool) -> str:
    """A PNG data URI; under ``redact`` the pixels are blurred before encoding (not by CSS)."""
    from PIL import Image, ImageFilter

    img = Image.open(io.BytesIO(png)).convert("RGB")
    if max(img.size) > MAX_IMAGE_SIDE:
        img.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE), Image.Resampling.LANCZOS)
    if redact:
        radius = max(6.0, REDACT_BLUR * min(img.size))
        img = img.filter(ImageFilter.GaussianBlur(radius))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# -- 5. membership ------------------------------------------------------------------------


def membership(u: Unit) -> dict[str, Any]:
    """Per variant: a log-log ROC plot and the TPR@FPR table with intervals; gaps and warnings spelled out."""
    if not isinstance(u.leakage.get(MIA), dict) or not u.leakage[MIA]:
        return {"blocks": [], "notes": [], "why": "no membership attack in this run; run with --attack mia"}
    by_variant: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for variant, target, victim, e in _mia_entries(u):
        by_variant.setdefault(variant, []).append((target, victim, e))
    blocks, notes = [], []
    for variant, entries in by_variant.items():
        curves, missing, warnings, nonmembers = [], [], [], []
        table = Table(["AUC (chance band)", "advantage (KS p)", *(f"TPR @ {lv:g} FPR [95% CI]" for lv in LEVELS),
                       "members / non-members",
                       "controls: holdout twin · positive control" if variant == ARTIFACT else "reference models (calibration)"])
        for target, victim, e in entries:
            label = f"{target} · {victim}"
            if "status" in e and "advantage" not in e:
                notes.append(f"{variant} · {label}: {e['status']} — {e.get('reason', 'no reason stored')}")
                continue
            lacks = [k for k in ("auc", "advantage", "roc") if k not in e] + (["levels"] if mia_level(e, 0.01) is None else [])
            if lacks:
                missing.append(f"{label}: missing {', '.join(lacks)}")
            band = e.get("auc_chance_interval")
            cells = [_f3(e.get("auc")) + (f" (chance {band[0]:.3f}–{band[1]:.3f})" if _interval(band) else ""),
                     _f3(e.get("advantage")) + (f" (p {_pfmt(e['advantage_p_value'])})" if "advantage_p_value" in e else "")]
            for lv in LEVELS:
                level = mia_level(e, lv)
                if level is None:
                    cells.append("missing")
                    continue
                text = f"{_f4(level.get('tpr'))} {_ci(mia_tpr_ci(level))}"
                if not level.get("resolvable", True):
                    text += " (unresolved)"
                    warnings.append(f"Too few non-members to resolve this level: {label}, FPR {lv:g}: "
                                    + (level.get("warning") or "too few non-members"))
                cells.append(text)
            cal, ref = e.get("calibration"), e.get("reference") or {}
            refs = _text(e.get("reference_models", MISSING))
            if isinstance(cal, dict):
                refs += (f" ({cal.get('status')}: non-members {_f3(cal.get('out_gap'))} σ from the OUT models, members "
                         f"{_f3(cal.get('in_gap'))} σ from the IN models)")
                if cal.get("status") == "miscalibrated":
                    epochs = (f"; they trained {ref['epochs']} epochs, the target saw each member "
                              f"{ref['target_exposure_epochs']} times" if ref.get("epochs") and ref.get("target_exposure_epochs")
                              else "")
                    warnings.append(f"{label}: the reference models do not stand in for the target{epochs}; read this "
                                    "variant's numbers as a miscalibrated attack's "
                                    f"({advice(u.metrics, 'calibrated_references')})")
            if variant == ARTIFACT:
                refs = _artifact_controls(e)
            cells += [f"{mia_count(e, 'members')} / {mia_count(e, 'nonmembers')}", refs]
            table.rows.append((label, cells))
            roc = e.get("roc") if isinstance(e.get("roc"), dict) else {}
            if isinstance(roc.get("fpr"), list) and isinstance(roc.get("tpr"), list) and roc["fpr"]:
                curves.append((label, roc["fpr"], roc["tpr"]))
            n = mia_count(e, "nonmembers")
            if isinstance(n, int) and n > 0:
                nonmembers.append(n)
        if not table.rows:
            continue
        # the axis reaches 1e-5 only when FPR 1e-3 is itself resolvable (10/FPR = 10,000 non-members); below
        # that the curve left of 1e-3 would be a few single false positives
        xmin = 1e-5 if nonmembers and max(nonmembers) >= RESOLVE_PER_LEVEL / 1e-3 else 1e-3
        svg = plots.roc_plot(curves, xmin, f"{variant}: ROC (log-log)") if curves else None
        if not curves:
            missing.append(f"{variant}: no stored ROC curve to plot")
        blocks.append({"variant": variant, "svg": svg, "table": table, "warnings": warnings, "missing": missing})
    why = None if blocks else "the membership attack stored no scored result (see the notes)"
    return {"blocks": blocks, "notes": notes, "why": why}


# -- 6. over rounds -----------------------------------------------------------------------


def rounds_section(units: Sequence[Unit]) -> dict[str, Any]:
    with_history = [u for u in units if u.history]
    if not with_history:
        return {"acc": None, "bytes": None, "table": None, "why": "history.csv is empty or missing in every run"}
    acc, traffic = [], []
    for u in with_history:
        xs = [r.get("round") for r in u.history]
        acc.append((f"{u.label}: source validation", xs, [_num(r.get("val_mean")) for r in u.history]))
        acc.append((f"{u.label}: unseen domain", xs, [_num(r.get("target")) for r in u.history]))
        traffic.append((f"{u.label}: MB up", xs, [_mb_num(r.get("bytes_up")) for r in u.history]))
        traffic.append((f"{u.label}: MB down", xs, [_mb_num(r.get("bytes_down")) for r in u.history]))
    table = _aligned(with_history, lambda u: [(f"round {r.get('round')}", (
        f"val {_f3(r.get('val_mean'))} · unseen {_f3(r.get('target'))} · "
        f"{_size(r.get('bytes_up'))} ↑ / {_size(r.get('bytes_down'))} ↓")) for r in u.history])
    return {"acc": plots.rounds_plot(acc, "accuracy", "Accuracy per round", percent=True),
            "bytes": plots.rounds_plot(traffic, "MB", "Traffic per round"), "table": table,
            "why": None if len(with_history) == len(units) else
            "history.csv is missing in: " + ", ".join(u.label for u in units if not u.history)}


# -- 7. provenance ------------------------------------------------------------------------


def provenance_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        p = u.metrics.get("provenance") or {}
        out = [("run directory", u.run_dir.name), ("command", _text(p.get("command") or u.config.get("command"))),
               ("config hash", _text(p.get("config_hash") or u.config.get("config_hash"))),
               ("dataset fingerprint", _text(p.get("dataset_fingerprint"))),
               ("dataset files skipped (unreadable)", _text(p.get("dataset_skipped_files"))),
               ("dataset class folders without images", _text(", ".join(p.get("dataset_empty_class_folders") or [])
                                                                or ("none" if "dataset_empty_class_folders" in p else None))),
               ("thin splits", _text("; ".join(p.get("data_warnings") or []) or ("none" if "data_warnings" in p else None))),
               ("seed", _text(p.get("seed"))), ("metrics schema version", _text(u.metrics.get("schema_version")))]
        dev = p.get("device") or {}
        out.append(("device", f"{dev.get('type', '?')} · {dev.get('name', '?')} · {dev.get('threads', '?')} threads"))
        for k, v in (p.get("numerics") or {}).items():  # what the numbers depend on beyond the config (docs/gpu.md)
            out.append((f"numerics: {k}", _text(", ".join(map(str, v)) or "none" if isinstance(v, list) else v)))
        model = p.get("model")
        if isinstance(model, dict):  # the model trained or audited: fedaudit's architecture or the user's factory
            built = (f"{model['factory']}({', '.join(f'{k}={v!r}' for k, v in (model.get('args') or {}).items())}), "
                     f"defined in {model.get('module_file')} (sha256 {model.get('sha256')})" if model.get("factory") else
                     f"fedaudit's {model.get('architecture')} (norm {model.get('norm')})")
            out += [("model", _text(f"{built}; {model.get('class')}, {model.get('parameters'):,} parameters"
                                    if isinstance(model.get("parameters"), int) else built)),
                    ("classifier head (for the attacks)", _text(model.get("head_layer") or "none found"))]
        recording = p.get("recording")
        if recording:  # `fedaudit audit`: nothing was trained here; the wire is a recorded federation's
            framework = recording.get("framework") or {}
            deployed = recording.get("deployed_model") or {}
            out += [("audited recording", _text(recording.get("path"))),
                    ("recorded with", _text(f"{framework.get('name', '?')} {framework.get('version', '')}, run id "
                                            f"{recording.get('run_id')}"
                                            + (f" ({framework.get('name')} run {recording['framework_run_id']})"
                                               if recording.get("framework_run_id") is not None else ""))),
                    ("recorded nodes", _text(", ".join(f"{k} = {v}" for k, v in (recording.get("nodes") or {}).items()))),
                    ("deployed model", _text(f"the server's {deployed.get('message_type', '?')} broadcast of round "
                                             f"{deployed.get('round', '?')}"))]
        for k, v in (p.get("versions") or {}).items():
            out.append((f"version: {k}", _text(v)))
        for k, v in (p.get("seconds") or {}).items():
            out.append((f"seconds: {k}", _value(v)))
        return out

    return _aligned(units, cells)


# -- formatting ---------------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x: Any) -> float | None:
    return float(x) if _finite(x) else None


def _mb_num(x: Any) -> float | None:
    return float(x) / 1e6 if _finite(x) else None


def _f3(x: Any) -> str:
    return f"{x:.3f}" if _finite(x) else MISSING if x is None else _text(x)


def _signed(x: Any) -> str:
    return f"{x:+.3f}" if _finite(x) else MISSING if x is None else _text(x)


def _f4(x: Any) -> str:
    return f"{x:.4f}" if _finite(x) else MISSING if x is None else _text(x)


def _size(x: Any) -> str:
    """Bytes for a reader: MB to three decimals with the exact byte count beside it (so parts and totals add up
    as shown), small messages in bytes (48 bytes is not "0.000 MB")."""
    if not _finite(x):
        return MISSING
    return f"{x / 1e6:.3f} MB ({int(x):,} bytes)" if x >= 1e4 else f"{int(x)} bytes"


def _pfmt(p: Any) -> str:
    return MISSING if not _finite(p) else (f"{p:.2g}" if p >= 0.001 else "< 0.001")


def mia_tpr_ci(level: dict[str, Any]) -> Any:
    return level.get("tpr_ci95", level.get("tpr_interval"))


def mia_count(entry: dict[str, Any], what: str) -> Any:
    return entry.get(what, entry.get(f"n_{what}", "?"))


def _rounds(rounds: Any) -> str:
    """Round numbers for a reader: a run of consecutive rounds as "1–19", with how many."""
    if not isinstance(rounds, list) or not all(isinstance(r, int) for r in rounds):
        return _text(rounds)
    if not rounds:
        return "none"
    if rounds == list(range(rounds[0], rounds[0] + len(rounds))) and len(rounds) > 2:
        text = f"{rounds[0]}–{rounds[-1]}"
    else:
        text = ", ".join(map(str, rounds))
    return f"{text} ({len(rounds)} rounds)" if len(rounds) > 1 else text


def _ci(ci: Any) -> str:
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_finite(v) for v in ci):
        return f"[{ci[0]:.3f}, {ci[1]:.3f}]"
    return "[interval missing]"


def _interval(ci: Any) -> bool:
    return isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_finite(v) for v in ci)


def _text(x: Any) -> str:
    return MISSING if x is None else str(x)


def _config_rows(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The resolved config, one row per option: an attack's block as ``deepinversion.inversion_iters``."""
    rows = []
    for key, value in config.items():
        if key == "attack_options" and isinstance(value, dict):
            rows += [(f"{family}.{name}", _value(v)) for family, opts in value.items() for name, v in opts.items()]
        else:
            rows.append((key, _value(value)))
    return rows


def _value(v: Any) -> str:
    if _finite(v):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return _text(v)


__all__ = ["REPORT_NAME", "Table", "image_uri", "render", "write_compare", "write_report"]
