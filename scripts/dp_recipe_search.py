"""The search behind fedaudit's DP-SGD recipe (``DP_RECIPE`` in fedaudit/run/config.py, issue 20).

    python scripts/dp_recipe_search.py --out runs/dp-recipe-search            # every stage, then the checks
    python scripts/dp_recipe_search.py --out runs/dp-recipe-search --stage batch

A coordinate search on the built-in ``digits`` data (fedavg, ``cnn`` with GroupNorm, the quick profile's
rounds), one ``fedaudit sweep`` grid per stage, each stage keeping the best value of the stages before it.
Points are ranked by **source-val accuracy** (the clients' own validation splits); the unseen domain is
printed but never used to choose, so nothing is tuned on the target. The clipping norm stays 1, so a
learning rate here is the recipe's ``DP_LR_TIMES_NORM``.

Stages (at ε = 8, δ = 1e-5):
  batch    — expected Poisson batch size × learning rate, one augmented view per record;
  lower-lr — a learning rate below the batch stage's lowest (which won it);
  epochs   — one local epoch per round instead of the quick profile's 3 (fewer steps to compose: less
             noise per step);
  train    — which weights DP-SGD trains (the encoder's last stage and the head, or the head alone) × lr,
             the rest frozen at the seed's random initialisation (there are no pretrained digits weights);
  views    — augmentation multiplicity (2 or 4 views per record averaged before clipping);
  batch-low-noise — the batch again at ε = 10,000 with the clean step: where noise is small, fewer steps cost
             more than noise, and this sets how much noise per step a batch may leave (the target);
  steps    — the shipped recipe (no batch given) at ε = 10,000 and 1,000, where a batch meets the target,
             allowed the method's local steps or up to twice them (``--dp-max-step-factor 1`` / ``2``), on
             seeds 0 and 1, beside the run without DP on the same seeds: what the extra steps buy where the
             noise leaves room (DP_MAX_STEP_FACTOR);
each stage's table also lists the incumbent (the best of the stages before), which stays a candidate;
a later stage's value replaces the incumbent only if it beats it by more than one standard error of the
source-val accuracy (the simpler, earlier choice stands within the noise). Then ``clean``: a control with
the noise taken out (σ = 0; the DP path's Poisson batches and clipping at norm 1, batch 32) over the
learning rate, which finds the step clipping needs when noise is no limit. The recipe's step is that clean
one, shrunk by √(noise-to-signal target / ratio) when the noise cannot be batched below the target —
the curve through both optima (fedaudit.simulation.dp_sgd.choose_batch). Then ``check``: fedaudit's
default recipe (``DP_RECIPE``, set from the stages) at ε = 10,000, 8 and 1, beside the run without DP;
at ε = 10,000 it shows whether clipping and step scaling alone cost accuracy (issue 20's first acceptance
point).

Every point is an ordinary run directory (``fedaudit report`` opens it); a second invocation skips the
points already complete. The tables go to ``docs/results/dp_recipe_<stage>.md`` with the command and its
provenance; docs/dp.md's DP section reads them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedaudit.run.config import OPTIONS
from fedaudit.sweeps.grid import Grid, run_grid

import results_page  # scripts/ is on sys.path when run as python scripts/dp_recipe_search.py

BASE: dict[str, Any] = {"method": "fedavg", "dataset": "digits", "model": "cnn", "norm": "gn", "attack": "none",
                        "seed": 0, "dp_max_grad_norm": 1.0}
EPSILON = 8.0
# Each stage: the axes it crosses; values not on an axis come from the stages before (or the first value).
# The incumbent (the best so far) stays a candidate of every later stage, so its value is not run again.
STAGES: dict[str, dict[str, list[Any]]] = {
    "batch": {"batch_size": [32, 64, 128, 256], "lr": [0.1, 0.5, 2.0]},
    "lower-lr": {"lr": [0.03]},  # the batch stage's best lr was its lowest
    "epochs": {"local_epochs": [1]},
    "train": {"dp_train": ["last", "head"], "lr": [0.1, 0.5, 2.0]},
    "views": {"dp_augmentations": [2, 4]},
}
START: dict[str, Any] = {"local_epochs": 3, "dp_augmentations": 1, "momentum": 0.9}  # --dp-train: its default, all


VAL_RECORDS = 135  # digits' source-val records: 3 source domains × 45 (the 0.1 val share of ~450 per domain)


def standard_error(accuracy: float) -> float:
    """One binomial standard error of a source-val accuracy: a later stage must beat the incumbent by more."""
    return (accuracy * (1 - accuracy) / VAL_RECORDS) ** 0.5


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
        lines.append("| " + " | ".join([*(str(r.get(k, "—")) for k in keys), f"{r['source_val']:.3f}", f"{r['unseen']:.3f}",
                                        seconds]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/dp-recipe-search")
    parser.add_argument("--stage", choices=[*STAGES, "batch-low-noise", "steps", "clean", "check", "all"],
                        default="all")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default: the quick profile's)")
    parser.add_argument("--jobs", type=int, default=2, help="points at once (2 on a 2-core machine)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per point")
    args = parser.parse_args(argv)
    out = Path(args.out)
    page: list[str] = []

    def say(text: str) -> None:  # printed as each stage ends, and kept for the results page
        print(text, flush=True)
        page.append(text)

    base = {**BASE, **({"rounds": args.rounds} if args.rounds else {})}
    chosen = dict(START)
    chosen["lr"], chosen["batch_size"] = STAGES["batch"]["lr"][0], STAGES["batch"]["batch_size"][0]
    incumbent: dict[str, Any] | None = None
    for name, axes in STAGES.items():
        fixed = {**base, **{k: v for k, v in chosen.items() if k not in axes}, "dp_epsilon": EPSILON}
        if args.stage not in (name, "all") and not (out / name / "sweep.json").is_file():
            continue
        rows = run_stage(out, name, fixed, axes, args.jobs, args.threads)
        if not rows:
            return 1
        candidates = rows + ([{**incumbent, **{k: chosen.get(k, OPTIONS[k].default) for k in axes},
                                    "stage": "incumbent"}] if incumbent else [])
        best = max(candidates, key=lambda r: r["source_val"])
        if incumbent and best["source_val"] - incumbent["source_val"] <= standard_error(incumbent["source_val"]):
            best = candidates[-1]  # within the noise of the val split: keep what the earlier stages chose
        chosen.update({k: best[k] for k in axes})
        incumbent = best
        say(f"\n## stage {name} (ε = {EPSILON:g}; fixed: "
              f"{', '.join(f'{k}={v}' for k, v in fixed.items() if k not in BASE)})\n")
        say(table(candidates, list(axes)))
        say(f"\nbest: {', '.join(f'{k}={best[k]}' for k in axes)} (source-val {best['source_val']:.3f})")
    if args.stage in ("batch-low-noise", "all"):
        # The batch where noise is small: ε = 10,000 (σ ≈ 0.06–0.07), the clean step (lr 0.5, no shrink, as a
        # given --batch-size turns it off). With the ε = 8 stages' "all records" it sets the batch target:
        # the largest ratio a batch may leave (DP_NOISE_TO_SIGNAL, fedaudit.simulation.dp_sgd.choose_batch).
        low = run_stage(out, "batch-low-noise", {**base, **START, "dp_epsilon": 10_000.0, "lr": 0.5},
                        {"batch_size": [32, 64, 128, 256]}, args.jobs, args.threads)
        say("\n## batch-low-noise: ε = 10,000, lr 0.5 (the clean step), noise-to-signal per step in metrics.json\n")
        say(table(low, ["batch_size"]))
    if args.stage in ("steps", "all"):
        # The recipe as shipped (no batch given, so the noise target picks it) where the target is met; a given
        # --dp-max-step-factor is the only change. Two seeds: the choice is a rule for every run, not one draw.
        recipe = {k: v for k, v in base.items() if k not in ("dp_max_grad_norm", "seed")}
        steps = run_stage(out, "steps", recipe, {"seed": [0, 1], "dp_epsilon": [10_000.0, 1_000.0],
                                                 "dp_max_step_factor": [1, 2]}, args.jobs, args.threads)
        steps += run_stage(out, "steps-no-dp", recipe, {"seed": [0, 1]}, args.jobs, args.threads)
        say("\n## steps: the recipe at ε = 10,000 and 1,000 with the method's local steps or up to twice them\n")
        say(table(steps, ["seed", "dp_epsilon", "dp_max_step_factor"]))
    if args.stage in ("clean", "all"):
        # A control, not a private run: the DP path (Poisson batches, per-record clipping at norm 1) with the
        # noise taken out, to find the step clipping needs when noise is no limit. In this process only.
        import fedaudit.simulation.dp_sgd

        noise_for = fedaudit.simulation.dp_sgd.noise_for
        fedaudit.simulation.dp_sgd.noise_for = lambda *a, **k: 0.0
        try:
            clean = run_stage(out, "clean", {**base, "dp_epsilon": 10_000.0, "batch_size": 32, "dp_augmentations": 1},
                              {"lr": [0.1, 0.5, 2.0]}, 1, args.threads * args.jobs)
        finally:
            fedaudit.simulation.dp_sgd.noise_for = noise_for
        say("\n## clean: the DP path without noise (σ = 0, a control), batch 32 (the non-private one)\n")
        say(table(clean, ["lr"]))
    if args.stage in ("check", "all"):
        # The recipe as fedaudit's defaults now hold it (set DP_RECIPE from the stages above first): no recipe
        # option is given, so each point trains as `fedaudit evaluate --dp-epsilon E` would.
        check = run_stage(out, "check", {k: v for k, v in base.items() if k != "dp_max_grad_norm"},
                          {"dp_epsilon": [10_000.0, EPSILON, 1.0, None]}, args.jobs, args.threads)
        say("\n## check: the default recipe at ε = 10,000 (little noise), 8 and 1, and the run without DP\n")
        say(table(check, ["dp_epsilon"]))
    if incumbent is not None:  # an ε = 8 stage ran (or was found finished): what they chose together
        say(f"\nthe ε = {EPSILON:g} stages' choice (the shipped recipe turns it into a rule: "
              f"fedaudit.simulation.dp_sgd.choose_batch): {json.dumps(chosen)}")
    results_page.write(f"dp_recipe_{args.stage}", f"The DP-SGD recipe search: {args.stage}", "\n".join(page),
                       "fedavg on `digits`, `cnn` with GroupNorm, the quick profile's rounds, seed 0 unless a table "
                       "names seeds; every point an ordinary run, ranked by source-val accuracy only (the unseen "
                       f"column is never used to choose). {args.jobs} point(s) at once, {args.threads} torch "
                       "thread(s) each; seconds per point as they ran.", echo=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
