"""Measure the README's leakage table: deepinversion against each method's shared artifacts.

For each (method, attacker) below this runs the quick profile on ``digits`` (or ``--dataset``)
(default target domain, seed 0, every victim) with ``--attack deepinversion``
and prints one markdown row per attacked artifact: the verdict the run stored
for that share, the headline metrics beside their nulls (untrained model or
noise-statistics bank, prior-only control, holdout twin) and computed chance,
and how many victims' attacks reached power on the positive control.

    python scripts/leakage_table.py --out runs/leakage-table [--only fedavg,ccst]
    python scripts/leakage_table.py --out runs/leakage-shapes --dataset shapes --only fedprox:server,fedsb:server

Runs that already finished are read back, not redone. Each row is
reproducible with the command in its run's ``config.json``. The table goes to
``docs/results/leakage_<dataset>.md`` (``--write PATH`` elsewhere) with the command and its provenance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.api import evaluate
from fedaudit.audit.verdict import judge
from fedaudit.run.stored.reconstruction import BOOKKEEPING
from fedaudit.statistics.intervals import clopper_pearson
import results_page  # scripts/ is on sys.path when run as python scripts/leakage_table.py
from method_table import finished

# (method, attacker): the server sees every upload; a curious client sees its broadcasts.
CASES = [
    ("fedavg", "server"), ("fedavg", "client:clean"),
    ("gperxan", "server"),
    ("fedfd_a", "server"), ("fedfd_a", "client:clean"),
    ("fedlsi", "server"),
    ("ccst", "server"), ("ccst", "client:clean"),
    ("elcfs", "server"),
]


def run(out: Path, method: str, attacker: str, dataset: str) -> Path:
    """The finished run under ``out`` that sent what the method now declares, or a new one."""
    done = finished(out, method)
    if done:
        return done
    return evaluate(method, out=str(out), dataset=dataset, attack="deepinversion", attacker=attacker,
                    victim="all").run_dir


ABOUT = ("Quick profile on `{dataset}`, default target domain, seed 0, every source client a victim, "
         "`--attack deepinversion`. Each metric cell is the attack, then its nulls in brackets (untrained control; "
         "prior-only control; holdout twin; computed chance; a curious client's entries have no twin); domain "
         "attribution is the macro average over victims; identifiability is pooled over victims with its 95% "
         "interval and the smallest victim's p-value (before the row's correction). Power counts the victims whose "
         "attack found, on the positive control, what the tests look for, and those where it also singled out the "
         "source records. The verdict is the tier of that artifact's inversion row, judged by the rules of the "
         "commit named.")

NULLS = (("control", "untrained"), ("prior_only", "prior-only"), ("twin", "twin"))


def with_nulls(d: dict | None, digits: int = 2) -> str:
    """``attack (untrained; prior-only; twin; chance)`` from a metric's stored values."""
    if not d:
        return "n/a"
    parts = [f"{d[k]:.{digits}f}" for k, _ in NULLS if isinstance(d.get(k), (int, float))]
    if isinstance(d.get("chance"), (int, float)):
        parts.append(f"chance {d['chance']:.{digits}f}")
    return f"{d['attack']:.{digits}f} ({'; '.join(parts)})"


def rows(run_dir: Path, method: str, attacker: str) -> list[str]:
    """One row per attacked artifact: the stored verdict row's tier, then each headline metric beside its
    nulls (untrained; prior-only; twin; chance), identifiability pooled over victims, and the power."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    section = metrics["leakage"].get("deepinversion") or {}  # as the file stores it
    summary = section.get("summary", {})
    # The verdict is a pure function of the stored evidence: judged here with the current rules, it is what a
    # run made now stores (runs made before a rule changed are not re-run for it).
    verdict = {r["row"]: r["tier"] for r in judge(metrics, metrics["provenance"]["config"])}
    arrow = "↑" if attacker == "server" else "↓"
    out = []
    for artifact, victims in section.items():
        if artifact in BOOKKEEPING or artifact not in summary:
            continue
        entries = [e for e in victims.values() if "metrics" in e and "identifiability" in e["metrics"]]
        idents = [e["metrics"]["identifiability"] for e in entries]
        n = sum(i["n"] for i in idents)
        k = sum(i["attack_k"] for i in idents)
        lo, hi = clopper_pearson(round(k), n)
        pmin = min(i["attack_p_value"] for i in idents)
        pooled = {name: sum(i[name] * i["n"] for i in idents) / n for name, _ in NULLS if all(name in i for i in idents)}
        s = summary[artifact]
        psnr = {side: sum(e["metrics"]["psnr_mean"][side] for e in entries) / len(entries)
                for side in ("attack", "prior_only", "control") if entries and "psnr_mean" in entries[0]["metrics"]
                and side in entries[0]["metrics"]["psnr_mean"]}
        powers = [e.get("power") or {} for e in entries]
        power = ("n/a" if not any(p.get("status") == "measured" for p in powers) else
                 f"{sum(bool(p.get('reached')) for p in powers)}/{len(powers)} reached, "
                 f"{sum(bool(p.get('record_level')) for p in powers)}/{len(powers)} record-level")
        out.append(" | ".join([
            f"| {method}", attacker, f"`{artifact}`", verdict.get(f"{artifact.split(':')[0]}{arrow}", "?"),
            with_nulls(s["domain_attribution"]["macro"]),
            with_nulls(s.get("class_fidelity")),
            (f"{k / n:.2f} [{lo:.2f}, {hi:.2f}], p {pmin:.2g} ({'; '.join(f'{pooled[name]:.2f}' for name, _ in NULLS if name in pooled)})"
             if n else "–"),
            power,
            (f"{psnr['attack']:.1f} ({psnr.get('prior_only', float('nan')):.1f}; {psnr.get('control', float('nan')):.1f})"
             if psnr else "–"),
            f"{metrics['accuracy']['unseen_domain']:.3f} |",
        ]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/leakage-table"))
    parser.add_argument("--only", default="", help="comma-separated methods or method:attacker cases (default: all); "
                                                   "a method:attacker case not in the default list is run too")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--write", type=Path, default=None, help="where the table goes (default docs/results/leakage_<dataset>.md)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    extra = [tuple(c.split(":", 1)) for c in sorted(only) if ":" in c and tuple(c.split(":", 1)) not in CASES]
    lines = ["| method | attacker | artifact | verdict | domain attribution, macro (untrained; prior-only; twin; chance) "
             "| class fidelity (untrained; prior-only; twin; chance) | identifiability [95% CI], smallest p (untrained; "
             "prior-only; twin) | power (victims) | PSNR dB to nearest member (prior-only; untrained) | unseen acc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method, attacker in [*CASES, *extra]:
        if only and method not in only and f"{method}:{attacker}" not in only:
            continue
        run_dir = run(args.out / f"{method}-{attacker.replace(':', '-')}", method, attacker, args.dataset)
        lines += rows(run_dir, method, attacker)
    results_page.write(f"leakage_{results_page.slug(args.dataset)}", f"DeepInversion against each method's shared artifacts on `{args.dataset}`",
                       "\n".join(lines), ABOUT.format(dataset=args.dataset), path=args.write)


if __name__ == "__main__":
    main()
