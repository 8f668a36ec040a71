"""``fedaudit report RUN --pdf``: the rendered report printed to PDF by headless Chromium, which CI installs and
which prints the page's own print stylesheet (A4, tables and figures kept whole, navigation left out).

The page has no script (every value is escaped; tests/test_report.py holds it) and embeds its images as data URIs,
so Chromium runs offline with a throw-away profile and no network services (scripts stay enabled: headless
printing itself needs them); a redacted page gives a redacted PDF (the sharp pixels are not in the HTML it
prints)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from fedaudit.errors import FedauditError
from fedaudit.run.run_directory import atomic_path

BROWSER_ENV = "FEDAUDIT_CHROMIUM"  # the browser binary, where it is not on PATH as chromium or google-chrome
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 300


def browser() -> str:
    """The headless browser to print with; none is a one-line user error naming the fix."""
    given = os.environ.get(BROWSER_ENV)
    if given:
        if not Path(given).is_file():
            raise FedauditError(f"{BROWSER_ENV}={given} is not a file; point it at a Chromium binary or unset it")
        return given
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FedauditError("--pdf prints the report with headless Chromium, and none was found: install it "
                        f"(apt-get install chromium) or set {BROWSER_ENV}=/path/to/chromium")


def write_pdf(html: Path, pdf: Path | None = None) -> Path:
    """Print ``html`` to ``pdf`` (default: beside it, same name, .pdf); returns the file written."""
    pdf = pdf or html.with_suffix(".pdf")
    binary = browser()
    with tempfile.TemporaryDirectory(prefix="fedaudit-pdf-") as profile, atomic_path(pdf) as tmp:
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--no-pdf-header-footer",
               f"--print-to-pdf={tmp}", html.resolve().as_uri()]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise FedauditError(f"Chromium did not print {html} within {TIMEOUT_S} s; the HTML report is written — "
                                "open it in a browser and print it") from None
        if not tmp.is_file() or tmp.stat().st_size == 0 or not tmp.read_bytes().startswith(b"%PDF"):
            last = (done.stderr or "").strip().splitlines()[-1:] or ["no message"]
            raise FedauditError(f"Chromium ({binary}) wrote no PDF for {html} (exit {done.returncode}: {last[0]}); "
                                "the HTML report is written — open it in a browser and print it")
    return pdf
