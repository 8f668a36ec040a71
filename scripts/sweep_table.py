"""The example sweep: ``fedaudit sweep examples/grid.toml`` run, then run again, as a table.

    python scripts/sweep_table.py --out runs/sweep-example            # writes docs/results/sweep_example.md

Runs the grid (2 methods × 2 unseen domains on digits, 2 rounds, the loss attack) into ``--out`` — a folder
that already holds it runs only what is not COMPLETE — then the same command again, and writes one row per
point (status, unseen accuracy, the verdict's headline, seconds, as the sweep's console table shows them) with the
time of each invocation.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fedaudit.cli.output import point_summary
from fedaudit.sweeps.grid import load_grid, run_grid

import results_page  # scripts/ is on sys.path when run as python scripts/sweep_table.py

GRID = results_page.ROOT / "examples" / "grid.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/sweep-example"))
    parser.add_argument("--write", type=Path, default=None,
                        help="where the table goes (default docs/results/sweep_example.md)")
    args = parser.parse_args()
    seconds = []
    for _ in range(2):  # the second invocation finds every point COMPLETE and trains nothing
        t0 = time.perf_counter()
        outcome = run_grid(load_grid(GRID), args.out)
        seconds.append(time.perf_counter() - t0)
    lines = ["| point | status | unseen acc | verdict | seconds |", "|---|---|---|---|---|"]
    for row in outcome.index["points"]:
        acc, top = point_summary(row, outcome.root)
        lines.append(f"| {row['name']} | {row['status']} | {acc} | {top} | "
                     f"{'-' if row.get('seconds') is None else format(row['seconds'], '.0f')} |")
    results_page.write("sweep_example", "The example sweep", "\n".join(lines),
                       f"`fedaudit sweep examples/grid.toml --out {args.out}` (2 methods × 2 unseen domains on digits, "
                       f"2 rounds, `--attack mia-loss`, local backend, one point at a time), then the same command "
                       f"again: {seconds[0]:.0f} s, then {seconds[1]:.0f} s (every point COMPLETE: nothing trains). "
                       f"Seconds per point as they ran.", path=args.write)


if __name__ == "__main__":
    main()
