"""The search behind fedaudit's DP-SGD recipe (``DP_RECIPE`` in fedaudit/config.py, issue 20).

    python scripts/dp_recipe_search.py --out runs/dp-recipe-search            # every stage, then the checks
    python scripts/dp_recipe_search.py --out runs/dp-recipe-search --stage batch

A coordinate search on the built-in ``digits`` data (fedavg, ``cnn`` with GroupNorm, the quick profile's
rounds), one ``fedaudit sweep`` grid per stage, each stage keeping the best value of the stages before it.
Points are ranked by **source-val accuracy** (the clients' own validation splits); the unseen domain is
printed but never used to choose, so nothing is tuned on the target. The clipping norm stays 1, so a
learning rate here is the recipe's ``DP_LR_TIMES_NORM``.

Stages (at ε = 8, δ = 1e-5):
  batch    — expected Poisson batch size × learning rate, one augmented view per record;
  epochs   — local epochs per round (fewer epochs: fewer steps to compose, less noise per step);
  train    — which weights DP-SGD trains (all; the encoder's last stage and the head; the head alone) × lr,
             the rest frozen at the seed's random initialisation (there are no pretrained digits weights);
  views    — augmentation multiplicity (views per record averaged before clipping);
then ``check``: the chosen recipe at ε = 10,000 (almost no noise) beside the same run without DP, which
shows whether clipping and step scaling alone cost accuracy (issue 20's first acceptance point).

Every point is an ordinary run directory (``fedaudit report`` opens it); a second invocation skips the
points already complete. The table printed at the end is what the README's DP section quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedaudit.grid import Grid, run_grid

BASE: dict[str, Any] = {"method": "fedavg", "dataset": "digits", "model": "cnn", "norm": "gn", "attack": "none",
                        "seed": 0, "dp_max_grad_norm": 1.0}
EPSILON = 8.0
# Each stage: the axes it crosses; values not on an axis come from the stages before (or the first value).
STAGES: dict[str, dict[str, list[Any]]] = {
    "batch": {"batch_size": [32, 64, 128, 256], "lr": [0.1, 0.5, 2.0]},
    "epochs": {"local_epochs": [1, 3]},
    "train": {"dp_train": ["all", "last", "head"], "lr": [0.5, 2.0, 8.0]},
    "views": {"dp_augmentations": [1, 2, 4]},
}
START: dict[str, Any] = {"local_epochs": 3, "dp_train": "all", "dp_augmentations": 1, "momentum": 0.9}


def source_val(run_dir: Path) -> tuple[float, float]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    accuracy = metrics["accuracy"]
    return float(accuracy["source_val"]["mean"]), float(accuracy["unseen_domain"])


def run_stage(out: Path, name: str, fixed: dict[str, Any], axes: dict[str, list[Any]], jobs: int,
              threads: int) -> list[dict[str, Any]]:
    outcome = run_grid(Grid(fixed, axes, source=f"stage {name}"), out / name, jobs=jobs, threads=threads)
    rows = []
    for row in outcome.index["points"]:
        if row["status"] != "complete":
            print(f"  {row['name']}: {row['status']} ({row.get('error')})", file=sys.stderr)
            continue
        sv, unseen = source_val(out / name / row["run_dir"])
        rows.append({"stage": name, **{k: row["options"][k] for k in axes}, "source_val": sv, "unseen": unseen,
                     "seconds": row.get("seconds")})
    return rows


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    head = [*keys, "source-val", "unseen (not used)", "s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        seconds = "" if r.get("seconds") is None else f"{r['seconds']:.0f}"
        lines.append("| " + " | ".join([*(str(r[k]) for k in keys), f"{r['source_val']:.3f}", f"{r['unseen']:.3f}",
                                        seconds]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/dp-recipe-search")
    parser.add_argument("--stage", choices=[*STAGES, "check", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default: the quick profile's)")
    parser.add_argument("--jobs", type=int, default=2, help="points at once (2 on a 2-core machine)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per point")
    args = parser.parse_args(argv)
    out = Path(args.out)
    base = {**BASE, **({"rounds": args.rounds} if args.rounds else {})}
    chosen = dict(START)
    chosen["lr"], chosen["batch_size"] = STAGES["batch"]["lr"][0], STAGES["batch"]["batch_size"][0]
    for name, axes in STAGES.items():
        fixed = {**base, **{k: v for k, v in chosen.items() if k not in axes}, "dp_epsilon": EPSILON}
        if args.stage not in (name, "all") and not (out / name / "sweep.json").is_file():
            continue
        rows = run_stage(out, name, fixed, axes, args.jobs, args.threads)
        if not rows:
            return 1
        best = max(rows, key=lambda r: r["source_val"])
        chosen.update({k: best[k] for k in axes})
        print(f"\n## stage {name} (ε = {EPSILON:g}; fixed: "
              f"{', '.join(f'{k}={v}' for k, v in fixed.items() if k not in BASE)})\n")
        print(table(rows, list(axes)))
        print(f"\nbest: {', '.join(f'{k}={best[k]}' for k in axes)} (source-val {best['source_val']:.3f})")
    if args.stage in ("check", "all"):
        check = run_stage(out, "check", {**base, **chosen}, {"dp_epsilon": [10_000.0]}, args.jobs, args.threads)
        # the same method without DP trains with the non-private defaults, as --dp-sweep's ∞ point does
        plain = run_stage(out, "check-no-dp", base, {"dp_epsilon": [None]}, args.jobs, args.threads)
        print("\n## check: the recipe with almost no noise, and without DP\n")
        print(table([*check, *plain], ["stage", "dp_epsilon"]))
    print(f"\nrecipe: {json.dumps(chosen)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
