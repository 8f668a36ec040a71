"""The plain-PyTorch example recorded and audited: the verdict a reviewer reads, as a table.

    python scripts/pytorch_example_table.py --out runs/pt-example    # writes docs/results/pytorch_example.md

Runs the README's two commands for auditing one's own deployment — ``python -m examples.pytorch_fedavg.run --out
REC`` (a hand-written FedAvg loop, 5 rounds × 2 epochs, recorded) and ``fedaudit audit REC --model
examples.pytorch_fedavg.net:Net`` (the attacks ``auto`` chooses) — or reads back what ``--out`` already holds,
and writes one row per verdict row: what it is about, its tier and the short form written from its facts,
with the recording's verification status, its digest and the deployed model's unseen accuracy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fedaudit.api import audit_recording

import results_page  # scripts/ is on sys.path when run as python scripts/pytorch_example_table.py

MODEL = "examples.pytorch_fedavg.net:Net"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/pt-example"))
    parser.add_argument("--write", type=Path, default=None,
                        help="where the table goes (default docs/results/pytorch_example.md)")
    args = parser.parse_args()
    recording, audits = args.out.resolve() / "recording", args.out.resolve() / "audit"
    if not (recording / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "examples.pytorch_fedavg.run", "--out", str(recording)], check=True,
                       cwd=results_page.ROOT)
    run_dir = results_page.finished_run(audits) or audit_recording(recording, model=MODEL, out=str(audits))[0]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    lines = ["| row | tier | short form (the row's deciding facts) |", "|---|---|---|"]
    for row in metrics["verdict"]:
        lines.append(f"| {row['title']} | {row['tier'].replace('_', ' ').upper()} | {row['short']} |")
    verification = metrics["provenance"]["recording"]["verification"]
    results_page.write("pytorch_example", "The plain-PyTorch example, recorded and audited", "\n".join(lines),
                       f"`python -m examples.pytorch_fedavg.run --out REC` then `fedaudit audit REC --model {MODEL}` "
                       f"(attacks chosen by `auto`: {metrics['provenance']['config']['attack']}). Recording "
                       f"{verification['status']} ({verification['messages']} message files, {verification['rounds']} "
                       f"rounds, {verification['clients']} clients; ledger sha256 {verification['ledger_sha256'][:16]}…); "
                       f"the deployed model's unseen accuracy {metrics['accuracy']['unseen_domain']:.3f}; audit wall "
                       f"time {metrics['provenance']['seconds']['wall']:.0f} s as it ran.", path=args.write)


if __name__ == "__main__":
    main()
