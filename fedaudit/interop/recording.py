"""Recordings: what crossed a federation fedaudit did not run, in fedaudit's wire format.

A recording directory holds

    manifest.json   what was recorded: format, framework and version, run id, the model the user
                    declared (and its state_dict shapes), record names mapped to artifact kinds,
                    the auditor's data per client
    nodes/ID.json   one per client node: its id and name (written by the client side as it starts)
    wire.jsonl      one ledger row per recorded record of a message, as fedaudit's own ledger, plus
                    where its tensors are, the message's id and type, and who recorded it
    messages/*.safetensors   one file per message: every array of every array record
                    (``record/key``) and every metric (``metrics:record/key``); config records ride
                    in the file's metadata

The writer is framework-free: a hand-written loop records with :class:`Recorder` (one ``send`` per
message), and ``fedaudit.interop.flower`` feeds the same writer from Flower messages. It is safe when several
processes record into one directory: message files are written to a temporary name and renamed, ledger
rows are appended under an exclusive lock, node files are written once each.

A recording is one run: the manifest's ``run_id`` is on every ledger row (with the framework's own run
id where there is one), a directory holding another run is refused when recording starts, and reading
refuses rows of two runs or a message recorded twice. Reading a recording
(:mod:`fedaudit.interop.recording_reader`) turns it into a :class:`~fedaudit.simulation.wire.Wire`: the same
ledger and views the attacks get from fedaudit's own simulation.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.run.run_directory import atomic_path, safe_name
from fedaudit.simulation.wire import SERVER, ArtifactKind, client_role

FORMAT = "fedaudit-recording/1"
MANIFEST = "manifest.json"
LEDGER = "wire.jsonl"
MESSAGES = "messages"
NODES = "nodes"
RECORDERS = ("client", "server")  # which side wrote a row: the client mod or the server-side recorder
BN_STAT_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")
METRICS_PREFIX = "metrics:"


# -- what a record is ----------------------------------------------------------------------------------


def classify_record(name: str, shapes: Mapping[str, tuple[int, ...]], *, sent_up: bool,
                    model_state: Mapping[str, tuple[int, ...]] | None = None,
                    declared: Mapping[str, str] | None = None) -> ArtifactKind:
    """The artifact kind of one array record: the user's declaration for its name first, then
    the declared model's whole state_dict → ``full_model``, BatchNorm running statistics only →
    ``bn_stats_all_layers`` up / ``global_stats`` down, a subset of the state_dict →
    ``partial_model``; anything else is a generic ``record`` that keeps its name."""
    if declared and name in declared:
        return ArtifactKind(declared[name])
    keys = set(shapes)
    if keys and all(k.endswith(BN_STAT_SUFFIXES) for k in keys):
        return ArtifactKind.BN_STATS_ALL_LAYERS if sent_up else ArtifactKind.GLOBAL_STATS
    if model_state and keys and keys <= set(model_state) and all(tuple(model_state[k]) == tuple(s)
                                                                for k, s in shapes.items()):
        return ArtifactKind.FULL_MODEL if keys == set(model_state) else ArtifactKind.PARTIAL_MODEL
    return ArtifactKind.RECORD


def check_kinds(declared: Mapping[str, str]) -> dict[str, str]:
    """The user's record-name → kind mapping, each kind checked against fedaudit's names."""
    valid = [k.value for k in ArtifactKind]
    for record, kind in declared.items():
        if kind not in valid:
            raise FedauditError(f"record {record!r} is mapped to unknown kind {kind!r}; valid kinds: {', '.join(valid)}")
    return dict(declared)


# -- writing ---------------------------------------------------------------------------------------------


def start_recording(root: str | Path, *, model: nn.Module | None = None,
                    architecture: Mapping[str, Any] | None = None, record_kinds: Mapping[str, str] | None = None,
                    data: Mapping[str, Any] | None = None, recipe: Mapping[str, Any] | None = None,
                    prior: Mapping[str, Any] | None = None, nodes: Mapping[int, str] | None = None,
                    dp: Mapping[str, Any] | None = None, framework: Mapping[str, Any] | None = None,
                    framework_run_id: int | str | None = None, append: bool = False) -> Path:
    """Create ``root`` with its manifest, before the run (any framework, or none: :class:`Recorder`).

    ``architecture`` is what ``fedaudit audit`` rebuilds the model from: fedaudit's own
    (``{"model": "cnn", "norm": "bn", "num_classes": 10, "image_size": 32}``) or a factory the audit may be
    told to import (``{"model": "mypkg.nets:Net", "args": {"width": 32}, "num_classes": 10, "image_size": 32}``;
    fedaudit imports it only when the user passes ``--model`` to ``fedaudit audit``); ``model`` (that
    architecture, built) gives the state_dict shapes that tell a whole model from a part of one;
    ``record_kinds`` maps custom array records to kinds (``{"styles": "style_bank"}``); ``data`` is the
    auditor's data (``{"dataset": "digits", "seed": 0, "target_domain": "textured"}``, or
    ``{"records": PATH, "seed": 0}`` for a deployment's own records; README, "What fedaudit audit does");
    ``recipe`` is the clients' public training recipe (lr, momentum, weight_decay, batch_size, local_epochs,
    augment), which the auditor's counterfactuals and an informed attacker's reference models follow;
    ``prior`` is what is public about the inputs when the auditor holds no data (``{"classes": [...],
    "mean": [...], "std": [...], "hflip": False}``): the attacks then still run, unscored; ``dp`` the privacy
    mechanism the deployment ran (:func:`fedaudit.interop.recorded_dp.check_dp`). ``framework_run_id`` is the
    framework's own id of the run (Flower's ``run_id``).

    A recording is one run: a directory that already holds another run's messages (or a manifest naming
    another framework run) is refused; ``append=True`` continues the run recorded there (a deployment
    resumed), keeping its run id."""
    from fedaudit.interop.recorded_dp import check_dp

    state = {k: list(v.shape) for k, v in model.state_dict().items()} if model is not None else None
    if dp:
        dp = check_dp(dp, "start_recording")
    return write_manifest(Path(root), {
        "framework": dict(framework) if framework else {"name": "none"},
        "framework_run_id": framework_run_id, "model": dict(architecture) if architecture else None,
        "model_state": state, "record_kinds": check_kinds(record_kinds or {}), "data": dict(data) if data else None,
        "recipe": dict(recipe) if recipe else None, "prior": dict(prior) if prior else None,
        "nodes": {str(k): v for k, v in nodes.items()} if nodes else None, "server_node_id": SERVER_NODE_ID,
        "dp": dict(dp) if dp else None,
    }, mode="append" if append else "start")


def write_manifest(root: Path, manifest: dict[str, Any], *, mode: str = "start") -> Path:
    """Create the recording directory and its manifest (``format`` and a ``run_id`` are added); an existing
    manifest of the same run is merged, so the client and server sides can each add what they know. ``mode``:
    ``start`` refuses another run's directory (see :func:`start_recording`), ``append`` continues the run
    recorded there, ``join`` is a side adding what it knows to the run being recorded."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / MANIFEST
    with _locked(root):
        old = json.loads(path.read_text()) if path.exists() else {}
        if mode == "start":
            _refuse_another_run(root, old, manifest.get("framework_run_id"))
            earlier = old.get("framework_run_id")
            if earlier is None or str(earlier) != str(manifest.get("framework_run_id")):
                old = {}  # a new run: nothing of an earlier, unused manifest (a run that never sent) carries over
        merged = {**old, **{k: v for k, v in manifest.items() if v is not None}, "format": FORMAT}
        merged["run_id"] = old.get("run_id") or uuid.uuid4().hex
        if old.get("framework_run_id") is not None:  # the run this directory recorded first stays its run
            merged["framework_run_id"] = old["framework_run_id"]
        if mode == "append":
            merged["appended"] = True
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path


def _refuse_another_run(root: Path, old: Mapping[str, Any], framework_run_id: Any) -> None:
    earlier = old.get("framework_run_id")
    if framework_run_id is not None and earlier is not None and str(earlier) != str(framework_run_id):
        raise FedauditError(f"{root} already holds the recording of another run ({old.get('framework', {}).get('name')} "
                            f"run {earlier}, not {framework_run_id}); record into a new directory, or, to continue "
                            "that run with its rounds numbered on, pass append=True")
    ledger = root / LEDGER
    if ledger.is_file() and ledger.stat().st_size and not (framework_run_id is not None and earlier is not None):
        raise FedauditError(f"{root} already holds a recorded run (run id {old.get('run_id')}, messages in {LEDGER}); "
                            "record into a new directory, or, to continue that run with its rounds numbered on, pass "
                            "append=True")


class RecordingWriter:
    """Writes messages into a recording directory (one writer per process and side)."""

    def __init__(self, root: str | Path, recorded_by: str):
        if recorded_by not in RECORDERS:
            raise ValueError(f"recorded_by must be one of {RECORDERS}, got {recorded_by!r}")
        self.root = Path(root)
        self.recorded_by = recorded_by
        self._manifest: dict[str, Any] | None = None
        self._named: set[int] = set()
        self._checked_runs: set[str] = set()

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest, read once it exists (a client process may start before the server side writes it)."""
        if self._manifest is None:
            path = self.root / MANIFEST
            if not path.exists():
                return {}
            self._manifest = json.loads(path.read_text())
        return self._manifest

    def name_node(self, node_id: int, name: str) -> None:
        """Say once which client name (a domain, for the auditor's data) a node id stands for."""
        if node_id in self._named:
            return
        path = self.root / NODES / f"{int(node_id)}.json"
        if not path.exists():
            with atomic_path(path) as tmp:
                tmp.write_text(json.dumps({"node_id": int(node_id), "name": name}) + "\n")
        self._named.add(node_id)

    def reload(self) -> None:
        """Read the manifest again at the next use (another writer, or this one, has just changed it)."""
        self._manifest = None

    def _join_run(self, framework_run_id: Any) -> None:
        """Make sure the directory is this run's: a manifest exists (a side may record before anyone started the
        recording), and the framework's run id, when known, is the one the directory records."""
        key = str(framework_run_id)
        if key in self._checked_runs and self._manifest:
            return
        self._manifest, self._named = None, set()  # a long-lived process may record a new run into a new directory
        manifest = self.manifest
        if not manifest:
            write_manifest(self.root, {"server_node_id": SERVER_NODE_ID, "framework_run_id": framework_run_id}, mode="join")
        elif framework_run_id is not None:
            earlier = manifest.get("framework_run_id")
            if earlier is None:
                write_manifest(self.root, {"framework_run_id": framework_run_id}, mode="join")
            elif str(earlier) != key and not manifest.get("appended"):
                raise FedauditError(f"{self.root} records run {earlier}, and this message belongs to run {key}; "
                                    "record each run into a new directory (or start_recording(append=True) to "
                                    "continue one)")
        self.reload()  # the run id may have just been written
        self._checked_runs.add(key)

    def message(self, *, src_node_id: int, dst_node_id: int, sender: str | None, receiver: str | None, round: int,
                message_type: str, message_id: str, arrays: Mapping[str, Mapping[str, Any]],
                metrics: Mapping[str, Mapping[str, Any]] | None = None,
                configs: Mapping[str, Mapping[str, Any]] | None = None,
                framework_run_id: int | str | None = None) -> list[dict[str, Any]]:
        """Record one message: its arrays (record → key → array), metrics and configs. ``sender`` and
        ``receiver`` are roles (``server``, ``client:<name>``) where this side knows them, else None
        (the reader names nodes from ``nodes/``); ``framework_run_id`` the framework's run the message belongs
        to, where known. Returns the ledger rows written."""
        self._join_run(framework_run_id)
        metrics, configs = metrics or {}, configs or {}
        tensors, shapes, numbers = _message_tensors(arrays, metrics)
        stem = "-".join([self.recorded_by, f"r{round:04d}", safe_name(message_type),
                         f"{src_node_id}to{dst_node_id}", safe_name(message_id)[:24] or "x", uuid.uuid4().hex[:8]])
        file = f"{MESSAGES}/{stem}.safetensors"
        digest = _save(self.root / file, tensors, {"configs": configs, "message_type": message_type,
                                                   "message_id": message_id})

        sent_up = dst_node_id == self.manifest.get("server_node_id", SERVER_NODE_ID)
        base = {"sender": sender, "receiver": receiver, "src_node_id": int(src_node_id), "dst_node_id": int(dst_node_id),
                "round": int(round), "direction": "up" if sent_up else "down", "message_type": message_type,
                "message_id": message_id, "recorded_by": self.recorded_by, "file": file, "sha256": digest,
                "time": time.time(),
                "run_id": self.manifest.get("run_id"),
                **({"framework_run_id": framework_run_id} if framework_run_id is not None else {})}
        state = {k: tuple(v) for k, v in (self.manifest.get("model_state") or {}).items()}
        declared = self.manifest.get("record_kinds") or {}
        rows = [{**base, "kind": classify_record(record, shapes[record], sent_up=sent_up, model_state=state,
                                                 declared=declared).value,
                 "record": record, "bytes": sum(tensors[f"{record}/{k}"].numel() * tensors[f"{record}/{k}"].element_size()
                                                for k in items),
                 "tensors": len(items), "shapes": {k: list(v) for k, v in shapes[record].items()}}
                for record, items in arrays.items()]
        for record, nbytes in numbers.items():
            rows.append({**base, "kind": ArtifactKind.SCALARS.value, "record": f"{METRICS_PREFIX}{record}",
                         "bytes": nbytes, "tensors": len(metrics[record])})
        if configs:
            rows.append({**base, "kind": "config", "record": ",".join(sorted(configs)), "bytes": 0, "tensors": 0,
                         "configs": {r: dict(v) for r, v in configs.items()}})
        line = "".join(json.dumps(r, default=_plain) + "\n" for r in rows)
        with _locked(self.root):
            with open(self.root / LEDGER, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        return rows


SERVER_NODE_ID = 1  # Flower's ServerApp speaks as the SuperLink's node (flwr.common.constant.SUPERLINK_NODE_ID)


class Recorder:
    """Record a federation from any training loop: call :meth:`send` once per message.

    ::

        recorder = Recorder("runs/my-federation", model=model, architecture={"model": "mypkg.nets:Net",
                            "num_classes": 10, "image_size": 32}, data={"records": "auditor-records"})
        for rnd in range(1, rounds + 1):
            for name in clients:
                recorder.send(rnd, "server", name, global_model.state_dict())
                ...  # the client trains
                recorder.send(rnd, name, "server", local_model.state_dict())
                recorder.send(rnd, name, "server", {"num_samples": n}, kind="scalars")

    ``sender`` and ``receiver`` are ``"server"`` or a client's name (the auditor's data names its records by it);
    ``tensors`` a state_dict or any mapping of names to arrays; ``kind`` (optional) an artifact kind, else the
    declared model's state_dict shapes decide (whole model, a part of it, BN statistics). The keyword arguments
    of the constructor are :func:`start_recording`'s; it refuses a directory that holds another run."""

    def __init__(self, root: str | Path, **manifest: Any):
        self.root = Path(start_recording(root, **manifest)).parent
        self._writer = RecordingWriter(self.root, "server")
        self._nodes: dict[str, int] = {}

    def send(self, round: int, sender: str, receiver: str, tensors: Mapping[str, Any], *, kind: str | None = None,
             record: str | None = None, message_type: str = "train") -> list[dict[str, Any]]:
        """Record one message of ``round``; ``record`` names it in the ledger (default: the kind, or ``arrays``).
        ``message_type`` ``evaluate`` marks a model sent to be scored, not trained from."""
        if not isinstance(round, int) or isinstance(round, bool) or round < 0:
            raise FedauditError(f"Recorder.send: round must be an integer >= 0, got {round!r}")
        if SERVER not in (sender, receiver) or sender == receiver:
            raise FedauditError(f"Recorder.send: a message goes between the server and a client, got {sender!r} → "
                                f"{receiver!r}; name one side \"server\"")
        name = record or kind or "arrays"
        if kind is not None and kind != ArtifactKind.SCALARS.value:  # scalars ride as metrics, named by the writer
            check_kinds({name: kind})
            declared = dict(self._writer.manifest.get("record_kinds") or {})
            if declared.get(name) != kind:
                declared[name] = kind
                write_manifest(self.root, {"record_kinds": declared}, mode="join")
                self._writer.reload()
        ids = {role: SERVER_NODE_ID if role == SERVER else self._node(role) for role in (sender, receiver)}
        roles = {role: SERVER if role == SERVER else client_role(role) for role in (sender, receiver)}
        arrays, metrics = {}, {}
        if kind == ArtifactKind.SCALARS.value:
            metrics[name] = {k: _scalar(k, v) for k, v in tensors.items()}
        else:
            arrays[name] = dict(tensors)
        return self._writer.message(src_node_id=ids[sender], dst_node_id=ids[receiver], sender=roles[sender],
                                    receiver=roles[receiver], round=round, message_type=message_type,
                                    message_id=uuid.uuid4().hex, arrays=arrays, metrics=metrics)

    def close(self) -> str:
        """The run has ended: seal the ledger (its sha256 into the manifest, see :func:`seal_recording`)."""
        return seal_recording(self.root)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _node(self, name: str) -> int:
        if not isinstance(name, str) or not name or name.startswith("client:"):
            raise FedauditError(f"Recorder.send: a client's name must be a plain non-empty string (as the auditor's "
                                f"data names it), got {name!r}")
        if name not in self._nodes:
            self._nodes[name] = SERVER_NODE_ID + 1 + len(self._nodes)
            self._writer.name_node(self._nodes[name], name)
        return self._nodes[name]


def _message_tensors(arrays: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Mapping[str, Any]]
                     ) -> tuple[dict[str, Tensor], dict[str, dict[str, tuple[int, ...]]], dict[str, int]]:
    """A message's tensors as the file stores them (``record/key``, ``metrics:record/key``), each array record's
    shapes, and each metrics record's size in bytes."""
    tensors: dict[str, Tensor] = {}
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    for record, items in arrays.items():
        shapes[record] = {}
        for key, value in items.items():
            t = torch.as_tensor(value).detach().cpu().contiguous()
            tensors[f"{record}/{key}"] = t
            shapes[record][key] = tuple(t.shape)
    numbers: dict[str, int] = {}
    for record, items in metrics.items():
        for key, value in items.items():
            t = torch.as_tensor(value, dtype=torch.float64 if _has_float(value) else torch.int64)
            tensors[f"{METRICS_PREFIX}{record}/{key}"] = t
            numbers[record] = numbers.get(record, 0) + t.numel() * t.element_size()
    return tensors, shapes, numbers


def _scalar(key: str, value: Any) -> float | int | list[float] | list[int]:
    v = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(v, bool) or not isinstance(v, (int, float, list)):
        raise FedauditError(f"Recorder.send: scalars {key!r} must be a number or a list of numbers, got {value!r}")
    return v


def _has_float(value: Any) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, float) for v in values)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def _save(path: Path, tensors: dict[str, Tensor], meta: dict[str, Any]) -> str:
    """Write one message file; returns its sha256, which its ledger rows carry (tamper evidence)."""
    from safetensors.torch import save

    data = save(tensors, metadata={"fedaudit": json.dumps(meta, default=_plain)})
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def seal_recording(root: str | Path) -> str:
    """Write the ledger's sha256 into the manifest when the run ends (``Recorder.close`` does; a Flower server
    calls it after its last round): an audit then verifies that no ledger row was added, removed or edited since.
    Returns the digest."""
    root = Path(root)
    with _locked(root):
        digest = hashlib.sha256((root / LEDGER).read_bytes()).hexdigest()
    write_manifest(root, {"ledger_sha256": digest, "sealed_at": time.time()}, mode="join")
    return digest


class _locked:
    """An exclusive lock on the recording directory's lock file (several client processes append at once)."""

    def __init__(self, root: Path):
        self.path = Path(root) / ".lock"

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a")
        fcntl.flock(self.fh, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


__all__ = ["FORMAT", "Recorder", "RecordingWriter", "seal_recording", "start_recording", "classify_record", "check_kinds", "write_manifest"]
