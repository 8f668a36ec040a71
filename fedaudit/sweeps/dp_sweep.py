"""``--dp-sweep 1,8,inf``: the same run at several DP-SGD ε, and one report with the privacy–utility curve.

A grid on :mod:`fedaudit.sweeps.grid`'s engine with one axis, ``dp_epsilon``: each ε is an ordinary run directory
under ``<sweep>/points/dp_epsilon=<ε>/``; ``∞`` (``inf``, ``dp_epsilon=none``) is the same run without DP.
Every point trains with the norm layers DP-SGD resolves to (GroupNorm when the chosen ones cannot be trained
privately), fixed before the first point runs, so the curve compares like with like. ``sweep.json`` indexes
the points; an interrupted sweep continues with ``--resume SWEEP_DIR`` (finished points are kept, a cut-off
point resumes from its last round). The folder is marked complete only when every point is and
``sweep.html`` is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedaudit.errors import FedauditError, PointCrashed
from fedaudit.run import run_directory

if TYPE_CHECKING:
    from fedaudit.sweeps.grid import Grid

log = logging.getLogger("fedaudit")

SWEEP_FILE = "sweep.json"
REPORT = "sweep.html"


@dataclass
class SweepResult:
    root: Path
    run_dirs: list[Path]
    report: Path
    metrics: list[dict[str, Any]]


def parse_epsilons(text: str) -> list[float | None]:
    """``"1,8,inf"`` → ``[1.0, 8.0, None]``: finite values ascending, then ∞ (no DP)."""
    values: list[float | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part.lower() in ("inf", "infinity", "∞"):
            value = None
        else:
            try:
                value = float(part)
            except ValueError:
                raise FedauditError(f"--dp-sweep takes ε values separated by commas, e.g. 1,8,inf; got {part!r}") from None
            if not 0.01 <= value <= 1e4:
                raise FedauditError(f"--dp-sweep values must be between 0.01 and 10000 or inf, got {part}")
        if value not in values:
            values.append(value)
    if len(values) < 2:
        raise FedauditError(f"--dp-sweep needs at least two ε values (e.g. 1,8,inf), got {text!r}")
    return sorted(v for v in values if v is not None) + ([None] if None in values else [])


DP_SWEEP = "--dp-sweep"  # the source a DP sweep's grid records (a `fedaudit sweep` grid names its file)


def is_sweep(path: str | Path) -> bool:
    """A folder ``--dp-sweep`` wrote (or an older one, which ``sweep_dp`` names as such)."""
    index = Path(path).expanduser() / SWEEP_FILE
    if not index.is_file():
        return False
    stored = run_directory.read_json(index)
    return "epsilons" in stored or stored.get("source") == DP_SWEEP


def sweep_dp(epsilons: list[float | None] | None, method: str | None = None, *, resume: str | Path | None = None,
             **evaluate_options: Any) -> SweepResult:
    """Run ``fedaudit.evaluate`` once per ε (or continue the sweep in ``resume``) and write ``sweep.html``.

    ``evaluate_options`` are :func:`fedaudit.api.evaluate`'s keyword arguments (run options,
    ``config``, ``method_option``, ``method_flags``, ``reporter``, ``on_round_end``, ``command``).
    """
    import torch

    from fedaudit.sweeps.grid import run_grid

    # in-process only: the progress reporter, the round callback, and the command line each point records
    hooks = {k: evaluate_options.pop(k) for k in ("reporter", "on_round_end", "command")
             if evaluate_options.get(k) is not None}
    if resume is not None:
        root, grid = _resumed(Path(resume).expanduser()), None
    else:
        root, grid = _new_sweep(epsilons, method, evaluate_options)
    # the first failure ends a DP sweep, as it ends a single run: its curve needs every point
    outcome = run_grid(grid, root, resume=resume is not None, threads=torch.get_num_threads(), compare_name=REPORT,
                       model=evaluate_options.get("model"), hooks=hooks, stop_on_failure=True)
    _raise_on_failure(outcome.failed, root)
    run_dirs = [root / row["run_dir"] for row in outcome.index["points"]]
    return SweepResult(root, run_dirs, root / REPORT, [run_directory.read_json(d / "metrics.json") for d in run_dirs])


def _resumed(root: Path) -> Path:
    """The folder of a sweep to continue, refused unless --dp-sweep wrote it with this fedaudit."""
    if not is_sweep(root):
        raise FedauditError(f"{root} is not a DP sweep (no {SWEEP_FILE} from --dp-sweep); give the folder "
                            "--dp-sweep created (continue a `fedaudit sweep` folder with `fedaudit sweep --resume`)")
    if "epsilons" in run_directory.read_json(root / SWEEP_FILE):
        raise FedauditError(f"{root} was written by an older fedaudit (eps-<ε>/ folders); its finished points "
                            "are ordinary runs — start the sweep again to continue it with this one")
    return root


def _new_sweep(epsilons: list[float | None] | None, method: str | None,
               evaluate_options: dict[str, Any]) -> tuple[Path, Grid]:
    """A new sweep's folder and grid, its options checked and resolved as its first private point will be."""
    from fedaudit.api import run_config
    from fedaudit.run.config import OPTIONS, load_toml
    from fedaudit.sweeps.grid import Grid

    if epsilons is None:
        raise FedauditError("give --dp-sweep EPS,... (e.g. 1,8,inf) or --resume SWEEP_DIR")
    private_eps = [e for e in epsilons if e is not None]
    if not private_eps:
        raise FedauditError("--dp-sweep needs at least one finite ε (e.g. 1,8,inf)")
    if evaluate_options.get("dp_epsilon") is not None and not OPTIONS["dp_epsilon"].is_none_word(
            evaluate_options["dp_epsilon"]):
        raise FedauditError("--dp-sweep and --dp-epsilon exclude each other; drop --dp-epsilon")
    options = {k: v for k, v in evaluate_options.items() if v is not None}
    if options.get("config") is not None:
        options["config"] = str(options["config"])
        if load_toml(options["config"]).get("dp_epsilon") is not None:  # it would hold the ∞ point at that ε
            raise FedauditError(f"config file {options['config']} sets dp_epsilon, which --dp-sweep sets per "
                                "point; remove it from the file")
    out = Path(options.pop("out", None) or "runs").expanduser()
    # evaluate's own arguments travel apart from the run options they resolve into
    config, method_option, method_flags = (options.get(k) for k in ("config", "method_option", "method_flags"))
    run_options = {k: v for k, v in options.items() if k not in ("config", "method_option", "method_flags")}
    # Checked and resolved now, as the first private point will be: a method DP-SGD cannot train fails here,
    # and every point (∞ too) trains with the norm layers the private points need.
    private, _ = run_config(method, config, method_option, method_flags, {**run_options, "dp_epsilon": private_eps[0]})
    root = run_directory.new_run_dir(out, private.method, private.dataset, "dpsweep")
    grid = Grid({**options, "method": private.method, "norm": private.norm}, {"dp_epsilon": epsilons}, source=DP_SWEEP)
    return root, grid


def _raise_on_failure(failed: list[dict[str, Any]], root: Path) -> None:
    if not failed:
        return
    errors = "; ".join(f"{row['name']}: {row['error']}" for row in failed if row.get("error"))
    if any(row.get("crashed") for row in failed):  # (run_grid resets it on points not run again)
        raise PointCrashed(f"{errors} — a bug in fedaudit, not in the input (please report it with that "
                           f"traceback); the finished points are kept: continue with --resume {root}")
    raise FedauditError(f"{errors} — fix it and continue with --resume {root}")
