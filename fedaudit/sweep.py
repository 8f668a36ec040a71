"""``--dp-sweep 1,8,inf``: the same run at several DP-SGD ε, and one report with the privacy–utility curve.

Each ε is an ordinary run directory under ``<sweep>/eps-<ε>/``; ``∞`` (``inf``)
is the same run without DP. The ∞ point trains with the norm layers the DP
points resolved to (GroupNorm when the chosen ones cannot be trained
privately), so the curve compares like with like. ``sweep.json`` records the
options; an interrupted sweep continues with ``--resume SWEEP_DIR`` (finished
points are kept, a cut-off point resumes from its last round). The folder is
marked complete only when every point is and ``sweep.html`` is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedaudit import runs
from fedaudit.errors import FedauditError

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
    return sorted((v for v in values if v is not None)) + ([None] if None in values else [])


def label(epsilon: float | None) -> str:
    return "eps-inf" if epsilon is None else f"eps-{epsilon:g}"


def is_sweep(path: str | Path) -> bool:
    return (Path(path).expanduser() / SWEEP_FILE).is_file()


def sweep_dp(epsilons: list[float | None] | None, method: str | None = None, *, resume: str | Path | None = None,
             **evaluate_options: Any) -> SweepResult:
    """Run ``fedaudit.evaluate`` once per ε (or continue the sweep in ``resume``) and write ``sweep.html``.

    ``evaluate_options`` are :func:`fedaudit.api.evaluate`'s keyword arguments (run options,
    ``config``, ``method_option``, ``method_flags``, ``reporter``, ``command``).
    """
    from fedaudit.api import evaluate
    from fedaudit.reports import write_compare

    passthrough = {k: evaluate_options.pop(k) for k in ("reporter", "on_round_end") if k in evaluate_options}
    if resume is not None:
        root = Path(resume).expanduser()
        if not is_sweep(root):
            raise FedauditError(f"{root} is not a DP sweep (no {SWEEP_FILE}); give the folder --dp-sweep created")
        state = runs.read_json(root / SWEEP_FILE)
        epsilons, method, options = state["epsilons"], state["method"], state["options"]
    else:
        if epsilons is None:
            raise FedauditError("give --dp-sweep EPS,... (e.g. 1,8,inf) or --resume SWEEP_DIR")
        if evaluate_options.get("dp_epsilon") is not None:
            raise FedauditError("--dp-sweep and --dp-epsilon exclude each other; drop --dp-epsilon")
        options = {k: v for k, v in evaluate_options.items() if v is not None}
        options["config"] = str(options["config"]) if options.get("config") is not None else None
        out = Path(options.pop("out", None) or "runs").expanduser()
        from fedaudit.config import RunConfig, load_toml

        # the folder is named like a run's: method and dataset as the points will resolve them
        from_file = load_toml(options["config"]) if options.get("config") else {}
        name = method or from_file.get("method") or RunConfig.method
        dataset = options.get("dataset") or from_file.get("dataset") or RunConfig.dataset
        root = runs.new_run_dir(out, str(name), str(dataset), "dpsweep")
        runs.write_json(root / SWEEP_FILE, {"epsilons": epsilons, "method": method, "options": options})

    run_dirs, metrics, norm = [], [], None
    for epsilon in epsilons:
        point = root / label(epsilon)
        started = sorted(d for d in point.glob("*") if (d / "config.json").is_file()) if point.exists() else []
        if started:
            result = evaluate(resume=started[0], **passthrough)
        else:
            opts = {**options, "dp_epsilon": epsilon, "out": str(point)}
            if epsilon is None and norm is not None:
                opts["norm"] = norm  # like with like: the norm the private points trained with
            log.info("DP sweep %s: %s", root.name, "no DP (ε = ∞)" if epsilon is None else f"ε = {epsilon:g}")
            result = evaluate(method, **opts, **passthrough)
        if epsilon is not None:
            norm = runs.read_json(result.run_dir / "config.json")["config"]["norm"]
        run_dirs.append(result.run_dir)
        metrics.append(result.metrics)
    report = write_compare(run_dirs, root / REPORT)
    runs.mark_complete(root, [SWEEP_FILE, REPORT])
    return SweepResult(root, run_dirs, report, metrics)
