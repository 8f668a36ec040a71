"""Where a measured table goes: ``docs/results/<name>.md``, headed by the exact command that wrote it and its
provenance (commit, the metrics schema its runs were written and judged under, torch build, threads, CPU, date), so
re-measuring is running the script again — never editing prose. Every script that measures a table for the
documentation writes it through :func:`write`; ``tests/test_docs.py`` holds every page in ``docs/results/`` to the
header this writes, and fails when a page's runs are of an older metrics schema than the one fedaudit writes now
(their verdict rows and the fields they read may mean something else since: measure them again).
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


NO_RUNS = "reads no run's metrics"  # the stamp of a page whose script reads no run directory


def provenance(reads_runs: bool = True) -> str:
    """``commit 1a2b3c4, metrics schema 3, torch 2.14.1+cu130, 2 thread(s), x86_64 (CPU model, 2 cores),
    2026-11-27 08:15 UTC``; a checkout with uncommitted changes says so, since its commit alone would not reproduce
    the numbers."""
    from fedaudit.run.results import SCHEMA_VERSION

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # pages this folder already holds do not change a number; any other change to a tracked file might, and so
    # does a script the commit does not hold
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results")
    changed += git("status", "--porcelain", "--", str(Path(sys.argv[0]).resolve()))
    dirty = " (with uncommitted changes)" if changed else ""
    schema = f"metrics schema {SCHEMA_VERSION}" if reads_runs else NO_RUNS
    return (f"commit {commit}{dirty}, {schema}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
            f"{platform.machine()} ({cpu_model()}, {os.cpu_count()} cores), "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU model unknown"


def command() -> str:
    """The command line this process was started with, as a user would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def finished_run(out: Path) -> Path | None:
    """The newest complete run directory under ``out``: a script run again reads its runs back and retrains
    nothing (delete the folder to measure afresh)."""
    from fedaudit.run import run_directory

    done = [d for d in sorted(out.glob("*")) if run_directory.is_complete(d)] if out.exists() else []
    return done[-1] if done else None


def calibration_cell(cal: list[dict]) -> str:
    """Mean calibration gaps over victims, non-members / members in σ, of the signal the attack scored, then before the
    attacker's shift where the runs stored one; "miscalibrated" where any victim's was."""
    if not cal:
        return "–"

    def pair(out: str, in_: str) -> str:
        return f"{sum(c[out] for c in cal) / len(cal):+.2f} / {sum(c[in_] for c in cal) / len(cal):+.2f}"

    raw = f" (before the shift {pair('raw_out_gap', 'raw_in_gap')})" if all("raw_out_gap" in c for c in cal) else ""
    bad = " miscalibrated" if any(c["status"] == "miscalibrated" for c in cal) else ""
    return pair("out_gap", "in_gap") + raw + bad


def slug(text: str) -> str:
    """A file-name part from an option value (``shapes:375`` → ``shapes_375``)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def write(name: str, title: str, body: str, about: str = "", path: Path | None = None, echo: bool = True,
          reads_runs: bool = True) -> Path:
    """Write ``docs/results/<name>.md`` (or ``path``): the title, the command and provenance, ``about`` (what the
    rows are, in a sentence or two), then ``body`` (the table and anything read from it). Prints the body (unless
    ``echo`` is off: a script that printed it as it went), and where it went. ``reads_runs`` off: the script reads no
    run's metrics.json (its page states no schema, and no schema change dates it)."""
    path = path or RESULTS / f"{name}.md"
    text = f"# {title}\n\nWritten by `{command()}` ({provenance(reads_runs)}).{' ' + about if about else ''}\n\n{body.strip()}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if echo:
        print(body.strip())
    print(f"\nwrote {path}", file=sys.stderr)
    return path
