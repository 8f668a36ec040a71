"""``fedaudit.evaluate(...)``: the one flow, callable from a notebook.

config → data (LODO split) → federation (method hooks, wire) → attacks →
run directory. The CLI is a thin layer over this module. With
``target_domain="all"`` every domain is the unseen target once; each gets its
own sub-directory and the top-level ``metrics.json`` averages them.
"""

from __future__ import annotations

import logging
import platform
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedaudit import runs
from fedaudit.config import RunConfig, load_toml, parse_method_options, resolve
from fedaudit.data import MultiDomainDataset, load_dataset, lodo_split
from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.federation import Federation
from fedaudit.wire import Wire

log = logging.getLogger("fedaudit")

RUN_FILES = ["config.json", "metrics.json", "history.csv", "wire.jsonl"]
DATA_SEED = 0  # built-in data is the same for every run seed, so fingerprints compare across seeds


class Reporter:
    """Progress callbacks; the CLI supplies a rich progress bar, the API is silent."""

    def start_target(self, target: str, rounds: int, done: int) -> None: ...

    def round_done(self, target: str, row: dict[str, Any]) -> None: ...

    def end_target(self, target: str) -> None: ...


@dataclass
class EvaluateResult:
    run_dir: Path
    metrics: dict[str, Any]


def evaluate(
    method: str | None = None,
    *,
    config: str | Path | None = None,
    resume: str | Path | None = None,
    method_option: list[str] | None = None,
    reporter: Reporter | None = None,
    on_round_end: Callable[[Federation, int], None] | None = None,
    command: str | None = None,
    **options: Any,
) -> EvaluateResult:
    """Train ``method`` in a LODO federation, attack what it shares, write a run directory.

    ``options`` are :class:`~fedaudit.config.RunConfig` fields (``dataset``,
    ``rounds``, ``target_domain``, ...); ``resume`` continues an interrupted
    run from its last finished round. Returns the run directory and metrics.
    """
    reporter = reporter or Reporter()
    command = command or "fedaudit.evaluate(" + ", ".join(f"{k}={v!r}" for k, v in {"method": method, **options}.items() if v is not None) + ")"
    if resume is not None:
        return _resume(Path(resume), reporter, on_round_end)

    from fedaudit.methods import get_method

    explicit = dict(options)
    if method is not None:
        explicit["method"] = method
    if method_option:
        explicit["method_options"] = parse_method_options(method_option)
    file_opts = load_toml(config) if config is not None else {}
    method_cls = get_method(explicit.get("method") or file_opts.get("method") or RunConfig.method)
    cfg = resolve(explicit, file_opts, method_cls.profile_defaults)
    check_names(cfg)
    method_cls(cfg)  # validates method options before any work is done
    device = resolve_device(cfg.device)

    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED)
    data_seconds = time.perf_counter() - t0
    targets = resolve_targets(cfg, dataset)

    root = runs.new_run_dir(Path(cfg.out).expanduser(), cfg.method, cfg.dataset, "all" if len(targets) > 1 else targets[0])
    runs.write_json(root / "config.json", {"config": cfg.to_json(), "config_hash": cfg.hash(), "command": command,
                                           "targets": targets})
    return _run_targets(root, cfg, dataset, targets, device, reporter, on_round_end, command, data_seconds)


def _resume(path: Path, reporter: Reporter, on_round_end) -> EvaluateResult:
    root = runs.resolve_resume(path)
    saved = runs.read_json(root / "config.json")
    cfg = RunConfig(**{**saved["config"], "split": tuple(saved["config"]["split"])})
    if runs.is_complete(root):
        log.info("run %s is already complete; nothing to resume", root)
        return EvaluateResult(root, runs.read_json(root / "metrics.json"))
    check_names(cfg)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED)
    return _run_targets(root, cfg, dataset, saved["targets"], device, reporter, on_round_end, saved["command"],
                        time.perf_counter() - t0)


def _run_targets(root: Path, cfg: RunConfig, dataset: MultiDomainDataset, targets: list[str], device: torch.device,
                 reporter: Reporter, on_round_end, command: str, data_seconds: float) -> EvaluateResult:
    if len(targets) == 1:
        metrics = run_one(root, cfg, dataset, targets[0], device, reporter, on_round_end, command, data_seconds)
        return EvaluateResult(root, metrics)
    per_target = {}
    for target in targets:
        sub = root / target_dirname(target)
        if not (sub / "config.json").exists():
            sub.mkdir(parents=True, exist_ok=True)
            runs.write_json(sub / "config.json", {"config": {**cfg.to_json(), "target_domain": target},
                                                  "config_hash": cfg.hash(), "command": command, "targets": [target]})
        per_target[target] = run_one(sub, cfg, dataset, target, device, reporter, on_round_end, command, data_seconds)
    metrics = summarise_targets(cfg, per_target)
    runs.write_json(root / "metrics.json", metrics)
    runs.mark_complete(root, ["config.json", "metrics.json", *(f"{target_dirname(t)}/{runs.COMPLETE}" for t in targets)])
    return EvaluateResult(root, metrics)


def run_one(run_dir: Path, cfg: RunConfig, dataset: MultiDomainDataset, target: str, device: torch.device,
            reporter: Reporter, on_round_end, command: str, data_seconds: float) -> dict[str, Any]:
    """Train, attack and write one target's run directory (resuming if it has a checkpoint)."""
    from fedaudit.methods import get_method

    if runs.is_complete(run_dir):
        return runs.read_json(run_dir / "metrics.json")
    wall0 = time.perf_counter()
    log.info("run directory %s (target %s)", run_dir, target)
    method = get_method(cfg.method)(cfg)
    split = lodo_split(dataset, target, cfg.split, seed=cfg.seed)
    wire = Wire(run_dir / "artifacts" if cfg.keep_artifacts else None)
    fed = Federation(cfg, method, dataset, split, device, wire)
    ckpt = runs.load_checkpoint(run_dir)
    if ckpt is not None:
        fed.restore(*ckpt)
        log.info("resuming %s after round %d", run_dir, fed.rounds_done)
    else:
        fed.setup()

    def after_round(fed: Federation, rnd: int) -> None:
        save_progress(run_dir, fed)
        reporter.round_done(target, fed.history[-1])
        if on_round_end is not None:
            on_round_end(fed, rnd)

    reporter.start_target(target, cfg.rounds, fed.rounds_done)
    try:
        fed.run(after_round)
    finally:
        reporter.end_target(target)

    t0 = time.perf_counter()
    # Attacks see only wire views; each registered attack fills its own
    # section once its issue lands (the registry is empty until then, and
    # check_names refuses any name but `none`).
    leakage: dict[str, Any] = {}
    attack_seconds = time.perf_counter() - t0

    stages = {"data": data_seconds, **fed.timings, "attacks": attack_seconds, "wall": time.perf_counter() - wall0}
    metrics = {
        "schema_version": runs.SCHEMA_VERSION,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "target_domain": target,
        "source_domains": [c.domain for c in fed.clients],
        "accuracy": fed.results(),
        "communication": communication(fed),
        "leakage": leakage,
        "provenance": provenance(cfg, dataset, device, command, stages),
    }
    save_progress(run_dir, fed)
    runs.write_json(run_dir / "metrics.json", metrics)
    runs.mark_complete(run_dir, RUN_FILES)
    runs.drop_checkpoint(run_dir)
    return metrics


def save_progress(run_dir: Path, fed: Federation) -> None:
    """After each round: history, ledger, and a checkpoint to resume from."""
    runs.write_csv(run_dir / "history.csv", fed.history)
    runs.write_jsonl(run_dir / "wire.jsonl", fed.wire.ledger_rows())
    runs.save_checkpoint(run_dir, *fed.checkpoint())


def communication(fed: Federation) -> dict[str, Any]:
    s = fed.wire.summary()
    rounds = max(fed.rounds_done, 1)
    return {
        **s,
        "rounds": fed.rounds_done,
        "clients": len(fed.clients),
        "mb_up_per_round": s["bytes_up"] / rounds / 1e6,
        "mb_down_per_round": s["bytes_down"] / rounds / 1e6,
        # what the configured method says it sends; tests hold the ledger to it
        "declared": sorted(f"{k.value}{'↑' if d == 'up' else '↓'}" for k, d in fed.method.declared_shares()),
    }


def summarise_targets(cfg: RunConfig, per_target: dict[str, dict]) -> dict[str, Any]:
    """Mean over targets of the headline numbers, with every target's own."""
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    accs = {t: m["accuracy"] for t, m in per_target.items()}
    first = next(iter(per_target.values()))
    return {
        "schema_version": runs.SCHEMA_VERSION,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "target_domain": "all",
        "accuracy": {
            "unseen_domain": mean([a["unseen_domain"] for a in accs.values()]),
            "source_val": {"mean": mean([a["source_val"]["mean"] for a in accs.values()])},
            "per_target": {t: {"unseen_domain": a["unseen_domain"], "source_val_mean": a["source_val"]["mean"],
                               "selected_round": a["selected_round"]} for t, a in accs.items()},
        },
        "communication": {
            "bytes_up": sum(m["communication"]["bytes_up"] for m in per_target.values()),
            "bytes_down": sum(m["communication"]["bytes_down"] for m in per_target.values()),
            "per_target": {t: m["communication"] for t, m in per_target.items()},
        },
        "leakage": {t: m["leakage"] for t, m in per_target.items()},
        "provenance": {**first["provenance"], "seconds": {t: m["provenance"]["seconds"] for t, m in per_target.items()}},
    }


def provenance(cfg: RunConfig, dataset: MultiDomainDataset, device: torch.device, command: str,
               stages: dict[str, float]) -> dict[str, Any]:
    import numpy
    import sklearn
    import torchvision

    from fedaudit import __version__

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {
        "command": command,
        "config_hash": cfg.hash(),
        "config": cfg.to_json(),
        "dataset_fingerprint": dataset.fingerprint(),
        "dataset_skipped_files": dataset.skipped,
        "seed": cfg.seed,
        "versions": {"fedaudit": __version__, "python": platform.python_version(), "torch": torch.__version__,
                     "torchvision": torchvision.__version__, "numpy": numpy.__version__, "scikit-learn": sklearn.__version__},
        "device": {"type": device.type, "name": device_name, "threads": torch.get_num_threads()},
        "seconds": {k: round(v, 3) for k, v in stages.items()},
    }


# -- validation helpers --------------------------------------------------------


def check_names(cfg: RunConfig) -> None:
    """Names checked against the registries before any data is loaded."""
    from fedaudit.attacks import get_attacks
    from fedaudit.models import ARCHITECTURES, NORM_LAYERS
    from fedaudit.methods import get_method

    get_method(cfg.method)
    get_attacks(cfg.attack)
    if cfg.model not in ARCHITECTURES:
        raise unknown_choice("model", cfg.model, ARCHITECTURES)
    if cfg.norm not in NORM_LAYERS:
        raise unknown_choice("norm layer", cfg.norm, NORM_LAYERS)
    if cfg.pretrained is not None and not Path(cfg.pretrained).expanduser().is_file():
        raise FedauditError(f"pretrained weights file {cfg.pretrained} does not exist; give a local state_dict (.pt/.pth/.safetensors)")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FedauditError("--device cuda was requested but no CUDA GPU is available; use --device cpu or --device auto")
    return torch.device(name)


def resolve_targets(cfg: RunConfig, dataset: MultiDomainDataset) -> list[str]:
    if cfg.target_domain is None:
        return [dataset.domains[-1]]
    if cfg.target_domain == "all":
        return list(dataset.domains)
    if cfg.target_domain not in dataset.domains:
        raise unknown_choice("target domain", cfg.target_domain, [*dataset.domains, "all"])
    return [cfg.target_domain]


def target_dirname(target: str) -> str:
    return "target-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in target)


def command_line() -> str:
    return "fedaudit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
