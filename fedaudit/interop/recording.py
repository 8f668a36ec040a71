"""Record a federation fedaudit did not run: the :class:`Recorder` any training loop calls once per message, and
:func:`seal_recording`, which ends a run (merging its shards when several processes recorded it).

The format and the writer are in :mod:`fedaudit.interop.recording_writer` (re-exported here); reading a recording
back is :mod:`fedaudit.interop.recording_reader`, and a run recorded in shards is checked and merged by
:mod:`fedaudit.interop.recording_shards`.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.interop.recording_shards import merge_shards
from fedaudit.interop.recording_writer import (FORMAT, LEDGER, MANIFEST, RELEASE, SERVER_NODE_ID, RecordingWriter, _locked,
                                               check_kinds, check_shard_name, classify_record, start_recording,
                                               write_manifest)
from fedaudit.simulation.wire import SERVER, ArtifactKind, client_role


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
    declared model's state_dict shapes decide (whole model, a part of it, BN statistics). After the last round,
    :meth:`release` records the model the deployment releases. The keyword arguments of the constructor are
    :func:`start_recording`'s; it refuses a directory that holds another run.

    When the run's messages are recorded by several processes (each site records what it receives and sends),
    each process makes its own ``Recorder(root, shard=SITE, run_id=RUN, ...)`` (``side="server"`` for the process
    that aggregates, whose copy of a broadcast is the one kept); ``close()`` then closes that
    shard, and :func:`seal_recording` (or ``fedaudit seal DIR``), once every process has finished, checks the
    shards belong together and seals them as one recording."""

    def __init__(self, root: str | Path, *, shard: str | None = None, side: str | None = None, **manifest: Any):
        self.root = Path(start_recording(root, shard=shard, **manifest)).parent
        # which side's copy of a message this is (a site's shard: the client's; one loop that sees all: the server's)
        self._writer = RecordingWriter(self.root, side or ("server" if shard is None else "client"), shard=shard)
        self._last_round = 0

    def send(self, round: int, sender: str, receiver: str, tensors: Mapping[str, Any], *, kind: str | None = None,
             record: str | None = None, message_type: str = "train") -> list[dict[str, Any]]:
        """Record one message of ``round``; ``record`` names it in the ledger (default: the kind, or ``arrays``).
        ``message_type`` ``evaluate`` marks a model sent to be scored, not trained from."""
        _check_round(round, "Recorder.send")
        if SERVER not in (sender, receiver) or sender == receiver:
            raise FedauditError(f"Recorder.send: a message goes between the server and a client, got {sender!r} → "
                                f"{receiver!r}; name one side \"server\"")
        if message_type == RELEASE:
            raise FedauditError("Recorder.send: the released model is recorded with Recorder.release(state_dict)")
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
        self._last_round = max(self._last_round, round)
        return self._writer.message(src_node_id=ids[sender], dst_node_id=ids[receiver], sender=roles[sender],
                                    receiver=roles[receiver], round=round, message_type=message_type,
                                    message_id=uuid.uuid4().hex, arrays=arrays, metrics=metrics)

    def release(self, tensors: Mapping[str, Any], *, round: int | None = None) -> list[dict[str, Any]]:
        """Record the model the deployment releases (the final aggregate, after round ``round``: by default the
        last round recorded). ``fedaudit audit`` judges this model as the deployed one; a recording without it
        is judged on the newest whole model the server sent, and the report says so."""
        rnd = self._last_round if round is None else round
        _check_round(rnd, "Recorder.release")
        return self._writer.release(rnd, tensors)

    def close(self) -> str | None:
        """The run has ended: seal the ledger (its sha256 into the manifest, see :func:`seal_recording`). For a
        shard: this process's part has ended (the shard says so; seal the run once every process has closed)."""
        if self._writer.shard is not None:
            self._writer.close_shard()
            return None
        return seal_recording(self.root)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _node(self, name: str) -> int:
        if not isinstance(name, str) or not name or name.startswith("client:"):
            raise FedauditError(f"Recorder.send: a client's name must be a plain non-empty string (as the auditor's "
                                f"data names it), got {name!r}")
        node = node_id_for(name)
        self._writer.name_node(node, name)
        return node


def node_id_for(name: str) -> int:
    """A client's node id in a :class:`Recorder`'s recording, from its name: every process that records the client
    gives it the same id, and two clients' ids differ (48 bits of its sha256; a clash is refused when recorded)."""
    return SERVER_NODE_ID + 1 + int.from_bytes(hashlib.sha256(name.encode()).digest()[:6], "big")


def _check_round(round: Any, where: str) -> None:
    if not isinstance(round, int) or isinstance(round, bool) or round < 0:
        raise FedauditError(f"{where}: round must be an integer >= 0, got {round!r}")


def _scalar(key: str, value: Any) -> float | int | list[float] | list[int]:
    v = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(v, bool) or not isinstance(v, (int, float, list)):
        raise FedauditError(f"Recorder.send: scalars {key!r} must be a number or a list of numbers, got {value!r}")
    return v


def seal_recording(root: str | Path) -> str:
    """Write the ledger's sha256 into the manifest when the run ends (``Recorder.close`` does; a Flower server
    calls it after its last round): an audit then verifies that no ledger row was added, removed or edited since.
    A run recorded in shards is first checked whole and merged into one ledger
    (:func:`fedaudit.interop.recording_shards.merge_shards`). Sealing a sealed recording again changes nothing, and
    is refused if its ledger changed since: a seal never approves an edit (a deployment resumed with
    ``append=True`` reopens its recording first). Returns the digest."""
    root = Path(root)
    merge_shards(root)
    if not (root / LEDGER).is_file():
        raise FedauditError(f"{root} holds no recorded message ({LEDGER} is missing): nothing to seal; check that "
                            "the recorder ran")
    with _locked(root):
        digest = hashlib.sha256((root / LEDGER).read_bytes()).hexdigest()
        sealed = json.loads((root / MANIFEST).read_text()).get("ledger_sha256") if (root / MANIFEST).is_file() else None
    if sealed == digest:
        return digest
    if sealed is not None:
        raise FedauditError(f"{root} was sealed when its run ended, and its ledger has changed since ({str(sealed)[:12]}… "
                            f"≠ {digest[:12]}…): sealing again would approve the change; record the run again (a "
                            "deployment resumed reopens its recording with append=True)")
    write_manifest(root, {"ledger_sha256": digest, "sealed_at": time.time()}, mode="join")
    return digest


__all__ = ["FORMAT", "RELEASE", "Recorder", "RecordingWriter", "check_kinds", "check_shard_name", "classify_record",
           "node_id_for", "seal_recording", "start_recording", "write_manifest"]
