"""Each target of an ``evaluate`` run, the one flow: split, train the federation, run the auditor's attacks,
judge the evidence, write the target's run directory (resuming from its checkpoint).

:mod:`fedaudit.api` resolves the options, looks the method and the attacks up in their registries and hands them
in (a :class:`RunPlan`); this module looks nothing up, and it writes no report (the API renders it once the run's
files are complete).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from fedaudit.attack import Attack, attack_setup
from fedaudit.audit.canary import accuracy_without_canaries, canary_split, plant_gradient_canaries
from fedaudit.audit.session import attack_role_and_victims, run_attacks
from fedaudit.audit.verdict import store_verdict
from fedaudit.data import MultiDomainDataset, lodo_split
from fedaudit.data.split import thin_splits
from fedaudit.run import run_directory
from fedaudit.run.config import RunConfig
from fedaudit.run.numerics import run_numerics
from fedaudit.run.results import RunMetrics, write_metrics
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.method import Method
from fedaudit.simulation.summary import communication, privacy, provenance, summarise_targets
from fedaudit.simulation.wire import Wire, client_role

log = logging.getLogger("fedaudit")

RUN_FILES = ["config.json", "metrics.json", "history.csv", "wire.jsonl"]


class Reporter:
    """Progress callbacks; the CLI supplies a rich progress bar, the API is silent."""

    def start_target(self, target: str, rounds: int, done: int) -> None: ...

    def round_done(self, target: str, row: dict[str, Any]) -> None: ...

    def end_target(self, target: str) -> None: ...


class RunResult(NamedTuple):
    """What ``evaluate`` and ``audit_recording`` return: the run directory and its metrics.json (as written;
    ``run_dir, metrics = ...`` unpacks it), with its typed reading beside them."""

    run_dir: Path
    metrics: dict[str, Any]

    @property
    def stored(self) -> RunMetrics:
        """metrics.json as typed objects (its verdict rows: ``.stored.rows()``)."""
        return RunMetrics.from_json(self.metrics, self.run_dir / "metrics.json")




@dataclass(frozen=True)
class RunPlan:
    """What every target of one ``evaluate`` shares: the resolved options, the data, the device, who hears of
    progress, the command line that made it, and the seconds the data took to load."""

    cfg: RunConfig
    method: type[Method]  # looked up by the API (the registries' one reader), as the attacks are
    attacks: list[type[Attack]]
    dataset: MultiDomainDataset
    device: torch.device
    reporter: Reporter
    on_round_end: Callable[[Federation, int], None] | None
    command: str
    data_seconds: float


def run_targets(root: Path, plan: RunPlan, targets: list[str]) -> RunResult:
    """Each target of the run in turn (one: the run directory is the target's; several: one sub-directory each and
    their mean at the top)."""
    cfg = plan.cfg
    if len(targets) == 1:
        return RunResult(root, run_one(root, plan, targets[0]))
    per_target = {}
    for target in targets:
        sub = root / run_directory.target_dirname(target)
        if not (sub / "config.json").exists():
            sub.mkdir(parents=True, exist_ok=True)
            run_directory.write_json(sub / "config.json", {"config": {**cfg.to_json(), "target_domain": target},
                                                  "config_hash": cfg.hash(), "command": plan.command, "targets": [target]})
        per_target[target] = run_one(sub, plan, target)
    metrics = write_metrics(root / "metrics.json", summarise_targets(cfg, per_target))
    run_directory.mark_complete(root, ["config.json", "metrics.json", *(f"{run_directory.target_dirname(t)}/{run_directory.COMPLETE}" for t in targets)])
    return RunResult(root, metrics)


def run_one(run_dir: Path, plan: RunPlan, target: str) -> dict[str, Any]:
    """Train, attack and write one target's run directory (resuming if it has a checkpoint), under the
    run's numeric settings (``--deterministic``)."""
    if run_directory.is_complete(run_dir):
        return run_directory.read_json(run_dir / "metrics.json")
    with run_numerics(plan.cfg.deterministic) as unpinned:
        return _run_one(run_dir, plan, target, unpinned)


def _run_one(run_dir: Path, plan: RunPlan, target: str, unpinned: list[str]) -> dict[str, Any]:
    cfg, dataset, device, reporter, on_round_end = plan.cfg, plan.dataset, plan.device, plan.reporter, plan.on_round_end
    command, data_seconds = plan.command, plan.data_seconds
    wall0 = time.perf_counter()
    log.info("run directory %s (target %s)", run_dir, target)
    method = plan.method(cfg)
    split = lodo_split(dataset, target, cfg.split, seed=cfg.seed)
    thin = thin_splits(split, dataset.classes)
    for line in thin:
        log.warning("thin split: %s", line)
    clean_split = split
    plants = any(cls.plants_canaries for cls in plan.attacks)
    if plants:  # before training: canaries change what is trained
        split = canary_split(cfg, split, len(dataset.classes), lambda sources: attack_role_and_victims(cfg, sources)[1])
    wire = Wire(run_dir / "artifacts" if cfg.keep_artifacts else None)
    fed = Federation(cfg, method, dataset, split, device, wire)
    if any(cls.keeps_rounds(attack_setup(cls, cfg)) for cls in plan.attacks):  # before training (and before a resume)
        wire.keep_history({client_role(v) for v in attack_role_and_victims(cfg, [c.domain for c in fed.clients])[1]})
    if plants:  # white-box canaries go into the DP-SGD itself
        plant_gradient_canaries(cfg, fed, attack_role_and_victims(cfg, [c.domain for c in fed.clients])[1])
    ckpt = run_directory.load_checkpoint(run_dir)
    if ckpt is not None:
        fed.restore(*ckpt)
        log.info("resuming %s after round %d", run_dir, fed.rounds_done)
    else:
        fed.setup()

    def after_round(fed: Federation, rnd: int) -> None:
        save_progress(writer, fed)
        reporter.round_done(target, fed.history[-1])
        if on_round_end is not None:
            on_round_end(fed, rnd)

    reporter.start_target(target, cfg.rounds, fed.rounds_done)
    try:
        with run_directory.ProgressWriter(run_dir) as writer:  # leaving it waits for the last round's files
            fed.run(after_round)
    finally:
        reporter.end_target(target)

    accuracy = fed.results()
    if plants and cfg.attack_option("canary", "canary_cost"):
        t0 = time.perf_counter()
        accuracy = accuracy.with_(without_canaries=accuracy_without_canaries(cfg, method, fed, clean_split))
        fed.timings["train_without_canaries"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    leakage, secure_aggregation = run_attacks(plan.attacks, run_dir, cfg, method, fed, dataset, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    attack_seconds = time.perf_counter() - t0

    stages = {"data": data_seconds, **fed.timings, "attacks": attack_seconds, "wall": time.perf_counter() - wall0}
    metrics = RunMetrics(
        method=cfg.method, dataset=cfg.dataset, target_domain=target, source_domains=[c.domain for c in fed.clients],
        accuracy=accuracy, communication=communication(fed), secure_aggregation=secure_aggregation,
        leakage=leakage, privacy=privacy(fed),
        provenance=provenance(cfg, dataset, device, command, stages, unpinned, fed.model, data_warnings=thin))
    # The verdict is computed once, here, from the evidence just stored; the report renders it.
    store_verdict(metrics, cfg.attacker)
    written = write_metrics(run_dir / "metrics.json", metrics)
    run_directory.mark_complete(run_dir, RUN_FILES)
    run_directory.drop_checkpoint(run_dir)
    return written


def save_progress(writer: run_directory.ProgressWriter, fed: Federation) -> None:
    """After each round: history, ledger, and a checkpoint to resume from, written off the training thread."""
    writer.submit(fed.history, fed.wire.ledger_rows(), *fed.checkpoint())


# -- for the sweep drivers: the plug-in rooms are looked up here, not in fedaudit.sweeps.grid -----------------------


