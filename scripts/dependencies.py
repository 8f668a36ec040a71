"""The next upstream break, before a user meets it; and the lock, refreshed from environments that passed.

    python scripts/dependencies.py                # check: the newest versions pyproject.toml allows, nothing written
    python scripts/dependencies.py --write-lock   # the same, then rewrite constraints*.txt if everything passed

It installs fedaudit as the README does but without the lock (``pip install --upgrade --upgrade-strategy eager -e
".[test]"``: the newest release of every package the ranges allow) in a scratch virtual environment, runs every
command's ``--help`` through the installed script and the fast suite (``python -m pytest -q``), then adds the extras
(``.[test,flower,nvflare,ray]``, whose caps may move shared packages) and runs the CLI's and the extras' tests. Where
something fails it reverts one package at a time to the version the lock holds, re-runs only what failed, and prints
which package at which version broke what. Run it before refreshing the lock, and whenever a fresh install
misbehaves; it took 19 min on 2 cores when it wrote the locks of 2026-12-07, before the extras' slow tests (~2.5 min)
joined its checks (``--no-suite``: help and the extras' tests only).

Two locks, because the extras cap packages the README's environment does not (Flower 1.41-1.42 caps typer below 0.21
and rich below 15): ``constraints.txt`` is the README's environment, ``constraints-extras.txt`` the one with every
extra. Each is ``pip freeze`` of an environment in which its checks passed, written with the command, the date and
the platform.

Machine-wide pip settings still apply (on the project's build machines ``/etc/xdg/pip`` caps torch at the release on
their disk); the script prints the constraints in effect so a reader can tell "newest allowed" from "newest on PyPI".
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE, EXTRAS = "test", "test,flower,nvflare,ray"
LOCKS = {BASE: ROOT / "constraints.txt", EXTRAS: ROOT / "constraints-extras.txt"}
# What each environment's checks run, after every command's --help: the README's test command in the README's
# environment; with the extras, the tests of the CLI (typer is what the extras move) and of the extras themselves.
SUITES: dict[str, list[list[str]]] = {BASE: [[]], EXTRAS: [["tests/test_cli.py"], ["-m", "extra"]]}


@dataclass
class Outcome:
    """What failed in one environment: a check's name (``fedaudit evaluate --help``, a test's node id) → its last
    lines of output."""

    failed: dict[str, str] = field(default_factory=dict)
    passed: int = 0


def run(cmd: list[str], env: dict[str, str] | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, text=True, capture_output=True, cwd=ROOT, env=env, check=check)


def pip(venv: Path, *args: str) -> None:
    found = run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args])
    if found.returncode != 0:
        sys.exit(f"error: pip {' '.join(args)} failed:\n{found.stdout[-3000:]}{found.stderr[-3000:]}")


def versions(venv: Path) -> dict[str, str]:
    """Installed distribution → version (normalised names), fedaudit itself left out."""
    out = run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"]).stdout
    return {_norm(name): version for name, version in re.findall(r"^([A-Za-z0-9._-]+)==(\S+)$", out, re.M)}


def locked(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return {_norm(name): version for name, version in
            re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", path.read_text(encoding="utf-8"), re.M)}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def commands(venv: Path) -> list[str]:
    """Every command of the installed ``fedaudit``, as the app declares them ("" is the group itself)."""
    code = "import typer.main; from fedaudit.cli import app; print(*typer.main.get_command(app).commands)"
    found = run([str(venv / "bin" / "python"), "-c", code])
    if found.returncode != 0:  # the package does not even import: that is the failure to report
        return [""]
    return ["", *found.stdout.split()]


def check_help(venv: Path, only: set[str] | None = None) -> Outcome:
    outcome = Outcome()
    for name in commands(venv):
        label = f"fedaudit {name} --help".replace("  ", " ")
        if only is not None and label not in only:
            continue
        found = run([str(venv / "bin" / "fedaudit"), *([name] if name else []), "--help"],
                    env={**os.environ, "COLUMNS": "80"})
        text = found.stdout + found.stderr
        if found.returncode != 0 or "Traceback" in text:
            outcome.failed[label] = text.strip().splitlines()[-1] if text.strip() else f"exit {found.returncode}"
        else:
            outcome.passed += 1
    return outcome


def check_tests(venv: Path, selection: list[str], report: Path) -> Outcome:
    """``python -m pytest -q`` with ``selection`` added, read back from its JUnit XML."""
    run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
         *selection])
    outcome = Outcome()
    if not report.exists():
        outcome.failed[" ".join(["pytest", *selection])] = "pytest wrote no report (it could not start)"
        return outcome
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is None:
            outcome.passed += case.find("skipped") is None
            continue
        path = case.get("classname", "").replace(".", "/")
        node = f"{path}.py::{case.get('name')}"
        outcome.failed[node] = (problem.get("message") or "").splitlines()[0][:200] if problem.get("message") else ""
    report.unlink()
    return outcome


def checks(venv: Path, extras: str, suite: bool, only: set[str] | None = None) -> Outcome:
    """Every check of one environment, or only the ones named in ``only`` (a re-run after a revert)."""
    outcome = check_help(venv, only)
    if not suite and extras == BASE:
        return outcome
    tests = None if only is None else sorted(n for n in only if "::" in n)
    selections: list[list[str]] = SUITES[extras] if tests is None else ([tests] if tests else [])
    for i, selection in enumerate(selections):
        found = check_tests(venv, selection, venv / f"junit-{i}.xml")
        outcome.failed.update(found.failed)
        outcome.passed += found.passed
    return outcome


def blame(venv: Path, extras: str, suite: bool, failed: set[str], newest: dict[str, str],
          lock: dict[str, str], limit: int) -> dict[str, list[str]]:
    """Revert one package at a time to the locked version and re-run what failed: a check that passes then was
    broken by that package's newer release. The packages fedaudit declares come first."""
    direct = _declared()
    suspects = sorted((name for name in newest if name in lock and lock[name] != newest[name]),
                      key=lambda name: (name not in direct, name))
    blamed: dict[str, list[str]] = {}
    left = set(failed)
    for name in suspects[:limit]:
        if not left:
            break
        print(f"  reverting {name} {newest[name]} -> {lock[name]} ...", flush=True)
        pip(venv, "install", "--quiet", "--no-deps", f"{name}=={lock[name]}")
        fixed = left - set(checks(venv, extras, suite, only=left).failed)
        pip(venv, "install", "--quiet", "--no-deps", f"{name}=={newest[name]}")
        if fixed:
            blamed[f"{name} {newest[name]} (lock: {lock[name]})"] = sorted(fixed)
            left -= fixed
    if left:
        blamed["no single package (several together, a package new since the lock, or fedaudit itself)"] = sorted(left)
    return blamed


@functools.cache
def _declared() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [*project["dependencies"], *(r for rs in project["optional-dependencies"].values() for r in rs)]
    return {_norm(m.group(0)) for r in reqs if (m := re.match(r"[A-Za-z0-9._-]+", r))}


def write_lock(venv: Path, extras: str) -> Path:
    path = LOCKS[extras]
    frozen = run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"]).stdout
    what = "the README's environment" if extras == BASE else "the environment with every extra"
    checked = ("every command's --help and the fast suite" if extras == BASE else
               "every command's --help, tests/test_cli.py and the extras' tests (-m extra)")
    header = (f"# The versions {what} (pip install -e \".[{extras}]\") last passed with: {checked}.\n"
              f"# Made by `python scripts/dependencies.py --write-lock` on {datetime.date.today()} "
              f"(Python {platform.python_version()}, {platform.machine()} {platform.system()}); do not edit by hand.\n"
              f"# Use: pip install -c {path.name} -e \".[{extras}]\" (a constraint pins a package only if it is "
              "installed at all).\n")
    path.write_text(header + frozen, encoding="utf-8")
    return path


def machine_constraints(venv: Path) -> str:
    found = run([str(venv / "bin" / "python"), "-m", "pip", "config", "list"]).stdout
    return ", ".join(line for line in found.splitlines() if "constraint" in line) or "none"


def environment(venv: Path, extras: str, suite: bool, limit: int) -> bool:
    """Install the newest allowed versions of ``.[extras]`` into ``venv``, check, and say what broke."""
    print(f"\n== .[{extras}]: installing the newest versions allowed (no lock) ...", flush=True)
    pip(venv, "install", "--quiet", "--upgrade", "--upgrade-strategy", "eager", "-e", f".[{extras}]")
    newest, lock = versions(venv), locked(LOCKS[extras])
    changed = {n: v for n, v in newest.items() if lock.get(n) != v}
    print(f"{len(newest)} packages; {len(changed)} differ from {LOCKS[extras].name}"
          + (f" ({LOCKS[extras].name} does not exist yet)" if not lock else ""))
    for name in sorted(changed, key=lambda n: (n not in _declared(), n)) if lock else ():
        print(f"  {name} {changed[name]} (lock: {lock.get(name, 'absent')})")
    outcome = checks(venv, extras, suite)
    print(f"checks: {outcome.passed} passed, {len(outcome.failed)} failed")
    if not outcome.failed:
        return True
    for name, why in outcome.failed.items():
        print(f"  FAILED {name}: {why}")
    if lock:
        print("finding which package broke what ...", flush=True)
        for package, broken in blame(venv, extras, suite, set(outcome.failed), newest, lock, limit).items():
            print(f"BROKE {package}:\n    " + "\n    ".join(broken))
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-lock", action="store_true", help="rewrite the lock of each environment that passed")
    parser.add_argument("--venv", type=Path, help="the scratch environment (kept; reused if it exists); default: a "
                                                  "temporary one, removed after")
    parser.add_argument("--no-suite", action="store_true", help="the README's environment: every --help only")
    parser.add_argument("--no-extras", action="store_true", help="skip the environment with every extra")
    parser.add_argument("--max-reverts", type=int, default=60, help="packages to revert one by one when blaming")
    args = parser.parse_args()
    if args.write_lock and args.no_suite:
        parser.error("--write-lock needs the suite: a lock records versions the suite passed with")
    with tempfile.TemporaryDirectory(prefix="fedaudit-deps-") as scratch:
        venv = args.venv or Path(scratch) / "venv"
        if not (venv / "bin" / "python").exists():
            run([sys.executable, "-m", "venv", str(venv)], check=True)
        print(f"scratch environment: {venv}; machine-wide pip constraints: {machine_constraints(venv)}")
        results = {}
        for extras in (BASE,) if args.no_extras else (BASE, EXTRAS):
            ok = environment(venv, extras, not args.no_suite, args.max_reverts)
            results[extras] = ok
            if ok and args.write_lock:
                print(f"wrote {write_lock(venv, extras).relative_to(ROOT)}")
    print("\n" + "; ".join(f".[{e}]: {'passed' if ok else 'BROKEN'}" for e, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
