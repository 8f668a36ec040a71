"""The ceiling is the data: the DP-SGD plan the recipe picks for a digits client at each ε.

    python scripts/dp_plan_table.py                                    # writes docs/results/dp_plan.md

For one ``digits`` client (225 training records) training fedaudit's ``cnn`` with GroupNorm (every weight
trained) over the quick profile's 20 rounds × 3 local epochs at δ = 1e-5, this asks
:func:`fedaudit.simulation.dp_sgd.choose_batch` — what a run calls, with the recipe's settings — for the plan
at each ε: the batch, how many times the method's steps it runs, σ from the tight accountant, the noise-to-signal
per step (σ·√d / expected batch, in clipping norms) and the step the recipe takes. Nothing trains; each run's
``metrics.json`` stores the same plan under ``privacy.dp.clients.<domain>``.
"""

from __future__ import annotations

from fedaudit.models import build_model
from fedaudit.run.config import DP_LR_TIMES_NORM, DP_MAX_STEP_FACTOR, DP_NOISE_TO_SIGNAL, DP_RECIPE
from fedaudit.simulation.dp_sgd import choose_batch

import results_page  # scripts/ is on sys.path when run as python scripts/dp_plan_table.py

RECORDS, BATCH, ROUNDS, DELTA = 225, 32, 20, 1e-5
EPSILONS = (1, 2, 4, 8, 100, 1_000, 10_000)


def main() -> None:
    model = build_model("cnn", 10, 32, "gn")
    trained = sum(p.numel() for p in model.parameters())
    lines = ["| ε | batch the recipe picks | steps per round | σ | noise-to-signal per step | step (lr) |",
             "|---|---|---|---|---|---|"]
    for eps in EPSILONS:
        plan = choose_batch(RECORDS, BATCH, DP_RECIPE["local_epochs"], None, ROUNDS, float(eps), DELTA, trained,
                            DP_NOISE_TO_SIGNAL, DP_MAX_STEP_FACTOR)
        batch = "225 (all)" if plan.batch_size >= RECORDS else str(plan.batch_size)
        passes = "" if plan.step_factor == 1 else f", {plan.step_factor}× the passes"
        lines.append(f"| {eps:,} | {batch}{passes} | {plan.steps_per_round} | {plan.noise_multiplier:.3g} | "
                     f"{plan.noise_to_signal(trained):.3g} | {DP_LR_TIMES_NORM * plan.lr_scale:.2g} |")
    results_page.write("dp_plan", "The DP-SGD plan the recipe picks for a digits client", "\n".join(lines),
                       f"`choose_batch` for {RECORDS} records, batch {BATCH}, {DP_RECIPE['local_epochs']} local epochs, "
                       f"{ROUNDS} rounds, δ = {DELTA:g}, the `cnn` with GroupNorm ({trained:,} trained parameters), "
                       f"noise-to-signal target {DP_NOISE_TO_SIGNAL:g}, at most {DP_MAX_STEP_FACTOR}× the method's "
                       f"steps, lr {DP_LR_TIMES_NORM:g} per unit of clipping norm (clipping norm 1). Computed, not "
                       f"trained: the same on every machine.", reads_runs=False)


if __name__ == "__main__":
    main()
