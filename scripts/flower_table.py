"""Measure the README's Flower table: the same FedAvg audited in a Flower recording and in fedaudit's simulation.

Runs examples/flower_digits/run.py (Flower's FedAvg on digits through its simulation engine, recorded)
unless ``--recording`` already holds a recording, audits it with ``fedaudit audit``, runs
``fedaudit evaluate --method fedavg --dataset digits`` with the same attacks (a finished run under
``--out`` is read back), and prints one markdown row per (source, artifact) with the leakage table's
columns, then each membership row.

    python scripts/flower_table.py --recording runs/flower-digits --out runs/flower-table

The two federations share data, split, model, recipe and aggregation rule; they differ in batch order,
augmentation draws and initial weights' RNG, and Flower evaluates the global model every round (its
broadcasts are on the wire), so numbers should agree within their intervals, not to the digit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fedaudit.api import audit_recording, evaluate
from fedaudit.audit.verdict import membership_row_of
from fedaudit.run import run_directory
from fedaudit.run.results import RunMetrics
import results_page  # scripts/ is on sys.path when run as python scripts/flower_table.py
from leakage_table import rows

ATTACKS = "deepinversion,mia-loss"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flower_digits" / "run.py"


def finished(out: Path) -> Path | None:
    done = [d for d in sorted(out.glob("*")) if run_directory.is_complete(d)] if out.exists() else []
    return done[0] if done else None


def membership_rows(run_dir: Path, label: str) -> list[str]:
    """The loss attack's rows: AUC mean and range over victims, advantage with its smallest KS p-value."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    run = RunMetrics.from_json(metrics, run_dir / "metrics.json")
    verdict = {r.row: r.tier for r in run.rows()}
    row_of = membership_row_of(metrics, run.provenance.config)
    by_target: dict[str, list[dict]] = {}
    for r in run.results.membership():
        if r.variant == "loss" and r.entry.has("auc"):
            by_target.setdefault(r.target, []).append(r.entry.dump())  # as the file stores it
    out = []
    for target, entries in by_target.items():
        aucs = [e["auc"] for e in entries]
        best = max(entries, key=lambda e: e["advantage"])
        out.append(f"| {label} | loss | {target} | {verdict.get(row_of.get(('loss', target), ''), '?')} | "
                   f"{sum(aucs) / len(aucs):.3f} ({min(aucs):.3f}–{max(aucs):.3f}) | "
                   f"{best['advantage']:.3f} (p {min(e['advantage_p_value'] for e in entries):.2g}) |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", type=Path, default=Path("runs/flower-digits"))
    parser.add_argument("--out", type=Path, default=Path("runs/flower-table"))
    parser.add_argument("--write", type=Path, default=None, help="where the tables go (default docs/results/flower.md)")
    args = parser.parse_args()
    if not (args.recording / "wire.jsonl").exists():
        subprocess.run([sys.executable, str(EXAMPLE), "--out", str(args.recording)], check=True)
    audited = finished(args.out / "flower") or audit_recording(args.recording, attack=ATTACKS,
                                                               out=str(args.out / "flower"))[0]
    simulated = finished(args.out / "fedaudit") or evaluate("fedavg", dataset="digits", attack=ATTACKS,
                                                            out=str(args.out / "fedaudit")).run_dir
    both = (("Flower, recorded", audited), ("fedaudit, simulated", simulated))
    lines = ["| federation | attacker | artifact | verdict | domain attribution, macro (untrained; prior-only; twin; "
             "chance) | class fidelity (untrained; prior-only; twin; chance) | identifiability [95% CI], smallest p "
             "(untrained; prior-only; twin) | power (victims) | PSNR dB to nearest member (prior-only; untrained) | "
             "unseen acc |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row.replace("| fedavg |", f"| {label} |", 1) for label, run_dir in both
              for row in rows(run_dir, "fedavg", "server")]
    lines += ["", "| federation | variant | target | verdict (row) | AUC, mean over victims (range) | largest "
              "advantage (smallest KS p) |", "|---|---|---|---|---|---|"]
    lines += [row for label, run_dir in both for row in membership_rows(run_dir, label)]
    lines.append("")
    for label, run_dir in both:
        m = json.loads((run_dir / "metrics.json").read_text())
        c = m["communication"]
        lines.append(f"- {label}: bytes up {c['bytes_up']:,}, down {c['bytes_down']:,} over {c['rounds']} rounds "
                     f"({', '.join(c['declared'])}); wall {m['provenance']['seconds'].get('wall', 0):.0f} s")
    results_page.write("flower", "FedAvg audited in a Flower recording and in fedaudit's simulation", "\n".join(lines),
                       f"Both audited with `--attack {ATTACKS}` (server attacker, every victim): the Flower side is "
                       f"`examples/flower_digits/run.py`'s recording through `fedaudit audit`, the simulated side "
                       f"`fedaudit evaluate --method fedavg --dataset digits`. The verdicts are by the rules of the "
                       f"commit named.", path=args.write)


if __name__ == "__main__":
    main()
