"""Audit a recording: the attack half of ``evaluate`` on what crossed a federation fedaudit did not run.

The steps below are engine work and take the method and attack classes in; ``fedaudit.api.audit_recording``
looks them up and strings the steps together.

The recording (:mod:`fedaudit.interop.recording`) gives the wire; its manifest gives the rest a run's config
holds — the model the clients trained, their public training recipe, the protocol (``method``,
whose public code the attacker's prior carries) and the auditor's data (the dataset the clients'
records came from, split as fedaudit splits it). From these the auditor rebuilds what it needs to
score attacks — the clients' members, validation and holdout records, the unseen target domain —
and runs the same attacks, controls and verdict as ``evaluate``, into an ordinary run directory.
Nothing is trained; the deployed model is the one the recording names as released, else the newest whole model
the server sent (and the report says which, and that it is not the named one).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedaudit.attack import Attack, attack_setup
from fedaudit.audit.session import attack_role_and_victims, run_attacks, run_unscored
from fedaudit.audit.verdict import store_verdict
from fedaudit.data import MultiDomainDataset
from fedaudit.data.base import ClientData, LODOSplit
from fedaudit.data.split import thin_splits
from fedaudit.errors import FedauditError
from fedaudit.interop.auditor_data import (NO_DATA, PRIOR_KEYS, RECORDS_LAYOUT, UNSCORED, auditor_data, public_data,
                                           recorded_clients)
from fedaudit.interop.manifest import AuditorDataDeclared
from fedaudit.interop.recorded_dp import recorded_privacy
from fedaudit.interop.recording_checks import trains
from fedaudit.interop.recording_reader import Recording
from fedaudit.models import build_model, is_factory
from fedaudit.run import run_directory
from fedaudit.run.results import RunMetrics, write_metrics
from fedaudit.run.stored import Accuracy, AuditedRecording, AuditorData, SecureAggregation, SourceVal
from fedaudit.run.stored.leakage import Leakage
from fedaudit.run.config import RunConfig
from fedaudit.simulation.summary import communication, privacy, provenance
from fedaudit.tensor_ops.aggregation import clone_state
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.method import Method
from fedaudit.simulation.secure_aggregation import (Disaggregated, RoundSum, disaggregate, disaggregation_rounds,
                                                     example_count, weighted_mean)
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, Wire, client_role

log = logging.getLogger("fedaudit")

# The options `fedaudit audit` takes (besides every attack's): who attacks whom, the architecture if the
# manifest's is to be overridden, and where and how the audit runs. Training options come from the manifest.
AUDIT_OPTIONS = ("attack", "attacker", "victim", "dataset", "secure_aggregation", "model", "model_args", "norm", "image_size", "device", "precision",
                 "deterministic", "out", "lpips_weights", "judge_steps")
REPLAY_KEYS = ("local_epochs", "batch_size", "lr")  # a replay reference cannot guess these of a client's round


def undeclared_recipe(rec: Recording) -> str:
    """Why reference models cannot replay the recorded clients' local rounds ("" where the manifest's recipe says
    enough: its other keys default to fedaudit's, which the audit stores)."""
    recipe = rec.manifest.recipe
    missing = [k for k in REPLAY_KEYS if recipe is None or getattr(recipe, k) is None]
    if not missing:
        return ""
    return (f"the recording declares no {', '.join(missing)} of the clients' local recipe (record with recipe={{...}}: "
            "local_epochs, batch_size, lr, momentum, weight_decay, augment), so reference models cannot replay a round")


def recorded_config(rec: Recording, records: str | Path | None = None, dataset: str | None = None) -> dict[str, Any]:
    """The run options the manifest states: protocol, data, architecture and the clients' recipe (a
    deployment's own records are the dataset ``records:PATH``; what the reviewer names — ``records``, the folder of
    ``--records``, or ``dataset``, the spec of ``--dataset`` — takes the place of the manifest's data)."""
    m = rec.manifest
    data = m.data or AuditorDataDeclared()
    options: dict[str, Any] = {"method": m.method or "fedavg"}
    options.update(data.model_dump(include={"target_domain", "seed"}, exclude_none=True))
    if m.model is not None:
        options.update(m.model.model_dump(include={"model", "norm", "image_size"}, exclude_none=True))
        if m.model.args:
            options["model_args"] = dict(m.model.args)
    if m.recipe is not None:
        options.update(m.recipe.model_dump(exclude_none=True))  # every recipe field is a run option of that name
    spec = auditor_dataset(rec, data, records, dataset)
    if spec is not None:
        options["dataset"] = spec
    else:
        if m.prior is None:
            raise FedauditError(f"{rec.root}/manifest.json names neither the auditor's data (data.dataset, or "
                                f"data.records: {RECORDS_LAYOUT}) nor what is public about the inputs (prior: "
                                f"{PRIOR_KEYS}); record with start_recording(data=...) to score the attacks, or "
                                "with start_recording(prior=...) to run them unscored")
        options["dataset"] = NO_DATA
    if "rounds" not in options:
        options["rounds"] = max((r["round"] for r in rec.rows), default=1)
    return options


def auditor_dataset(rec: Recording, data: AuditorDataDeclared, records: str | Path | None,
                    dataset: str | None) -> str | None:
    """The dataset spec the auditor scores with: what the reviewer names (``--records PATH`` or ``--dataset SPEC``),
    else the manifest's ``data.records`` or ``data.dataset`` — a path in either followed only where it lies inside the
    recording; None where neither names any."""
    if records is not None and dataset is not None:
        raise FedauditError("--records and --dataset both name the auditor's data; give one: --records PATH for a "
                            "deployment's own records, --dataset SPEC for data fedaudit splits")
    if dataset is not None:
        return dataset  # the reviewer's own choice, checked as evaluate checks it
    if records is not None or data.records is not None:
        return f"records:{auditor_records(rec, data.records, records)}"
    spec = data.dataset  # a string: the manifest's model holds it to its type
    if spec is None:
        return None
    if spec.startswith(FOLDER):
        return FOLDER + confined_folder(rec, spec[len(FOLDER):], "data.dataset", "the clients' dataset",
                                        f"--dataset {FOLDER}{{}}")
    if spec.startswith(RECORDS):
        return RECORDS + confined_folder(rec, spec[len(RECORDS):], "data.dataset", "the auditor's records",
                                         "--records {}")
    return spec  # a built-in dataset: no path


FOLDER, RECORDS = "folder:", "records:"  # the dataset specs that name a path


def auditor_records(rec: Recording, declared: Any, named: str | Path | None) -> str:
    """The folder the auditor's records are read from: the one the reviewer names (``--records``), else the
    manifest's, but only when it lies inside the recording (a relative path is read against it)."""
    if named is not None:
        path = Path(named).expanduser()
        if not path.is_dir():
            raise FedauditError(f"--records {named}: no such folder; give the folder of the auditor's records "
                                f"({RECORDS_LAYOUT})")
        return str(path.resolve())
    return confined_folder(rec, declared, "data.records", "the auditor's records", "--records {}")


def confined_folder(rec: Recording, declared: Any, key: str, what: str, flag: str) -> str:
    """A folder the manifest names (its ``key``), resolved against the recording, where it and every link under it
    stay inside the recording. A recording is someone else's file: a path it names elsewhere on the reviewer's disk
    is shown, never followed or listed — the reviewer names it (``flag``, with ``{}`` for the path)."""
    if not isinstance(declared, str) or not declared.strip():
        raise FedauditError(f"{rec.root}/manifest.json {key} is {declared!r}, not a folder path; pass {what} with "
                            f"{flag.format('PATH')}")
    root = rec.root.resolve()
    path = Path(declared)
    resolved = (path if path.is_absolute() else root / path).resolve()
    if not resolved.is_relative_to(root):
        named = declared if path.is_absolute() else os.path.normpath(root / path)  # as typed from anywhere
        raise FedauditError(f"{rec.root}/manifest.json points {what} at {declared}, outside the recording; fedaudit "
                            f"follows a path outside a recording only where you name it: check that the folder holds "
                            f"{what}, then pass {flag.format(named)}")
    for folder, dirs, files in os.walk(resolved):  # links are not followed here, only resolved
        for name in (*dirs, *files):
            entry = Path(folder) / name
            if entry.is_symlink() and not entry.resolve().is_relative_to(root):
                raise FedauditError(f"{rec.root}/manifest.json {key}: {entry.relative_to(root)} is a link that leads "
                                    f"outside the recording; fedaudit follows a path outside a recording only where "
                                    f"you name it: pass {what} with {flag.format('PATH')}")
    return str(resolved)


def check_audit_options(explicit: dict[str, Any], attack_option_names: set[str]) -> None:
    unknown = set(explicit) - set(AUDIT_OPTIONS) - attack_option_names
    if unknown:
        raise FedauditError(f"fedaudit audit takes no option {sorted(unknown)[0]!r}; training options come from the "
                            "recording's manifest")


def audited_model(rec: Recording, base: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
    """The manifest's options with the architecture the user chose. A manifest may *name* a model factory, but
    only ``--model`` on the command line makes fedaudit import code: the manifest's suggestion is refused until
    the user passes it. A factory's model keeps its own norm layers (the manifest's ``norm`` is dropped)."""
    suggested = base.get("model")
    if is_factory(suggested) and "model" not in explicit:
        raise FedauditError(f"{rec.root}/manifest.json names the model factory {suggested}; fedaudit imports code only "
                            f"when you name it: check that it is the code the clients ran, then pass --model {suggested}")
    out = dict(base)
    if "model" in explicit and explicit["model"] != suggested:
        out.pop("model_args", None)  # the manifest's arguments belong to its own model
    if is_factory(explicit.get("model", suggested)):
        out.pop("norm", None)
    return out


def name_model_records(rec: Recording, cfg: RunConfig, num_classes: int) -> None:
    """Records of a recording made without a declared model, named as the audited architecture's state."""
    state = {k: tuple(v.shape) for k, v in build_model(cfg.model, num_classes, cfg.image_size, cfg.norm,
                                                        model_args=cfg.model_args).state_dict().items()}
    if rec.reclassify(state):
        log.info("records named as the %s model's state from its shapes (the recording declared no model)", cfg.model)


def recorded_shares(rec: Recording) -> tuple[tuple[ArtifactKind, str], ...]:
    """(kind, direction) pairs the recording's ledger holds, sorted: what the recorded protocol sends."""
    return tuple(sorted(rec.shares(), key=lambda s: (s[0].value, s[1])))


def check_architecture(model: torch.nn.Module, rec: Recording, cfg: RunConfig) -> None:
    """Every recorded model tensor, in every round, must be one of the architecture's with its shape (the shapes
    verification read from each message file): else name the first that is not, with its round."""
    state = model.state_dict()
    hint = ("give the model the clients trained: --model cnn/resnet18/resnet50 with --norm and --image-size, or "
            "their own as --model PKG.MODULE:CALLABLE (with --model-arg KEY=VALUE)")
    given = f"--model {cfg.model}" + (f" (norm {cfg.norm})" if not is_factory(cfg.model) else "")
    models = (ArtifactKind.FULL_MODEL.value, ArtifactKind.PARTIAL_MODEL.value)
    for row in rec.rows:
        if row["kind"] not in models:
            continue
        for name, shape in (row.get("shapes") or {}).items():
            where = f"recorded {row['kind']} from {row['sender']} in round {row['round']}"
            if name not in state:
                raise FedauditError(f"{where} holds tensor {name!r}, which {given} does not have; {hint}")
            if tuple(state[name].shape) != tuple(shape):
                raise FedauditError(f"{where}: tensor {name!r} has shape {tuple(shape)}, but {given} has "
                                    f"{tuple(state[name].shape)}; {hint}")


def check_some_client_answered(rec: Recording) -> None:
    """A run in which no client sent back a training update (every client failed, or none ran) has nothing to
    audit: refused in one line, never audited as a federation at chance."""
    seen = rec.participation()
    protocol = rec.secure_aggregation()
    if seen["uploads"] == 0 and protocol is not None:
        raise FedauditError(f"{rec.root}: the run used {protocol} and its clients' replies were recorded after the mask "
                            "(masked vectors, no array): nothing per client to audit; list the recording mod after "
                            "secaggplus_mod in ClientApp(mods=[...]) so it records what each client computed, and "
                            "audit again (the audit then judges the server under secure aggregation beside it)")
    if seen["uploads"] == 0:
        missed = ", ".join(c[len("client:"):] for c in sorted(seen["missed"])) or "none named"
        raise FedauditError(f"{rec.root}: no client sent back a training update in any round (clients sent a model: "
                            f"{missed}): every client failed or none ran, so there is no federation to audit — see "
                            "the deployment's logs and record the run again")


def recorded_disaggregation(rec: Recording, device: torch.device | str = "cpu") -> Disaggregated:
    """Where the recorded participation varied, each client's single upload solved from the aggregates of two
    rounds whose clients differ by it alone (:func:`~fedaudit.simulation.secure_aggregation.disaggregation_rounds`):
    what a server under secure aggregation can recover. Only those rounds' messages are read."""
    out: dict[tuple[ArtifactKind, str], tuple[dict[str, Tensor], int, int]] = {}
    for kind in (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL):
        uploads = [r for r in rec.rows if r["receiver"] == SERVER and r["kind"] == kind.value and trains(r)]
        sets: dict[int, set[str]] = {}
        for r in uploads:
            sets.setdefault(r["round"], set()).add(r["sender"][len("client:"):])
        rounds = {r: frozenset(c) for r, c in sets.items()}
        sums: dict[int, RoundSum | None] = {}
        for client in sorted(set().union(*rounds.values()) if rounds else ()):
            pair = disaggregation_rounds(client, rounds)
            if pair is None:
                continue
            for rnd in pair:
                if rnd not in sums:
                    sums[rnd] = _round_sum(rec, [u for u in uploads if u["round"] == rnd], device)
            first, second = sums[pair[0]], sums[pair[1]]
            if first is not None and second is not None:
                out[(kind, client)] = (disaggregate(first, second), *pair)
    return out


def _round_sum(rec: Recording, uploads: list[dict[str, Any]], device: torch.device | str) -> RoundSum | None:
    """One round's aggregate as the server under secure aggregation learns it (None without the model it sent)."""
    rnd = uploads[0]["round"]
    sent = [r for r in rec.rows if r["sender"] == SERVER and r["round"] == rnd and trains(r)
            and r["kind"] in (ArtifactKind.FULL_MODEL.value, ArtifactKind.PARTIAL_MODEL.value)]
    if not sent:
        return None
    counts = {}
    for r in rec.rows:
        if r["kind"] == ArtifactKind.SCALARS.value and r["round"] == rnd and r["receiver"] == SERVER:
            count = example_count(rec.artifact(r))
            if count is not None:
                counts[r["sender"]] = count
    weights = [counts.get(u["sender"], 1.0) for u in uploads]
    mean = weighted_mean([rec.artifact(u, device).tensors for u in uploads], weights)
    return RoundSum(rnd, frozenset(u["sender"][len("client:"):] for u in uploads), float(sum(weights)), mean,
                    rec.artifact(sent[0], device).tensors)


def check_finite_reads(rec: Recording, wire: Wire, deployed: Artifact, role: str, victims: Sequence[str],
                       attacks: bool) -> None:
    """A recorded tensor holding NaN or infinity is a finding for the report; an attack that would read one is
    refused here, in one line naming the message and the tensor, before any work — not a crash or a score of NaN
    later. What the attacks read: the deployed model (and, with it, the accuracy the audit scores), and the newest
    training message to or from each victim (the server's view) or to or from the attacking client (its view)."""
    findings = (rec.verification or {}).get("non_finite") or []
    parties = {client_role(v) for v in victims} if role == SERVER else {role}
    read = {_message_key(deployed.sender, deployed.receiver, deployed.round, deployed.meta): "the deployed model, "
            "which the audit scores and every membership attack queries"}
    if attacks:
        for art in wire.retained.values():
            if art.sender in parties or art.receiver in parties:
                read.setdefault(_message_key(art.sender, art.receiver, art.round, art.meta),
                                f"the newest {art.kind.value} {art.sender} → {art.receiver}, which the attacks "
                                f"from {role}'s view read")
    for f in findings:
        why = read.get(_message_key(f["sender"], f["receiver"], f["round"], f))
        if why is None:
            continue
        others = sorted({r["sender"] for r in rec.rows if r["direction"] == "up"} - {f["sender"]})
        fix = (f"audit another client with --victim {others[0][len('client:'):]}, or ask for a recording whose "
               f"tensors are finite" if role == SERVER and f["sender"] in parties and others
               else "ask for a recording whose tensors are finite")
        raise FedauditError(f"{f['sender']} → {f['receiver']}, round {f['round']}: tensor {f['record']}/{f['tensor']} "
                            f"holds NaN or infinity, and it is {why}; {fix}")


def _message_key(sender: str, receiver: str, round_: int, meta: Mapping[str, Any]) -> tuple[Any, ...]:
    return sender, receiver, round_, meta.get("record"), meta.get("message_type")


def data_free_attacks(selected: Sequence[type[Attack]], chosen_by_auto: bool) -> tuple[list[type[Attack]], dict[str, str]]:
    """Without the clients' records: the selected attacks that can still run (those that need no challenge or
    canary the auditor would draw from the records), and why each other one cannot. An attack the user named
    is refused with one line; one ``auto`` chose is left out and said so in metrics.json."""
    kept, left_out = [], {}
    for cls in selected:
        if cls.needs & {"challenges", "domain_challenge", "canaries"}:
            why = ("membership inference challenges the model with the clients' members and non-members, which this "
                   "audit does not have")
            if not chosen_by_auto:
                raise FedauditError(f"--attack {cls.name} needs the clients' records and the recording's manifest names "
                                    "no data for the auditor; add it (start_recording(data=...)) or drop "
                                    f"{cls.name} from --attack")
            left_out[cls.name] = why
        else:
            kept.append(cls)
    return kept, left_out


def attack_recording(rec: Recording, selected: Sequence[type[Attack]], run_dir: Path, cfg: RunConfig, method: Method,
                     fed: Federation, dataset: MultiDomainDataset, device: torch.device, scored: bool
                     ) -> tuple[Leakage, SecureAggregation | None]:
    """The attacks on the recorded wire: scored by the auditor's records (with secure aggregation, the single updates
    the recorded participation lets a server solve for), or unscored without them."""
    if not scored:
        return run_unscored(selected, run_dir, cfg, method, fed, dataset, device, UNSCORED), None
    solved = recorded_disaggregation(rec, device) if cfg.secure_aggregation else None
    return run_attacks(selected, run_dir, cfg, method, fed, dataset, device, retrain=False, disaggregated=solved)


def mapped_sources(clients: list[str], split: LODOSplit, cfg: RunConfig) -> list[ClientData]:
    """The split's source clients the recording names; a recorded client with no source domain is an error."""
    sources = [c.domain for c in split.sources]
    for name in clients:
        if name not in sources:
            raise FedauditError(f"recorded client {name!r} has no data mapping: it is not a source domain of "
                                f"{cfg.dataset} with target {split.target} (sources: {', '.join(sources)}); name each "
                                "node after the domain its records come from (the mod's name=) or fix the manifest's "
                                "data")
    for c in split.sources:
        if c.domain not in clients:
            log.warning("the auditor's data holds client %r, which the recording never names; it is left out", c.domain)
    return [c for c in split.sources if c.domain in clients]


def audit(rec: Recording, cfg: RunConfig, method: Method, selected: Sequence[type[Attack]],
          dataset: MultiDomainDataset, split: LODOSplit, device: torch.device,
          command: str = "", left_out: dict[str, str] | None = None,
          unpinned: list[str] | None = None) -> tuple[Path, dict[str, Any]]:
    """Attack the recording as ``evaluate`` attacks its own wire, score the deployed model, write a run
    directory (no report: the caller renders it); on failure no directory is left. Without the clients'
    records (:data:`NO_DATA`) the attacks run and keep their outputs, and nothing is scored."""
    wall0 = time.perf_counter()
    scored = cfg.dataset != NO_DATA
    target = split.target
    clients = recorded_clients(rec)
    method.replay_note = undeclared_recipe(rec)
    split.sources = mapped_sources(clients, split, cfg)
    thin = thin_splits(split, dataset.classes) if scored else []
    for line in thin:
        log.warning("thin split: %s", line)
    role, victims = attack_role_and_victims(cfg, clients)  # a bad --attacker/--victim fails before any work

    keep = any(cls.keeps_rounds(attack_setup(cls, cfg)) for cls in selected) and not method.replay_note
    wire = rec.wire(device, {client_role(v) for v in victims} if keep else ())
    fed = Federation(cfg, method, dataset, split, device, wire)
    check_architecture(fed.model, rec, cfg)
    found = rec.deployed(device)
    if found is None:
        raise FedauditError(f"{rec.root}: the server sent no whole model and the recording names no released model, so "
                            "there is no deployed model to audit; record it (Recorder.release) or the server's "
                            "full_model broadcasts")
    deployed, judged = found
    if not judged["released"]:
        log.warning("%s", judged["what"])
    check_finite_reads(rec, wire, deployed, role, victims, bool(selected))
    method.global_state = clone_state(deployed.tensors)
    fed.rounds_done = deployed.round
    if scored:  # the engine's own scoring of the one model there is (no training loss: nothing was trained here)
        fed.history.append(fed.evaluate(deployed.round, float("nan")))

    run_dir = run_directory.new_run_dir(Path(cfg.out).expanduser(), f"recording-{cfg.method}", cfg.dataset, target)
    try:
        run_directory.write_json(run_dir / "config.json", {"config": cfg.to_json(), "config_hash": cfg.hash(), "command": command,
                                                  "targets": [target], "recording": str(rec.root.resolve())})
        t0 = time.perf_counter()
        leakage, secure_aggregation = attack_recording(rec, selected, run_dir, cfg, method, fed, dataset, device, scored)
        attack_seconds = time.perf_counter() - t0
        shares = recorded_shares(rec)
        accuracy = (fed.results().with_(note=f"the deployed model: {judged['what']}") if scored else
                    Accuracy(status="unscored", why=UNSCORED, unseen_domain=None, source_val=SourceVal(mean=None, per_domain={}),
                             selected_round=deployed.round, note=f"the deployed model ({judged['what']}) was not scored"))
        metrics = RunMetrics(
            method=cfg.method, dataset=cfg.dataset, target_domain=target, source_domains=clients,
            auditor_data=(AuditorData(status="held", dataset=cfg.dataset) if scored else
                          AuditorData(status="none", why=UNSCORED, left_out=dict(left_out or {}),
                                      needs_data=["every leakage score and its nulls, twin and positive control",
                                                  "membership inference", "accuracy of the deployed model"])),
            accuracy=accuracy,
            communication=communication(fed, shares),
            secure_aggregation=secure_aggregation,
            leakage=leakage,
            privacy=recorded_privacy(rec, shares) or privacy(
                fed, shares, no_dp="no DP mechanism in the recording's manifest: whether the clients trained with one is "
                                   "not known here (start_recording(dp=...) declares it)"),
            provenance=provenance(cfg, dataset, device, command, {"attacks": attack_seconds,
                                                                  "wall": time.perf_counter() - wall0}, unpinned,
                                  fed.model, data_warnings=thin).with_(recording=AuditedRecording.model_validate({
                                      "path": str(rec.root.resolve()), "framework": rec.manifest.framework,
                                      "verification": rec.verification, "run_id": rec.manifest.run_id,
                                      "framework_run_id": rec.manifest.framework_run_id,
                                      "nodes": {str(k): v for k, v in rec.nodes.items()}, "deployed_model": judged,
                                      "secure_aggregation": rec.secure_aggregation(),
                                      "participation": rec.participation()})))
        store_verdict(metrics, cfg.attacker)
        run_directory.write_csv(run_dir / "history.csv", fed.history)
        run_directory.write_jsonl(run_dir / "wire.jsonl", wire.ledger_rows())
        written = write_metrics(run_dir / "metrics.json", metrics)
        run_directory.mark_complete(run_dir, ["config.json", "metrics.json", "history.csv", "wire.jsonl"])
    except BaseException:  # whatever fails after the directory exists (a stored block's check included)
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing to resume: an audit is rerun whole
        raise
    return run_dir, written


__all__ = ["AUDIT_OPTIONS", "NO_DATA", "attack_recording", "audit", "audited_model", "auditor_data", "auditor_dataset", "auditor_records", "check_architecture", "confined_folder", "check_audit_options",
           "check_finite_reads", "check_some_client_answered",
           "data_free_attacks", "name_model_records", "public_data", "recorded_clients", "recorded_config", "recorded_disaggregation",
           "recorded_shares"]
