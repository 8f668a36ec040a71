"""Verifying a recording whole before an audit judges anything (issue 37): the ledger against the digest the
recorder sealed into the manifest, every message file against the sha256 its rows carry, and every file opened and
held to what its rows declare (a safetensors file with each declared tensor at its declared shape and the declared
byte count). A broken or edited file is refused in one line naming the ledger row; non-finite values are kept as
findings (which client, round and tensor) for the report; the audit refuses the attacks that would read one
(:func:`fedaudit.interop.audit_recording.check_finite_reads`).
A recording made before the recorder wrote hashes reads as "unverified: no hashes", not as an error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from fedaudit.errors import FedauditError
from fedaudit.interop.recording_writer import LEDGER
from fedaudit.interop.recording_checks import DAMAGED, is_release
from fedaudit.interop.recording_reader import Recording

VERIFIED, NO_HASHES, OVERRIDDEN = "verified", "unverified: no hashes", "unverified: accepted with --unverified"
NOT_SEALED = "unverified: ledger not sealed"  # messages hashed, but the run never sealed its ledger


def verify_recording(rec: Recording, *, unverified: bool = False) -> dict[str, Any]:
    """Check the whole recording; returns what was verified, for the report's provenance. ``unverified``: a hash
    mismatch is recorded instead of refused (the report then says so on its first screen)."""
    digest, sealed, mismatches = _ledger_mismatches(rec)
    broadcasts = SameModel()
    files, non_finite = _messages_held_to_rows(rec, mismatches, unverified, broadcasts)
    if mismatches and not unverified:
        raise FedauditError(f"{mismatches[0]}; {DAMAGED} (or audit it anyway with --unverified, which the report "
                            "marks on its first screen)")
    hashed = any("sha256" in r for r in rec.rows)
    status = (OVERRIDDEN if mismatches else NO_HASHES if not hashed else NOT_SEALED if sealed is None else VERIFIED)
    return {"status": status, "ledger_sha256": digest, "sealed": sealed is not None, "mismatches": mismatches,
            "messages": len(files), "rows": len(rec.rows), "bytes": sum(files.values()),
            "rounds": len({r["round"] for r in rec.rows}),
            "clients": len({r["sender"] for r in rec.rows if r["direction"] == "up"}), "non_finite": non_finite,
            "broadcasts": broadcasts.result()}


def _ledger_mismatches(rec: Recording) -> tuple[str, Any, list[str]]:
    """(the ledger's sha256, the digest sealed in the manifest or None, what does not match): the ledger against
    its seal, and hashes present on every row or on none."""
    mismatches: list[str] = []
    ledger = rec.root / LEDGER
    digest = hashlib.sha256(ledger.read_bytes()).hexdigest()
    sealed = rec.manifest.ledger_sha256
    if sealed is not None and sealed != digest:
        mismatches.append(f"{ledger} does not match the digest sealed in the manifest ({str(sealed)[:12]}… ≠ "
                          f"{digest[:12]}…): rows were added, removed or edited after the run ended")
    hashed = [r for r in rec.rows if "sha256" in r]
    if hashed and len(hashed) < len(rec.rows):
        mismatches.append(f"{ledger}: {len(rec.rows) - len(hashed)} of {len(rec.rows)} rows carry no sha256 although "
                          "the others do: hashes were removed")
    return digest, sealed, mismatches


def _messages_held_to_rows(rec: Recording, mismatches: list[str], unverified: bool,
                           broadcasts: SameModel) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Every message file read, hashed and loaded once (the rows of one message are adjacent: the newest file's
    tensors are kept for them), against its rows' sha256 (a mismatch appended to ``mismatches``) and held to each
    row (each model sent down given to ``broadcasts``); returns each file's size and the non-finite tensors found.
    The other side's copy of a message both sides recorded is held to its rows as well."""
    non_finite: list[dict[str, Any]] = []
    sizes: dict[str, int] = {}
    digests: dict[str, str] = {}
    loaded: tuple[str, dict[str, torch.Tensor]] | None = None
    kept = len(rec.rows)
    for n, row in enumerate(rec.rows + rec.copies):
        if row["file"] not in digests:
            data = _read(rec, row)
            sizes[row["file"]], digests[row["file"]] = len(data), hashlib.sha256(data).hexdigest()
            loaded = (row["file"], _tensors(data, row))
        if "sha256" in row and digests[row["file"]] != row["sha256"]:
            mismatches.append(f"{row['file']} (round {row['round']}, {row['sender']} → {row['receiver']}) does not match "
                              "the sha256 its ledger row carries: the message was edited after it was recorded")
            if not unverified:
                continue  # refused by the caller, naming the first mismatch
        if loaded is None or loaded[0] != row["file"]:  # rows of one file apart: read it again (rare)
            loaded = (row["file"], _tensors(_read(rec, row), row))
        # an edited message audited with --unverified is still held to its row: format, shapes, non-finite values
        found = _held_to_row(row, loaded[1])
        non_finite += found if n < kept else []  # a finding once per message
        broadcasts.add(row, loaded[1])
    return sizes, non_finite


class SameModel:
    """Did every client of a round receive the same model? The content of each model sent down (whole, part, or
    global statistics), digested per (round, record, message type): a server that sends one client another
    model than the rest — the signature of model-inconsistency attacks, which secure aggregation does not stop —
    shows as two digests in one round."""

    KINDS = ("full_model", "partial_model", "global_stats")

    def __init__(self) -> None:
        # (round, record, message type) → content digest → receivers, per side that recorded the copies: the
        # clients' copies are what they received; the server's are what it says it sent
        self.sides: dict[str, dict[tuple[int, str, str], dict[str, list[str]]]] = {}

    def add(self, row: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        if row["direction"] != "down" or row["kind"] not in self.KINDS or is_release(row):
            return
        prefix = row["record"] + "/"
        h = hashlib.sha256()
        for key in sorted(k for k in tensors if k.startswith(prefix)):
            t = tensors[key].contiguous()
            h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # any dtype, bf16 included; no copy
        groups = self.sides.setdefault(row["recorded_by"], {})
        group = groups.setdefault((row["round"], row["record"], row["message_type"]), {})
        group.setdefault(h.hexdigest(), []).append(row["receiver"])

    def result(self) -> dict[str, Any]:
        """Compared on the clients' copies where they recorded them (what each received), else on the server's:
        how many (round, record, message type) broadcasts reached two clients or more, and each one whose clients
        got different content (the clients of each content, largest group first), from either side's copies."""
        side = "client" if self.sides.get("client") else "server"
        groups = self.sides.get(side, {})
        differ = {}
        for recorded_by, by_key in sorted(self.sides.items()):
            for (rnd, record, kind), by_digest in sorted(by_key.items()):
                if len(by_digest) > 1:
                    differ.setdefault((rnd, record, kind), {
                        "round": rnd, "record": record, "message_type": kind, "recorded_by": recorded_by,
                        "groups": sorted((sorted(c) for c in by_digest.values()), key=lambda c: (-len(c), c))})
        return {"compared": sum(1 for g in groups.values() if sum(map(len, g.values())) > 1), "recorded_by": side,
                "different": [differ[k] for k in sorted(differ)]}


def _read(rec: Recording, row: Mapping[str, Any]) -> bytes:
    path = rec.root / row["file"]
    if not path.is_file():
        raise FedauditError(f"{row['file']} (round {row['round']}, {row['sender']} → {row['receiver']}) is missing; "
                            f"{DAMAGED}")
    return path.read_bytes()


def _tensors(data: bytes, row: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(data)
    except (SafetensorError, ValueError, OSError) as exc:
        raise FedauditError(f"{row['file']} (round {row['round']}, {row['sender']} → {row['receiver']}) is not a "
                            f"safetensors file ({exc}); {DAMAGED}") from None


def _held_to_row(row: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> list[dict[str, Any]]:
    """The row's tensors exist at their declared shapes and add up to its bytes; returns its non-finite ones."""
    where = f"{row['file']} (round {row['round']}, {row['sender']} → {row['receiver']}, record {row['record']!r})"
    if row["kind"] == "config":
        return []
    prefix = row["record"] + "/"  # record/key, or metrics:record/key for a scalars row
    mine = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
    if "shapes" not in row:  # a row that declared none: the shapes as read, which the model check then holds
        row["shapes"] = {key: list(t.shape) for key, t in mine.items()}  # (recording.rows is a read-back copy)
    for key, shape in (row.get("shapes") or {}).items():
        if key not in mine:
            raise FedauditError(f"{where} lacks the tensor {key!r} its ledger row declares; {DAMAGED}")
        if list(mine[key].shape) != list(shape):
            raise FedauditError(f"{where}: tensor {key!r} has shape {list(mine[key].shape)}, its ledger row declares "
                                f"{list(shape)}; {DAMAGED}")
    if len(mine) != row["tensors"] or sum(t.numel() * t.element_size() for t in mine.values()) != row["bytes"]:
        raise FedauditError(f"{where} holds {len(mine)} tensor(s) of "
                            f"{sum(t.numel() * t.element_size() for t in mine.values())} bytes, its ledger row declares "
                            f"{row['tensors']} of {row['bytes']}; {DAMAGED}")
    return [{"sender": row["sender"], "receiver": row["receiver"], "round": row["round"], "record": row["record"],
             "tensor": key, "kind": row["kind"], "message_type": row["message_type"]}
            for key, t in mine.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


__all__ = ["NO_HASHES", "NOT_SEALED", "OVERRIDDEN", "VERIFIED", "verify_recording"]
