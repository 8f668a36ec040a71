"""Measure the README's membership table: ``--attack mia`` per method (``digits`` or ``shapes:375``).

Quick profile, default target domain, seed 0, server attacker, every victim,
8 reference models per victim. Prints one markdown row per (method, variant,
target): AUC and TPR at 1% FPR with its 95% interval, as the mean over
victims, and the number of members and non-members per victim.

    python scripts/mia_table.py --out runs/mia-table [--only fedavg] [--dataset shapes:375]

Runs that already finished are read back, not redone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit import runs
from fedaudit.api import evaluate

METHODS = ("fedavg", "fedgala", "fedlsi")


def run(out: Path, method: str, dataset: str) -> Path:
    done = [d for d in sorted(out.glob("*")) if runs.is_complete(d)] if out.exists() else []
    return done[0] if done else evaluate(method, out=str(out), dataset=dataset, attack="mia", victim="all").run_dir


def rows(run_dir: Path, method: str) -> list[str]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    out = []
    for variant, targets in metrics["leakage"]["mia"].items():
        for target, victims in targets.items():
            done = {v: e for v, e in victims.items() if "auc" in e}
            if not done:
                reason = next(iter(victims.values())).get("reason", "not run")
                out.append(f"| {method} | {variant} | {target} | n/a: {reason} | | | |")
                continue
            auc = sum(e["auc"] for e in done.values()) / len(done)
            lvl = [e["tpr_at_fpr"]["0.01"] for e in done.values()]
            tpr = sum(x["tpr"] for x in lvl) / len(lvl)
            lo = min(x["tpr_interval"][0] for x in lvl)
            hi = max(x["tpr_interval"][1] for x in lvl)
            resolvable = all(x["resolvable"] for x in lvl)
            e0 = next(iter(done.values()))
            out.append(f"| {method} | {variant} | {target} | {auc:.3f} | {tpr:.3f} [{lo:.3f}, {hi:.3f}]"
                       f"{'' if resolvable else ' ⚠'} | {e0['n_members']} / {e0['n_nonmembers']} | "
                       f"{', '.join(sorted(done))} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mia-table"))
    parser.add_argument("--only", default="")
    parser.add_argument("--dataset", default="digits", help="digits (180 non-members per victim) or shapes:375 (1,051)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    lines = ["| method | variant | target | AUC (mean over victims) | TPR at 1% FPR [widest 95% CI] | members / non-members per victim | victims |",
             "|---|---|---|---|---|---|---|"]
    for method in METHODS:
        if not only or method in only:
            lines += rows(run(args.out / runs.safe_name(f"{method}-{args.dataset}"), method, args.dataset), method)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
