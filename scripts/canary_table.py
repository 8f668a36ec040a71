"""The canary audit on digits: input canaries without DP, and input and white-box gradient canaries under DP-SGD.

    python scripts/canary_table.py --out runs/canary-table            # writes docs/results/canaries.md

Runs (or reads back under ``--out``) ``fedaudit evaluate --method fedavg --dataset digits --attack canary`` and
``fedaudit evaluate --method fedavg --norm gn --dataset digits --dp-epsilon 8 --attack canary`` (quick profile,
seed 0, every victim) and writes two tables: per victim the input canaries' guesses, ε lower bound and power
with the ε the accountant spent; and, under DP, the gradient canaries' (ε, δ) bound, f-DP bound, the bounds a
mechanism spending exactly the claimed ε would give the same canaries, the audit's ceiling and the one-shot
estimate — each beside the verdict row that judges the DP claim.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedaudit.api import evaluate
from fedaudit.audit.verdict import judge
from fedaudit.run.results import Leakage

import results_page  # scripts/ is on sys.path when run as python scripts/canary_table.py

RUNS = {  # label → (folder under --out, evaluate options)
    "no DP": ("no-dp", {}),
    "`--dp-epsilon 8`": ("dp-epsilon-8", {"norm": "gn", "dp_epsilon": 8.0}),
}
COMMAND = "fedaudit evaluate --method fedavg --dataset digits --attack canary"


def run(out: Path, options: dict[str, Any]) -> dict:
    run_dir = results_page.finished_run(out) or evaluate("fedavg", dataset="digits", attack="canary", victim="all",
                                                         out=str(out), device="cpu", **options).run_dir
    return json.loads((run_dir / "metrics.json").read_text())


def input_rows(label: str, metrics: dict) -> list[str]:
    spent = ((metrics.get("privacy") or {}).get("dp") or {}).get("clients") or {}
    out = []
    for victim, e in Leakage.of(metrics).canary.items():
        if e.correct is None:
            continue
        eps = spent.get(victim, {}).get("epsilon_spent")
        out.append(f"| {label} | {victim} | {e.correct} / {e.guesses} | {e.epsilon_lower_bound:.2f} | "
                   f"{e.epsilon_max_certifiable:.2f} | {'–' if eps is None else f'{eps:.2f}'} | "
                   f"{metrics['accuracy']['unseen_domain']:.3f} |")
    return out


def gradient_rows(metrics: dict) -> list[str]:
    out = []
    nan = float("nan")
    for victim, e in Leakage.of(metrics).canary_gradient.items():
        if e.correct is None or e.gdp is None or e.estimate is None:
            continue
        g = e.gdp
        out.append(f"| {victim} | {e.correct} / {e.guesses} | {e.epsilon_lower_bound:.2f} | "
                   f"{g.mu_lower_bound:.3f} ({g.epsilon_if_gaussian:.2f}) | "
                   f"{nan if e.ideal_bound is None else e.ideal_bound:.2f}, "
                   f"{nan if e.ideal_gdp_mu is None else e.ideal_gdp_mu:.3f} | "
                   f"{e.epsilon_max_certifiable:.2f}, {g.mu_max_certifiable:.2f} | {e.estimate.epsilon:.2f} | "
                   f"{e.p_claim:.2g} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/canary-table"))
    parser.add_argument("--write", type=Path, default=None, help="where the tables go (default docs/results/canaries.md)")
    args = parser.parse_args()
    found = {label: run(args.out / folder, options) for label, (folder, options) in RUNS.items()}
    lines = ["| run | victim | correct / guesses | ε lower bound (95%, δ 1e-5) | power | ε spent | unseen acc |",
             "|---|---|---|---|---|---|---|"]
    for label, metrics in found.items():
        lines += input_rows(label, metrics)
    private = found["`--dp-epsilon 8`"]
    tiers = {r["row"]: r["tier"] for r in judge(private, private["provenance"]["config"])}
    lines += ["", "Gradient canaries (white-box, in each victim's DP-SGD) in the `--dp-epsilon 8` run; the DP claim's "
              f"verdict rows: {', '.join(f'{k} {v}' for k, v in tiers.items() if 'canary' in k) or 'none'}.", "",
              "| victim | correct / guesses | (ε, δ) bound (95%) | f-DP bound: μ ≥ (ε if Gaussian) | a mechanism at "
              "exactly the claim: ε, μ | ceiling: ε, μ | estimate (not a bound) | p of the claim |",
              "|---|---|---|---|---|---|---|---|"]
    lines += gradient_rows(private)
    walls = ", ".join(f"{label} {m['provenance']['seconds']['wall']:.0f} s" for label, m in found.items())
    results_page.write("canaries", "The canary audit on digits", "\n".join(lines),
                       f"`{COMMAND}` and `fedaudit evaluate --method fedavg --norm gn --dataset digits --dp-epsilon 8 "
                       f"--attack canary` (quick profile, seed 0, every victim; the DP run uses the DP-SGD recipe). "
                       f"Wall times as they ran: {walls}.",
                       path=args.write)


if __name__ == "__main__":
    main()
