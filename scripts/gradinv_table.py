"""Inverting Gradients against FedAvg's last-round update on digits, without DP-SGD and at ε = 8.

    python scripts/gradinv_table.py --out runs/gradinv-table          # writes docs/results/gradinv.md

Runs (or reads back under ``--out``) ``fedaudit evaluate --method fedavg --attack gradinv --dataset digits`` and
the same with ``--dp-epsilon 8`` (quick profile, seed 0, every victim: 40 dummies per victim, 200 iterations) and
writes one row per run: unseen accuracy, then the mean over victims of the attack and (in brackets) its
random-update control — cosine to the real update, PSNR and SSIM of each reconstruction to the distinct member
Hungarian matching pairs it with, class fidelity — and the tier of the update's inversion row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedaudit.api import evaluate
from fedaudit.audit.verdict import judge

import results_page  # scripts/ is on sys.path when run as python scripts/gradinv_table.py

# label → (folder under --out, evaluate options)
RUNS = {"fedavg": ("no-dp", {}), "fedavg, `--dp-epsilon 8`": ("dp-epsilon-8", {"dp_epsilon": 8.0})}
ARTIFACT = "full_model:update"


def run(out: Path, options: dict[str, Any]) -> dict:
    run_dir = results_page.finished_run(out) or evaluate("fedavg", dataset="digits", attack="gradinv", victim="all",
                                                         out=str(out), device="cpu", **options).run_dir
    return json.loads((run_dir / "metrics.json").read_text())


def row(label: str, metrics: dict) -> str:
    entries = [e for e in metrics["leakage"]["gradinv"][ARTIFACT].values()
               if isinstance(e, dict) and e.get("status") == "attacked"]

    def pair(get, digits: int = 2) -> str:
        attack = sum(get(e, "attack") for e in entries) / len(entries)
        control = sum(get(e, "control") for e in entries) / len(entries)
        return f"{attack:.{digits}f} ({control:.{digits}f})"

    tiers = {r["row"]: r["tier"] for r in judge(metrics, metrics["provenance"]["config"])}
    return " | ".join([
        f"| {label}", f"{metrics['accuracy']['unseen_domain']:.3f}",
        pair(lambda e, side: e["cosine"][side]),
        pair(lambda e, side: e["metrics"]["matched"][side]["psnr_mean"], 1),
        pair(lambda e, side: e["metrics"]["matched"][side]["ssim_mean"], 3),
        pair(lambda e, side: e["metrics"]["class_fidelity"][side]),
        tiers.get("full_model↑", "?"), f"{metrics['provenance']['seconds']['wall']:.0f} s |"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/gradinv-table"))
    parser.add_argument("--write", type=Path, default=None, help="where the table goes (default docs/results/gradinv.md)")
    args = parser.parse_args()
    lines = ["| run | unseen acc | cosine to the real update | matched PSNR dB, mean | matched SSIM, mean | "
             "class fidelity | full_model↑ inversion row | wall |", "|---|---|---|---|---|---|---|---|"]
    lines += [row(label, run(args.out / folder, options)) for label, (folder, options) in RUNS.items()]
    results_page.write("gradinv", "Inverting Gradients against FedAvg's last-round update on digits", "\n".join(lines),
                       "`fedaudit evaluate --method fedavg --attack gradinv --dataset digits` and the same with "
                       "`--dp-epsilon 8` (the DP-SGD recipe): quick profile, seed 0, every victim, 40 dummies per "
                       "victim, 200 iterations. Each cell: the mean over the three victims, attack (random-update "
                       "control); the inversion row's tier is judged from the stored evidence by the rules of the "
                       "commit named; wall times as they ran.", path=args.write)


if __name__ == "__main__":
    main()
