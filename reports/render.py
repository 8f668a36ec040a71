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
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedaudit.audit.verdict import NOT_ASSESSED, RiskThresholds, judge_rows, load_thresholds
from fedaudit.errors import FedauditError
from fedaudit.reports import plots
from fedaudit.reports.attack_sections import image_uri, membership, reconstructions
from fedaudit.reports.cells import (MISSING, Table, aligned, as_text, ci_text, config_rows, f3, is_finite, mb, num_text,
                                    p_fmt, rounds_text, signed, size_text, to_float, value_text)
from fedaudit.reports.leakage_sections import dp_curve_section, dp_of, leakage_table, scatter_section
from fedaudit.reports.load import Run, Unit, load_run
from fedaudit.reports.summary import dpia, first_screen, verification_text
from fedaudit.run import run_directory
from fedaudit.run.entries import AuditedRun
from fedaudit.run.results import SCHEMA_VERSION, RunMetrics, VerdictRow

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
        "summaries": [] if compare else [first_screen(u, verdict_rows(u, thresholds)[0]) for u in units],
        "dpia": [] if compare else [dpia(u, verdict_rows(u, thresholds)[0]) for u in units],
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
    any_dp = any(dp_of(u) for u in units)
    for i, u in enumerate(units, 1):
        # with DP in any run, every label says its ε: the runs may differ only in it
        dp = dp_of(u) or {}
        value = dp.get("epsilon_target", dp.get("epsilon"))  # a recorded deployment's ε is accounted, not targeted
        eps = (f" · ε {value:.3g}" if isinstance(value, (int, float)) else " · ε ?") if dp else (" · no DP" if any_dp else "")
        if compare:
            u.label = f"{i}. {u.method} · {u.dataset} · target {u.target}{eps}"
        else:
            u.label = f"target {u.target}{eps}"


# -- 1. verdict ------------------------------------------------------------------


def verdict_table(units: Sequence[Unit], t: RiskThresholds | None
                  ) -> tuple[list[tuple[str, str, list[dict | None]]], str]:
    """Rows: both questions for every shared (kind, direction) any unit declares, then the released model and the
    canary audit; each with the observer it was judged for; cells: each unit's stored verdict row (or None where
    the unit does not share that artifact). And a note on where the verdict came from."""
    per_unit: list[dict[str, VerdictRow]] = []
    judged = 0
    for u in units:
        rows, rejudged = verdict_rows(u, t)
        judged += rejudged
        per_unit.append({r.row: r for r in rows})
    keys: list[str] = []
    for rows in per_unit:
        keys += [k for k in rows if k not in keys]
    table = []
    for key in keys:
        first = next(r[key] for r in per_unit if key in r)
        table.append((first.title, first.observer, [None if key not in rows else {
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
    run = RunMetrics.from_json(u.metrics)
    if t is not None or not isinstance(u.metrics.get("verdict"), list) or u.schema < SCHEMA_VERSION:
        return judge_rows(AuditedRun.of(u.metrics, _config(u)), t), True
    return run.rows(), False


def verdict_evidence(row: VerdictRow, limit: int = 4) -> list[str]:
    """The tests that decided a row, one short line each, deciding ones first."""
    order = {"high": 0, "medium": 1, "low": 2}
    items = sorted(row.evidence, key=lambda e: (order.get(e.tier, 3), -(e.effect or 0.0) if is_finite(e.effect) else 0))
    out = []
    for e in items[:limit]:
        base = f" vs {e.baseline_name or '?'} {f3(e.baseline)}" if is_finite(e.baseline) else ""
        ci = f" {ci_text(e.interval)}" if e.interval else ""
        pw = "" if not isinstance(e.power, dict) else (" · power reached" if e.power.get("reached") else
                                                       " · power not reached")
        out.append(f"{e.test} ({e.source}): {f3(e.value)}{ci}{base}; p {p_fmt(e.p_value)}, "
                   f"adjusted {p_fmt(e.p_adjusted)}{pw}")
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
        out = [("unseen-domain accuracy (selected round)", f3(acc.get("unseen_domain"))),
               ("selected round (best source validation)", as_text(acc.get("selected_round")))]
        final = acc.get("final_round") or {}
        if final:
            out.append(("unseen-domain accuracy at the final round", f"{f3(final.get('unseen_domain'))} (round {as_text(final.get('round'))})"))
        undeployed = acc.get("rounds_without_deployed_model")
        if undeployed:
            out.append(("rounds with no deployable model (not scored, never selected)", rounds_text(undeployed)))
        val = acc.get("source_val") or {}
        out.append(("source validation accuracy, mean", f3(val.get("mean"))))
        for domain, v in (val.get("per_domain") or {}).items():
            out.append((f"source validation accuracy, {domain}", f3(v)))
        for k, v in (acc.get("method_specific") or {}).items():
            out.append((f"method-specific: {k}", value_text(v)))
        twin = acc.get("without_canaries")
        if isinstance(twin, dict):
            change = twin.get("change_with_canaries") or {}
            out.append(("the same run without the canary audit's canaries: unseen-domain / source validation",
                        f"{f3(twin.get('unseen_domain'))} / {f3((twin.get('source_val') or {}).get('mean'))} (the "
                        f"canaries changed them by {signed(change.get('unseen_domain'))} / "
                        f"{signed(change.get('source_val_mean'))})"))
        return out

    return aligned(units, cells)


def mean_note(run: Run) -> str:
    acc = run.metrics.get("accuracy") or {}
    n = len(run.units)
    return (f"{run.run_dir.name}: mean over its {n} targets as stored in metrics.json — unseen-domain accuracy "
            f"{f3(acc.get('unseen_domain'))}, source validation {f3((acc.get('source_val') or {}).get('mean'))}.")


def communication_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        c = u.metrics.get("communication") or {}
        out = [("shares (declared by the method)", ", ".join(c.get("declared") or []) or MISSING),
               ("rounds × clients", f"{as_text(c.get('rounds'))} × {as_text(c.get('clients'))}"),
               ("MB up per round (clients → server)", f3(c.get("mb_up_per_round"))),
               ("MB down per round (server → clients)", f3(c.get("mb_down_per_round"))),
               ("total up", size_text(c.get("bytes_up"))),
               ("total down", size_text(c.get("bytes_down")))]
        for kind, d in (c.get("by_kind") or {}).items():
            for direction, arrow in (("up", "↑"), ("down", "↓")):
                if (d or {}).get(direction):
                    out.append((f"total, {kind} {arrow}", size_text(d[direction])))
        return out

    return aligned(units, cells)


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
            out = [("defense", f"{as_text(dp.get('mechanism'))} ({as_text(dp.get('source'))}): {as_text(dp.get('clipping'))}, "
                               f"the server adds Gaussian noise of std {num_text(dp.get('noise_std_on_sum'))} to the sum "
                               f"of {as_text(dp.get('num_sampled_clients'))} sampled updates (noise multiplier "
                               f"{num_text(dp.get('noise_multiplier'))}, clipping norm {num_text(dp.get('clipping_norm'))}); "
                               f"unit: {as_text(dp.get('unit'))}; neighbours: {as_text(dp.get('neighbours'))}"),
                   ("ε", f"{f3(dp.get('epsilon'))} at δ {num_text(dp.get('delta'))} over {as_text(dp.get('rounds'))} "
                         f"rounds ({as_text(dp.get('accountant'))} accountant"
                         + (f"; RDP's bound {f3(dp['epsilon_rdp'])}" if is_finite(dp.get("epsilon_rdp")) else "")
                         + f"; {as_text(dp.get('sampling'))})")]
            if dp.get("weaker_rounds"):
                out.append(("noise per client", as_text(dp["weaker_rounds"])))
            check = dp.get("clipping_check") or {}
            if check.get("status") in ("held", "violated"):
                out.append(("clipping on the wire", f"{check['status']}: {as_text(check.get('over_norm'))} of "
                                                    f"{as_text(check.get('updates'))} recorded updates over the clipping "
                                                    f"norm; largest {f3(check.get('max_ratio'))}× it ({as_text(check.get('worst'))})"))
            else:
                out.append(("clipping on the wire", f"{as_text(check.get('status'))}: {as_text(check.get('why'))}"))
            if dp.get("claim"):
                out.append(("claim", as_text(dp["claim"])))
        else:
            out = [("defense", f"DP-SGD (Opacus), target ε {num_text(dp.get('epsilon_target'))} per client over all rounds, "
                               f"δ {num_text(dp.get('delta'))}, clipping norm {num_text(dp.get('max_grad_norm'))}, "
                               f"{as_text(dp.get('accountant'))} accountant; unit: {as_text(dp.get('unit'))}"
                               + ("; noise from torch's PRNG, not a cryptographic one" if dp.get("secure_rng") is False else ""))]
            if "trained_parameters" in dp:  # runs from before the DP recipe did not record it
                out.append(("DP-SGD recipe", f"{as_text(dp.get('augmentations'))} augmented view(s) per record; trains "
                                             f"{as_text(dp.get('trained'))} ({as_text(dp.get('trained_parameters'))} parameters, "
                                             f"{as_text(dp.get('frozen_parameters'))} frozen at their initialisation)"))
            for domain, c in (dp.get("clients") or {}).items():
                ratio = c.get("noise_to_signal")
                rdp = (f"; RDP's bound on the same noise {f3(c['epsilon_rdp'])}" if is_finite(c.get("epsilon_rdp")) else "")
                out.append((f"ε spent, {domain}", f"{f3(c.get('epsilon_spent'))}"
                                                   + (f" by {as_text(c['accountant'])}" if c.get("accountant") else "")
                                                   + f" (noise multiplier {f3(c.get('noise_multiplier'))}, "
                                                   f"sampling rate {f3(c.get('sample_rate'))}, {as_text(c.get('steps'))} steps, "
                                                   f"{as_text(c.get('records'))} records"
                                                   + (f", batch {as_text(c['batch_size'])}" if "batch_size" in c else "")
                                                   + (f", {as_text(c['step_factor'])}× the method's local steps"
                                                      if c.get("step_factor", 1) != 1 else "")
                                                   + (f"; noise-to-signal per step {f3(ratio)}" if is_finite(ratio) else "")
                                                   + rdp + ")"))
        for row in privacy.get("coverage") or []:
            arrow = "↑" if row.get("direction") == "up" else "↓"
            verdict = "covered" if row.get("covered") else "NOT covered"
            out.append((f"covered by ε? {as_text(row.get('artifact'))} {arrow}", f"{verdict}: {as_text(row.get('why'))}"))
        return out

    return aligned(units, cells)


# -- privacy–utility scatter (compare) ---------------------------------------------------


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
            row.append(f"{size_text(b[0])} · {b[1]} msg" if b else MISSING)
        table.rows.append((f"round {rnd}", row))
    totals = [sum(v[0] for (r, k, d), v in cells.items() if (k, d) == col) for col in cols]
    counts = [sum(v[1] for (r, k, d), v in cells.items() if (k, d) == col) for col in cols]
    table.rows.append(("all rounds", [f"{size_text(b)} · {n} msg" for b, n in zip(totals, counts)]))
    return table


# -- 4. reconstructions ------------------------------------------------------------------


# -- 5. membership ------------------------------------------------------------------------


# -- 6. over rounds -----------------------------------------------------------------------


def rounds_section(units: Sequence[Unit]) -> dict[str, Any]:
    with_history = [u for u in units if u.history]
    if not with_history:
        return {"acc": None, "bytes": None, "table": None, "why": "history.csv is empty or missing in every run"}
    acc, traffic = [], []
    for u in with_history:
        xs = [r.get("round") for r in u.history]
        acc.append((f"{u.label}: source validation", xs, [to_float(r.get("val_mean")) for r in u.history]))
        acc.append((f"{u.label}: unseen domain", xs, [to_float(r.get("target")) for r in u.history]))
        traffic.append((f"{u.label}: MB up", xs, [mb(r.get("bytes_up")) for r in u.history]))
        traffic.append((f"{u.label}: MB down", xs, [mb(r.get("bytes_down")) for r in u.history]))
    table = aligned(with_history, lambda u: [(f"round {r.get('round')}", (
        f"val {f3(r.get('val_mean'))} · unseen {f3(r.get('target'))} · "
        f"{size_text(r.get('bytes_up'))} ↑ / {size_text(r.get('bytes_down'))} ↓")) for r in u.history])
    return {"acc": plots.rounds_plot(acc, "accuracy", "Accuracy per round", percent=True),
            "bytes": plots.rounds_plot(traffic, "MB", "Traffic per round"), "table": table,
            "why": None if len(with_history) == len(units) else
            "history.csv is missing in: " + ", ".join(u.label for u in units if not u.history)}


# -- 7. provenance ------------------------------------------------------------------------


def provenance_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        p = u.metrics.get("provenance") or {}
        out = [("run directory", u.run_dir.name), ("command", as_text(p.get("command") or u.config.get("command"))),
               ("config hash", as_text(p.get("config_hash") or u.config.get("config_hash"))),
               ("dataset fingerprint", as_text(p.get("dataset_fingerprint"))),
               ("dataset files skipped (unreadable)", as_text(p.get("dataset_skipped_files"))),
               ("dataset class folders without images", as_text(", ".join(p.get("dataset_empty_class_folders") or [])
                                                                or ("none" if "dataset_empty_class_folders" in p else None))),
               ("thin splits", as_text("; ".join(p.get("data_warnings") or []) or ("none" if "data_warnings" in p else None))),
               ("seed", as_text(p.get("seed"))), ("metrics schema version", as_text(u.metrics.get("schema_version")))]
        dev = p.get("device") or {}
        out.append(("device", f"{dev.get('type', '?')} · {dev.get('name', '?')} · {dev.get('threads', '?')} threads"))
        for k, v in (p.get("numerics") or {}).items():  # what the numbers depend on beyond the config (docs/gpu.md)
            out.append((f"numerics: {k}", as_text(", ".join(map(str, v)) or "none" if isinstance(v, list) else v)))
        model = p.get("model")
        if isinstance(model, dict):  # the model trained or audited: fedaudit's architecture or the user's factory
            built = (f"{model['factory']}({', '.join(f'{k}={v!r}' for k, v in (model.get('args') or {}).items())}), "
                     f"defined in {model.get('module_file')} (sha256 {model.get('sha256')})" if model.get("factory") else
                     f"fedaudit's {model.get('architecture')} (norm {model.get('norm')})")
            out += [("model", as_text(f"{built}; {model.get('class')}, {model.get('parameters'):,} parameters"
                                    if isinstance(model.get("parameters"), int) else built)),
                    ("classifier head (for the attacks)", as_text(model.get("head_layer") or "none found"))]
        recording = p.get("recording")
        if recording:  # `fedaudit audit`: nothing was trained here; the wire is a recorded federation's
            framework = recording.get("framework") or {}
            deployed = recording.get("deployed_model") or {}
            out += [("audited recording", as_text(recording.get("path"))),
                    ("recorded with", as_text(f"{framework.get('name', '?')} {framework.get('version', '')}, run id "
                                            f"{recording.get('run_id')}"
                                            + (f" ({framework.get('name')} run {recording['framework_run_id']})"
                                               if recording.get("framework_run_id") is not None else ""))),
                    ("recorded nodes", as_text(", ".join(f"{k} = {v}" for k, v in (recording.get("nodes") or {}).items()))),
                    ("recording verified", as_text(verification_text(recording.get("verification")))),
                    ("deployed model", as_text(f"the server's {deployed.get('message_type', '?')} broadcast of round "
                                             f"{deployed.get('round', '?')}"))]
        for k, v in (p.get("versions") or {}).items():
            out.append((f"version: {k}", as_text(v)))
        for k, v in (p.get("seconds") or {}).items():
            out.append((f"seconds: {k}", value_text(v)))
        return out

    return aligned(units, cells)


# -- formatting ---------------------------------------------------------------------------


__all__ = ["REPORT_NAME", "Table", "image_uri", "render", "write_compare", "write_report"]
