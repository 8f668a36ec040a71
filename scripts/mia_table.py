"""Measure the README's membership table: ``--attack mia`` per method (``digits`` or ``shapes:375``).

Quick profile, default target domain, seed 0, server attacker, every victim,
8 reference models per victim. Prints one markdown row per (method, variant,
target): the stored verdict of its membership row, AUC, advantage with its
smallest KS p-value, TPR at 1% FPR with its 95% interval (means over
victims), LiRA/RMIA's calibration figure, and the number of members and
non-members per victim.

    python scripts/mia_table.py --out runs/mia-table [--only fedavg] [--dataset shapes:375]

With ``--artifacts`` it measures the artifact-level table instead: ``--attack
mia-loss,mia-artifact`` on every method that ships a bank or statistics
(elcfs, ccst in both style modes, gperxan, fedfd_a from a curious client,
fedlsi), one row per (method, artifact): its membership row's verdict, AUC,
advantage, TPR at 10% FPR, the holdout twin's and the positive control's
AUC, the records found verbatim, and the loss attack's AUC on the global
model of the same run beside it.

    python scripts/mia_table.py --artifacts --out runs/artifact-mia-table

Runs that already finished are read back, not redone. The table goes to ``docs/results/membership_<dataset>.md``
(``membership_artifacts_<dataset>.md`` with ``--artifacts``; ``--write PATH`` elsewhere) with the command and its
provenance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.api import evaluate
from fedaudit.audit.verdict import judge, membership_row_of
from fedaudit.run import run_directory
from fedaudit.run.results import Leakage, MembershipResult

import results_page  # scripts/ is on sys.path when run as python scripts/mia_table.py

METHODS = ("fedavg", "fedgala", "fedlsi")
ABOUT = ("`--attack mia` on `{dataset}`: quick profile, default target domain, seed 0, server attacker, every "
         "victim, 8 reference models per victim. AUC, advantage and TPR are means over victims; the verdict is the "
         "tier of the row that judges that target (the domain-level attack's: the participation row), by the rules "
         "of the commit named (⚠: fewer non-members than 1% FPR can resolve). LiRA's and RMIA's references replay "
         "the victim's rounds where the method declares its round recipe (fedavg) and train from scratch "
         "otherwise; the calibration column says how far they sit from the target (non-members from the OUT "
         "models / members from the IN models, in σ, after the attack took off the target's uniform lift over them, "
         "and before it).")
ARTIFACT_ABOUT = ("`--attack mia-loss,mia-artifact` on `{dataset}`: quick profile, default target domain, seed 0, "
                  "every victim; one row per (method, artifact) with the loss attack on the same run's global "
                  "model beside it. The verdict is the tier of the artifact's membership row, by the rules of the "
                  "commit named.")
# (label, method, options) of the artifact-level table
ARTIFACT_RUNS = (
    ("elcfs", "elcfs", {}),
    ("ccst single", "ccst", {"method_options": {"style": "single"}}),
    ("ccst overall", "ccst", {"method_options": {"style": "overall"}}),
    ("gperxan", "gperxan", {}),
    ("fedfd_a (client:clean)", "fedfd_a", {"attacker": "client:clean"}),
    ("fedlsi", "fedlsi", {}),
)


def run(out: Path, method: str, dataset: str, attack: str = "mia", **options) -> Path:
    return results_page.finished_run(out) or evaluate(method, out=str(out), dataset=dataset, attack=attack,
                                                      victim="all", **options).run_dir


def artifact_rows(run_dir: Path, label: str) -> list[str]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    verdict = {r["row"]: r["tier"] for r in judge(metrics, metrics["provenance"]["config"])}
    row_of = membership_row_of(metrics, metrics["provenance"]["config"])
    found = Leakage.of(metrics).membership()
    loss = [r.entry.auc for r in found if (r.variant, r.target) == ("loss", "global_model") and r.entry.auc is not None]
    beside = f"{sum(loss) / len(loss):.3f}" if loss else "–"

    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):.3f}" if values else "–"

    out = []
    for artifact, victims in _tables(found, "artifact").items():
        done = {v: e for v, e in victims.items() if "auc" in e}
        if not done:
            reason = next(iter(victims.values())).get("reason", "not run")
            out.append(f"| {label} | {artifact} | {verdict.get(row_of.get(('artifact', artifact), ''), '?')} | n/a: {reason} "
                       f"| | | | | | {beside} |")
            continue
        twin = [e["twin"]["auc"] for e in done.values() if "auc" in (e.get("twin") or {})]
        power = [e["power"]["auc"] for e in done.values() if "auc" in (e.get("power") or {})]
        exact = [e["exact_matches"]["members"] for e in done.values() if "exact_matches" in e]
        verbatim = f"{sum(exact)} of {sum(e['members'] for e in done.values())}" if exact else "–"
        out.append(f"| {label} | {artifact} | {verdict.get(row_of.get(('artifact', artifact), ''), '?')} | "
                   f"{mean([e['auc'] for e in done.values()])} | {mean([e['advantage'] for e in done.values()])} | "
                   f"{mean([e['tpr_at_fpr']['0.1']['tpr'] for e in done.values()])} | "
                   f"{mean(twin) if twin else 'n/a (client view)'} | {mean(power) if power else 'n/a (client view)'} | "
                   f"{verbatim} | {beside} |")
    return out


def _tables(found: list[MembershipResult], variant: str) -> dict[str, dict[str, dict]]:
    """target → victim → entry of one variant's stored results."""
    out: dict[str, dict[str, dict]] = {}
    for r in found:
        if r.variant == variant:
            out.setdefault(r.target, {})[r.victim] = r.entry.dump()  # as the file stores it
    return out


def rows(run_dir: Path, method: str) -> list[str]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # The verdict is a pure function of the stored evidence: judged here with the current rules, it is what a
    # run made now stores (runs made before a rule changed are not re-run for it).
    verdict = {r["row"]: r["tier"] for r in judge(metrics, metrics["provenance"]["config"])}
    row_of = membership_row_of(metrics, metrics["provenance"]["config"])
    out = []
    for variant in dict.fromkeys(r.variant for r in Leakage.of(metrics).membership()):
        for target, victims in _tables(Leakage.of(metrics).membership(), variant).items():
            done = {v: e for v, e in victims.items() if "auc" in e}
            row = row_of.get((variant, target), "")
            if not done:
                reason = next(iter(victims.values())).get("reason", "not run")
                out.append(f"| {method} | {variant} | {target} | {verdict.get(row, '?')} | n/a: {reason} | | | | |")
                continue
            auc = sum(e["auc"] for e in done.values()) / len(done)
            adv = sum(e["advantage"] for e in done.values()) / len(done)
            pmin = min(e["advantage_p_value"] for e in done.values())
            lvl = [e["tpr_at_fpr"]["0.01"] for e in done.values()]
            tpr = sum(x["tpr"] for x in lvl) / len(lvl)
            lo = min(x["tpr_interval"][0] for x in lvl)
            hi = max(x["tpr_interval"][1] for x in lvl)
            resolvable = all(x["resolvable"] for x in lvl)
            cal = [e["calibration"] for e in done.values() if "calibration" in e]
            calibration = results_page.calibration_cell(cal)
            e0 = next(iter(done.values()))
            out.append(f"| {method} | {variant} | {target} | {verdict.get(row, '?')} | {auc:.3f} | {adv:.3f} (p {pmin:.2g}) | "
                       f"{tpr:.3f} [{lo:.3f}, {hi:.3f}]{'' if resolvable else ' ⚠'} | {calibration} | "
                       f"{e0['n_members']} / {e0['n_nonmembers']} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mia-table"))
    parser.add_argument("--only", default="")
    parser.add_argument("--dataset", default="digits", help="digits (180 non-members per victim) or shapes:375 (1,051)")
    parser.add_argument("--artifacts", action="store_true", help="the artifact-level table (mia-artifact)")
    parser.add_argument("--write", type=Path, default=None, help="where the table goes (default under docs/results/)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    if args.artifacts:
        lines = ["| method | artifact | verdict (row) | AUC | advantage | TPR at 10% FPR | holdout twin AUC | "
                 "positive control AUC | members found verbatim | loss attack AUC, global model |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for label, method, options in ARTIFACT_RUNS:
            if not only or method in only:
                out = args.out / run_directory.safe_name(f"{label}-{args.dataset}")
                lines += artifact_rows(run(out, method, args.dataset, "mia-loss,mia-artifact", **options), label)
        results_page.write(f"membership_artifacts_{results_page.slug(args.dataset)}",
                           f"Membership inference against shared banks and statistics on `{args.dataset}`",
                           "\n".join(lines), ARTIFACT_ABOUT.format(dataset=args.dataset), path=args.write)
        return
    lines = ["| method | variant | target | verdict (row) | AUC (mean over victims) | advantage (smallest KS p) | "
             "TPR at 1% FPR [widest 95% CI] | calibration: non-members / members vs OUT / IN (σ) | members / non-members per victim |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        if not only or method in only:
            lines += rows(run(args.out / run_directory.safe_name(f"{method}-{args.dataset}"), method, args.dataset), method)
    results_page.write(f"membership_{results_page.slug(args.dataset)}", f"Membership inference on `{args.dataset}`",
                       "\n".join(lines), ABOUT.format(dataset=args.dataset), path=args.write)


if __name__ == "__main__":
    main()
