"""The ``fedaudit`` command: a thin typer layer over :mod:`fedaudit.api`.

User errors print one line (``error: ...``) naming the problem and the fix
and exit with status 2; ``evaluate --fail-on TIER`` exits with status 3 when a
verdict reaches that tier; an interrupted run says how to resume it.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedaudit.errors import FedauditError, PointCrashed, unknown_choice
from fedaudit.models.factory import parse_model_args
from fedaudit.run.config import DEFAULT_SPLIT, parse_split
from fedaudit.run.options import Option, flag_of

# Consoles are made when used, so they follow the terminal (and tests' COLUMNS).
def console() -> Console:
    return Console()


def err_console() -> Console:
    return Console(stderr=True)

log = logging.getLogger("fedaudit")

USER_ERROR = 2


def fail(message: str, status: int = USER_ERROR) -> None:
    # The message may quote user text (folder and class names): escape it.
    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(status)


class RichReporter:
    """Round progress bars, one per target domain."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task = None

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
        if self.progress is not None:
            self.progress.update(self.task, advance=1, status=status)
        else:
            log.info("target %s round %d: %s", target, row["round"], status)

    def end_target(self, target: str) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def method_flags(args: list[str]) -> list[tuple[str, str]]:
    """Leftover ``--<method>-<option> VALUE`` words → ``[(method, "option=VALUE")]``.

    Every method option has its own flag (``--ccst-k 3``, ``--elcfs-fraction
    0.5``) besides the generic ``--method-option k=3``; which method a flag
    belongs to is checked once the run's method is known.
    """
    from fedaudit.methods import METHODS

    out: list[tuple[str, str]] = []
    words = list(args)
    while words:
        word = words.pop(0)
        if not word.startswith("--") or len(word) == 2:
            raise FedauditError(f"unexpected argument {word!r}; see `fedaudit evaluate --help`")
        name, eq, value = word[2:].partition("=")
        key = name.replace("-", "_")
        owner = next((m for m in sorted(METHODS, key=len, reverse=True)
                      if key.startswith(f"{m}_") and key[len(m) + 1:] in METHODS[m].options), None)
        if owner is None:
            flags = ", ".join(f"--{m}-{o}".replace("_", "-") for m, cls in METHODS.items() for o in cls.options)
            raise FedauditError(f"no such option {'--' + name!r}; see `fedaudit evaluate --help` (method options: {flags})")
        if not eq:
            if not words or (words[0].startswith("--") and len(words[0]) > 2):
                raise FedauditError(f"--{name} needs a value, e.g. --{name} VALUE")
            value = words.pop(0)
        out.append((owner, f"{key[len(owner) + 1:]}={value}"))
    return out


# -- evaluate: its flags come from the declarations (RunConfig's fields, every registered attack's options) ---

PANELS = {"run": "Run", "training": "Local training", "audit": "Attacker and auditor", "dp": "Defense: DP-SGD",
          "attack": "Attack options (declared by each attack; see `fedaudit list attacks`)"}
PANEL_OF = {
    **dict.fromkeys(("rounds", "local_epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "augment",
                     "split"), "training"),
    **dict.fromkeys(("attacker", "victim", "lpips_weights", "judge_steps"), "audit"),
    **dict.fromkeys(("dp_epsilon", "dp_delta", "dp_max_grad_norm", "dp_augmentations", "dp_noise_to_signal", "dp_max_step_factor", "dp_train", "dp_recipe", "dp_sweep"), "dp"),
}


def declared_options() -> dict[str, tuple[Option, str]]:
    """Every option ``evaluate`` takes as a flag, with its help panel: the run's own, then each registered attack's."""
    from fedaudit.attacks import attack_options
    from fedaudit.run.config import OPTIONS

    out = {name: (opt, PANEL_OF.get(name, "run")) for name, opt in OPTIONS.items()}
    for name, opt in attack_options().items():
        out.setdefault(name, (opt, "attack"))
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_help(opt: Option) -> str:
    """The declaration's help with its defaults, e.g. ``Communication rounds. (default 20; paper 40)``
    (parentheses: rich would read square brackets as markup)."""
    defaults = [f"default {_shown(opt.default)}", *(f"{p} {_shown(v)}" for p, v in opt.profiles.items())]
    choices = f" Choices: {', '.join(opt.choices)}." if opt.choices else ""
    return f"{opt.help}{choices} ({'; '.join(defaults)})"


def _parameter(name: str, opt: Option, panel: str) -> inspect.Parameter:
    flag = flag_of(name)
    if opt.kind is bool:
        info = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=option_help(opt), rich_help_panel=PANELS[panel])
        annotation: Any = Optional[bool]
    else:
        # A nullable number also takes the word `none` ("no cap"): it arrives as text and its declaration parses it.
        info = typer.Option(None, flag, help=option_help(opt), rich_help_panel=PANELS[panel],
                            metavar=opt.kind.__name__.upper() + ("|none" if opt.nullable else ""))
        annotation = Optional[str] if opt.nullable and opt.kind is not str else Optional[opt.kind]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


# Options of the command itself, not of a run.
COMMAND_PARAMETERS = [
    ("split", Optional[str], typer.Option(None, help="train,val,holdout fractions of each source domain (default "
                                          f"{','.join(f'{f:g}' for f in DEFAULT_SPLIT)}).",
                                          rich_help_panel=PANELS["training"])),
    ("dp_sweep", Optional[str], typer.Option(None, help="Run once per DP-SGD ε, e.g. 1,8,inf (inf: no DP), and write "
                                             "sweep.html with the privacy–utility curve.", rich_help_panel=PANELS["dp"])),
    ("method_option", Optional[list[str]], typer.Option(
        None, help="Method-specific NAME=VALUE (repeatable); each also has its own flag --<method>-<name> VALUE, "
                   "e.g. --ccst-style single --ccst-k 3 (see `fedaudit list methods`).")),
    ("model_arg", Optional[list[str]], typer.Option(
        None, help="KEY=VALUE keyword argument of a --model factory (repeatable; VALUE a JSON scalar or a word).",
        rich_help_panel=PANELS["run"])),
    ("config", Optional[Path], typer.Option(None, help="TOML file of options (keys are the option names); explicit "
                                            "options win.")),
    ("resume", Optional[Path], typer.Option(None, help="Continue an interrupted run directory from its last round.")),
    ("quiet", bool, typer.Option(False, "--quiet", help="Log lines only: no progress bars, no tables.")),
    ("json_summary", bool, typer.Option(False, "--json", help="Print the metrics summary (accuracy, traffic, verdict, "
                                        "paths) as JSON on stdout, for scripts; logs stay on stderr.")),
    ("fail_on", Optional[str], typer.Option(None, "--fail-on", metavar="high|medium",
                                            help="Exit with status 3 when any verdict row reaches this tier, after "
                                                 "every file is written (a CI gate; status 2 stays for user errors).")),
]

GATE_EXIT = 3  # --fail-on: a verdict reached the tier (2 is a user error, 1 a crash)
CRASH_EXIT = 1  # what an uncaught exception gives; also a DP-sweep point's crash, said in one line
SWEEP_FAILED_EXIT = 4  # fedaudit sweep: every point ran, and some failed (each with its one-line error)
GATE_TIERS = ("high", "medium")


def evaluate_signature() -> inspect.Signature:
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    params += [_parameter(name, opt, panel) for name, (opt, panel) in declared_options().items()]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
               for name, annotation, info in COMMAND_PARAMETERS]
    return inspect.Signature(params)


def parsed_options(given: dict[str, Any], fail_on: str | None) -> dict[str, Any]:
    """The declared options given as flags, each parsed by its declaration (``none`` for a nullable number);
    ``--fail-on`` checked first, so a typo fails before any work."""
    if fail_on is not None and fail_on not in GATE_TIERS:
        raise unknown_choice("--fail-on tier", fail_on, list(GATE_TIERS))
    declared = declared_options()
    return {name: declared[name][0].parse(name, value) if isinstance(value, str) and declared[name][0].kind
            is not str else value for name, value in given.items()}


def evaluate(ctx: typer.Context, **given: Any) -> None:
    """Train a method in a leave-one-domain-out federation, record its wire, attack it, write a run directory."""
    from fedaudit import api
    from fedaudit.sweeps.dp_sweep import is_sweep, parse_epsilons, sweep_dp

    quiet, split, dp_sweep = given.pop("quiet"), given.pop("split"), given.pop("dp_sweep")
    json_summary, fail_on = given.pop("json_summary"), given.pop("fail_on")
    method_option, config, resume, method = given.pop("method_option"), given.pop("config"), given.pop("resume"), given.pop("method")
    model_arg = given.pop("model_arg")
    _setup_logging(quiet)
    try:
        options = parsed_options(given, fail_on)
        options["split"] = parse_split(split)
        if model_arg:
            options["model_args"] = parse_model_args(model_arg)
        flags = method_flags(ctx.args)
        if dp_sweep is not None or (resume is not None and is_sweep(resume)):
            swept = sweep_dp(None if dp_sweep is None else parse_epsilons(dp_sweep), method, resume=resume,
                                   config=config, method_option=method_option, method_flags=flags,
                                   reporter=RichReporter(quiet or json_summary), command=api.command_line(), **options)
            show_results(list(zip(swept.metrics, swept.run_dirs)), quiet, json_summary,
                         extra={"sweep": str(swept.root), "sweep_report": str(swept.report)})
            gate(swept.metrics, fail_on)
            return
        result = api.evaluate(method, config=config, resume=resume, method_option=method_option, method_flags=flags,
                              reporter=RichReporter(quiet or json_summary), command=api.command_line(), **options)
    except FedauditError as exc:
        fail(str(exc))
    except PointCrashed as exc:  # a DP-sweep point crashed: its traceback is in its error.txt
        fail(str(exc), CRASH_EXIT)
    except KeyboardInterrupt:
        err_console().print("interrupted; finished rounds are saved — continue with `fedaudit evaluate --resume "
                            "RUN_DIR` (a run stopped before its first round leaves no directory: start it again)",
                            highlight=False, markup=False)
        raise typer.Exit(130) from None
    show_results([(result.metrics, result.run_dir)], quiet, json_summary)
    gate([result.metrics], fail_on)


def audit_signature() -> inspect.Signature:
    """``fedaudit audit RECORDING``: who attacks, the architecture override, where it runs, and every attack option."""
    from fedaudit.interop.audit_recording import AUDIT_OPTIONS

    params = [inspect.Parameter("recording", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Path,
                                default=typer.Argument(..., help="A recording directory (written by fedaudit's Recorder, "
                                                                 "or fedaudit.interop.flower's recording mod and RecordingGrid)."))]
    params += [_parameter(name, opt, panel) for name, (opt, panel) in declared_options().items()
               if name in AUDIT_OPTIONS or panel == "attack"]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
               for name, annotation, info in COMMAND_PARAMETERS if name in ("model_arg", "quiet", "json_summary", "fail_on")]
    return inspect.Signature(params)


def audit(recording: Path, **given: Any) -> None:
    """Attack a recorded federation (e.g. a Flower run) as evaluate attacks its own: same controls, verdict and report.

    RECORDING is a directory written by fedaudit's Recorder (any training loop) or fedaudit.interop.flower's recording mod
    and RecordingGrid. A recording may name its model's factory; fedaudit imports it only when you pass --model.
    """
    from fedaudit import api

    quiet, json_summary, fail_on = given.pop("quiet"), given.pop("json_summary"), given.pop("fail_on")
    model_arg = given.pop("model_arg")
    _setup_logging(quiet)
    try:
        options = parsed_options(given, fail_on)
        if model_arg:
            options["model_args"] = parse_model_args(model_arg)
        run_dir, metrics = api.audit_recording(recording, command=api.command_line(), **options)
    except FedauditError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err_console().print("interrupted; an unfinished audit leaves no directory: run it again", highlight=False,
                            markup=False)
        raise typer.Exit(130) from None
    show_results([(metrics, run_dir)], quiet, json_summary)
    gate([metrics], fail_on)


def show_results(runs: list[tuple[dict[str, Any], Path]], quiet: bool, json_summary: bool,
                 extra: dict[str, Any] | None = None) -> None:
    """What a finished evaluate prints: tables (default), JSON (--json), or nothing but log lines (--quiet)."""
    if json_summary:
        summaries = [summary_json(m, d) for m, d in runs]
        out: Any = summaries[0] if len(summaries) == 1 and not extra else {"runs": summaries, **(extra or {})}
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return
    for metrics, run_dir in runs:
        if quiet:
            log.info("run directory: %s", run_dir)
            continue
        print_summary(metrics, run_dir)
    if extra and not quiet:
        console().print("\n".join(f"{k.replace('_', ' ')}: {v}" for k, v in extra.items()), highlight=False, markup=False)


def gate(all_metrics: list[dict[str, Any]], fail_on: str | None) -> None:
    """--fail-on: exit with GATE_EXIT when a verdict row of any run reaches the tier (files are all written)."""
    if fail_on is None:
        return
    from fedaudit.audit.verdict import TIER_ORDER

    blind = [m for m in all_metrics if (m.get("auditor_data") or {}).get("status") == "none"]
    if blind:  # fail closed: a gate must not pass what it could not see
        err_console().print(f"--fail-on {fail_on}: nothing was assessed ({blind[0]['auditor_data'].get('why')}); a "
                            "gate cannot pass such an audit — give the auditor the clients' records",
                            highlight=False, markup=False)
        raise typer.Exit(GATE_EXIT)
    hits = [row for m in all_metrics for row in m.get("verdict") or [] if TIER_ORDER.get(row.get("tier"), -1) >= TIER_ORDER[fail_on]]
    if hits:
        err_console().print(f"--fail-on {fail_on}: {len(hits)} verdict row(s) reached it, e.g. "
                            f"{hits[0].get('title', hits[0].get('row'))}: {hits[0]['tier'].upper()}",
                            highlight=False, markup=False)
        raise typer.Exit(GATE_EXIT)


def summary_json(metrics: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    report = run_dir / "report.html"
    keep = ("method", "dataset", "target_domain", "accuracy", "communication")
    return {"run_dir": str(run_dir), "report": str(report) if report.is_file() else None,
            **{k: metrics.get(k) for k in keep},
            "verdict": [{k: row.get(k) for k in ("row", "title", "question", "artifact", "observer", "tier", "short",
                                                 "reason", "target") if k in row}
                        for row in metrics.get("verdict") or []]}


QUESTION_WORDS = {"inversion": "inversion", "membership": "membership", "dp_audit": "DP claim"}
OBSERVER_WORDS = {"anyone holding the released model": "model holders"}


def verdict_label(row: dict[str, Any]) -> str:
    """``full_model ↑ · membership · server``: the artifact, the question and whose view, in a few words."""
    artifact = str(row.get("artifact") or row.get("row") or "?")
    artifact = f"{artifact[:-1]} {artifact[-1]}" if artifact[-1:] in "↑↓" else artifact
    observer = str(row.get("observer") or "")
    return " · ".join(x for x in (artifact, QUESTION_WORDS.get(str(row.get("question")), ""),
                                  OBSERVER_WORDS.get(observer, observer)) if x)


def print_verdict(metrics: dict[str, Any], run_dir: Path) -> None:
    """One row per question: the tier, what and whose view, and the fact that decided it (the row's short form, written
    from its facts; the full reason and evidence are in the report)."""
    rows = metrics.get("verdict") or []
    if rows:
        table = Table(title="verdict (full reasons and evidence: the report)")
        table.add_column("tier", no_wrap=True)
        table.add_column("artifact · question · observer / deciding fact", overflow="fold")
        many = len({row.get("target") for row in rows}) > 1
        for row in rows:
            label = verdict_label(row) + (f" [{row['target']}]" if many and row.get("target") else "")
            fact = str(row.get("short") or row.get("reason", ""))
            tier = str(row.get("tier", "?"))
            table.add_row(TIER_STYLE.get(tier, escape(tier)), f"{escape(label)}\n[dim]{escape(fact)}[/]")
        console().print(table)
    report = run_dir / "report.html"
    if report.is_file():
        console().print(f"report: {report}", highlight=False, markup=False)


TIER_STYLE = {"high": "[bold red]HIGH[/]", "medium": "[yellow]MEDIUM[/]", "low": "[green]LOW[/]",
              "inconclusive": "[magenta]INCONCLUSIVE[/]", "not_assessed": "[dim]not assessed[/]"}


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
    print_verdict(metrics, run_dir)
    console().print(f"run directory: {run_dir}", highlight=False, markup=False)


def _acc(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def list_(what: str = typer.Argument(..., help="methods, attacks or datasets"),
          as_json: bool = typer.Option(False, "--json", help="Print JSON, for scripts.")) -> None:
    """List methods (with what each shares), attacks, or datasets.

    WHAT is methods, attacks or datasets.
    """
    try:
        if as_json:
            sys.stdout.write(json.dumps(listing(what), indent=1) + "\n")
        else:
            _list(what)
    except FedauditError as exc:
        fail(str(exc))


def listing(what: str) -> list[dict[str, Any]]:
    """``fedaudit list WHAT --json``: one object per method, attack or dataset."""
    if what == "methods":
        from fedaudit.attacks import auto_attacks
        from fedaudit.methods import METHODS

        return [{"name": name, "summary": cls.summary, "paper": cls.paper,
                 "shares": [{"kind": k.value, "direction": d} for k, d in cls.shares],
                 "auto_attacks": {p: auto_attacks(cls.shares, p).split(",") for p in ("quick", "paper")},
                 "options": {flag_of(f"{name}_{k}"): v for k, v in cls.options.items()},
                 "dp": not cls.dp_incompatible, "dp_incompatible": cls.dp_incompatible or None,
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


def _list(what: str) -> None:
    if what == "methods":
        # One block per method: its name and shares whole at any width (what a reviewer scans this list for),
        # the rest wrapped under it.
        out = console()
        out.print("shares: ↑ client→server, ↓ server→client", highlight=False, markup=False)
        for m in listing("methods"):
            arrows = {"up": "↑", "down": "↓"}
            shares = ", ".join(f"{s['kind']}{arrows[s['direction']]}" for s in m["shares"])
            opts = ", ".join(f"{flag} {_shown(v)}" for flag, v in m["options"].items()) or "-"
            dp = "yes" if m["dp"] else f"no: {m['dp_incompatible']}"
            own = "yes (--model PKG.MODULE:CALLABLE)" if m["any_model"] else f"no: needs {m['needs_architecture']}"
            out.print(f"\n{m['name']}", style="bold", highlight=False, markup=False)
            auto = ", ".join(m["auto_attacks"]["quick"]) + (
                f" (paper: {', '.join(m['auto_attacks']['paper'])})" if m["auto_attacks"]["paper"] != m["auto_attacks"]["quick"] else "")
            for label, text in (("what", f"{m['summary']} ({m['paper']})"), ("shares", shares), ("options", opts),
                                ("--attack auto", auto), ("--dp-epsilon", dp), ("your own model", own)):
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
            opts = ", ".join(f"{flag_of(k)} {_shown(o.default)}" for k, o in cls.options.items()) or "-"
            table.add_row(name, ", ".join(cls.roles), opts, cls.summary)
    elif what == "datasets":
        from fedaudit.data import DATASETS

        table = Table("dataset", "what it is")
        for name, text in DATASETS.items():
            table.add_row(name, text)
    else:
        raise unknown_choice("list", what, ["methods", "attacks", "datasets"])
    console().print(table)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (tests swap it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _setup_logging(quiet: bool) -> None:
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


def report(
    run_dir: Path = typer.Argument(..., help="A finished run directory (written by `fedaudit evaluate`)."),
    redact: bool = typer.Option(False, "--redact", help="Write a redacted copy, report-redacted.html (or -o), every embedded reconstruction blurred; the sharp report stays."),
    risk_thresholds: Optional[Path] = typer.Option(None, help="TOML or JSON file of risk-tier thresholds (keys listed in the report)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write (default RUN_DIR/report.html)."),
) -> None:
    """Re-render a run's HTML leakage report from its stored files.

    RUN_DIR is a finished run directory (written by `fedaudit evaluate` or `fedaudit audit`).
    """
    from fedaudit.reports import write_report

    try:
        path = write_report(run_dir, output, redact=redact, thresholds=risk_thresholds)
    except FedauditError as exc:
        fail(str(exc))
    console().print(f"report: {path}", highlight=False, markup=False)


def compare(
    run_dirs: list[Path] = typer.Argument(..., help="Finished run directories, one column each."),
    output: Path = typer.Option(..., "-o", "--output", help="The HTML file to write."),
    redact: bool = typer.Option(False, "--redact", help="Blur every embedded reconstruction."),
    risk_thresholds: Optional[Path] = typer.Option(None, help="TOML or JSON file of risk-tier thresholds."),
) -> None:
    """One page comparing runs side by side, with a privacy–utility scatter.

    RUN_DIRS are finished run directories, one column each.
    """
    from fedaudit.reports import write_compare

    try:
        path = write_compare(run_dirs, output, redact=redact, thresholds=risk_thresholds)
    except FedauditError as exc:
        fail(str(exc))
    console().print(f"comparison: {path}", highlight=False, markup=False)


def sweep(
    grid_file: Optional[Path] = typer.Argument(None, metavar="GRID.toml", help="Grid file: \\[fixed] options and \\[grid] "
                                               "lists of `fedaudit evaluate` options (see examples/grid.toml)."),
    out: Optional[Path] = typer.Option(None, "--out", help="The sweep's folder (default runs/sweep-<grid file name>); "
                                       "running the same grid into it again skips COMPLETE points."),
    backend: str = typer.Option("local", help="local (this machine) or ray (Ray tasks; pip install -e \".\\[ray]\")."),
    jobs: int = typer.Option(1, help="local backend: points run at once, each in its own process."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per point (default: cores / --jobs locally, 1 on "
                                          "Ray); results are identical across backends at the same count."),
    address: Optional[str] = typer.Option(None, help="ray backend: the cluster to join (e.g. auto, or "
                                          "ray://HOST:10001); default: start a local Ray."),
    resume: Optional[Path] = typer.Option(None, help="Continue the sweep in this folder, with the grid it holds."),
    quiet: bool = typer.Option(False, "--quiet", help="Log lines only, no table."),
    json_summary: bool = typer.Option(False, "--json", help="Print sweep.json's points as JSON on stdout."),
) -> None:
    r"""Run a grid of evaluate runs (methods × targets × seeds × ...) locally or on Ray; one compare page for all.

    GRID.toml holds \[fixed] options and \[grid] lists of `fedaudit evaluate` options (see examples/grid.toml).
    """
    from fedaudit.sweeps.grid import load_grid, run_grid

    _setup_logging(quiet)
    try:
        if resume is not None and (grid_file is not None or out is not None):
            raise FedauditError("--resume SWEEP_DIR continues the grid that folder holds; drop the grid file and --out")
        grid = load_grid(grid_file) if grid_file is not None else None
        folder = resume or out or Path("runs") / f"sweep-{grid_file.stem if grid_file else 'grid'}"
        outcome = run_grid(grid, folder, backend=backend, jobs=jobs, threads=threads, address=address,
                           resume=resume is not None)
    except FedauditError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err_console().print("interrupted; finished points are kept — run the same command again (or --resume "
                            "SWEEP_DIR) to continue", highlight=False, markup=False)
        raise typer.Exit(130) from None
    points = outcome.index["points"]
    if json_summary:
        sys.stdout.write(json.dumps({"sweep": str(outcome.root), "compare": str(outcome.compare) if outcome.compare
                                     else None, "points": points}, indent=1) + "\n")
    elif not quiet:
        table = Table(title=f"sweep {outcome.root}")
        for col in ("point", "status", "unseen acc", "highest verdict", "seconds"):
            table.add_column(col, overflow="fold")
        for row in points:
            acc, top = point_summary(row, outcome.root)
            seconds = row.get("seconds")
            table.add_row(escape(row["name"]), escape(row["status"]), acc, top,
                          "-" if seconds is None else f"{seconds:.0f}")
        console().print(table)
        if outcome.compare is not None:
            console().print(f"comparison: {outcome.compare}", highlight=False, markup=False)
    if outcome.failed:
        err_console().print(f"{len(outcome.failed)} of {len(points)} point(s) failed: "
                            + "; ".join(f"{r['name']}: {r['error']}" for r in outcome.failed),
                            highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(SWEEP_FAILED_EXIT)


def point_summary(row: dict[str, Any], root: Path) -> tuple[str, str]:
    """A finished point's unseen accuracy and its highest verdict tier, read from its metrics.json."""
    from fedaudit.audit.verdict import TIER_ORDER

    if row.get("status") != "complete" or not row.get("run_dir"):
        return "-", "-"
    metrics = json.loads((root / row["run_dir"] / "metrics.json").read_text())
    acc = (metrics.get("accuracy") or {}).get("unseen_domain")
    tiers = [r.get("tier") for r in metrics.get("verdict") or [] if r.get("tier") in TIER_ORDER]
    return _acc(acc), max(tiers, key=TIER_ORDER.get, default="-")


def make_app() -> typer.Typer:
    """The ``fedaudit`` command, its ``evaluate`` flags made from the option declarations registered now."""
    cli = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      help="Audit federated domain generalization methods: accuracy, communication and privacy leakage.")
    signature = evaluate_signature()

    def show_version(value: bool) -> None:
        if value:
            from fedaudit import __version__

            console().print(f"fedaudit {__version__}", highlight=False, markup=False)
            raise typer.Exit(0)

    @cli.callback()
    def root(version: bool = typer.Option(False, "--version", help="Print fedaudit's version and exit.",
                                          is_eager=True, callback=show_version)) -> None:
        """Audit federated domain generalization methods: accuracy, communication and privacy leakage."""

    def evaluate_command(ctx: typer.Context, **given: Any) -> None:
        evaluate(ctx, **given)

    evaluate_command.__signature__ = signature  # type: ignore[attr-defined]
    evaluate_command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    evaluate_command.__doc__ = evaluate.__doc__
    cli.command("evaluate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(evaluate_command)
    audit_sig = audit_signature()

    def audit_command(**given: Any) -> None:
        audit(**given)

    audit_command.__signature__ = audit_sig  # type: ignore[attr-defined]
    audit_command.__annotations__ = {p.name: p.annotation for p in audit_sig.parameters.values()}
    audit_command.__doc__ = audit.__doc__
    cli.command("audit")(audit_command)
    cli.command("list")(list_)
    cli.command()(report)
    cli.command()(compare)
    cli.command()(sweep)
    return cli


app = make_app()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
