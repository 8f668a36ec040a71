"""The privacy–utility curve on digits: one DP sweep with membership inference, as a table.

    python scripts/dp_curve_table.py --out runs/dp-curve                 # writes the page dp_curve in docs/results/

Runs ``fedaudit evaluate --method fedavg --dataset digits --dp-sweep 1,2,4,8,inf --attack mia`` (or reads back a
finished sweep under ``--out``) and writes one row per ε: source-val and unseen accuracy, the largest AUC over
the victims of each membership attack on the final global model (the domain-level one included), and the tiers
of the released model's two rows — records (loss, LiRA, RMIA) and participation (the domain-level attack against
its domain twins; issue 47) — judged from each point's stored evidence by the rules of the commit the page names.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.audit.verdict import judge, membership_row_of
from fedaudit.run import run_directory
from fedaudit.run.results import Leakage
from fedaudit.sweeps.dp_sweep import parse_epsilons, sweep_dp

import results_page  # scripts/ is on sys.path when run as python scripts/dp_curve_table.py

VARIANTS = ("loss", "lira_online", "lira_offline", "rmia")


def points(out: Path, epsilons: str) -> list[dict]:
    """Each point's metrics, in the sweep's order: a finished sweep under ``out`` read back, or a new one."""
    done = results_page.finished_run(out)
    if done:
        index = run_directory.read_json(done / "sweep.json")
        return [json.loads((done / p["run_dir"] / "metrics.json").read_text()) for p in index["points"]]
    return sweep_dp(parse_epsilons(epsilons), "fedavg", dataset="digits", attack="mia", out=str(out)).metrics


def row(metrics: dict) -> str:
    config = metrics["provenance"]["config"]
    tiers = {r["row"]: r["tier"] for r in judge(metrics, config)}
    row_of = membership_row_of(metrics, config)
    aucs: dict[str, list[float]] = {}
    for r in Leakage.of(metrics).membership():
        if r.target == "global_model" and r.entry.auc is not None:
            aucs.setdefault(r.variant, []).append(r.entry.auc)

    def best(variant: str) -> str:
        return f"{max(aucs[variant]):.3f}" if aucs.get(variant) else "–"

    eps = config.get("dp_epsilon")
    acc = metrics["accuracy"]
    # the released model's records row judges every record-level attack on it; the domain-level attack has the
    # participation row, judged against its domain twins (issue 47)
    records_tier = tiers.get(row_of.get(("loss", "global_model"), ""), "?")
    participation_tier = tiers.get("participation:global_model", "?")
    return (f"| {'∞ (no DP)' if eps is None else f'{eps:g}'} | {acc['source_val']['mean']:.3f} | "
            f"{acc['unseen_domain']:.3f} | {best('loss')} | {best('lira_online')} / {best('lira_offline')} | "
            f"{best('rmia')} | {best('domain')} | {records_tier} | {participation_tier} | "
            f"{metrics['provenance']['seconds']['wall']:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/dp-curve"))
    parser.add_argument("--epsilons", default="1,2,4,8,inf")
    parser.add_argument("--write", type=Path, default=None, help="where the table goes (default: the page --name in docs/results/)")
    parser.add_argument("--name", default="dp_curve", help="the page's name under docs/results/")
    args = parser.parse_args()
    lines = ["| ε | source-val | unseen | loss AUC | LiRA online / offline AUC | RMIA AUC | domain-level AUC | "
             "released model: records row | participation row | wall |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row(m) for m in points(args.out, args.epsilons)]
    results_page.write(args.name, "The privacy–utility curve on digits", "\n".join(lines),
                       f"`fedaudit evaluate --method fedavg --dataset digits --dp-sweep {args.epsilons} --attack mia` "
                       f"(quick profile, GroupNorm at every point, seed 0, server attacker, every victim). AUCs are the "
                       f"largest over the three victims, on the final global model; wall times as they ran.",
                       path=args.write)


if __name__ == "__main__":
    main()
