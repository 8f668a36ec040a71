"""Writing a recording (what crossed a federation fedaudit did not run, in fedaudit's wire format): the format,
the manifest and the writer every recorder is built on (:mod:`fedaudit.interop.recording` holds the Recorder).

A recording directory holds

    manifest.json   what was recorded: format, framework and version, run id, the model the user
                    declared (and its state_dict shapes), record names mapped to artifact kinds,
                    the auditor's data per client
    nodes/ID.json   one per client node: its id and name (written by the client side as it starts)
    shards/NAME/    a run recorded by several processes: each process's own ledger, messages, node names
                    and shard.json (its run id; closed when the process ends), merged into wire.jsonl
                    and nodes/ when the run is sealed (:mod:`fedaudit.interop.recording_shards`)
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
from fedaudit.interop.manifest import FORMAT, NO_FRAMEWORK, checked_manifest
from fedaudit.run.stored.provenance import Framework
from fedaudit.run.run_directory import atomic_path, safe_name
from fedaudit.simulation.wire import SERVER, ArtifactKind

MANIFEST = "manifest.json"
LEDGER = "wire.jsonl"
MESSAGES = "messages"
NODES = "nodes"
SHARDS = "shards"  # shards/<name>/: one process's part of a run (its ledger, messages, nodes), merged when sealed
SHARD_FILE = "shard.json"
RELEASE = "release"  # the message type of the model the deployment releases (server → server: it crosses no wire)
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
                    dp: Mapping[str, Any] | None = None, framework: Framework | Mapping[str, Any] | None = None,
                    framework_run_id: int | str | None = None, append: bool = False, run_id: str | None = None,
                    shard: str | None = None) -> Path:
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
    resumed), keeping its run id.

    A run recorded by several processes (a server and its sites, on one machine or several): each process
    passes its own ``shard`` name and the same ``run_id`` (a string every process knows: the framework's job
    id, or one the launcher hands out); each writes ``shards/<shard>/`` alone, the first to start writes the
    manifest and the others must declare nothing that contradicts it. :func:`seal_recording` checks that the
    shards belong together and merges them into one ledger."""
    from fedaudit.interop.recorded_dp import check_dp

    state = {k: list(v.shape) for k, v in model.state_dict().items()} if model is not None else None
    order = list(model.state_dict()) if model is not None else None  # the manifest's keys are sorted; this is not
    if dp:
        dp = check_dp(dp, "start_recording")
    return write_manifest(Path(root), {
        "framework": framework or {"name": NO_FRAMEWORK},
        "framework_run_id": framework_run_id, "model": dict(architecture) if architecture else None,
        "model_state": state, "model_order": order, "record_kinds": check_kinds(record_kinds or {}), "data": dict(data) if data else None,
        "recipe": dict(recipe) if recipe else None, "prior": dict(prior) if prior else None,
        "nodes": {str(k): v for k, v in nodes.items()} if nodes else None, "server_node_id": SERVER_NODE_ID,
        "dp": dict(dp) if dp else None, "run_id": run_id,
    }, mode="shard" if shard is not None else "append" if append else "start", shard=shard, append=append)


def write_manifest(root: Path, manifest: dict[str, Any], *, mode: str = "start", shard: str | None = None,
                   append: bool = False) -> Path:
    """Create the recording directory and its manifest (``format`` and a ``run_id`` are added); an existing
    manifest of the same run is merged, so the client and server sides can each add what they know. ``mode``:
    ``start`` refuses another run's directory (see :func:`start_recording`), ``append`` continues the run
    recorded there, ``join`` is a side adding what it knows to the run being recorded, ``shard`` a process
    starting its own shard of the run ``manifest["run_id"]`` (with ``append``: continuing it)."""
    root = Path(root)
    path = root / MANIFEST
    manifest = _as_declared(manifest, path)  # checked before any folder exists, and in the form the file holds
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        old = json.loads(path.read_text()) if path.exists() else {}
        if mode == "shard":
            _start_shard(root, old, manifest, shard, append)
        if mode == "start":
            _refuse_another_run(root, old, manifest.get("framework_run_id"))
            earlier = old.get("framework_run_id")
            if earlier is None or str(earlier) != str(manifest.get("framework_run_id")):
                old = {}  # a new run: nothing of an earlier, unused manifest (a run that never sent) carries over
        merged = {**old, **{k: v for k, v in manifest.items() if v is not None}, "format": FORMAT}
        merged["run_id"] = old.get("run_id") or manifest.get("run_id") or uuid.uuid4().hex
        if old.get("framework_run_id") is not None:  # the run this directory recorded first stays its run
            merged["framework_run_id"] = old["framework_run_id"]
        if mode == "append":  # a deployment resumed: its recording reopens, and is sealed again when it ends
            merged["appended"] = True
            merged.pop("ledger_sha256", None)
            merged.pop("sealed_at", None)
        checked_manifest(merged, f"recording manifest {path}")  # with what the file held (another version may have written it)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path


def _as_declared(manifest: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """What a recorder declares, in the form the file holds it (issue 71): through the reader's model, so a field it
    does not declare, or a value of the wrong type, fails here, in the recorder — and a block given as a model
    (``Framework(...)``) compares equal to the same block another process wrote. ``None`` values declare nothing."""
    given = {k: v for k, v in manifest.items() if v is not None}
    checked = checked_manifest({"run_id": "", **given}, f"recording manifest {path}")  # run_id: added on writing
    return {k: v for k, v in checked.model_dump(mode="json", exclude_unset=True).items() if k in given}


def _start_shard(root: Path, old: Mapping[str, Any], manifest: Mapping[str, Any], shard: str | None,
                 append: bool) -> None:
    """A process starting its shard of a run: the directory records that run (or nothing yet), what this process
    declares agrees with what the others declared, and its shard is new (or continued with ``append``)."""
    run_id = manifest.get("run_id")
    if not isinstance(run_id, str) or not run_id.strip():
        raise FedauditError(f"recording shard {shard!r}: give run_id=, a string every process of the run shares (the "
                            "framework's job id, or one the launcher hands out), so the shards can be told to belong "
                            "together")
    check_shard_name(shard)
    if old and old.get("run_id") != run_id:
        raise FedauditError(f"{root} records run {old.get('run_id')}, and shard {shard!r} belongs to run {run_id}; "
                            "record each run into a new directory (every process of one run passes the same run_id)")
    for key, value in manifest.items():
        if value is not None and key not in ("run_id", "server_node_id") and key in old and old[key] != value:
            raise FedauditError(f"shard {shard!r} declares {key} {json.dumps(value, default=str)[:80]}, but another "
                                f"process of run {run_id} declared {json.dumps(old[key], default=str)[:80]}; every "
                                "process must declare the same run (or leave it to the one that starts the recording)")
    ledger = root / SHARDS / shard / LEDGER
    if ledger.is_file() and ledger.stat().st_size and not append:
        raise FedauditError(f"{root} already holds shard {shard!r} of run {run_id}; give each process its own shard "
                            "name, or pass append=True to continue this shard (a process restarted)")
    info = root / SHARDS / shard / SHARD_FILE
    if not info.exists() or append:
        with atomic_path(info) as tmp:
            tmp.write_text(json.dumps({"shard": shard, "run_id": run_id, "closed": False,
                                       "host": os.uname().nodename, "pid": os.getpid(),
                                       "started_at": time.time()}) + "\n")


def check_shard_name(shard: Any) -> str:
    """A shard's name: a plain folder name (letters, digits, ``-``, ``_``, ``.``; no path)."""
    if not isinstance(shard, str) or not shard or safe_name(shard) != shard:
        raise FedauditError(f"shard name {shard!r} must be a plain folder name (letters, digits, - and _), e.g. the "
                            "site's name")
    return shard


def check_fresh(root: str | Path) -> None:
    """Refuse, before a run starts, a directory that already holds a recorded run (its ledger or any shard): a
    script checks here, in one line, what a framework would otherwise report as a traceback mid-run."""
    root = Path(root)
    if (root / LEDGER).is_file() and (root / LEDGER).stat().st_size or any((root / SHARDS).glob("*/" + LEDGER)):
        raise FedauditError(f"{root} already holds a recorded run; record into a new directory")


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
                            "append=True (several processes recording one run: give each its own shard, "
                            "Recorder(DIR, shard=NAME, run_id=RUN), and seal them together)")


class RecordingWriter:
    """Writes messages into a recording directory (one writer per process and side); with ``shard``, into that
    process's own shard of the run (``shards/<shard>/``: its ledger, messages and node names)."""

    def __init__(self, root: str | Path, recorded_by: str, shard: str | None = None):
        if recorded_by not in RECORDERS:
            raise ValueError(f"recorded_by must be one of {RECORDERS}, got {recorded_by!r}")
        self.root = Path(root)
        self.recorded_by = recorded_by
        self.shard = check_shard_name(shard) if shard is not None else None
        self.home = self.root / SHARDS / shard if shard is not None else self.root  # where this writer writes
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
        """Say once which client name (a domain, for the auditor's data) a node id stands for; a node id another
        writer gave another name is refused here, as it is recorded, not found later."""
        if node_id in self._named:
            return
        path = self.home / NODES / f"{int(node_id)}.json"
        with _locked(self.home):
            earlier = json.loads(path.read_text()).get("name") if path.exists() else None
            if earlier is not None and earlier != name:
                raise FedauditError(f"node {node_id} is already named {earlier!r} in {self.home}, and this process names "
                                    f"it {name!r}: two clients would share one node id; give each client its own name "
                                    "(or node id)")
            if earlier is None:
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
        arrays = {record: named_by_order(items, self.manifest) for record, items in arrays.items()}
        tensors, shapes, numbers = _message_tensors(arrays, metrics)
        stem = "-".join([self.recorded_by, f"r{round:04d}", safe_name(message_type),
                         f"{src_node_id}to{dst_node_id}", safe_name(message_id)[:24] or "x", uuid.uuid4().hex[:8]])
        file = str((self.home / MESSAGES / f"{stem}.safetensors").relative_to(self.root))
        digest = _save(self.root / file, tensors, {"configs": configs, "message_type": message_type,
                                                   "message_id": message_id})

        sent_up = dst_node_id == self.manifest.get("server_node_id", SERVER_NODE_ID) and message_type != RELEASE
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
        with _locked(self.home):
            with open(self.home / LEDGER, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        return rows

    def release(self, round: int, tensors: Mapping[str, Any], *, record: str = "model",
                framework_run_id: int | str | None = None) -> list[dict[str, Any]]:
        """Record the model the deployment releases after ``round`` (the final aggregate): the model an audit
        judges as the one anyone holding the deployed model can query. Server → server: it crosses no wire."""
        return self.message(src_node_id=SERVER_NODE_ID, dst_node_id=SERVER_NODE_ID, sender=SERVER, receiver=SERVER,
                            round=round, message_type=RELEASE, message_id=uuid.uuid4().hex,
                            arrays={record: dict(tensors)}, framework_run_id=framework_run_id)

    def close_shard(self) -> None:
        """This process has finished its part of the run: its shard says so, with its ledger's sha256."""
        if self.shard is None:
            return
        info = self.home / SHARD_FILE
        with _locked(self.home):
            ledger = self.home / LEDGER
            digest = hashlib.sha256(ledger.read_bytes()).hexdigest() if ledger.is_file() else None
            data = json.loads(info.read_text()) if info.is_file() else {"shard": self.shard}
            with atomic_path(info) as tmp:
                tmp.write_text(json.dumps({**data, "closed": True, "ledger_sha256": digest,
                                           "closed_at": time.time()}) + "\n")


SERVER_NODE_ID = 1  # Flower's ServerApp speaks as the SuperLink's node (flwr.common.constant.SUPERLINK_NODE_ID)


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


def named_by_order(items: Mapping[str, Any], manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record of numbered arrays (``"0"`` … ``"N-1"``: a list of arrays, as Flower's legacy ``Parameters`` and a
    ``NumPyClient`` send a state_dict's values) named as the declared model's state, where they are its state in
    order, every shape matching; any other record as it is."""
    order = manifest.get("model_order") or []
    state = manifest.get("model_state") or {}
    if not order or list(items) != [str(i) for i in range(len(order))]:
        return items
    named = {name: items[str(i)] for i, name in enumerate(order)}
    if any(tuple(torch.as_tensor(v).shape) != tuple(state.get(k, ())) for k, v in named.items()):
        return items
    return named


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


__all__ = ["FORMAT", "LEDGER", "MANIFEST", "MESSAGES", "NODES", "RECORDERS", "RELEASE", "SERVER_NODE_ID", "SHARD_FILE",
           "SHARDS", "RecordingWriter", "check_fresh", "check_kinds", "check_shard_name", "classify_record", "start_recording",
           "write_manifest"]
