"""Issue 37: a recording is untrusted evidence. Every path it names stays inside it (a file outside is never opened)
and every ledger row is held to the format before anything is judged: each problem one line, status 2, no
traceback, nothing written. Each test alters a recording the recorder made."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedaudit.cli import app
from fedaudit.errors import FedauditError
from fedaudit.interop import recording_reader
from fedaudit.interop.recording import Recorder
from fedaudit.interop.recording_reader import read_recording

runner = CliRunner()


@pytest.fixture
def recording(tmp_path) -> Path:
    """Two rounds of a two-client loop, recorded by the core Recorder."""
    root = tmp_path / "rec"
    recorder = Recorder(root)
    for rnd in (1, 2):
        for client in ("clean", "colour"):
            recorder.send(rnd, "server", client, {"w": torch.ones(3)})
            recorder.send(rnd, client, "server", {"w": torch.full((3,), float(rnd))})
    return root


def _rewrite(root: Path, change) -> None:
    """Apply ``change`` to every ledger row (it may return a new row)."""
    ledger = root / "wire.jsonl"
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    ledger.write_text("".join(json.dumps(change(dict(r), i) or r) + "\n" for i, r in enumerate(rows)))


def _refused(root: Path, tmp_path: Path, *needles: str) -> None:
    """Refused by the reader and by `fedaudit audit`: one line naming the problem, status 2, no run written."""
    with pytest.raises(FedauditError) as caught:
        read_recording(root)
    message = str(caught.value)
    assert "\n" not in message and all(n in message for n in needles), message
    out = tmp_path / "runs"
    result = runner.invoke(app, ["audit", str(root), "--attack", "mia-loss", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and needles[0] in result.output.replace("\n", " ").replace("  ", " ")
    assert not out.exists() or not any(out.iterdir())


def _outside_copy(root: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """A complete copy of every message file outside the recording (what would let an audit succeed), and the
    recording's own message files emptied."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / "messages", elsewhere)
    own = sorted((root / "messages").iterdir())
    for f in own:
        f.unlink()
    return elsewhere, own


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_message_paths_outside_the_recording_are_refused_and_never_opened(recording, tmp_path, how, monkeypatch):
    elsewhere, _ = _outside_copy(recording, tmp_path)
    if how == "absolute":
        _rewrite(recording, lambda r, i: {**r, "file": str(elsewhere / Path(r["file"]).name)})
    else:
        _rewrite(recording, lambda r, i: {**r, "file": f"../elsewhere/{Path(r['file']).name}"})
    opened = []
    monkeypatch.setattr(recording_reader, "load_message", lambda path: opened.append(path))
    _refused(recording, tmp_path, "line 1", "is not a path inside the recording")
    assert opened == []


def test_a_symlink_out_of_the_recording_is_refused(recording, tmp_path):
    elsewhere, own = _outside_copy(recording, tmp_path)
    for f in own:
        os.symlink(elsewhere / f.name, f)  # the same names, now links to the copies outside
    _refused(recording, tmp_path, "line 1", "leads outside the recording")


def test_a_node_file_or_ledger_linked_from_outside_is_refused(recording, tmp_path):
    outside = tmp_path / "ledger.jsonl"
    shutil.move(recording / "wire.jsonl", outside)
    os.symlink(outside, recording / "wire.jsonl")
    with pytest.raises(FedauditError, match="wire.jsonl.*leads outside the recording"):
        read_recording(recording)


@pytest.mark.parametrize(("change", "needles"), [
    (lambda r, i: {**r, "round": "abc"} if i == 2 else None, ("line 3", "field 'round' is 'abc', not a whole number")),
    (lambda r, i: {k: v for k, v in r.items() if k != "kind"} if i == 0 else None, ("line 1", "field 'kind' is missing")),
    (lambda r, i: {**r, "direction": "sideways"} if i == 1 else None, ("line 2", "field 'direction' is 'sideways'")),
    (lambda r, i: {**r, "kind": "weights"} if i == 0 else None, ("line 1", "field 'kind' is 'weights', not one of")),
    (lambda r, i: {**r, "bytes": -1} if i == 0 else None, ("line 1", "field 'bytes' is -1, below 0")),
    (lambda r, i: {**r, "shapes": {"w": ["3"]}} if i == 0 else None, ("line 1", "gives 'w' the shape")),
    (lambda r, i: [1, 2] if i == 0 else None, ("line 1", "is not a JSON object")),
])
def test_a_ledger_row_that_breaks_the_format_is_one_line(recording, tmp_path, change, needles):
    _rewrite(recording, change)
    _refused(recording, tmp_path, *needles)


def test_an_intact_recording_reads_whole(recording):
    rec = read_recording(recording)
    assert len(rec.rows) == 8 and all(torch.equal(rec.artifact(r).tensors["w"], torch.full((3,), float(r["round"])))
                                      for r in rec.rows if r["direction"] == "up")
