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
from datetime import datetime, UTC
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
from fedaudit.run.blocks import DP
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
        values = list(dict.fromkeys(str(_run_config(r).get(key, r.metrics.get(key, "?"))) for r in loaded))
        if len(values) > 1:
            out[label] = values
    return out


def unscored_notes(units: Sequence[Unit]) -> list[dict[str, Any]]:
    """Units audited without the clients' records: why nothing is scored, what needs the data, what was left out."""
    out = []
    for u in units:
        data = u.stored.auditor_data
        if data is not None and data.status == "none":
            out.append({"label": u.label, "why": str(data.why), "needs": [str(x) for x in data.needs_data],
                        "left_out": [f"{k}: {v}" for k, v in data.left_out.items()]})
    return out


def render(run_list: Sequence[Run], *, redact: bool, thresholds: RiskThresholds | None, compare: bool) -> str:
    """``thresholds`` None: every unit's stored verdict; otherwise the stored evidence re-judged with them."""
    from fedaudit import __version__

    units = [u for r in run_list for u in r.units]
    _label_units(units, compare)
    shown = [verdict_rows(u, thresholds) for u in units]  # judged once per unit: the table, first screen and DPIA
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
        "summaries": [] if compare else [first_screen(u, rows) for u, (rows, _) in zip(units, shown)],
        "dpia": [] if compare else [dpia(u, rows) for u, (rows, _) in zip(units, shown)],
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
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                              autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


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
                  ) -> tuple[list[tuple[str, str, list[dict | None]]], str]:
    """Rows: both questions for every shared (kind, direction) any unit declares, then the released model and the
    canary audit; each with the observer it was judged for; cells: each unit's stored verdict row (or None where
    the unit does not share that artifact). And a note on where the verdict came from. ``shown``: each unit's
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
    if t is not None or not isinstance(u.stored.verdict, list) or u.schema < SCHEMA_VERSION:
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
    return _run_config(u) or u.stored.provenance.config or {}


def _run_config(r: Run | Unit) -> dict[str, Any]:
    """config.json's resolved configuration (empty where the run directory has none)."""
    found = r.config["config"] if "config" in r.config else None
    return found if isinstance(found, dict) else {}


# -- 2. side by side -------------------------------------------------------------------


def accuracy_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        acc = u.stored.accuracy
        out = [("unseen-domain accuracy (selected round)", f3(acc.unseen_domain)),
               ("selected round (best source validation)", as_text(acc.selected_round))]
        final = acc.final_round
        if final:
            out.append(("unseen-domain accuracy at the final round", f"{f3(final.unseen_domain)} (round {as_text(final.round)})"))
        if acc.rounds_without_deployed_model:
            out.append(("rounds with no deployable model (not scored, never selected)",
                        rounds_text(acc.rounds_without_deployed_model)))
        out.append(("source validation accuracy, mean", f3(acc.source_val.mean)))
        for domain, v in acc.source_val.per_domain.items():
            out.append((f"source validation accuracy, {domain}", f3(v)))
        for k, v in acc.method_specific.items():
            out.append((f"method-specific: {k}", value_text(v)))
        twin = acc.without_canaries
        if twin is not None:
            change = twin.change_with_canaries
            out.append(("the same run without the canary audit's canaries: unseen-domain / source validation",
                        f"{f3(twin.unseen_domain)} / {f3(twin.source_val.mean)} (the "
                        f"canaries changed them by {signed(change.unseen_domain)} / "
                        f"{signed(change.source_val_mean)})"))
        return out

    return aligned(units, cells)


def mean_note(run: Run) -> str:
    acc = run.stored.accuracy
    n = len(run.units)
    return (f"{run.run_dir.name}: mean over its {n} targets as stored in metrics.json — unseen-domain accuracy "
            f"{f3(acc.unseen_domain)}, source validation {f3(acc.source_val.mean)}.")


def communication_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        c = u.stored.communication
        out = [("shares (declared by the method)", ", ".join(c.declared) or MISSING),
               ("rounds × clients", f"{as_text(c.rounds)} × {as_text(c.clients)}"),
               ("MB up per round (clients → server)", f3(c.mb_up_per_round)),
               ("MB down per round (server → clients)", f3(c.mb_down_per_round)),
               ("total up", size_text(c.bytes_up)),
               ("total down", size_text(c.bytes_down))]
        for kind, d in c.by_kind.items():
            for sent, arrow in ((d.up, "↑"), (d.down, "↓")):
                if sent:
                    out.append((f"total, {kind} {arrow}", size_text(sent)))
        return out

    return aligned(units, cells)


def privacy_table(units: Sequence[Unit]) -> Table:
    """The defense in force: DP-SGD's ε per client (the tight accountant's, RDP's beside it), and for every artifact the
    method shares whether that ε covers it — an ε says nothing about what it does not cover."""
    def cells(u: Unit) -> list[tuple[str, str]]:
        privacy = u.stored.privacy
        if privacy is None:
            return [("defense", "not recorded (a run from before fedaudit recorded defenses)")]
        dp = privacy.dp
        if not dp:
            out = [("defense", "none: clients train with plain SGD; no artifact is covered by a privacy guarantee")]
        elif dp.recorded:  # the deployment's own mechanism, read from its recording
            out = _recorded_dp_cells(dp)
        else:
            out = _dp_sgd_cells(dp)
        for row in privacy.coverage:
            arrow = "↑" if row.direction == "up" else "↓"
            verdict = "covered" if row.covered else "NOT covered"
            out.append((f"covered by ε? {as_text(row.artifact)} {arrow}", f"{verdict}: {as_text(row.why)}"))
        return out

    return aligned(units, cells)


def _recorded_dp_cells(dp: DP) -> list[tuple[str, str]]:
    out = [("defense", f"{as_text(dp.mechanism)} ({as_text(dp.source)}): {as_text(dp.clipping)}, "
                       f"the server adds Gaussian noise of std {num_text(dp.noise_std_on_sum)} to the sum "
                       f"of {as_text(dp.num_sampled_clients)} sampled updates (noise multiplier "
                       f"{num_text(dp.noise_multiplier)}, clipping norm {num_text(dp.clipping_norm)}); "
                       f"unit: {as_text(dp.unit)}; neighbours: {as_text(dp.neighbours)}"),
           ("ε", f"{f3(dp.epsilon)} at δ {num_text(dp.delta)} over {as_text(dp.rounds)} "
                 f"rounds ({as_text(dp.accountant)} accountant"
                 + (f"; RDP's bound {f3(dp.epsilon_rdp)}" if is_finite(dp.epsilon_rdp) else "")
                 + f"; {as_text(dp.sampling)})")]
    if dp.weaker_rounds:
        out.append(("noise per client", as_text(dp.weaker_rounds)))
    check = dp.clipping_check
    if check.status in ("held", "violated"):
        out.append(("clipping on the wire", f"{check.status}: {as_text(check.over_norm)} of "
                                            f"{as_text(check.updates)} recorded updates over the clipping "
                                            f"norm; largest {f3(check.max_ratio)}× it ({as_text(check.worst)})"))
    else:
        out.append(("clipping on the wire", f"{as_text(check.status)}: {as_text(check.why)}"))
    if dp.claim:
        out.append(("claim", as_text(dp.claim)))
    return out


def _dp_sgd_cells(dp: DP) -> list[tuple[str, str]]:
    out = [("defense", f"DP-SGD (Opacus), target ε {num_text(dp.epsilon_target)} per client over all rounds, "
                       f"δ {num_text(dp.delta)}, clipping norm {num_text(dp.max_grad_norm)}, "
                       f"{as_text(dp.accountant)} accountant; unit: {as_text(dp.unit)}"
                       + ("; noise from torch's PRNG, not a cryptographic one" if dp.secure_rng is False else ""))]
    if dp.trained_parameters is not None:  # runs from before the DP recipe did not record it
        out.append(("DP-SGD recipe", f"{as_text(dp.augmentations)} augmented view(s) per record; trains "
                                     f"{as_text(dp.trained)} ({as_text(dp.trained_parameters)} parameters, "
                                     f"{as_text(dp.frozen_parameters)} frozen at their initialisation)"))
    for domain, c in dp.clients.items():
        rdp = f"; RDP's bound on the same noise {f3(c.epsilon_rdp)}" if is_finite(c.epsilon_rdp) else ""
        out.append((f"ε spent, {domain}", f"{f3(c.epsilon_spent)}"
                                           + (f" by {as_text(c.accountant)}" if c.accountant else "")
                                           + f" (noise multiplier {f3(c.noise_multiplier)}, "
                                           f"sampling rate {f3(c.sample_rate)}, {as_text(c.steps)} steps, "
                                           f"{as_text(c.records)} records"
                                           + (f", batch {as_text(c.batch_size)}" if c.batch_size is not None else "")
                                           + (f", {as_text(c.step_factor)}× the method's local steps"
                                              if c.step_factor != 1 else "")
                                           + (f"; noise-to-signal per step {f3(c.noise_to_signal)}"
                                              if is_finite(c.noise_to_signal) else "")
                                           + rdp + ")"))
    return out


# -- privacy–utility scatter (compare) ---------------------------------------------------


# -- 3. the ledger ----------------------------------------------------------------------


def wire_table(u: Unit) -> Table | str:
    """Rounds × (kind, direction): MB and message count, from wire.jsonl."""
    if not u.wire:
        return "wire.jsonl is empty or missing: this run recorded no messages"
    cols: list[tuple[str, str]] = []
    cells: dict[tuple[int, str, str], list[int]] = {}
    for row in u.wire_rows:
        key = (str(row.kind), str(row.direction))
        if key not in cols:
            cols.append(key)
        slot = cells.setdefault((int(row.round), *key), [0, 0])
        slot[0] += int(row.bytes)
        slot[1] += 1
    table = Table([f"{k} {'↑' if d == 'up' else '↓' if d == 'down' else d}" for k, d in cols])
    for rnd in sorted({r for r, _, _ in cells}):
        row = []
        for k, d in cols:
            b = cells[(rnd, k, d)] if (rnd, k, d) in cells else None
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
        xs = [r.round for r in u.history_rows]
        acc.append((f"{u.label}: source validation", xs, [to_float(r.val_mean) for r in u.history_rows]))
        acc.append((f"{u.label}: unseen domain", xs, [to_float(r.target) for r in u.history_rows]))
        traffic.append((f"{u.label}: MB up", xs, [mb(r.bytes_up) for r in u.history_rows]))
        traffic.append((f"{u.label}: MB down", xs, [mb(r.bytes_down) for r in u.history_rows]))
    table = aligned(with_history, lambda u: [(f"round {r.round}", (
        f"val {f3(r.val_mean)} · unseen {f3(r.target)} · "
        f"{size_text(r.bytes_up)} ↑ / {size_text(r.bytes_down)} ↓")) for r in u.history_rows])
    return {"acc": plots.rounds_plot(acc, "accuracy", "Accuracy per round", percent=True),
            "bytes": plots.rounds_plot(traffic, "MB", "Traffic per round"), "table": table,
            "why": None if len(with_history) == len(units) else
            "history.csv is missing in: " + ", ".join(u.label for u in units if not u.history)}


# -- 7. provenance ------------------------------------------------------------------------


def provenance_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        p = u.stored.provenance
        config_file = u.config  # config.json: the command and hash, where metrics.json's provenance lacks them
        out = [("run directory", u.run_dir.name),
               ("command", as_text(p.command or (config_file["command"] if "command" in config_file else None))),
               ("config hash", as_text(p.config_hash
                                       or (config_file["config_hash"] if "config_hash" in config_file else None))),
               ("dataset fingerprint", as_text(p.dataset_fingerprint)),
               ("dataset files skipped (unreadable)", as_text(p.dataset_skipped_files)),
               ("dataset class folders without images", as_text(", ".join(p.dataset_empty_class_folders or [])
                                                                or ("none" if p.dataset_empty_class_folders is not None
                                                                    else None))),
               ("thin splits", as_text("; ".join(p.data_warnings or [])
                                       or ("none" if p.data_warnings is not None else None))),
               ("seed", as_text(p.seed)), ("metrics schema version", as_text(u.stored.schema_version))]
        dev = p.device
        out.append(("device", f"{dev.type} · {dev.name} · {dev.threads} threads"))
        for k, v in p.numerics.items():  # what the numbers depend on beyond the config (docs/gpu.md)
            out.append((f"numerics: {k}", as_text(", ".join(map(str, v)) or "none" if isinstance(v, list) else v)))
        model = p.model
        if model is not None:  # the model trained or audited: fedaudit's architecture or the user's factory
            built = (f"{model.factory}({', '.join(f'{k}={v!r}' for k, v in (model.args or {}).items())}), "
                     f"defined in {model.module_file} (sha256 {model.sha256})" if model.factory else
                     f"fedaudit's {model.architecture} (norm {model.norm})")
            out += [("model", as_text(f"{built}; {model.cls}, {model.parameters:,} parameters"
                                    if isinstance(model.parameters, int) else built)),
                    ("classifier head (for the attacks)", as_text(model.head_layer or "none found"))]
        recording = p.recording
        if recording:  # `fedaudit audit`: nothing was trained here; the wire is a recorded federation's
            framework = recording.framework_block
            deployed = recording.deployed_model
            out += [("audited recording", as_text(recording.path)),
                    ("recorded with", as_text(f"{framework.name} {framework.version}, run id "
                                            f"{recording.run_id}"
                                            + (f" ({framework.name} run {recording.framework_run_id})"
                                               if recording.framework_run_id is not None else ""))),
                    ("recorded nodes", as_text(", ".join(f"{k} = {v}" for k, v in recording.nodes.items()))),
                    ("recording verified", as_text(verification_text(recording.verified))),
                    ("deployed model", as_text(f"the server's {deployed.message_type} broadcast of round "
                                             f"{deployed.round}"))]
        for k, v in p.versions.items():
            out.append((f"version: {k}", as_text(v)))
        for k, v in p.seconds.items():
            out.append((f"seconds: {k}", value_text(v)))
        return out

    return aligned(units, cells)


# -- formatting ---------------------------------------------------------------------------


__all__ = ["REPORT_NAME", "Table", "image_uri", "render", "write_compare", "write_report"]
