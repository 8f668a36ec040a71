"""Reading a recording (:mod:`fedaudit.interop.recording` writes it): the manifest, the ledger rows with their
senders named from ``nodes/``, one run and one recorder per message, and each message's tensors loaded as wire
artifacts for an audit."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedaudit.errors import FedauditError
from fedaudit.interop.manifest import Manifest, checked_manifest, format_refusal
from fedaudit.interop.recording_writer import LEDGER, MANIFEST, NODES, SERVER_NODE_ID, classify_record
from fedaudit.interop.recording_checks import DAMAGED, check_row, inside, is_evaluation, is_release, own_file, trains
from fedaudit.interop.recording_shards import unmerged_shards
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, LedgerEntry, Wire, client_role, direction

# Config records a framework's secure-aggregation protocol exchanges, and the protocol's name.
SECURE_AGGREGATION_RECORDS = {"secaggplus_configs": "Flower SecAgg+", "secagg_configs": "Flower SecAgg"}


@dataclass
class Recording:
    """A recording read back: its manifest, node names and ledger rows (one recorder's per message)."""

    root: Path
    manifest: Manifest  # validated by the model every recorder writes it through
    nodes: dict[int, str]
    rows: list[dict[str, Any]]
    verification: dict[str, Any] | None = None  # what fedaudit.interop.recording_verify checked, once it has
    copies: list[dict[str, Any]] = field(default_factory=list)  # the other side's copy of a message both recorded

    def reclassify(self, model_state: Mapping[str, tuple[int, ...]]) -> int:
        """Name the generic records that are the given model's state (whole or part) — for a recording made
        without ``start_recording(model=...)``, once the audit knows the architecture. Returns how many rows."""
        declared = self.manifest.record_kinds
        changed = 0
        for row in self.rows:
            if row["kind"] != ArtifactKind.RECORD.value or row["record"] in declared or "shapes" not in row:
                continue
            kind = classify_record(row["record"], {k: tuple(v) for k, v in row["shapes"].items()},
                                   sent_up=row["direction"] == "up", model_state=model_state)
            if kind != ArtifactKind.RECORD:
                row["kind"] = kind.value
                changed += 1
        return changed

    def secure_aggregation(self) -> str | None:
        """The secure-aggregation protocol the recorded run used, recognised from its stage messages (Flower's
        SecAgg+ and SecAgg exchange their keys, shares and masked vectors in these config records), or None."""
        names = {name for r in [*self.rows, *self.copies] if r["kind"] == "config"
                 for name in str(r["record"]).split(",")}
        return next((protocol for record, protocol in SECURE_AGGREGATION_RECORDS.items() if record in names), None)

    def shares(self) -> set[tuple[ArtifactKind, str]]:
        """(kind, direction) pairs the ledger holds: what the recorded protocol sends."""
        return {(ArtifactKind(r["kind"]), r["direction"]) for r in self.rows
                if r["kind"] != "config" and not is_release(r)}

    def wire(self, device: torch.device | str = "cpu", history_roles: Iterable[str] = ()) -> Wire:
        """The recording as fedaudit's wire: every row in the ledger; the newest artifact of each
        (kind, sender, receiver) retained, as the simulation's wire retains it — from training
        messages: an evaluation broadcast of the same round would hide the weights that round's
        local training started from, which the auditor's counterfactual replays need. With ``history_roles`` every
        training message to or from those roles is kept too, every round (replay reference models re-live them)."""
        wire = Wire()
        wire.keep_history(set(history_roles))
        newest: dict[tuple[str, str, str], dict[str, Any]] = {}
        for row in self.rows:
            if row["kind"] == "config" or is_release(row):  # the released model crossed no wire
                continue
            wire.ledger.append(LedgerEntry(row["kind"], row["sender"], row["receiver"], row["round"], row["bytes"],
                                           row["tensors"]))
            key = (row["kind"], row["sender"], row["receiver"])
            if not is_evaluation(row) and (key not in newest or row["round"] >= newest[key]["round"]):
                newest[key] = row
            if not is_evaluation(row) and wire.history_roles & {row["sender"], row["receiver"]}:
                wire.history.append(self.artifact(row, "cpu"))
        for key, row in newest.items():
            wire.retained[key] = self.artifact(row, device)
        return wire

    def deployed(self, device: torch.device | str = "cpu") -> tuple[Artifact, dict[str, Any]] | None:
        """The model the audit judges as the deployed one, and which it is: the model the recording names as
        released (``Recorder.release``), else the newest whole model the server sent (an evaluation broadcast
        after the last aggregation when the strategy evaluates, else the last round's training broadcast) —
        said, since the final aggregate may be newer than any broadcast."""
        released = [r for r in self.rows if is_release(r)]
        if released:
            row = released[-1]
            if row["kind"] != ArtifactKind.FULL_MODEL.value:
                raise FedauditError(f"{self.root}: the released model (round {row['round']}) is not a whole model of "
                                    f"the audited architecture (its record is a {row['kind']}); release the whole "
                                    "state_dict, or give the architecture the clients trained (--model)")
            return self.artifact(row, device), {"round": row["round"], "message_type": row["message_type"],
                                                "released": True, "what": f"the model the recording names as released "
                                                                          f"after round {row['round']}"}
        down = [r for r in self.rows if r["kind"] == ArtifactKind.FULL_MODEL.value and r["sender"] == SERVER]
        if not down:
            return None
        row = down[-1]
        last = max(r["round"] for r in self.rows)
        return self.artifact(row, device), {
            "round": row["round"], "message_type": row["message_type"], "released": False,
            "what": (f"NOT the released model: the recording names none, so the audit judged the newest whole model "
                     f"the server sent — its round {row['round']} {row['message_type']} broadcast"
                     + (f" (the run recorded {last} rounds; the final aggregate was never recorded and may differ)"
                        if row["round"] < last or not is_evaluation(row) else "")
                     + "; record the released model (Recorder.release, or the integration's final aggregate)")}

    def participation(self) -> dict[str, Any]:
        """Who answered: training uploads in all, and for each client the rounds in which the server sent it a
        model to train from and it sent nothing back (it failed, dropped or timed out)."""
        sent = {(r["receiver"], r["round"]) for r in self.rows if r["sender"] == SERVER and trains(r)}
        answered = {(r["sender"], r["round"]) for r in self.rows if r["receiver"] == SERVER and trains(r)}
        missed: dict[str, list[int]] = {}
        for client, rnd in sorted(sent - answered):
            missed.setdefault(client, []).append(rnd)
        return {"uploads": len({(c, rnd) for c, rnd in answered if c != SERVER}),
                "rounds": sorted({rnd for _, rnd in sent}), "missed": missed}

    def artifact(self, row: dict[str, Any], device: torch.device | str = "cpu") -> Artifact:
        """The artifact one ledger row stands for, its tensors read from the message file."""
        tensors = load_message(self.root / row["file"])
        prefix = f"{row['record']}/"
        mine = {k[len(prefix):]: t.to(device) for k, t in tensors.items() if k.startswith(prefix)}
        order = list(row.get("shapes") or {})  # the order they were sent in (the file's is alphabetical)
        mine = {k: mine[k] for k in order if k in mine} | mine
        return Artifact(ArtifactKind(row["kind"]), row["sender"], row["receiver"], row["round"], mine,
                        {"record": row["record"], "message_type": row["message_type"]})

    def bytes_by_round(self, kinds: set[str] | None = None) -> dict[int, int]:
        """Ledger bytes per round (of these kinds), both directions; the released model crossed no wire."""
        out: dict[int, int] = {}
        for row in self.rows:
            if (kinds is None or row["kind"] in kinds) and not is_release(row):
                out[row["round"]] = out.get(row["round"], 0) + row["bytes"]
        return out


def load_message(path: Path) -> dict[str, Tensor]:
    """One message file's tensors; a missing or truncated file is a one-line error naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise FedauditError(f"recorded message {path} is missing; the recording is incomplete — record the run again")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise FedauditError(f"recorded message {path} is not a readable safetensors file ({exc}); "
                            "it may be truncated — record the run again") from None


def read_recording(root: str | Path) -> Recording:
    """Read a recording directory (manifest, node names, ledger), each problem a one-line error."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FedauditError(f"recording {root} does not exist; give the directory the recorder wrote")
    manifest = _manifest(root)
    nodes = _nodes(root, manifest)
    unmerged = unmerged_shards(root, manifest.shards or {})
    if unmerged:
        raise FedauditError(f"{root} holds {len(unmerged)} shard(s) not sealed into one recording "
                            f"({', '.join(unmerged[:4])}): once every process of the run has finished, run "
                            f"`fedaudit seal {root}` (seal_recording), which checks they belong together")
    ledger = root / LEDGER
    raw = _ledger_rows(root, ledger)
    _one_run(raw, manifest, ledger)
    server_node = SERVER_NODE_ID if manifest.server_node_id is None else manifest.server_node_id
    kept, copies = _one_recorder_per_message(raw)
    rows = [_named(r, nodes, server_node, ledger) for r in kept]
    rows.sort(key=lambda r: (r["round"], r["time"]))
    _no_repeats(rows, ledger)
    if len([r for r in rows if is_release(r)]) > len({r["record"] for r in rows if is_release(r)}):
        raise FedauditError(f"{ledger} records a released model more than once; a run releases one final model — "
                            "record each run into its own directory")
    return Recording(root, manifest, nodes, rows, copies=[_named(r, nodes, server_node, ledger) for r in copies])


def _manifest(root: Path) -> Manifest:
    """The manifest, validated whole by the model the recorders write it through, before anything is judged."""
    path = root / MANIFEST
    if not path.is_file():
        raise FedauditError(f"{root} has no {MANIFEST}: not a fedaudit recording; record with fedaudit's Recorder or "
                            "fedaudit.interop.flower (recording_mod / RecordingGrid), which write it")
    own_file(root, path)
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FedauditError(f"{path} is not valid JSON ({exc}); record the run again") from None
    if not isinstance(manifest, dict):
        raise FedauditError(f"{path} is not a JSON object; {DAMAGED}")
    refusal = format_refusal(manifest.get("format"), str(path))
    if refusal:
        raise FedauditError(refusal)
    return checked_manifest(manifest, f"{path} is not a manifest this fedaudit reads",
                            "a field no fedaudit recorder writes, or a value not of its type: the manifest was "
                            "altered or written by hand — ask for the recording as it was made, or correct that field "
                            "in a copy (fedaudit.interop.manifest declares each)")


def _nodes(root: Path, manifest: Manifest) -> dict[int, str]:
    """Node id → client name: the manifest's, then the node files'."""
    named = manifest.nodes or {}
    if not all(k.isdigit() for k in named):
        raise FedauditError(f"{root / MANIFEST}: field 'nodes' must map node ids to client names; {DAMAGED}")
    nodes = {int(k): v for k, v in named.items()}
    for node_file in sorted((root / NODES).glob("*.json")):
        item = _node(root, node_file)
        nodes.setdefault(item["node_id"], item["name"])
    return nodes


def _ledger_rows(root: Path, ledger: Path) -> list[dict[str, Any]]:
    """Every ledger row held to the format, and its file to the directory, before anything is read or judged."""
    if not ledger.is_file():
        raise FedauditError(f"{root} has no {LEDGER}: nothing was recorded; check that the mod or recorder ran")
    own_file(root, ledger)
    raw = []
    for n, line in enumerate(ledger.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise FedauditError(f"{ledger} line {n} is not a JSON row (truncated?); record the run again") from None
        check_row(row, f"{ledger} line {n}")
        inside(root, row["file"], f"{ledger} line {n}")
        raw.append(row)
    return raw


def _node(root: Path, node_file: Path) -> dict[str, Any]:
    """One node file: inside the recording, with an integer id and a name."""
    own_file(root, node_file)
    try:
        item = json.loads(node_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FedauditError(f"{node_file} is not valid JSON; {DAMAGED}") from None
    if not (isinstance(item, dict) and isinstance(item.get("node_id"), int) and not isinstance(item["node_id"], bool)
            and isinstance(item.get("name"), str)):
        raise FedauditError(f"{node_file} does not hold a node_id (a whole number) and a name (a string); {DAMAGED}")
    if str(item["node_id"]) != node_file.stem:
        raise FedauditError(f"{node_file} names node {item['node_id']}, not the node its file name says; {DAMAGED}")
    return item


def _one_run(rows: list[dict[str, Any]], manifest: Manifest, ledger: Path) -> None:
    """A recording is one run: every row carries the manifest's run id, and one framework run id unless the
    run was continued (``append``)."""
    for n, row in enumerate(rows, 1):
        if row.get("run_id") not in (None, manifest.run_id):
            raise FedauditError(f"{ledger} line {n} belongs to run {row['run_id']}, the manifest to run "
                                f"{manifest.run_id}: the recording mixes runs; record each run into its own directory")
    runs = sorted({str(r["framework_run_id"]) for r in rows if r.get("framework_run_id") is not None})
    if len(runs) > 1 and not manifest.appended:
        raise FedauditError(f"{ledger} holds messages of {len(runs)} framework runs ({', '.join(runs[:3])}): the "
                            "recording mixes runs; record each run into its own directory")


def _no_repeats(rows: list[dict[str, Any]], ledger: Path) -> None:
    """Each (round, sender, receiver, record, message type) once: a repeat means two runs, or a round recorded twice.
    Configs are left out: a protocol of several exchanges per round (secure aggregation's stages) repeats them."""
    seen: set[tuple[Any, ...]] = set()
    for row in rows:
        if row["kind"] == "config":
            continue
        key = (row["round"], row["sender"], row["receiver"], row["record"], row["message_type"])
        if key in seen:
            raise FedauditError(f"{ledger} records {row['record']!r} from {row['sender']} to {row['receiver']} in "
                                f"round {row['round']} ({row['message_type']}) twice: the recording mixes runs or "
                                "repeats a round; record each run into its own directory")
        seen.add(key)


def _one_recorder_per_message(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """When both sides recorded, keep what left the sender: the client's rows for uploads, the
    server's for broadcasts; a message only one side recorded is kept as recorded. Returns (kept, the other
    side's copies): a client's copy of a broadcast is what it received, whatever the server recorded."""
    preferred = {"up": "client", "down": "server"}
    by_message: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        key = (r["src_node_id"], r["dst_node_id"], r["round"], r["message_type"])
        by_message.setdefault(key, {}).setdefault(r["recorded_by"], []).append(r)
    kept, copies = [], []
    for sides in by_message.values():
        some = next(iter(sides.values()))
        side = preferred[some[0]["direction"]] if preferred[some[0]["direction"]] in sides else next(iter(sides))
        kept += sides[side]
        copies += [r for other, found in sides.items() if other != side for r in found]
    return kept, copies


def _named(row: dict[str, Any], nodes: dict[int, str], server_node: int, ledger: Path) -> dict[str, Any]:
    out = dict(row)
    for role, node in (("sender", "src_node_id"), ("receiver", "dst_node_id")):
        if out.get(role):
            named = nodes.get(row[node])
            if named is not None and out[role] != client_role(named) and row[node] != server_node:
                raise FedauditError(f"{ledger}: node {row[node]} is {named!r} in the recording's node names but "
                                    f"{out[role]!r} in a ledger row (round {row['round']}): two clients share a node "
                                    f"id, so their messages cannot be told apart; {DAMAGED}")
            continue
        if row[node] == server_node:
            out[role] = SERVER
        elif row[node] in nodes:
            out[role] = client_role(nodes[row[node]])
        else:
            raise FedauditError(f"{ledger}: node {row[node]} has no name (no nodes/{row[node]}.json and none in the "
                                "manifest's nodes); install fedaudit's recording mod on every ClientApp, or name "
                                "the node in the manifest")
    out["direction"] = "down" if is_release(row) else direction(out["receiver"])
    return out




__all__ = ["Recording", "is_evaluation", "is_release", "load_message", "read_recording"]
