"""What the command prints: round progress, the results table, the verdict (each row's short form), the JSON
summary and ``fedaudit list``. Consoles are made when used, so they follow the terminal (and tests' COLUMNS)."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedaudit.errors import unknown_choice
from fedaudit.run.options import flag_of
from fedaudit.run.results import RunMetrics, VerdictRow

from .flags import shown

log = logging.getLogger("fedaudit")


# Consoles are made when used, so they follow the terminal (and tests' COLUMNS).
def console() -> Console:
    return Console()


def err_console() -> Console:
    return Console(stderr=True)


class RichReporter:
    """Round progress bars, one per target domain."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def start_target(self, target: str, rounds: int, done: int) -> None:
        if self.quiet:
            log.info("target %s: rounds %d..%d", target, done + 1, rounds)
            return
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=err_console(), transient=False)
        self.progress.start()
        self.task = self.progress.add_task(f"target {target}: rounds", total=rounds, completed=done, status="")

    def round_done(self, target: str, row: dict[str, Any]) -> None:
        def acc(x: float | None) -> str:  # None: no deployable model after this round
            return "—" if x is None else f"{x:.3f}"

        status = f"val {acc(row['val_mean'])}  unseen {acc(row['target'])}  loss {row['train_loss']:.3f}"
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, advance=1, status=status)
        else:
            log.info("target %s round %d: %s", target, row["round"], status)

    def end_target(self, target: str) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def summary_json(metrics: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    from fedaudit.audit.verdict import Headline

    report = run_dir / "report.html"
    keep = ("method", "dataset", "target_domain", "accuracy", "communication")
    headline = Headline.of(r.tier for r in RunMetrics.from_json(metrics).rows())
    return {"run_dir": str(run_dir), "report": str(report) if report.is_file() else None,
            **{k: metrics.get(k) for k in keep},
            "headline": {"words": headline.words, "decided": headline.decided, "inconclusive": headline.inconclusive,
                         "not_assessed": headline.not_assessed},
            "verdict": [{k: row.get(k) for k in ("row", "title", "question", "artifact", "observer", "tier", "short",
                                                 "reason", "target") if k in row}
                        for row in metrics.get("verdict") or []]}


# The question in a few words, its level first (records, the client's data as a whole, participation).
QUESTION_WORDS = {"inversion": "records: reconstruction", "membership": "records: membership", "dp_audit": "DP claim",
                  "consistency": "records: same model to all?",
                  "client_data": "client's data", "participation": "participation"}
OBSERVER_WORDS = {"anyone holding the released model": "model holders"}
def verdict_label(row: VerdictRow, observer: bool = True) -> str:
    """``full_model ↑ · records: membership · server``: the artifact, the question and whose view, in a few words."""
    artifact = row.artifact or row.row or "?"
    artifact = f"{artifact[:-1]} {artifact[-1]}" if artifact[-1:] in "↑↓" else artifact
    return " · ".join(x for x in (artifact, QUESTION_WORDS.get(row.question, ""),
                                  OBSERVER_WORDS.get(row.observer, row.observer) if observer else "") if x)


def print_verdict(metrics: dict[str, Any], run_dir: Path) -> None:
    """One row per judged question: the tier, what and whose view, and the fact that decided it (the row's short form,
    written from its facts; the full reason and evidence are in the report); the rows not assessed last, one line
    per reason, so the first screen stays short."""
    from fedaudit.audit.verdict import Headline

    rows = RunMetrics.from_json(metrics).rows()
    if rows:
        headline = Headline.of(row.tier for row in rows)
        console().print(f"verdict: [{TIER_COLOUR[headline.tier]}]{escape(headline.lead)}[/]{escape(headline.rest)}",
                        highlight=False)
        table = Table(title="verdict (full reasons and evidence: the report)")
        table.add_column("tier", no_wrap=True)
        table.add_column("artifact · question · observer / deciding fact", overflow="fold")
        many = len({row.target for row in rows}) > 1
        unassessed: dict[str, dict[str, list[str]]] = {}  # fact → "artifact · observer [target]" → questions
        for row in rows:
            target = f" [{row.target}]" if many and row.target else ""
            fact, tier = row.short or row.reason, row.tier
            if tier == "not_assessed":
                where = verdict_label(row, observer=False).split(" · ")[0]
                who = OBSERVER_WORDS.get(row.observer, row.observer)
                unassessed.setdefault(fact, {}).setdefault(f"{where} · {who}{target}", []).append(
                    QUESTION_WORDS.get(row.question, row.question))
                continue
            table.add_row(TIER_STYLE.get(tier, escape(tier)), f"{escape(verdict_label(row) + target)}\n[dim]{escape(fact)}[/]")
        for fact, grouped in unassessed.items():
            labels = "; ".join(f"{where.split(' · ')[0]} ({', '.join(qs)}) · {where.split(' · ', 1)[1]}"
                               for where, qs in grouped.items())
            table.add_row(TIER_STYLE["not_assessed"], f"{escape(labels)}\n[dim]{escape(fact)}[/]")
        console().print(table)
    report = run_dir / "report.html"
    if report.is_file():
        console().print(f"report: {report}", highlight=False, markup=False)


TIER_COLOUR = {"high": "bold red", "medium": "yellow", "low": "green", "inconclusive": "magenta", "not_assessed": "dim"}
TIER_STYLE = {tier: f"[{colour}]{'not assessed' if tier == 'not_assessed' else tier.upper()}[/]"
              for tier, colour in TIER_COLOUR.items()}
def print_summary(metrics: dict[str, Any], run_dir: Path) -> None:
    table = Table(title=f"{metrics['method']} on {metrics['dataset']}")
    for col in ("unseen domain", "unseen acc", "source-val acc", "selected round", "MB up", "MB down"):
        table.add_column(col, justify="left" if col == "unseen domain" else "right")
    acc, comm = metrics["accuracy"], metrics["communication"]
    if metrics["target_domain"] == "all":
        for target, a in acc["per_target"].items():
            c = comm["per_target"][target]
            table.add_row(target, f"{a['unseen_domain']:.3f}", f"{a['source_val_mean']:.3f}", str(a["selected_round"]),
                          f"{c['bytes_up'] / 1e6:.1f}", f"{c['bytes_down'] / 1e6:.1f}")
        table.add_row("[bold]mean[/]", f"[bold]{acc['unseen_domain']:.3f}[/]", f"[bold]{acc['source_val']['mean']:.3f}[/]", "",
                      f"{comm['bytes_up'] / 1e6:.1f}", f"{comm['bytes_down'] / 1e6:.1f}")
    else:
        table.add_row(metrics["target_domain"], _acc(acc["unseen_domain"]), _acc(acc["source_val"]["mean"]),
                      str(acc["selected_round"]), f"{comm['bytes_up'] / 1e6:.1f}", f"{comm['bytes_down'] / 1e6:.1f}")
    console().print(table)
    if acc.get("status") == "unscored":
        console().print(f"not scored: {acc.get('why')}", highlight=False, markup=False)
    recording = (metrics.get("provenance") or {}).get("recording")
    if isinstance(recording, dict):  # before any verdict: which model was judged, who failed to answer
        from fedaudit.reports.summary import recording_lines
        from fedaudit.run.stored import AuditedRecording

        for what, text in recording_lines(AuditedRecording.read(recording)):  # what was verified first, as on the report
            console().print(f"{what}: {text}", highlight=False, markup=False)
    print_verdict(metrics, run_dir)
    console().print(f"run directory: {run_dir}", highlight=False, markup=False)


def _acc(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def listing(what: str) -> list[dict[str, Any]]:
    """``fedaudit list WHAT --json``: one object per method, attack or dataset."""
    if what == "methods":
        from fedaudit.attacks import auto_attacks
        from fedaudit.methods import METHODS
        from fedaudit.simulation.secure_aggregation import leaves

        return [{"name": name, "summary": cls.summary, "paper": cls.paper,
                 "shares": [{"kind": k.value, "direction": d} for k, d in cls.shares],
                 "auto_attacks": {p: auto_attacks(cls.shares, p).split(",") for p in ("quick", "paper")},
                 "secure_aggregation_leaves": leaves(cls.shares, cls.clear_scalars),
                 "options": {flag_of(f"{name}_{k}"): o.default for k, o in cls.options.items()},
                 "dp": not cls.dp_incompatible, "dp_incompatible": cls.dp_incompatible or None,
                 "client_dp": not cls.client_dp_incompatible,
                 "client_dp_incompatible": cls.client_dp_incompatible or None,
                 "any_model": not cls.needs_architecture, "needs_architecture": cls.needs_architecture or None}
                for name, cls in METHODS.items()]
    if what == "attacks":
        from fedaudit.attacks import ATTACKS

        return [{"name": name, "summary": cls.summary, "roles": list(cls.roles),
                 "options": {flag_of(k): o.default for k, o in cls.options.items()}} for name, cls in ATTACKS.items()]
    if what == "datasets":
        from fedaudit.data import DATASETS

        return [{"name": name, "summary": text} for name, text in DATASETS.items()]
    raise unknown_choice("list", what, ["methods", "attacks", "datasets"])


def print_listing(what: str) -> None:
    if what == "methods":
        # One block per method: its name and shares whole at any width (what a reviewer scans this list for),
        # the rest wrapped under it.
        out = console()
        out.print("shares: ↑ client→server, ↓ server→client", highlight=False, markup=False)
        for m in listing("methods"):
            arrows = {"up": "↑", "down": "↓"}
            shares = ", ".join(f"{s['kind']}{arrows[s['direction']]}" for s in m["shares"])
            opts = ", ".join(f"{flag} {shown(v)}" for flag, v in m["options"].items()) or "-"
            dp = "yes" if m["dp"] else f"no: {m['dp_incompatible']}"
            client_dp = "yes" if m["client_dp"] else f"no: {m['client_dp_incompatible']}"
            own = "yes (--model PKG.MODULE:CALLABLE)" if m["any_model"] else f"no: needs {m['needs_architecture']}"
            left = "; ".join(f"{x['kind']}{arrows[x['direction']]} ({x['why']})"
                             for x in m["secure_aggregation_leaves"]) or "nothing (every upload is in the masked parameters)"
            out.print(f"\n{m['name']}", style="bold", highlight=False, markup=False)
            auto = ", ".join(m["auto_attacks"]["quick"]) + (
                f" (paper: {', '.join(m['auto_attacks']['paper'])})" if m["auto_attacks"]["paper"] != m["auto_attacks"]["quick"] else "")
            for label, text in (("what", f"{m['summary']} ({m['paper']})"), ("shares", shares), ("options", opts),
                                ("--attack auto", auto), ("--dp-epsilon", dp), ("--client-dp-epsilon", client_dp),
                                ("secure aggregation leaves", left), ("your own model", own)):
                lines = textwrap.wrap(text, width=max(40, out.width - 1), initial_indent=f"  {label}: ",
                                      subsequent_indent="      ", break_long_words=False, break_on_hyphens=False)
                out.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
        return
    if what == "attacks":
        from fedaudit.attacks import ATTACKS, AUTO, NO_ATTACK

        table = Table("attack", "roles", "options", "what it is")
        table.add_row(AUTO, "-", "-", "the default: the attacks that apply to what the method shares "
                                      "(`fedaudit list methods` names them per method)")
        table.add_row(NO_ATTACK, "-", "-", "no attack: accuracy and communication only")
        for name, cls in ATTACKS.items():
            opts = ", ".join(f"{flag_of(k)} {shown(o.default)}" for k, o in cls.options.items()) or "-"
            table.add_row(name, ", ".join(cls.roles), opts, cls.summary)
    elif what == "datasets":
        from fedaudit.data import DATASETS

        table = Table("dataset", "what it is")
        for name, text in DATASETS.items():
            table.add_row(name, text)
    else:
        raise unknown_choice("list", what, ["methods", "attacks", "datasets"])
    console().print(table)


def point_summary(row: dict[str, Any], root: Path) -> tuple[str, str]:
    """A finished point's unseen accuracy and its verdict's headline, read from its metrics.json."""
    from fedaudit.audit.verdict import Headline

    if row.get("status") != "complete" or not row.get("run_dir"):
        return "-", "-"
    metrics = json.loads((root / row["run_dir"] / "metrics.json").read_text())
    acc = (metrics.get("accuracy") or {}).get("unseen_domain")
    rows = RunMetrics.from_json(metrics).rows()
    return _acc(acc), Headline.of(r.tier for r in rows).words if rows else "-"


