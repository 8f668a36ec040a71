"""Reading a run directory for the report: stored files only, nothing recomputed.

A single-target run directory holds ``config.json``, ``metrics.json``,
``history.csv``, ``wire.jsonl``, ``images/*.png`` and ``COMPLETE``
(:mod:`fedaudit.run.run_directory`). A ``target_domain=all`` run holds the averaged
``metrics.json`` at its root and one such directory per target
(``target-<domain>/``); the report renders one *unit* per target, and the
root's own averages beside them.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import JsonValue

from fedaudit.errors import FedauditError
from fedaudit.run import run_directory
from fedaudit.run.blocks import HistoryRow, WireRow
from fedaudit.run.audited_run import AuditedRun
from fedaudit.run.results import Leakage, RunMetrics, schema_version


JsonObject = dict[str, JsonValue]  # a JSON object a run wrote (checked where it is read)


@dataclass
class Unit:
    """One trained federation with one unseen target: the rows and columns of every table."""

    run_dir: Path
    config: JsonObject  # config.json, as stored
    metrics: JsonObject  # metrics.json, as stored (read once into ``stored``)
    history: list[HistoryRow]  # history.csv, a row per round
    wire: list[WireRow]  # wire.jsonl, a row per message
    label: str = ""
    images: dict[str, bytes] = field(default_factory=dict)  # path relative to run_dir -> PNG bytes

    @cached_property
    def stored(self) -> RunMetrics:
        """metrics.json as the typed objects the run wrote it from (its blocks by name), read once."""
        return RunMetrics.from_json(self.metrics, self.run_dir / "metrics.json")

    @property
    def method(self) -> str:
        return str(self.stored.method)

    @property
    def dataset(self) -> str:
        return str(self.stored.dataset)

    @property
    def target(self) -> str:
        return str(self.stored.target_domain)

    @cached_property
    def audited(self) -> AuditedRun:
        """The attack results as typed entries (fedaudit.run.entries), the same the verdict judges."""
        return AuditedRun.of_run(self.stored, str(run_config(self.config).get("attacker") or "server"))

    @property
    def schema(self) -> int:
        """The metrics schema this unit was written in (1: before the version was declared)."""
        return schema_version(self.metrics, self.run_dir / "metrics.json")

    @property
    def results(self) -> Leakage:
        """The attack results (:class:`fedaudit.run.results.Leakage`)."""
        return self.stored.results


@dataclass
class Run:
    """A run directory: its units (one per target) and, for ``target_domain=all``, the root's averages."""

    run_dir: Path
    config: JsonObject
    metrics: JsonObject
    units: list[Unit]

    @property
    def multi_target(self) -> bool:
        return self.stored.target_domain == "all"

    @cached_property
    def stored(self) -> RunMetrics:
        """The root's metrics.json, typed (a ``--target-domain all`` run: the means)."""
        return RunMetrics.from_json(self.metrics, self.run_dir / "metrics.json")


def load_run(path: str | Path) -> Run:
    """Load a finished run directory; a folder that is not one, or an unfinished run, is a one-line user error."""
    root = Path(path).expanduser()
    if not root.is_dir() or not (root / "config.json").is_file():
        raise FedauditError(f"{root} is not a fedaudit run directory (no config.json); "
                            "give a folder written by `fedaudit evaluate`")
    if not run_directory.is_complete(root) or not (root / "metrics.json").is_file():
        raise FedauditError(f"{root} is an incomplete run (no {run_directory.COMPLETE} marker); "
                            f"finish it with `fedaudit evaluate --resume {root}` first")
    config = _read_json(root / "config.json")
    metrics = _read_json(root / "metrics.json")
    schema_version(metrics, root / "metrics.json")  # a newer fedaudit's run is a one-line error naming the version
    if metrics.get("target_domain") != "all":
        return Run(root, config, metrics, [_load_unit(root, config, metrics)])

    units = []
    listed = config.get("targets")
    targets = ([str(t) for t in listed] if isinstance(listed, list) and listed else
               list(RunMetrics.from_json(metrics, root / "metrics.json").accuracy.per_target or {}))
    for target in targets:
        sub = root / run_directory.target_dirname(target)
        if not run_directory.is_complete(sub) or not (sub / "metrics.json").is_file():
            raise FedauditError(f"{root} is an incomplete run: target {target} has no finished {sub.name}/; "
                                f"finish it with `fedaudit evaluate --resume {root}` first")
        units.append(_load_unit(sub, _read_json(sub / "config.json"), _read_json(sub / "metrics.json")))
    return Run(root, config, metrics, units)


def _load_unit(run_dir: Path, config: JsonObject, metrics: JsonObject) -> Unit:
    unit = Unit(run_dir, config, metrics, [HistoryRow.of(r) for r in _read_history(run_dir / "history.csv")],
                [WireRow.of(r) for r in _read_jsonl(run_dir / "wire.jsonl")])
    for rel in _image_paths(unit.results):
        path = (run_dir / rel).resolve()
        # only files inside the run directory: metrics.json is data, not a licence to read the disk
        if path.is_file() and run_dir.resolve() in path.parents:
            unit.images[rel] = path.read_bytes()
    return unit


def _image_paths(leakage: Leakage) -> list[str]:
    """The image grids the reconstruction entries name (paths as stored: confined to the run directory by the
    caller)."""
    return [entry.image_grid for _, _, by_victim in leakage.attacked_artifacts() for entry in by_victim.values()
            if entry.image_grid is not None]


def run_config(config: JsonObject) -> JsonObject:
    """config.json's resolved configuration (its ``config`` block; empty where the file has none)."""
    found = config.get("config")
    return found if isinstance(found, dict) else {}


def _read_json(path: Path) -> JsonObject:
    try:
        return run_directory.read_json(path)
    except (OSError, ValueError) as exc:
        raise FedauditError(f"cannot read {path}: {exc}; the run directory is damaged — re-run it") from None


def _read_history(path: Path) -> list[dict[str, int | float | str | None]]:
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            rows.append({k: _number(v) for k, v in row.items()})
    return rows


def _read_jsonl(path: Path) -> list[JsonObject]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _number(text: str | None) -> int | float | str | None:
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value
