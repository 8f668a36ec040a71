"""Measure the README's leakage table: deepinversion against each method's shared artifacts.

For each (method, attacker) below this runs the quick profile on ``digits``
(default target domain, seed 0, every victim) with ``--attack deepinversion``
and prints one markdown row per attacked artifact: the headline metrics with
their controls (untrained model, untrained head, or noise-statistics bank)
and chance.

    python scripts/leakage_table.py --out runs/leakage-table [--only fedavg,ccst]

Runs that already finished are read back, not redone. Each row is
reproducible with the command in its run's ``config.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.api import evaluate
from fedaudit.intervals import clopper_pearson
from method_table import finished  # scripts/ is on sys.path when run as python scripts/leakage_table.py

# (method, attacker): the server sees every upload; a curious client sees its broadcasts.
CASES = [
    ("fedavg", "server"), ("fedavg", "client:clean"),
    ("gperxan", "server"),
    ("fedfd_a", "server"), ("fedfd_a", "client:clean"),
    ("fedlsi", "server"),
    ("ccst", "server"), ("ccst", "client:clean"),
    ("elcfs", "server"),
]


def run(out: Path, method: str, attacker: str) -> Path:
    """The finished run under ``out`` that sent what the method now declares, or a new one."""
    done = finished(out, method)
    if done:
        return done
    return evaluate(method, out=str(out), dataset="digits", attack="deepinversion", attacker=attacker,
                    victim="all").run_dir


def pair(m: dict, key: str, digits: int = 2) -> str:
    if key not in m:
        return "–"
    x = m[key]
    return f"{x['attack']:.{digits}f} ({x['control']:.{digits}f})"


def rows(run_dir: Path, method: str, attacker: str) -> list[str]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    di = metrics["leakage"]["deepinversion"]
    summary = di.get("summary", {})
    out = []
    for artifact, victims in di.items():
        if artifact in ("summary", "auditor", "settings") or artifact not in summary:
            continue
        entries = [e for e in victims.values() if "metrics" in e and "identifiability" in e["metrics"]]
        k = sum(e["metrics"]["identifiability"]["attack_k"] for e in entries)
        kc = sum(e["metrics"]["identifiability"]["control_k"] for e in entries)
        n = sum(e["metrics"]["identifiability"]["n"] for e in entries)
        lo, hi = clopper_pearson(k, n)
        s = summary[artifact]
        dom = s["domain_attribution"]["macro"]
        cls = s.get("class_fidelity")
        mean = lambda key: {side: sum(e["metrics"][key][side] for e in entries) / len(entries)  # noqa: E731
                            for side in ("attack", "control")} if entries and key in entries[0]["metrics"] else None
        psnr = mean("psnr_mean")
        out.append(" | ".join([
            f"| {method}", attacker, f"`{artifact}`",
            f"{dom['attack']:.2f} ({dom['control']:.2f}; chance {dom['chance']:.2f})",
            f"{cls['attack']:.2f} ({cls['control']:.2f}; chance {cls['chance']:.2f})" if cls else "n/a",
            f"{k / n:.2f} [{lo:.2f}, {hi:.2f}] ({kc / n:.2f})" if n else "–",
            f"{psnr['attack']:.1f} ({psnr['control']:.1f})" if psnr else "–",
            f"{metrics['accuracy']['unseen_domain']:.3f} |",
        ]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/leakage-table"))
    parser.add_argument("--only", default="", help="comma-separated methods or method:attacker cases (default: all)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    lines = ["| method | attacker | artifact | domain attribution, macro (control; chance) | class fidelity (control; chance) "
             "| identifiability [95% CI] (control) | PSNR dB to nearest member (control) | unseen acc |",
             "|---|---|---|---|---|---|---|---|"]
    for method, attacker in CASES:
        if only and method not in only and f"{method}:{attacker}" not in only:
            continue
        run_dir = run(args.out / f"{method}-{attacker.replace(':', '-')}", method, attacker)
        lines += rows(run_dir, method, attacker)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
