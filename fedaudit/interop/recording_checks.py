"""A recording is untrusted evidence: someone else made it, and the verdict is only as good as what was read.

Before anything is judged, every ledger row is held to the format (its fields, their types, known kinds,
directions and recorders) and every path a recording names — a row's message file, a node file, the manifest
and the ledger themselves — must resolve inside the recording directory, symlinks included. Each problem is one
line naming the row and the field (:class:`~fedaudit.errors.FedauditError`); a file outside is never opened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.interop.recording_writer import RECORDERS, RELEASE
from fedaudit.simulation.wire import ArtifactKind

DIRECTIONS = ("up", "down")
KINDS = frozenset({k.value for k in ArtifactKind} | {"config"})
DAMAGED = "the recording is damaged or was altered — ask for the recording as it was made"

# field → (the JSON types it may hold, its name in an error); every row written by RecordingWriter has all of them
REQUIRED: dict[str, tuple[tuple[type, ...], str]] = {
    "kind": ((str,), "a string"), "record": ((str,), "a string"), "round": ((int,), "a whole number"),
    "direction": ((str,), "a string"), "src_node_id": ((int,), "a whole number"),
    "dst_node_id": ((int,), "a whole number"), "message_type": ((str,), "a string"), "file": ((str,), "a string"),
    "bytes": ((int,), "a whole number"), "tensors": ((int,), "a whole number"), "recorded_by": ((str,), "a string"),
    "time": ((int, float), "a number"),
}
OPTIONAL: dict[str, tuple[tuple[type, ...], str]] = {
    "sender": ((str, type(None)), "a string or null"), "receiver": ((str, type(None)), "a string or null"),
    "message_id": ((str,), "a string"), "run_id": ((str, type(None)), "a string or null"),
    "framework_run_id": ((str, int, type(None)), "a string, a number or null"), "shapes": ((dict,), "an object"),
    "configs": ((dict,), "an object"),
}


def check_row(row: Any, where: str) -> None:
    """One ledger row against the format; ``where`` names it (``wire.jsonl line 7``)."""
    if not isinstance(row, dict):
        raise FedauditError(f"{where} is not a JSON object; {DAMAGED}")
    for name, (types, what) in {**REQUIRED, **OPTIONAL}.items():
        if name not in row:
            if name in REQUIRED:
                raise FedauditError(f"{where}: field {name!r} is missing; {DAMAGED}")
            continue
        value = row[name]
        if not isinstance(value, types) or isinstance(value, bool) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise FedauditError(f"{where}: field {name!r} is {value!r}, not {what}; {DAMAGED}")
    for name, allowed in (("kind", KINDS), ("direction", DIRECTIONS), ("recorded_by", RECORDERS)):
        if row[name] not in allowed:
            raise FedauditError(f"{where}: field {name!r} is {row[name]!r}, not one of {', '.join(sorted(allowed))}; "
                                f"{DAMAGED}")
    for name in ("round", "bytes", "tensors"):
        if row[name] < 0:
            raise FedauditError(f"{where}: field {name!r} is {row[name]}, below 0; {DAMAGED}")
    _check_shapes(row.get("shapes"), where)


def _check_shapes(shapes: Mapping[str, Any] | None, where: str) -> None:
    for key, shape in (shapes or {}).items():
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                  for n in shape):
            raise FedauditError(f"{where}: field 'shapes' gives {key!r} the shape {shape!r}, not a list of sizes; "
                                f"{DAMAGED}")


# -- what a row is --------------------------------------------------------------------------------------


def is_release(row: Mapping[str, Any]) -> bool:
    """The model the deployment released (``Recorder.release``): server → server, after the last round."""
    return row.get("message_type") == RELEASE


def trains(row: Mapping[str, Any]) -> bool:
    """A training message that carries arrays (a model to train from, or what training produced): not evaluation,
    release, config or metrics alone — a reply without any array (a site whose update was empty) trained nothing."""
    return (row["kind"] not in ("config", ArtifactKind.SCALARS.value) and row["tensors"] > 0
            and not is_evaluation(row) and not is_release(row))


def is_evaluation(row: Mapping[str, Any]) -> bool:
    """Flower's ``evaluate`` messages (and ``evaluate.<name>``): they carry a model to score, not to train."""
    return str(row.get("message_type", "")).split(".")[0] == "evaluate"



def inside(root: Path, relative: str, where: str) -> Path:
    """``root / relative`` resolved, refused unless it stays inside the recording (absolute paths, ``..`` and
    symlinks out all refused before anything is opened)."""
    path = Path(relative)
    if path.is_absolute() or ".." in path.parts or not relative.strip():
        raise FedauditError(f"{where}: file {relative!r} is not a path inside the recording; a recording names its "
                            f"messages relative to its directory (messages/…) — refusing to read it: {DAMAGED}")
    resolved = (root / path).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise FedauditError(f"{where}: file {relative!r} leads outside the recording (a symbolic link to "
                            f"{resolved}); refusing to read it: {DAMAGED}")
    return resolved


def own_file(root: Path, path: Path) -> Path:
    """A file the format itself names (manifest, ledger, a node file), refused if it is a link out of ``root``."""
    return inside(root, str(path.relative_to(root)), str(path.relative_to(root)))


__all__ = ["DAMAGED", "KINDS", "check_row", "inside", "is_evaluation", "is_release", "own_file", "trains"]
