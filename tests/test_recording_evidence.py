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


# -- verified whole, tamper-evident (items 2 and 3) ------------------------------------------------------------


def _sealed(root: Path) -> Path:
    from fedaudit.interop.recording import seal_recording

    seal_recording(root)
    return root


def _message(root: Path, round_: int = 1, direction: str = "up") -> tuple[dict, Path]:
    rows = [json.loads(line) for line in (root / "wire.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["round"] == round_ and r["direction"] == direction)
    return row, root / row["file"]


def _strip_hashes(root: Path) -> None:
    _rewrite(root, lambda r, i: {k: v for k, v in r.items() if k != "sha256"})


def _verify(root: Path, **kw):
    from fedaudit.interop.recording_verify import verify_recording

    return verify_recording(read_recording(root), **kw)


def _audit_refused(root: Path, tmp_path: Path, *needles: str) -> None:
    with pytest.raises(FedauditError) as caught:
        _verify(root)
    assert "\n" not in str(caught.value) and all(n in str(caught.value) for n in needles), str(caught.value)
    out = tmp_path / "runs"
    result = runner.invoke(app, ["audit", str(root), "--attack", "mia-loss", "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert not out.exists() or not any(out.iterdir())


def test_an_intact_sealed_recording_verifies_and_says_what_was_checked(recording):
    from fedaudit.reports.summary import verification_text
    from fedaudit.run.stored import Verification

    v = _verify(_sealed(recording))
    assert v["status"] == "verified" and v["messages"] == 8 and v["rows"] == 8 and v["rounds"] == 2
    assert v["clients"] == 2 and v["non_finite"] == [] and len(v["ledger_sha256"]) == 64
    assert verification_text(Verification.read(v)).startswith("VERIFIED") and v["ledger_sha256"] in verification_text(Verification.read(v))
    assert _verify(recording)["status"] == "verified"
    unsealed = recording.parent / "unsealed"
    shutil.copytree(recording, unsealed)
    manifest = json.loads((unsealed / "manifest.json").read_text())
    del manifest["ledger_sha256"]
    (unsealed / "manifest.json").write_text(json.dumps(manifest))
    assert _verify(unsealed)["status"] == "unverified: ledger not sealed"


def test_an_edited_tensor_is_refused_unless_audited_as_unverified(recording, tmp_path):
    from safetensors.torch import load_file, save_file

    _sealed(recording)
    row, path = _message(recording, round_=1)  # a round the attacks on the last upload never read
    tensors = load_file(str(path))
    save_file({k: v + 1 for k, v in tensors.items()}, str(path))
    _audit_refused(recording, tmp_path, "does not match the sha256 its ledger row carries", "--unverified")
    v = _verify(recording, unverified=True)
    assert v["status"] == "unverified: accepted with --unverified" and "sha256" in v["mismatches"][0]
    # accepted unverified, the edited message is still held to its row: a NaN put in is found, a wrong shape refused
    save_file({k: torch.full_like(v, float("nan")) for k, v in tensors.items()}, str(path))
    assert [f["round"] for f in _verify(recording, unverified=True)["non_finite"]] == [1]
    save_file({k: torch.ones(4) for k in tensors}, str(path))
    with pytest.raises(FedauditError, match="has shape \\[4\\], its ledger row declares \\[3\\]"):
        _verify(recording, unverified=True)


def test_an_edited_ledger_after_the_seal_is_refused(recording, tmp_path):
    _sealed(recording)
    _rewrite(recording, lambda r, i: {**r, "bytes": r["bytes"]} if i else {**r, "time": r["time"] + 1})
    _audit_refused(recording, tmp_path, "does not match the digest sealed in the manifest")


def test_a_pickle_or_wrong_shapes_in_a_round_no_attack_reads_are_refused(recording, tmp_path):
    import pickle

    from safetensors.torch import save_file

    _strip_hashes(recording)  # as a recording made before hashes: the file itself must still be checked
    row, path = _message(recording, round_=1)
    original = path.read_bytes()
    path.write_bytes(pickle.dumps({"w": [1.0, 2.0, 3.0]}))
    _audit_refused(recording, tmp_path, "round 1", "is not a safetensors file")
    path.write_bytes(original)
    save_file({f"{row['record']}/w": torch.ones(4)}, str(path))
    _audit_refused(recording, tmp_path, "round 1", "tensor 'w' has shape [4], its ledger row declares [3]")


def test_a_recording_without_hashes_reads_as_unverified_not_as_an_error(recording):
    from fedaudit.reports.summary import verification_text
    from fedaudit.run.stored import Verification

    _strip_hashes(recording)
    v = _verify(recording)
    assert v["status"] == "unverified: no hashes" and v["messages"] == 8
    assert verification_text(Verification.read(v)).startswith("UNVERIFIED: the recording carries no hashes")


def test_an_upload_of_nan_is_a_finding_that_names_client_round_and_tensor(tmp_path):
    from fedaudit.reports.summary import verification_text
    from fedaudit.run.stored import Verification

    root = tmp_path / "nan"
    with Recorder(root) as recorder:
        recorder.send(1, "server", "clean", {"w": torch.ones(3)})
        recorder.send(1, "clean", "server", {"w": torch.tensor([1.0, float("nan"), 0.0])})
    v = _verify(root)
    assert v["status"] == "verified"
    assert v["non_finite"] == [{"sender": "client:clean", "receiver": "server", "round": 1, "record": "arrays",
                                "tensor": "w", "kind": "record", "message_type": "train"}]
    assert "NON-FINITE values (NaN or infinity) in: client:clean round 1: arrays/w" in verification_text(Verification.read(v))


# -- a recording that is whole but does not fit, or holds NaN where an attack reads ----------------------------


def _model_recording(tmp_path: Path) -> Path:
    """Two rounds of a hand-written FedAvg loop on digits (fedaudit's cnn at 16 px), recorded and sealed."""
    from tests.test_own_model import record_loop

    return record_loop(tmp_path / "loop", "cnn", rounds=2)


def _remade(root: Path, round_: int, sender: str, change) -> str:
    """Rewrite one upload's message file with ``change(tensors)`` as if the deployment had sent it so: its ledger
    row's shapes, bytes and sha256 follow, and the ledger is sealed again. Returns the first tensor changed."""
    import hashlib

    from safetensors.torch import load_file, save_file

    rows = [json.loads(line) for line in (root / "wire.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["round"] == round_ and r["sender"] == sender and r["kind"] == "full_model")
    path = root / row["file"]
    tensors = load_file(str(path))
    changed = change(tensors)
    save_file(tensors, str(path))
    prefix = row["record"] + "/"
    mine = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
    row.update(shapes={k: list(t.shape) for k, t in mine.items()}, sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
               bytes=sum(t.numel() * t.element_size() for t in mine.values()))
    (root / "wire.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _sealed(root)
    return changed


def test_an_upload_that_does_not_fit_the_model_is_refused_in_a_round_no_attack_reads(tmp_path):
    root = _model_recording(tmp_path)

    def widen(tensors):
        name = next(k for k in tensors if k.endswith(".weight") and tensors[k].dim() == 4)
        tensors[name] = torch.zeros(tensors[name].shape[0] + 1, *tensors[name].shape[1:])
        return name.split("/", 1)[1]

    tensor = _remade(root, 1, "client:clean", widen)
    assert _verify(root)["status"] == "verified"  # whole and sealed: only the model it claims to be says otherwise
    _audit_refused_after_verification(root, tmp_path, f"recorded full_model from client:clean in round 1: tensor "
                                                      f"{tensor!r} has shape", "--model")


def _audit_refused_after_verification(root: Path, tmp_path: Path, *needles: str, args: tuple = ()) -> None:
    out = tmp_path / "runs"
    result = runner.invoke(app, ["audit", str(root), "--attack", "mia-loss", "--device", "cpu", "--out", str(out), *args])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert all(n in text for n in needles), text
    assert not out.exists() or not any(out.iterdir())


def test_nan_where_an_attack_reads_refuses_it_and_elsewhere_is_a_finding_in_the_report(tmp_path):
    """A NaN in the victim's newest upload refuses the attacks on it, in one line naming the message, the tensor and
    the way to audit the rest; audited without that victim, the run completes and its report names the finding."""
    root = _model_recording(tmp_path)

    def poison(tensors):
        name = next(k for k in tensors if k.endswith(".weight"))
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = float("nan")
        return name.split("/", 1)[1]

    tensor = _remade(root, 2, "client:clean", poison)
    assert _verify(root)["non_finite"][0]["tensor"] == tensor
    _audit_refused_after_verification(root, tmp_path, f"client:clean → server, round 2: tensor arrays/{tensor} holds NaN "
                                                      "or infinity", "--victim colour")
    out = tmp_path / "audited"
    result = runner.invoke(app, ["audit", str(root), "--attack", "mia-loss", "--victim", "colour", "--device", "cpu",
                                 "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = next(out.glob("*/report.html")).read_text(encoding="utf-8")
    assert f"client:clean round 2: arrays/{tensor}" in page


def _declare_data(root: Path, data: dict) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**manifest, "data": data}))


def _outside_dataset(tmp_path: Path) -> Path:
    """A DomainBed-layout folder outside the recording, its names ones an error must never list."""
    from PIL import Image

    outside = tmp_path / "outside"
    for part in ("", "members/", "holdout/", "unseen/"):
        folder = outside / f"{part}secret-domain" / "secret-class"
        folder.mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(folder / "0.png")
    return outside


@pytest.mark.parametrize(("declared", "flag"), [
    ("folder:{outside}", "--dataset folder:{outside}"),
    ("folder:../outside", "--dataset folder:{outside}"),  # relative: read against the recording, shown absolute
    ("records:{outside}", "--records {outside}"),
    ({"records": "{outside}"}, "--records {outside}"),
])
def test_a_manifest_path_outside_the_recording_is_refused_before_anything_of_it_is_read(
        recording, tmp_path, declared, flag, monkeypatch):
    """Issue 56: no path the manifest names is followed outside the recording unless the reviewer names it — the
    dataset's folder: and records: as much as data.records. Refused in one line naming the flag, before the folder
    is read, and nothing of it is listed."""
    from fedaudit.data import folder

    outside = _outside_dataset(tmp_path)
    data = ({k: v.format(outside=outside) for k, v in declared.items()} if isinstance(declared, dict)
            else {"dataset": declared.format(outside=outside)})
    _declare_data(recording, data)
    read = []
    monkeypatch.setattr(folder, "load_folder", lambda *a, **k: read.append(a))
    out = tmp_path / "runs"
    result = runner.invoke(app, ["audit", str(recording), "--attack", "mia-loss", "--out", str(out)])
    said = result.output.replace("\n", " ").replace("  ", " ")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "outside the recording" in said and f"pass {flag.format(outside=outside)}" in said, said
    assert "secret" not in said and read == [] and not out.exists()


def test_a_link_inside_a_manifests_data_folder_that_leads_out_is_refused(recording, tmp_path, monkeypatch):
    from fedaudit.data import folder
    from fedaudit.interop.audit_recording import recorded_config

    outside = _outside_dataset(tmp_path)
    (recording / "data").mkdir()
    os.symlink(outside / "secret-domain", recording / "data" / "clean")
    _declare_data(recording, {"dataset": "folder:data"})
    monkeypatch.setattr(folder, "load_folder", lambda *a, **k: pytest.fail("read a folder"))
    with pytest.raises(FedauditError, match=r"data\.dataset: data/clean is a link that leads outside the recording; "
                                            r".*pass the clients' dataset with --dataset folder:PATH"):
        recorded_config(read_recording(recording))


def test_a_manifests_data_inside_the_recording_or_what_the_reviewer_names_is_followed(recording, tmp_path):
    from fedaudit.interop.audit_recording import recorded_config

    outside = _outside_dataset(tmp_path)
    (recording / "data").mkdir()
    _declare_data(recording, {"dataset": "folder:data"})
    rec = read_recording(recording)
    assert recorded_config(rec)["dataset"] == f"folder:{(recording / 'data').resolve()}"
    _declare_data(recording, {"dataset": f"folder:{outside}"})
    rec = read_recording(recording)
    assert recorded_config(rec, dataset=f"folder:{outside}")["dataset"] == f"folder:{outside}"  # named: followed
    assert recorded_config(rec, records=outside)["dataset"] == f"records:{outside.resolve()}"
    assert recorded_config(rec, dataset="digits")["dataset"] == "digits"
    with pytest.raises(FedauditError, match="--records and --dataset both name the auditor's data; give one"):
        recorded_config(rec, records=outside, dataset="digits")
    _declare_data(recording, {"dataset": "digits"})  # a built-in dataset names no path
    assert recorded_config(read_recording(recording))["dataset"] == "digits"


def test_records_the_manifest_names_but_the_recording_lacks_are_asked_for_with_the_flag(recording, tmp_path):
    """Issue 56: an audit whose declared records are missing (an NVFlare job's auditor-records not copied in) names
    --records, the way to give them."""
    _declare_data(recording, {"records": "auditor-records"})
    result = runner.invoke(app, ["audit", str(recording), "--attack", "mia-loss", "--out", str(tmp_path / "runs")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "have no members/ folder" in said and "--records PATH" in said, said


# -- the manifest's framework block, declared once (issue 71) ------------------------------------------------------


def test_a_framework_field_the_reader_does_not_declare_is_refused_in_one_line(recording, tmp_path):
    """A manifest whose framework block holds a field the reader's model does not declare (made by another version,
    or altered) is refused when the recording is read — one line naming the field — not by a traceback after the
    attacks have run, as NVFlare's job_id once was."""
    path = recording / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["framework"] = {**manifest["framework"], "shard_of": "site-1"}
    path.write_text(json.dumps(manifest))
    _refused(recording, tmp_path, "is not a manifest this fedaudit reads", "framework.shard_of")


DECLARED_BLOCKS = {  # start_recording's argument → a block as the recorders write it, and the manifest's key
    "framework": ({"name": "nvflare", "version": "2.9.0", "job_id": "simulate_job", "round_offset": 1}, "framework"),
    "architecture": ({"model": "cnn", "norm": "bn", "num_classes": 10, "image_size": 32, "channels": 3}, "model"),
    "data": ({"dataset": "digits", "seed": 0, "target_domain": "textured"}, "data"),
    "recipe": ({"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 32, "local_epochs": 1, "rounds": 2,
                "augment": True}, "recipe"),
    "prior": ({"classes": ["a", "b"], "mean": [0.5] * 3, "std": [0.25] * 3, "hflip": False}, "prior"),
    "dp": ({"mechanism": "central-dp-server-side-fixed-clipping", "noise_multiplier": 1.0, "clipping_norm": 1.0,
            "num_sampled_clients": 2}, "dp"),
}


@pytest.mark.parametrize("argument", sorted(DECLARED_BLOCKS))
def test_a_recorder_that_writes_an_undeclared_manifest_field_fails_where_it_is_written(tmp_path, argument):
    """Every recorder writes the manifest through the reader's own model (fedaudit.interop.manifest): a field that
    model does not declare, in any block, fails in the recorder (and so in the recorder's tests), one line naming it
    — a misspelt recipe key is no longer silently the default. Each block as the recorders write it reads back
    whole, and a value of the wrong type (a count given as text) fails as well."""
    from fedaudit.interop.recording_reader import _manifest
    from fedaudit.interop.recording_writer import start_recording

    block, key = DECLARED_BLOCKS[argument]
    with pytest.raises(FedauditError) as caught:
        start_recording(tmp_path / "bad", **{argument: {**block, "undeclared_field": 1}})
    said = str(caught.value)
    assert f"'{key}.undeclared_field'" in said and "\n" not in said and not (tmp_path / "bad").exists(), said  # no orphan
    first = next(iter(block))
    with pytest.raises(FedauditError, match=f"{key}.{first}\\b"):
        start_recording(tmp_path / "wrong", **{argument: {**block, first: {"a": "block"}}})
    start_recording(tmp_path / "ok", **{argument: block})
    written = _manifest(tmp_path / "ok").model_dump(exclude_unset=True)[key]
    assert {k: written.get(k) for k in block} == block, written  # dp: check_dp adds delta's default


def test_an_audit_that_fails_after_its_directory_exists_leaves_none_and_says_so_in_one_line(tmp_path, monkeypatch):
    """Issue 71: a failure while the audit stores its result (here a stored block failing its model, as the NVFlare
    framework block once did) removes the half-written run directory and reads as one line, status 2, no
    traceback; the same recording, unbroken, audits to a complete run."""
    from pydantic import ValidationError

    from examples.pytorch_fedavg.net import Net
    from fedaudit.interop import audit_recording
    from fedaudit.run.stored.provenance import Framework

    torch.manual_seed(0)
    model = Net(num_classes=10, width=4)
    root = tmp_path / "rec"
    recorder = Recorder(root, model=model, architecture={"model": "examples.pytorch_fedavg.net:Net", "num_classes": 10,
                                                         "image_size": 32, "args": {"width": 4}},
                        data={"dataset": "digits", "seed": 0, "target_domain": "textured"})
    for rnd in (1, 2):
        for client in ("clean", "colour"):
            recorder.send(rnd, "server", client, model.state_dict())
            recorder.send(rnd, client, "server", model.state_dict())
    recorder.release(model.state_dict())
    recorder.close()
    args = ["audit", str(root), "--model", "examples.pytorch_fedavg.net:Net", "--attack", "none", "--device", "cpu",
            "--quiet"]

    def broken(*_args, **_kwargs):
        Framework.model_validate({"name": "x", "undeclared": 1})

    monkeypatch.setattr(audit_recording, "store_verdict", broken)
    out = tmp_path / "runs"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert "failed its model" in line and "'undeclared'" in line and "left no run directory" in line
    assert not out.exists() or list(out.iterdir()) == []
    assert isinstance(result.exception, SystemExit) and not isinstance(result.exception, ValidationError)
    monkeypatch.undo()
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    assert (run_dir / "COMPLETE").exists()
