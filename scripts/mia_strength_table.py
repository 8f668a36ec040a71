"""How strong fedaudit's membership attacks are: LOSS against LiRA and RMIA with from-scratch and replayed reference
models, on long local training and on data with enough non-members to read low false-positive rates.

    python scripts/mia_strength_table.py --out runs/mia-strength        # writes docs/results/membership_strength.md

Four runs of ``fedaudit evaluate --method fedavg --attack mia-loss,mia-lira,mia-rmia`` (quick profile, seed 0, the
server attacking every victim, 8 reference models per victim), each with ``--reference-training scratch`` and
``replay``:

* **long local training**: ``--dataset shapes --rounds 2 --local-epochs 15`` — each round trains 15 epochs on the
  victim's 525 members. Meant as a known-truth positive control, it is a weak one: shapes' rendered records
  generalise, and LOSS barely separates members (AUC 0.54-0.57 on the upload, measured 2026-11-28); a stronger
  control (fewer records, more epochs, or planted duplicates) is open;
* **low FPR**: the quick profile's 20 rounds × 3 local epochs on ``--dataset shapes:215 --split 0.2,0.1,0.7`` (301
  members and 1,054 non-members per victim, so 0.1% FPR allows one false positive per victim; a replay costs each
  reference one client's whole training, so the members are kept few).

One row per (case, attack, target): AUC, TPR at 1% and at 0.1% FPR with their 95% Clopper–Pearson intervals (the
mean over victims, and the widest interval), and the reference models' calibration (the mean offset of the target's
non-members from the OUT models and of its members from the IN models, in σ, of the signal the attack scored; in
brackets before it took off the target's uniform lift over its references, where it took one). Runs that already finished under
``--out`` are read back, not redone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.api import evaluate

import results_page  # scripts/ is on sys.path when run as python scripts/mia_strength_table.py

ATTACK = "mia-loss,mia-lira,mia-rmia"
CASES = {"overfit": {"dataset": "shapes", "rounds": 2, "local_epochs": 15},
         "low FPR": {"dataset": "shapes:215", "split": (0.2, 0.1, 0.7)}}
# the case's label in the table (its key names its run folders)
LABELS = {"overfit": "15 local epochs", "low FPR": "low FPR"}
TRAINING = ("scratch", "replay")
ROWS = (("loss", None), ("lira_online", "scratch"), ("lira_offline", "scratch"), ("rmia", "scratch"),
        ("lira_online", "replay"), ("lira_offline", "replay"), ("rmia", "replay"))
LEVELS = ("0.01", "0.001")


def run(out: Path, training: str, options: dict) -> dict:
    done = results_page.finished_run(out)
    run_dir = done or evaluate("fedavg", out=str(out), attack=ATTACK, victim="all", reference_training=training,
                               **options).run_dir
    return json.loads((run_dir / "metrics.json").read_text())


def cells(entries: list[dict]) -> list[str]:
    """AUC, TPR at each level with the widest interval, calibration, over one target's victims."""
    scored = [e for e in entries if "auc" in e]
    if not scored:
        return ["–"] * (2 + len(LEVELS))
    out = [f"{sum(e['auc'] for e in scored) / len(scored):.3f}"]
    for level in LEVELS:
        points = [e["tpr_at_fpr"][level] for e in scored]
        lo = min(p["tpr_interval"][0] for p in points)
        hi = max(p["tpr_interval"][1] for p in points)
        out.append(f"{sum(p['tpr'] for p in points) / len(points):.4f} [{lo:.4f}, {hi:.4f}]")
    out.append(results_page.calibration_cell([e["calibration"] for e in scored if "calibration" in e]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mia-strength"))
    parser.add_argument("--write", type=Path, default=None, help="where the table goes (default "
                                                                  "docs/results/membership_strength.md)")
    args = parser.parse_args()
    lines = ["| case | attack | references | target | AUC | TPR at 1% FPR [widest 95% CI] | TPR at 0.1% FPR "
             "[widest 95% CI] | calibration: non-members / members (σ; before the attack's shift) | members / non-members per victim |",
             "|---|---|---|---|---|---|---|---|---|"]
    walls = []
    for case, options in CASES.items():
        metrics = {t: run(args.out / f"{results_page.slug(case)}-{t}", t, options) for t in TRAINING}
        for t, m in metrics.items():
            seconds = m["provenance"].get("seconds", {})
            walls.append(f"{LABELS[case]}, {t}: {seconds.get('wall', float('nan')):.0f} s "
                         f"(training {seconds.get('local_train', float('nan')):.0f} s, attacks "
                         f"{seconds.get('attacks', float('nan')):.0f} s)")
        for variant, training in ROWS:
            mia = metrics[training or "replay"]["leakage"]["mia"][variant]
            for target in ("last_upload", "global_model"):
                entries = [e for e in mia.get(target, {}).values() if isinstance(e, dict)]
                counts = sorted({f"{e['members']} / {e['nonmembers']}" for e in entries if "members" in e})
                lines.append(f"| {LABELS[case]} | {variant} | {training or '–'} | {target} | {' | '.join(cells(entries))} | "
                             f"{', '.join(counts)} |")
    lines += ["", "Wall time per run, as it ran: " + "; ".join(walls) + "."]
    results_page.write("membership_strength", "How strong the membership attacks are: LOSS, LiRA and RMIA with "
                       "from-scratch and replayed references", "\n".join(lines),
                       "`fedaudit evaluate --method fedavg --attack mia-loss,mia-lira,mia-rmia` (quick profile, seed 0, "
                       "the server attacking every victim, 8 reference models per victim) with "
                       "`--reference-training scratch` and `replay`, on long local training (`--dataset "
                       "shapes --rounds 2 --local-epochs 15`) and with 1,054 non-members per victim (`--dataset "
                       "shapes:215 --split 0.2,0.1,0.7`). Means over the three victims; the "
                       "interval is the widest victim's. fedaudit calls a level resolved only with 10/level "
                       "non-members (10,000 at 0.1%), which no victim here has: read 0.1% as one false positive "
                       "allowed per victim.", path=args.write)


if __name__ == "__main__":
    main()
