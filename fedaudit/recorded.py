"""Audit a recording: the attack half of ``evaluate`` on what crossed a federation fedaudit did not run.

The recording (:mod:`fedaudit.recording`) gives the wire; its manifest gives the rest a run's config
holds — the model the clients trained, their public training recipe, the protocol (``method``,
whose public code the attacker's prior carries) and the auditor's data (the dataset the clients'
records came from, split as fedaudit splits it). From these the auditor rebuilds what it needs to
score attacks — the clients' members, validation and holdout records, the unseen target domain —
and runs the same attacks, controls and verdict as ``evaluate``, into an ordinary run directory.
Nothing is trained; the deployed model is the last whole model the server sent.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from fedaudit import runs
from fedaudit.aggregation import clone_state
from fedaudit.api import DATA_SEED, check_names, resolve_device
from fedaudit.audit.session import attack_role_and_victims, run_attacks
from fedaudit.audit.verdict import RiskThresholds, judge
from fedaudit.config import RunConfig, resolve
from fedaudit.data import MultiDomainDataset, load_dataset, lodo_split
from fedaudit.data.base import ClientData, LODOSplit
from fedaudit.data.split import stratified_split
from fedaudit.dp import coverage
from fedaudit.errors import FedauditError
from fedaudit.federation import Federation
from fedaudit.models import build_model
from fedaudit.recording import Recording, read_recording
from fedaudit.reports import write_report_or_warn
from fedaudit.results import provenance
from fedaudit.seeds import derive_seed
from fedaudit.wire import SERVER, ArtifactKind, Wire

log = logging.getLogger("fedaudit")

# The options `fedaudit audit` takes (besides every attack's): who attacks whom, the architecture if the
# manifest's is to be overridden, and where and how the audit runs. Training options come from the manifest.
AUDIT_OPTIONS = ("attack", "attacker", "victim", "model", "norm", "image_size", "device", "precision", "out",
                 "lpips_weights", "judge_steps")
RECIPE_KEYS = ("rounds", "local_epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "augment")


def recorded_config(rec: Recording) -> dict[str, Any]:
    """The run options the manifest states: protocol, data, architecture and the clients' recipe."""
    m = rec.manifest
    data, model, recipe = m.get("data") or {}, m.get("model") or {}, m.get("recipe") or {}
    options: dict[str, Any] = {"method": m.get("method", "fedavg")}
    for key in ("dataset", "target_domain", "seed"):
        if key in data:
            options[key] = data[key]
    options.update({k: model[k] for k in ("model", "norm", "image_size") if k in model})
    options.update({k: recipe[k] for k in RECIPE_KEYS if k in recipe})
    if "rounds" not in options:
        options["rounds"] = max((r["round"] for r in rec.rows), default=1)
    return options


RECORDS_LAYOUT = ("records PATH holds members/<client>/<class>/<image> (what each client trained on), "
                  "holdout/<client>/<class>/<image> (its records it never trained on) and unseen/<domain>/<class>/<image> "
                  "(a domain no client holds)")
VAL_OF_HOLDOUT = 0.2  # of a client's holdout records, the share the auditor uses as validation (twin records,
# source accuracy); the rest are the membership test's non-members — fedaudit's own split keeps the same 1:4


def load_records(path: str, image_size: int, seed: int) -> tuple[MultiDomainDataset, LODOSplit]:
    """The auditor's data for a deployment fedaudit did not split: each client's members and holdout records,
    and an unseen domain's, in folders (:data:`RECORDS_LAYOUT`); the holdout is split into validation and
    non-members with ``seed``."""
    from fedaudit.data.folder import load_folder

    root = Path(path).expanduser()
    for part in ("members", "holdout", "unseen"):
        if not (root / part).is_dir():
            raise FedauditError(f"auditor records {root} have no {part}/ folder; {RECORDS_LAYOUT}")
    members = load_folder(str(root / "members"), image_size, min_domains=1)
    holdout = load_folder(str(root / "holdout"), image_size, min_domains=1)
    unseen = load_folder(str(root / "unseen"), image_size, min_domains=1)
    for part, ds in (("holdout", holdout), ("unseen", unseen)):
        if ds.classes != members.classes:
            raise FedauditError(f"auditor records {root}: {part}/ has classes {ds.classes}, members/ has "
                                f"{members.classes}; every part needs the same class folders")
    missing = [d for d in members.domains if d not in holdout.domains]
    if missing:
        raise FedauditError(f"auditor records {root}: client {missing[0]!r} has members but no holdout/{missing[0]}/; "
                            f"{RECORDS_LAYOUT}")
    target = unseen.domains[0]
    sources = []
    for i, dom in enumerate(members.domains):
        hx, hy = holdout.images[dom], holdout.labels[dom]
        _, val, hold = stratified_split(hy, (0.0, VAL_OF_HOLDOUT, 1 - VAL_OF_HOLDOUT),
                                        torch.Generator().manual_seed(derive_seed(seed, i)))
        n = members.labels[dom].numel()
        sources.append(ClientData(domain=dom, train_x=members.images[dom], train_y=members.labels[dom],
                                  val_x=hx[val], val_y=hy[val], holdout_x=hx[hold], holdout_y=hy[hold],
                                  train_idx=torch.arange(n), val_idx=n + val, holdout_idx=n + hold))
    dataset = MultiDomainDataset(
        name=f"records:{path}", classes=members.classes, domains=[*members.domains, target],
        images={**{d: torch.cat([members.images[d], holdout.images[d]]) for d in members.domains},
                target: unseen.images[target]},
        labels={**{d: torch.cat([members.labels[d], holdout.labels[d]]) for d in members.domains},
                target: unseen.labels[target]},
        skipped=members.skipped + holdout.skipped + unseen.skipped)
    return dataset, LODOSplit(target=target, sources=sources, target_x=unseen.images[target],
                              target_y=unseen.labels[target])


def auditor_data(cfg: RunConfig, records: str | None) -> tuple[MultiDomainDataset, LODOSplit]:
    """The records the auditor scores with: a dataset split as fedaudit splits it, or the deployment's own."""
    if records is not None:
        return load_records(records, cfg.image_size, cfg.seed)
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED)
    target = cfg.target_domain or dataset.domains[-1]
    return dataset, lodo_split(dataset, target, cfg.split, seed=cfg.seed)


def recorded_shares(rec: Recording) -> tuple[tuple[ArtifactKind, str], ...]:
    """(kind, direction) pairs the recording's ledger holds, sorted: what the recorded protocol sends."""
    return tuple(sorted(rec.shares(), key=lambda s: (s[0].value, s[1])))


def check_architecture(model: torch.nn.Module, wire: Wire, cfg: RunConfig) -> None:
    """Every recorded model tensor must be one of the architecture's, with its shape: else name the first that is not."""
    state = model.state_dict()
    for art in wire.retained.values():
        if art.kind not in (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL):
            continue
        for name, tensor in art.tensors.items():
            hint = ("give the architecture the clients trained (--model, --norm, --image-size) or fix the "
                    "manifest's model")
            if name not in state:
                raise FedauditError(f"recorded {art.kind.value} from {art.sender} holds tensor {name!r}, which "
                                    f"--model {cfg.model} (norm {cfg.norm}) does not have; {hint}")
            if tuple(state[name].shape) != tuple(tensor.shape):
                raise FedauditError(f"recorded {art.kind.value} tensor {name!r} has shape {tuple(tensor.shape)}, but "
                                    f"--model {cfg.model} (norm {cfg.norm}) has {tuple(state[name].shape)}; {hint}")


def audit_recording(recording: str | Path, *, command: str = "", **explicit: Any) -> tuple[Path, dict[str, Any]]:
    """Attack a recording as ``evaluate`` attacks its own wire; returns (run directory, metrics)."""
    from fedaudit.attacks import AUTO, attack_options, attack_schema, auto_attacks, get_attacks
    from fedaudit.methods import get_method

    wall0 = time.perf_counter()
    rec = read_recording(recording)
    base = recorded_config(rec)
    records = (rec.manifest.get("data") or {}).get("records")
    if records is not None:
        base["dataset"] = f"records:{records}"
    if "dataset" not in base:
        raise FedauditError(f"{rec.root}/manifest.json names no data for the auditor (data.dataset, or data.records: "
                            f"{RECORDS_LAYOUT}); the attacks' scores need the clients' records — record with "
                            "start_recording(data=...)")
    explicit = {k: v for k, v in explicit.items() if v is not None}
    unknown = set(explicit) - set(AUDIT_OPTIONS) - set(attack_options())
    if unknown:
        raise FedauditError(f"fedaudit audit takes no option {sorted(unknown)[0]!r}; training options come from the "
                            "recording's manifest")
    method_cls = get_method(base["method"])
    # First the options without attacks: the data and the architecture say what the recorded records are,
    # and those say what `--attack auto` runs.
    draft = resolve({**base, **explicit, "attack": "none"}, None, method_cls.profile_defaults, {}, set(attack_options()))
    check_names(draft)
    dataset, split = auditor_data(draft, records)
    state = {k: tuple(v.shape) for k, v in build_model(draft.model, len(dataset.classes), draft.image_size,
                                                        draft.norm).state_dict().items()}
    if rec.reclassify(state):
        log.info("records named as the %s model's state from its shapes (the recording declared no model)", draft.model)
    spec = explicit.get("attack", AUTO)
    if spec == AUTO:
        spec = auto_attacks(recorded_shares(rec), "quick")
        log.info("--attack auto: %s (from what the recording holds)", spec)
    selected = get_attacks(spec)
    if any(cls.plants_canaries for cls in selected):
        raise FedauditError("the canary audit plants canaries before training, which a recording cannot have; "
                            "drop canary from --attack")
    cfg = resolve({**base, **explicit, "attack": spec}, None, method_cls.profile_defaults, attack_schema(spec),
                  set(attack_options()))
    check_names(cfg)
    device = resolve_device(cfg.device)
    target = split.target
    clients = sorted({r[side][len("client:"):] for r in rec.rows for side in ("sender", "receiver")
                      if r[side] != SERVER})
    sources = [c.domain for c in split.sources]
    for name in clients:
        if name not in sources:
            raise FedauditError(f"recorded client {name!r} has no data mapping: it is not a source domain of "
                                f"{cfg.dataset} with target {target} (sources: {', '.join(sources)}); name each node "
                                "after the domain its records come from (the mod's name=) or fix the manifest's data")
    for c in split.sources:
        if c.domain not in clients:
            log.warning("the auditor's data holds client %r, which the recording never names; it is left out", c.domain)
    split.sources = [c for c in split.sources if c.domain in clients]
    attack_role_and_victims(cfg, clients)  # a bad --attacker/--victim fails before any work

    wire = rec.wire(device)
    method = method_cls(cfg)
    fed = Federation(cfg, method, dataset, split, device, wire)
    check_architecture(fed.model, wire, cfg)
    deployed = rec.deployed(device)
    if deployed is None:
        raise FedauditError(f"{rec.root}: the server sent no whole model, so there is no deployed model to audit; "
                            "this audit needs full_model broadcasts")
    method.global_state = clone_state(deployed.tensors)
    fed.rounds_done = deployed.round

    run_dir = runs.new_run_dir(Path(cfg.out).expanduser(), f"recording-{cfg.method}", cfg.dataset, target)
    try:
        runs.write_json(run_dir / "config.json", {"config": cfg.to_json(), "config_hash": cfg.hash(), "command": command,
                                                  "targets": [target], "recording": str(rec.root.resolve())})
        scores = method.score(fed, method.global_model(fed))
        t0 = time.perf_counter()
        leakage = run_attacks(selected, run_dir, cfg, method, fed, dataset, device)
        attack_seconds = time.perf_counter() - t0
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing to resume: an audit is rerun whole
        raise
    val_mean = sum(scores.val.values()) / len(scores.val)
    history = [{"round": deployed.round, "val_mean": val_mean, "target": scores.target,
                **{f"val/{d}": v for d, v in scores.val.items()}}]
    shares = recorded_shares(rec)
    summary = wire.summary()
    rounds = max(deployed.round, 1)
    metrics = {
        "schema_version": runs.SCHEMA_VERSION,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "target_domain": target,
        "source_domains": clients,
        "accuracy": {"unseen_domain": scores.target, "source_val": {"mean": val_mean, "per_domain": scores.val},
                     "selected_round": deployed.round,
                     "final_round": {"round": deployed.round, "unseen_domain": scores.target, "source_val_mean": val_mean},
                     "note": "the deployed model: the last whole model the server sent (nothing is selected)"},
        "communication": {**summary, "rounds": deployed.round, "clients": len(clients),
                          "mb_up_per_round": summary["bytes_up"] / rounds / 1e6,
                          "mb_down_per_round": summary["bytes_down"] / rounds / 1e6,
                          "declared": sorted(f"{k.value}{'↑' if d == 'up' else '↓'}" for k, d in shares)},
        "leakage": leakage,
        "privacy": {"dp": None, "coverage": [{**row, "covered": False, "why": "no DP recorded"} for row in coverage(shares)]},
        "provenance": {**provenance(cfg, dataset, device, command, {"attacks": attack_seconds,
                                                                    "wall": time.perf_counter() - wall0}),
                       "recording": {"path": str(rec.root.resolve()), "framework": rec.manifest.get("framework"),
                                     "run_id": rec.manifest.get("run_id"), "nodes": {str(k): v for k, v in rec.nodes.items()},
                                     "deployed_model": {"round": deployed.round,
                                                        "message_type": deployed.meta.get("message_type")}}},
    }
    metrics["verdict"] = judge(metrics, cfg.to_json(), RiskThresholds())
    metrics["verdict_thresholds"] = asdict(RiskThresholds())
    runs.write_csv(run_dir / "history.csv", history)
    runs.write_jsonl(run_dir / "wire.jsonl", wire.ledger_rows())
    runs.write_json(run_dir / "metrics.json", metrics)
    runs.mark_complete(run_dir, ["config.json", "metrics.json", "history.csv", "wire.jsonl"])
    write_report_or_warn(run_dir)
    return run_dir, metrics


__all__ = ["AUDIT_OPTIONS", "audit_recording", "check_architecture", "recorded_config", "recorded_shares"]
