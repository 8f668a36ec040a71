"""A run recorded by several processes, each into its own shard (``shards/<name>/``: its ledger, messages and
node names), merged into the one ledger an audit reads when the run is sealed — never silently.

Before anything is merged the shards are held to belonging together: every shard closed by its process, one run
id, each node id one client's and each client one node id, every file a shard names inside that shard, rounds
that never go back within a shard, one copy of a message per side, and every training upload's broadcast present
in some shard (a shard missing is refused, not audited as a client that never trained). Each problem is one line
naming the shard and the fix. Once merged, the manifest lists each shard's ledger digest: sealing again is a no-op,
and a shard changed or added afterwards is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.interop.recording_writer import (LEDGER, MANIFEST, NODES, SERVER_NODE_ID, SHARD_FILE, SHARDS,
                                        _locked, write_manifest)
from fedaudit.interop.recording_checks import DAMAGED, check_row, inside, is_release, own_file, trains
from fedaudit.run.run_directory import atomic_path


@dataclass
class Shard:
    """One process's part of the run, read back."""

    name: str
    info: dict[str, Any]
    rows: list[dict[str, Any]]
    nodes: dict[int, str]
    digest: str


def shard_dirs(root: Path) -> list[Path]:
    """The recording's shard folders, each a real folder inside it."""
    folder = root / SHARDS
    if not folder.is_dir():
        return []
    own_file(root, folder)
    return sorted(d for d in folder.iterdir() if own_file(root, d).is_dir())


def unmerged_shards(root: Path, merged: Iterable[str]) -> list[str]:
    """Shards holding messages that the recording's ledger does not hold yet (the run was never sealed whole):
    ``merged`` names those the manifest lists as merged."""
    merged = set(merged)
    return [d.name for d in shard_dirs(root) if (d / LEDGER).is_file() and d.name not in merged]


def merge_shards(root: Path) -> dict[str, Any] | None:
    """Check the shards of ``root`` belong together and merge them into its ledger and node files (see the module
    docstring); returns what the manifest now lists of them, or None for a recording without shards."""
    root = Path(root)
    folders = shard_dirs(root)
    if not folders:
        return None
    if not (root / MANIFEST).is_file():
        raise FedauditError(f"{root} has shards but no {MANIFEST}: no process started the recording; {DAMAGED}")
    manifest = json.loads((root / MANIFEST).read_text())
    shards = [_read_shard(root, d) for d in folders]
    listed = _merged_before(root, manifest, shards)
    if listed:
        return listed
    _check_belong_together(root, manifest, shards)
    nodes = _one_name_per_node(shards)
    with _locked(root):
        # rows the recording held before this merge; a merge cut short (its ledger written, its manifest not)
        # left shard rows in it, which this merge writes again
        earlier = [r for r in _root_rows(root) if not Path(r["file"]).parts[:1] == (SHARDS,)]
        rows = sorted(earlier + [r for s in shards for r in s.rows], key=lambda r: (r["round"], r["time"]))
        _every_upload_has_its_broadcast(rows, manifest, shards)
        for node, name in nodes.items():
            path = root / NODES / f"{node}.json"
            if path.is_file() and json.loads(path.read_text()).get("name") != name:
                raise FedauditError(f"{path} names node {node} otherwise than shard nodes ({name!r}); {DAMAGED}")
            with atomic_path(path) as tmp:
                tmp.write_text(json.dumps({"node_id": node, "name": name}) + "\n")
        with atomic_path(root / LEDGER) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    listed = {s.name: {"ledger_sha256": s.digest, "rows": len(s.rows), "host": s.info.get("host"),
                       "recorded_by": sorted({r["recorded_by"] for r in s.rows})} for s in shards}
    write_manifest(root, {"shards": listed}, mode="join")
    return listed


def _merged_before(root: Path, manifest: dict[str, Any], shards: list[Shard]) -> dict[str, Any] | None:
    """The shards the manifest lists as merged, when they are the very ones on disk; None for a recording never
    sealed. A shard changed or added after a seal is refused: a sealed recording is not added to."""
    listed = manifest.get("shards") or {}
    if not listed and not manifest.get("ledger_sha256"):
        return None
    now = {s.name: s.digest for s in shards}
    if now != {k: v.get("ledger_sha256") for k, v in listed.items()}:
        changed = sorted(set(now.items()) ^ {(k, v.get("ledger_sha256")) for k, v in listed.items()})
        how = "changed or was added after the shards were merged" if listed else "was added after the recording was"
        raise FedauditError(f"{root}: shard {changed[0][0]!r} {how} sealed; a sealed recording is not added to — "
                            "record the run into a new directory")
    return listed


def _read_shard(root: Path, folder: Path) -> Shard:
    name = folder.name
    info_path = folder / SHARD_FILE
    if not info_path.is_file():
        raise FedauditError(f"shard {name!r} has no {SHARD_FILE}: it was not started by fedaudit's recorder; {DAMAGED}")
    own_file(root, info_path)
    info = _json(info_path)
    ledger = folder / LEDGER
    rows: list[dict[str, Any]] = []
    digest = ""
    if ledger.is_file():
        own_file(root, ledger)
        data = ledger.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            where = f"shard {name!r} {LEDGER} line {n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise FedauditError(f"{where} is not a JSON row (truncated? its process may have died while "
                                    "writing); record the run again") from None
            check_row(row, where)
            file = inside(root, row["file"], where)
            if not file.is_relative_to(folder.resolve()):
                raise FedauditError(f"{where} names {row['file']!r}, a file of another shard; a shard records only its "
                                    f"own messages: {DAMAGED}")
            rows.append(row)
    nodes: dict[int, str] = {}
    for node_file in sorted((folder / NODES).glob("*.json")):
        own_file(root, node_file)
        item = _json(node_file)
        if not (isinstance(item.get("node_id"), int) and isinstance(item.get("name"), str)):
            raise FedauditError(f"{node_file} does not hold a node_id and a name; {DAMAGED}")
        nodes[item["node_id"]] = item["name"]
    return Shard(name, info, rows, nodes, digest)


def _check_belong_together(root: Path, manifest: dict[str, Any], shards: Iterable[Shard]) -> None:
    run_id = manifest.get("run_id")
    for s in shards:
        if s.info.get("run_id") != run_id:
            raise FedauditError(f"shard {s.name!r} belongs to run {s.info.get('run_id')}, the recording to run {run_id}: "
                                "shards of two runs in one directory; copy only one run's shards into it")
        if not s.info.get("closed"):
            raise FedauditError(f"shard {s.name!r} was never closed (its process has not called Recorder.close(), or "
                                f"died): seal once every process of the run has finished; if one died, its part of the "
                                "run is incomplete — record the run again")
        if s.info.get("ledger_sha256") not in (None, s.digest) or (s.info.get("ledger_sha256") is None and s.rows):
            raise FedauditError(f"shard {s.name!r}: its ledger changed after its process closed it; {DAMAGED}")
        latest = 0
        for n, row in enumerate(sorted(s.rows, key=lambda r: r["time"]), 1):
            if row.get("run_id") not in (None, run_id):
                raise FedauditError(f"shard {s.name!r} holds a message of run {row['run_id']}, the recording is run "
                                    f"{run_id}: the shard mixes runs; record each run into its own directory")
            if row["round"] < latest and not is_release(row):
                raise FedauditError(f"shard {s.name!r} goes back from round {latest} to round {row['round']} (its "
                                    f"message {n} in time order): one process recorded two runs into one shard; "
                                    "record each run into its own directory")
            latest = max(latest, row["round"])
    seen: dict[tuple[Any, ...], str] = {}
    for s in shards:
        for key in sorted({(r["src_node_id"], r["dst_node_id"], r["round"], r["message_type"], r["recorded_by"])
                           for r in s.rows}, key=lambda k: (k[2], k[0], k[1], k[3])):
            if key in seen and seen[key] != s.name:
                raise FedauditError(f"shards {seen[key]!r} and {s.name!r} both hold the {key[4]}'s copy of the round "
                                    f"{key[2]} {key[3]} message from node {key[0]} to node {key[1]}: two processes "
                                    "recorded as one node; give each process its own client name (or node id)")
            seen[key] = s.name


def _one_name_per_node(shards: Iterable[Shard]) -> dict[int, str]:
    nodes: dict[int, tuple[str, str]] = {}
    names: dict[str, tuple[int, str]] = {}
    for s in shards:
        for node, name in s.nodes.items():
            if node in nodes and nodes[node][0] != name:
                raise FedauditError(f"node {node} is {nodes[node][0]!r} in shard {nodes[node][1]!r} and {name!r} in shard "
                                    f"{s.name!r}: two clients share a node id; record each client under its own id")
            if name in names and names[name][0] != node:
                raise FedauditError(f"client {name!r} is node {names[name][0]} in shard {names[name][1]!r} and node "
                                    f"{node} in shard {s.name!r}; record each client under one id")
            nodes[node], names[name] = (name, s.name), (node, s.name)
    return {node: name for node, (name, _) in nodes.items()}


def _every_upload_has_its_broadcast(rows: list[dict[str, Any]], manifest: dict[str, Any],
                                    shards: Iterable[Shard]) -> None:
    """A training upload answers the model the server sent that client that round; an upload whose broadcast no
    shard holds means the shard of the process that recorded the server's side is missing."""
    server = manifest.get("server_node_id", SERVER_NODE_ID)
    sent = {(r["dst_node_id"], r["round"]) for r in rows
            if r["src_node_id"] == server and r["dst_node_id"] != server and trains(r)}
    for r in rows:
        if r["dst_node_id"] == server and r["src_node_id"] != server and trains(r) and (
                (r["src_node_id"], r["round"]) not in sent):
            raise FedauditError(f"node {r['src_node_id']} uploaded in round {r['round']}, but no shard "
                                f"({', '.join(s.name for s in shards)}) holds the model the server sent it that round: "
                                "a shard is missing — copy every process's shards/<name>/ folder into the recording and "
                                "seal again")


def _root_rows(root: Path) -> list[dict[str, Any]]:
    """Rows recorded into the recording's own ledger, outside any shard (a process recording without one)."""
    ledger = root / LEDGER
    if not ledger.is_file():
        return []
    own_file(root, ledger)
    rows = []
    for n, line in enumerate(ledger.read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise FedauditError(f"{ledger} line {n} is not a JSON row; {DAMAGED}") from None
        check_row(rows[-1], f"{ledger} line {n}")
    return rows


def _json(path: Path) -> dict[str, Any]:
    try:
        item = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FedauditError(f"{path} is not valid JSON; {DAMAGED}") from None
    if not isinstance(item, dict):
        raise FedauditError(f"{path} is not a JSON object; {DAMAGED}")
    return item


__all__ = ["merge_shards", "shard_dirs", "unmerged_shards"]
