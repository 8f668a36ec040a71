"""HTML reports (``fedaudit.reports``): the leakage report and ``fedaudit compare``.

* :mod:`~fedaudit.reports.load` reads a finished run directory (stored files only);
* the verdict it shows is the one the run stored (``metrics.json → verdict``,
  computed by :mod:`fedaudit.audit.verdict`); ``--risk-thresholds`` re-judges
  the stored evidence with other thresholds;
* :mod:`~fedaudit.reports.plots` draws matplotlib figures as inline SVG;
* :mod:`~fedaudit.reports.render` fills ``templates/report.html.j2`` (Jinja2,
  autoescaped) into one self-contained page.

This module imports nothing heavy, so :mod:`fedaudit.api` can import it at
start-up; the renderer loads on first use.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("fedaudit")


def write_report(run_dir: str | Path, out: str | Path | None = None, **options: Any) -> Path:
    """Render ``run_dir/report.html`` (or ``out``); options: ``redact``, ``thresholds``."""
    from fedaudit.reports.render import write_report as write

    return write(run_dir, out, **options)


def write_compare(run_dirs: list[str | Path], out: str | Path, **options: Any) -> Path:
    """One page comparing runs; options: ``redact``, ``thresholds``."""
    from fedaudit.reports.render import write_compare as write

    return write(run_dirs, out, **options)


def write_report_or_warn(run_dir: str | Path) -> Path | None:
    """``write_report`` for the end of ``fedaudit evaluate``: a report failure is a warning, never a lost run."""
    try:
        return write_report(run_dir)
    except Exception as exc:  # the run is already complete on disk; the report can be re-rendered
        log.warning("could not write report.html for %s (%s: %s); the run itself is complete — "
                    "retry with `fedaudit report %s`", run_dir, type(exc).__name__, exc, run_dir)
        return None
