"""The ``fedaudit`` command: a thin typer layer over :mod:`fedaudit.api`.

User errors print one line (``error: ...``) naming the problem and the fix
and exit with status 2; ``evaluate --fail-on TIER`` exits with status 3 when a
verdict reaches that tier; an interrupted run says how to resume it.

The commands live here; :mod:`.flags` builds their flags from the declarations and :mod:`.output` prints
what they show.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from fedaudit.errors import FedauditError, PointCrashed, unknown_choice
from fedaudit.models.factory import parse_model_args
from fedaudit.run.config import parse_split
from fedaudit.run.results import RunMetrics, VerdictRow
from fedaudit.run.stored.core import first_problem

from .flags import audit_signature, declared_options, evaluate_signature, given_method_flags, refuse_leftovers
from .help import SectionedCommand
from .output import (RichReporter, console, err_console, listing, point_summary, print_listing, print_summary,
                     summary_json)

log = logging.getLogger("fedaudit")

USER_ERROR = 2


def fail(message: str, status: int = USER_ERROR) -> None:
    # The message may quote user text (folder and class names): escape it.
    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(status)


# -- evaluate: its flags come from the declarations (RunConfig's fields, every registered attack's options) ---


GATE_EXIT = 3  # --fail-on: a verdict reached the tier (2 is a user error, 1 a crash)
CRASH_EXIT = 1  # what an uncaught exception gives; also a DP-sweep point's crash, said in one line
SWEEP_FAILED_EXIT = 4  # fedaudit sweep: every point ran, and some failed (each with its one-line error)
GATE_TIERS = ("high", "medium")


def gate_spec(fail_on: str) -> tuple[str, str | None]:
    """``high`` → (high, every level); ``high:records`` → (high, records): a gate limited to one level (issue 47)."""
    from fedaudit.audit.verdict import LEVELS

    tier, _, level = fail_on.partition(":")
    if tier not in GATE_TIERS:
        raise unknown_choice("--fail-on tier", tier, [*GATE_TIERS, *(f"{t}:{lv}" for t in GATE_TIERS for lv in LEVELS)])
    if level and level not in LEVELS:
        raise unknown_choice("--fail-on level", level, list(LEVELS))
    return tier, level or None


def parsed_options(given: dict[str, Any], fail_on: str | None) -> dict[str, Any]:
    """The declared options given as flags, each parsed by its declaration (``none`` for a nullable number);
    ``--fail-on`` checked first, so a typo fails before any work."""
    if fail_on is not None:
        gate_spec(fail_on)
    declared = declared_options()
    return {name: declared[name][0].parse(name, value) if isinstance(value, str) and declared[name][0].kind
            is not str else value for name, value in given.items()}


def evaluate(ctx: typer.Context, **given: Any) -> None:
    """Train a method in a leave-one-domain-out federation, record its wire, attack it, write a run directory."""
    from fedaudit import api
    from fedaudit.sweeps.dp_sweep import is_sweep, parse_epsilons, sweep_dp

    quiet, split, dp_sweep = given.pop("quiet"), given.pop("split"), given.pop("dp_sweep")
    json_summary, fail_on, inconclusive = given.pop("json_summary"), given.pop("fail_on"), given.pop("fail_on_inconclusive")
    method_option, config, resume, method = given.pop("method_option"), given.pop("config"), given.pop("resume"), given.pop("method")
    model_arg = given.pop("model_arg")
    flags = given_method_flags(given)
    _setup_logging(quiet)
    try:
        refuse_leftovers(ctx.args)
        options = parsed_options(given, fail_on)
        options["split"] = parse_split(split)
        if model_arg:
            options["model_args"] = parse_model_args(model_arg)
        if dp_sweep is not None or (resume is not None and is_sweep(resume)):
            swept = sweep_dp(None if dp_sweep is None else parse_epsilons(dp_sweep), method, resume=resume,
                                   config=config, method_option=method_option, method_flags=flags,
                                   reporter=RichReporter(quiet or json_summary), command=api.command_line(), **options)
            show_results(list(zip(swept.metrics, swept.run_dirs)), quiet, json_summary,
                         extra={"sweep": str(swept.root), "sweep_report": str(swept.report)})
            gate(swept.metrics, fail_on, inconclusive)
            return
        result = api.evaluate(method, config=config, resume=resume, method_option=method_option, method_flags=flags,
                              reporter=RichReporter(quiet or json_summary), command=api.command_line(), **options)
    except FedauditError as exc:
        fail(str(exc))
    except ValidationError as exc:  # a typed block failed its model deep in the run (issue 71): one line, not a traceback
        fail(f"the run stopped on a block that failed its model ({first_problem(exc)}); it is left incomplete, never "
             "marked complete — a fedaudit bug: report it with the run directory's config.json; its finished rounds "
             "are saved, and `fedaudit evaluate --resume RUN_DIR` continues it once fixed")
    except PointCrashed as exc:  # a DP-sweep point crashed: its traceback is in its error.txt
        fail(str(exc), CRASH_EXIT)
    except KeyboardInterrupt:
        err_console().print("interrupted; finished rounds are saved — continue with `fedaudit evaluate --resume "
                            "RUN_DIR` (a run stopped before its first round leaves no directory: start it again)",
                            highlight=False, markup=False)
        raise typer.Exit(130) from None
    show_results([(result.metrics, result.run_dir)], quiet, json_summary)
    gate([result.metrics], fail_on, inconclusive)


def audit(recording: Path, **given: Any) -> None:
    """Attack a recorded federation (e.g. a Flower run) as evaluate attacks its own: same controls, verdict and report.

    RECORDING is a directory written by fedaudit's Recorder (any training loop) or fedaudit.interop.flower's recording mod
    and RecordingGrid. A recording may name its model's factory; fedaudit imports it only when you pass --model.
    """
    from fedaudit import api

    quiet, json_summary, fail_on = given.pop("quiet"), given.pop("json_summary"), given.pop("fail_on")
    inconclusive = given.pop("fail_on_inconclusive")
    model_arg, unverified, records = given.pop("model_arg"), given.pop("unverified"), given.pop("records")
    _setup_logging(quiet)
    try:
        options = parsed_options(given, fail_on)
        if model_arg:
            options["model_args"] = parse_model_args(model_arg)
        run_dir, metrics = api.audit_recording(recording, command=api.command_line(), unverified=unverified,
                                               records=records, **options)
    except FedauditError as exc:
        fail(str(exc))
    except ValidationError as exc:  # a typed block failed its model, wherever: the audit removed its directory
        fail(f"the audit stopped on a block that failed its model ({first_problem(exc)}) and left no run directory; "
             f"if the recording is as it was made, this is a fedaudit bug: report it with {recording}/manifest.json")
    except KeyboardInterrupt:
        err_console().print("interrupted; an unfinished audit leaves no directory: run it again", highlight=False,
                            markup=False)
        raise typer.Exit(130) from None
    show_results([(metrics, run_dir)], quiet, json_summary)
    gate([metrics], fail_on, inconclusive)


def seal(recording: Path = typer.Argument(..., help="A recording directory whose processes have all finished.")) -> None:
    """End a recorded run: merge its shards (one per process) after checking they belong together, and seal its
    ledger, so an audit can tell if a row was added, removed or edited since."""
    from fedaudit import api

    try:
        digest, shards = api.seal_recording(recording)
    except FedauditError as exc:
        fail(str(exc))
    merged = f"{len(shards)} shard(s) merged ({', '.join(shards)}); " if shards else ""
    console().print(f"{recording}: {merged}ledger sealed, sha256 {digest}", highlight=False, markup=False)


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


def gate(all_metrics: list[dict[str, Any]], fail_on: str | None, inconclusive: bool = False) -> None:
    """--fail-on: exit with GATE_EXIT when a verdict row of any run reaches the tier (files are all written); with
    ``TIER:LEVEL``, only rows of that level count. INCONCLUSIVE is no tier of leakage and fails a gate only with
    ``--fail-on-inconclusive`` (alone, or beside --fail-on and its level); NOT ASSESSED rows never do, but an audit
    that assessed nothing fails closed."""
    if fail_on is None and not inconclusive:
        return
    tier, level = gate_spec(fail_on) if fail_on is not None else (None, None)
    flag = " ".join(x for x in (fail_on and f"--fail-on {fail_on}", inconclusive and "--fail-on-inconclusive") if x)
    blind = [m for m in all_metrics if (m.get("auditor_data") or {}).get("status") == "none"]
    if blind:  # fail closed: a gate must not pass what it could not see
        err_console().print(f"{flag}: nothing was assessed ({blind[0]['auditor_data'].get('why')}); a "
                            "gate cannot pass such an audit — give the auditor the clients' records",
                            highlight=False, markup=False)
        raise typer.Exit(GATE_EXIT)
    hits = [row for m in all_metrics for row in RunMetrics.from_json(m).rows() if fails(row, tier, level, inconclusive)]
    if hits:
        err_console().print(f"{flag}: {len(hits)} verdict row(s) reached it, e.g. "
                            f"{hits[0].title or hits[0].row}: {hits[0].tier.upper()}",
                            highlight=False, markup=False)
        raise typer.Exit(GATE_EXIT)


def fails(row: VerdictRow, tier: str | None, level: str | None, inconclusive: bool) -> bool:
    """Whether a gate fails on ``row``: of the gated level, at or above the tier, or INCONCLUSIVE where asked."""
    from fedaudit.audit.verdict import INCONCLUSIVE, TIER_ORDER

    if level not in (None, row.level):
        return False
    return (tier is not None and TIER_ORDER.get(row.tier, -1) >= TIER_ORDER[tier]) or (
        inconclusive and row.tier == INCONCLUSIVE)


def list_(what: str = typer.Argument(..., help="methods, attacks or datasets"),
          as_json: bool = typer.Option(False, "--json", help="Print JSON, for scripts.")) -> None:
    """List methods (with what each shares), attacks, or datasets.

    WHAT is methods, attacks or datasets.
    """
    try:
        if as_json:
            sys.stdout.write(json.dumps(listing(what), indent=1) + "\n")
        else:
            print_listing(what)
    except FedauditError as exc:
        fail(str(exc))


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
    risk_thresholds: Path | None = typer.Option(None, help="TOML or JSON file of risk-tier thresholds (keys listed in the report)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Where to write (default RUN_DIR/report.html)."),
    pdf: bool = typer.Option(False, "--pdf", help="Also print it to PDF beside the HTML (report.pdf, or "
                                                  "report-redacted.pdf with --redact), with headless Chromium."),
) -> None:
    """Re-render a run's HTML leakage report from its stored files.

    RUN_DIR is a finished run directory (written by `fedaudit evaluate` or `fedaudit audit`).
    """
    from fedaudit.reports import write_report
    from fedaudit.reports.pdf import browser, write_pdf

    try:
        if pdf:
            browser()  # before rendering: a missing browser is a user error, not a half-done command
        path = write_report(run_dir, output, redact=redact, thresholds=risk_thresholds)
        console().print(f"report: {path}", highlight=False, markup=False)
        if pdf:
            console().print(f"pdf: {write_pdf(path)}", highlight=False, markup=False)
    except FedauditError as exc:
        fail(str(exc))


def compare(
    run_dirs: list[Path] = typer.Argument(..., help="Finished run directories, one column each."),
    output: Path | None = typer.Option(None, "-o", "--output", help="The HTML file to write (required)."),
    redact: bool = typer.Option(False, "--redact", help="Blur every embedded reconstruction."),
    risk_thresholds: Path | None = typer.Option(None, help="TOML or JSON file of risk-tier thresholds."),
) -> None:
    """One page comparing runs side by side, with a privacy–utility scatter.

    RUN_DIRS are finished run directories, one column each (two or more).
    """
    from fedaudit.reports import write_compare

    try:
        # what the comparison needs first, then where it goes (click would name a missing -o before either)
        if len(run_dirs) < 2:
            raise FedauditError(f"compare needs two or more run directories, got {len(run_dirs)}; one run's page is "
                                f"its report: fedaudit report {run_dirs[0] if run_dirs else 'RUN_DIR'}")
        if output is None:
            raise FedauditError("compare writes one page: give its path with -o FILE, e.g. fedaudit compare "
                                f"{' '.join(map(str, run_dirs))} -o compare.html")
        path = write_compare(run_dirs, output, redact=redact, thresholds=risk_thresholds)
    except FedauditError as exc:
        fail(str(exc))
    console().print(f"comparison: {path}", highlight=False, markup=False)


def sweep(
    grid_file: Path | None = typer.Argument(None, metavar="GRID.toml", help="Grid file: [fixed] options and [grid] "
                                               "lists of `fedaudit evaluate` options (see examples/grid.toml)."),
    out: Path | None = typer.Option(None, "--out", help="The sweep's folder (default runs/sweep-<grid file name>); "
                                       "running the same grid into it again skips COMPLETE points."),
    backend: str = typer.Option("local", help="local (this machine) or ray (Ray tasks; pip install -e \".[ray]\")."),
    jobs: int = typer.Option(1, help="local backend: points run at once, each in its own process."),
    threads: int | None = typer.Option(None, help="Torch threads per point (default: cores / --jobs locally, 1 on "
                                          "Ray); results are identical across backends at the same count."),
    address: str | None = typer.Option(None, help="ray backend: the cluster to join (e.g. auto, or "
                                          "ray://HOST:10001); default: start a local Ray."),
    resume: Path | None = typer.Option(None, help="Continue the sweep in this folder, with the grid it holds."),
    quiet: bool = typer.Option(False, "--quiet", help="Log lines only, no table."),
    json_summary: bool = typer.Option(False, "--json", help="Print sweep.json's points as JSON on stdout."),
) -> None:
    r"""Run a grid of evaluate runs (methods × targets × seeds × ...) locally or on Ray; one compare page for all.

    GRID.toml holds [fixed] options and [grid] lists of `fedaudit evaluate` options (see examples/grid.toml).
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
        for col in ("point", "status", "unseen acc", "verdict", "seconds"):
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


def make_app() -> typer.Typer:
    """The ``fedaudit`` command, its ``evaluate`` flags made from the option declarations registered now."""
    # Plain help (rich_markup_mode None): rich's option tables cut flag names at 80 columns (fedaudit.cli.help).
    cli = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
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
    cli.command("evaluate", cls=SectionedCommand,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(evaluate_command)
    audit_sig = audit_signature()

    def audit_command(**given: Any) -> None:
        audit(**given)

    audit_command.__signature__ = audit_sig  # type: ignore[attr-defined]
    audit_command.__annotations__ = {p.name: p.annotation for p in audit_sig.parameters.values()}
    audit_command.__doc__ = audit.__doc__
    cli.command("audit", cls=SectionedCommand)(audit_command)
    cli.command("seal", cls=SectionedCommand)(seal)
    cli.command("list", cls=SectionedCommand)(list_)
    cli.command(cls=SectionedCommand)(report)
    cli.command(cls=SectionedCommand)(compare)
    cli.command(cls=SectionedCommand)(sweep)
    return cli


app = make_app()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
