"""Accuracy on the built-in data: FedAvg with every domain held out in turn, on ``shapes`` and ``digits``.

    python scripts/accuracy_table.py --out runs/accuracy-table        # writes docs/results/accuracy.md

Runs ``fedaudit evaluate --method fedavg --dataset D --target-domain all --attack none`` (quick profile: ``cnn``
with BatchNorm, 32 px, 20 rounds × 3 local epochs, SGD lr 0.01, seed 0) for each dataset, or reads back a
finished run under ``--out``, and writes one row per unseen target with the selected round, then each dataset's
mean, with the command and its provenance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.api import evaluate
from fedaudit.run import run_directory

import results_page  # scripts/ is on sys.path when run as python scripts/accuracy_table.py

DATASETS = {"shapes": 7, "digits": 10}  # dataset → classes (chance is 1 / classes)
COMMAND = "fedaudit evaluate --method fedavg --dataset {dataset} --target-domain all --attack none"


def run(out: Path, dataset: str) -> Path:
    """The finished all-targets run under ``out``, or a new one."""
    done = [p.parent for p in sorted(out.glob("*/COMPLETE")) if (p.parent / "metrics.json").exists()]
    if done:
        return done[-1]
    return evaluate("fedavg", dataset=dataset, target_domain="all", attack="none", out=str(out), device="cpu").run_dir


def rows(run_dir: Path, dataset: str) -> list[str]:
    """One row per unseen target (its sub-directory's metrics.json), then the mean over targets."""
    per_target = [json.loads(p.read_text()) for p in sorted(run_dir.glob("*/metrics.json"))]
    config = run_directory.read_json(run_dir / "config.json")
    order = {t: i for i, t in enumerate(config["targets"])}
    per_target.sort(key=lambda m: order[m["target_domain"]])
    out = []
    for i, m in enumerate(per_target):
        acc = m["accuracy"]
        label = f"{dataset} (chance {1 / DATASETS[dataset]:.3f})" if i == 0 else ""
        norm = m["provenance"]["config"]["norm"] if i == 0 else ""
        out.append(f"| {label} | {norm} | {m['target_domain']} | {acc['unseen_domain']:.3f} | "
                   f"{acc['source_val']['mean']:.3f} | {acc['selected_round']} |")
    unseen = sum(m["accuracy"]["unseen_domain"] for m in per_target) / len(per_target)
    source = sum(m["accuracy"]["source_val"]["mean"] for m in per_target) / len(per_target)
    out.append(f"| | | **mean** | **{unseen:.3f}** | **{source:.3f}** | |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/accuracy-table"))
    parser.add_argument("--write", type=Path, default=None, help="where the table goes (default docs/results/accuracy.md)")
    args = parser.parse_args()
    lines = ["| dataset | norm | unseen target | unseen acc | mean source-val acc | selected round |",
             "|---|---|---|---|---|---|"]
    walls = []
    for dataset in DATASETS:
        run_dir = run(args.out / dataset, dataset)
        lines += rows(run_dir, dataset)
        seconds = [json.loads(p.read_text())["provenance"]["seconds"]["wall"] for p in run_dir.glob("*/metrics.json")]
        low, high = round(min(seconds)), round(max(seconds))
        span = f"{low}" if low == high else f"{low}–{high}"
        walls.append(f"{dataset} {span} s per target")
    commands = " and ".join(f"`{COMMAND.format(dataset=d)}`" for d in DATASETS)
    results_page.write("accuracy", "Accuracy on the built-in data", "\n".join(lines),
                       f"FedAvg, quick profile (`cnn` with BatchNorm, 32 px, 20 rounds × 3 local epochs, SGD lr 0.01, "
                       f"seed 0), each domain held out in turn: {commands}. The selected round is the one with the "
                       f"best mean source-val accuracy (the unseen domain never chooses). Wall time as it ran: "
                       f"{'; '.join(walls)}.", path=args.write)


if __name__ == "__main__":
    main()
