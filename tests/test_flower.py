"""Recording a Flower federation: the client mod and the server-side grid write fedaudit's wire format.

Most tests need no Ray: a ClientApp is called with a Message and a Context, and a fake Grid serves Flower's own
FedAvg strategy by calling the ClientApps directly; the example's tests run Flower's own simulation.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.extra  # needs the flower extra: CI runs it in the environment with the extras
flwr = pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedaudit.errors import FedauditError  # noqa: E402
from fedaudit.interop.flower import RecordingGrid, recording_mod, start_recording  # noqa: E402
from fedaudit.interop.recording import RecordingWriter, classify_record  # noqa: E402
from fedaudit.interop.recording_reader import read_recording  # noqa: E402
from fedaudit.simulation.dp_accounting import GAUSSIAN  # noqa: E402
from fedaudit.simulation.wire import ArtifactKind  # noqa: E402

from tests.flower_grid import NAMES, SERVER_NODE, FakeGrid, array_bytes  # noqa: E402


@pytest.fixture(autouse=True)
def server_identity():
    """Messages take their run and sender from the process's task identity, as in a ServerApp process."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SERVER_NODE
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))


def built_model() -> nn.Module:
    model = small_model()
    model(torch.zeros(2, 3, 8, 8))
    return model


def client_app(root: Path, steps: int = 1) -> ClientApp:
    app = ClientApp(mods=[recording_mod(root)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = built_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["lr"]))
        for _ in range(steps):
            loss = model(torch.randn(4, 3, 8, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": 10 + context.node_id % 7})}), reply_to=msg)

    return app


def run_fedavg(root: Path, rounds: int = 2) -> FakeGrid:
    model = built_model()
    start_recording(root, model=model, architecture={"model": "tiny"})
    grid = FakeGrid({node: client_app(root) for node in NAMES})
    FedAvg(fraction_evaluate=0.0, min_available_nodes=2).start(
        grid=RecordingGrid(grid, root), initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.1}))
    return grid


def test_fedavg_recording_ledger_matches_what_flower_sent(tmp_path):
    """Both sides recorded; read back, each message counts once, with the bytes of the arrays Flower sent,
    filed under the round the strategy set and the names the nodes gave."""
    grid = run_fedavg(tmp_path, rounds=2)
    rec = read_recording(tmp_path)
    recorders = {json.loads(line)["recorded_by"] for line in (tmp_path / "wire.jsonl").read_text().splitlines()}
    assert recorders == {"client", "server"}
    assert rec.bytes_by_round({ArtifactKind.FULL_MODEL.value}) == grid.bytes_by_round
    wire = rec.wire()
    assert sorted((e.kind, e.sender, e.receiver, e.round) for e in wire.ledger) == sorted(
        [(k, s, r, rnd) for rnd in (1, 2) for name in NAMES.values()
         for k, s, r in (("full_model", "server", f"client:{name}"), ("full_model", f"client:{name}", "server"),
                         ("scalars", f"client:{name}", "server"))])
    # the view a server attack gets: each client's newest upload, its tensors as the client sent them
    upload = wire.view("server").latest(ArtifactKind.FULL_MODEL, "client:colour")
    last_reply = [r for m, r in zip(grid.sent, grid.replies) if m.metadata.dst_node_id == 202][-1]
    expected = last_reply.content["arrays"].to_torch_state_dict()
    assert upload.round == 2 and set(upload.tensors) == set(expected)
    assert all(torch.equal(upload.tensors[k], expected[k]) for k in expected)


def test_client_mod_alone_records_both_directions(tmp_path):
    model = built_model()
    start_recording(tmp_path, model=model)
    app = client_app(tmp_path)
    msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord({"server-round": 3, "lr": 0.1})}),
                  dst_node_id=101, message_type="train")
    reply = app(msg, Context(run_id=7, node_id=101, node_config={"name": "clean"}, state=RecordDict(), run_config={}))
    rec = read_recording(tmp_path)
    rows = [(r["kind"], r["sender"], r["receiver"], r["round"], r["bytes"]) for r in rec.rows if r["kind"] != "config"]
    assert rows == [("full_model", "server", "client:clean", 3, array_bytes(msg)),
                    ("full_model", "client:clean", "server", 3, array_bytes(reply)),
                    ("scalars", "client:clean", "server", 3, 8)]


def test_record_kinds_from_the_declared_model_and_the_manifest():
    state = {k: tuple(v.shape) for k, v in built_model().state_dict().items()}
    whole = dict(state)
    stats = {k: s for k, s in state.items() if "running" in k or "num_batches" in k}
    part = {k: s for k, s in state.items() if k.startswith("0.")}
    assert classify_record("arrays", whole, sent_up=True, model_state=state) == ArtifactKind.FULL_MODEL
    assert classify_record("arrays", part, sent_up=True, model_state=state) == ArtifactKind.PARTIAL_MODEL
    assert classify_record("bn", stats, sent_up=True, model_state=state) == ArtifactKind.BN_STATS_ALL_LAYERS
    assert classify_record("bn", stats, sent_up=False, model_state=state) == ArtifactKind.GLOBAL_STATS
    assert classify_record("styles", {"mean": (3, 4)}, sent_up=True, model_state=state) == ArtifactKind.RECORD
    assert classify_record("styles", {"mean": (3, 4)}, sent_up=True, model_state=state,
                           declared={"styles": "style_bank"}) == ArtifactKind.STYLE_BANK
    # same names, another shape: not this model's state
    wrong = {**whole, "3.weight": (5, 5)}
    assert classify_record("arrays", wrong, sent_up=True, model_state=state) == ArtifactKind.RECORD


def test_unknown_declared_kind_is_a_one_line_error(tmp_path):
    with pytest.raises(FedauditError, match="record 'styles' is mapped to unknown kind 'styel_bank'; valid kinds:"):
        start_recording(tmp_path, record_kinds={"styles": "styel_bank"})


def test_bad_recordings_get_one_line_errors(tmp_path):
    with pytest.raises(FedauditError, match="has no manifest.json: not a fedaudit recording"):
        read_recording(tmp_path)
    run_fedavg(tmp_path, rounds=1)
    rec = read_recording(tmp_path)
    row = next(r for r in rec.rows if r["kind"] == "full_model")
    path = tmp_path / row["file"]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(FedauditError, match=r"is not a readable safetensors file .*truncated"):
        rec.artifact(row)
    for node_file in (tmp_path / "nodes").glob("*.json"):
        node_file.unlink()
    with pytest.raises(FedauditError, match=r"node \d+ has no name"):
        read_recording(tmp_path)


def _write_many(root: str, worker: int) -> None:
    writer = RecordingWriter(root, "client")
    for i in range(25):
        writer.message(src_node_id=100 + worker, dst_node_id=SERVER_NODE, sender=f"client:w{worker}", receiver="server",
                       round=i, message_type="train", message_id="", arrays={"arrays": {"w": torch.full((64,), float(i))}})


def test_several_processes_record_into_one_directory(tmp_path):
    start_recording(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rec = read_recording(tmp_path)
    assert len(rec.rows) == 50
    assert {(r["sender"], r["round"]) for r in rec.rows} == {(f"client:w{w}", i) for w in range(2) for i in range(25)}
    for row in rec.rows:
        assert torch.equal(rec.artifact(row).tensors["w"], torch.full((64,), float(row["round"])))


# -- fedaudit audit on a recording ------------------------------------------------------------------------


def example_app():
    """examples/flower_digits/run.py, imported: its ClientApp and server loop, run here on the fake grid."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "flower_digits" / "run.py"
    spec = importlib.util.spec_from_file_location("flower_digits_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_example(root: Path, rounds: int = 1, local_epochs: int = 1) -> FakeGrid:
    example = example_app()
    nodes = {11: 0, 22: 1, 33: 2}
    grid = FakeGrid({node: example.make_client_app(root, seed=0) for node in nodes},
                    {node: {"partition-id": part} for node, part in nodes.items()})
    example.run_server(grid, root, rounds, local_epochs, seed=0)
    return grid


def example_recording_at(root: Path) -> Path:
    """One round of the example app, recorded into ``root``."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SERVER_NODE
    try:
        record_example(root)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    return root


@pytest.fixture(scope="module")
def example_recording(tmp_path_factory) -> Path:
    """One round of the example app, recorded once for this module's audit tests (each copies it)."""
    return example_recording_at(tmp_path_factory.mktemp("example") / "rec")


def test_audit_of_the_example_recording_writes_a_run(example_recording, tmp_path):
    """The example app (FedAvg on digits, trained and evaluated through Flower's strategy), recorded and audited:
    a complete run directory whose ledger is the recording's and whose verdict assessed the model."""
    from fedaudit.api import audit_recording

    rec_dir = example_recording
    rec = read_recording(rec_dir)
    assert {(r["message_type"], r["kind"], r["direction"]) for r in rec.rows if r["kind"] != "config"} == {
        ("train", "full_model", "down"), ("train", "full_model", "up"), ("train", "scalars", "up"),
        ("evaluate", "full_model", "down"), ("evaluate", "scalars", "up"), ("release", "full_model", "down")}
    run_dir, metrics = audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"), device="cpu")
    for name in ("config.json", "metrics.json", "wire.jsonl", "report.html", "COMPLETE"):
        assert (run_dir / name).exists(), name
    ledger = [json.loads(line) for line in (run_dir / "wire.jsonl").read_text().splitlines()]
    assert sum(r["bytes"] for r in ledger) == sum(r["bytes"] for r in rec.rows if r["message_type"] != "release")
    # the deployed model is the final aggregate the strategy returned, recorded as released; it is the model the
    # strategy evaluated after the last aggregation, and it is what was scored: its accuracy on each client's
    # validation records is what that client reported back to Flower's strategy
    judged = metrics["provenance"]["recording"]["deployed_model"]
    assert (judged["round"], judged["message_type"], judged["released"]) == (1, "release", True)
    released = rec.deployed()[0].tensors
    evaluated = rec.artifact([r for r in rec.rows if r["message_type"] == "evaluate" and r["kind"] == "full_model"][-1])
    assert all(torch.equal(released[k], evaluated.tensors[k]) for k in released)
    reported = {r["sender"][len("client:"):]: float(rec.artifact(r).tensors["accuracy"]) for r in rec.rows
                if r["kind"] == "scalars" and r["message_type"] == "evaluate"}
    assert reported.keys() == {"clean", "colour", "rotated"}
    assert metrics["accuracy"]["source_val"]["per_domain"] == pytest.approx(reported, abs=1e-9)
    # the loss attack scored every victim against the recorded uploads and the deployed model
    for target in ("global_model", "last_upload"):
        assert set(metrics["leakage"]["mia"]["loss"][target]) >= {"clean", "colour", "rotated"}
    assert {"membership:global_model", "membership:full_model↑"} <= {r["row"] for r in metrics["verdict"]}
    # issue 37: verified whole before the audit, and the report says what was verified and prints the digest
    verification = metrics["provenance"]["recording"]["verification"]
    # every message file checked, the other side's copy of a message both sides recorded included
    assert verification["status"] == "verified" and verification["messages"] == len({r["file"] for r in rec.rows + rec.copies})
    assert rec.copies and verification["broadcasts"]["recorded_by"] == "client"  # what each client received
    rows = {r["row"]: r for r in metrics["verdict"]}
    assert rows["consistency:broadcasts"]["tier"] == "low" and rows["consistency:broadcasts"]["level"] == "records"
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "VERIFIED: every message matches" in page and verification["ledger_sha256"] in page


def test_audit_errors_name_the_problem(example_recording, tmp_path):
    import shutil

    from fedaudit.api import audit_recording

    rec_dir = tmp_path / "rec"
    shutil.copytree(example_recording, rec_dir)
    with pytest.raises(FedauditError, match=r"recorded full_model .*tensor '[^']+'.*--model resnet18"):
        audit_recording(rec_dir, attack="mia-loss", model="resnet18", out=str(tmp_path / "runs"))
    node = next((rec_dir / "nodes").glob("*.json"))
    old = json.loads(node.read_text())["name"]
    node.write_text(json.dumps({**json.loads(node.read_text()), "name": "sketchy"}))
    with pytest.raises(FedauditError, match=f"node {node.stem} is 'sketchy' in the recording's node names but "
                                            f"'client:{old}' in a ledger row"):  # a node renamed in one place only
        audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"))
    ledger = rec_dir / "wire.jsonl"
    ledger.write_text(ledger.read_text().replace(f'"client:{old}"', '"client:sketchy"'))
    with pytest.raises(FedauditError, match="recorded client 'sketchy' has no data mapping"):
        audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"), unverified=True)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_example_runs_in_flower_simulation(tmp_path):
    """The example as a user runs it (Flower's simulation engine, Ray, one SuperNode per domain): each round's
    ledger holds every model message once, at the bytes of the arrays sent, and both sides agree on them."""
    import subprocess
    import sys

    out = tmp_path / "rec"
    script = Path(__file__).resolve().parent.parent / "examples" / "flower_digits" / "run.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--rounds", "2", "--local-epochs", "1"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rec = read_recording(out)
    example = example_app()
    state_bytes = sum(t.numel() * t.element_size() for t in example.new_model(0).state_dict().values())
    # per round: train broadcast, train upload and evaluation broadcast of a whole model, for 3 clients
    assert rec.bytes_by_round({"full_model"}) == {1: 9 * state_bytes, 2: 9 * state_bytes}
    raw = [json.loads(line) for line in (out / "wire.jsonl").read_text().splitlines() if '"full_model"' in line]
    by_side = {side: sorted((r["round"], r["direction"], r["message_type"], r["bytes"]) for r in raw
                            if r["recorded_by"] == side and r["message_type"] != "release") for side in ("client", "server")}
    assert by_side["client"] == by_side["server"] and len(by_side["client"]) == 18
    # and the final aggregate, once, as the server released it after the last round: the model the audit judges
    assert [(r["round"], r["recorded_by"], r["bytes"]) for r in raw if r["message_type"] == "release"] == [
        (2, "server", state_bytes)]
    assert rec.deployed()[1]["released"]
    assert set(rec.nodes.values()) == {"clean", "colour", "rotated"}


def test_audit_command_refuses_a_directory_without_a_recording(tmp_path):
    from typer.testing import CliRunner

    from fedaudit.cli import app

    result = CliRunner().invoke(app, ["audit", str(tmp_path), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert "has no manifest.json: not a fedaudit recording" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


def write_records(root: Path, parts: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]], classes: list[str]) -> None:
    """``root/<part>/<domain>/<class>/<i>.png`` from uint8 images and labels."""
    from PIL import Image

    for part, domains in parts.items():
        for domain, (x, y) in domains.items():
            for i, (img, label) in enumerate(zip(x, y)):
                folder = root / part / domain / classes[int(label)]
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(img.permute(1, 2, 0).numpy()).save(folder / f"{i}.png")


def test_audit_with_the_deployments_own_records(example_recording, tmp_path):
    """A deployment's data is not fedaudit's split: the auditor gives each client's members and holdout records
    and an unseen domain in folders (data.records), and the membership test uses exactly those."""
    import shutil

    from fedaudit.api import audit_recording

    example = example_app()
    dataset, sources = example.client_data(0)
    records = tmp_path / "records"
    write_records(records, {
        "members": {d: (c.train_x, c.train_y) for d, c in sources.items()},
        "holdout": {d: (torch.cat([c.val_x, c.holdout_x]), torch.cat([c.val_y, c.holdout_y])) for d, c in sources.items()},
        "unseen": {"textured": (dataset.images["textured"][:60], dataset.labels["textured"][:60])},
    }, dataset.classes)
    rec_dir = tmp_path / "rec"
    shutil.copytree(example_recording, rec_dir)
    manifest = json.loads((rec_dir / "manifest.json").read_text())
    (rec_dir / "manifest.json").write_text(json.dumps({**manifest, "data": {"records": str(records), "seed": 0}}))
    # a path the recording names outside itself is shown, never followed: the reviewer names it (--records)
    with pytest.raises(FedauditError, match=f"points the auditor's records at {records}, outside the recording; .*"
                                            f"pass --records {records}"):
        audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"), device="cpu")
    from typer.testing import CliRunner

    from fedaudit.cli import app

    forged = CliRunner().invoke(app, ["audit", str(rec_dir), "--attack", "mia-loss", "--out", str(tmp_path / "runs")])
    assert forged.exit_code == 2 and "outside the recording" in forged.output and "Traceback" not in forged.output
    from fedaudit.interop.audit_recording import auditor_records

    inside = auditor_records(read_recording(rec_dir), "auditor", None)  # a folder inside the recording is its own
    assert inside == str((rec_dir / "auditor").resolve())
    with pytest.raises(FedauditError, match="outside the recording"):
        auditor_records(read_recording(rec_dir), "../../etc", None)
    run_dir, metrics = audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"), device="cpu",
                                       records=records)
    assert metrics["target_domain"] == "textured" and metrics["dataset"] == f"records:{records}"
    entry = metrics["leakage"]["mia"]["loss"]["global_model"]["clean"]
    holdout = len(sources["clean"].val_y) + len(sources["clean"].holdout_y)
    assert entry["n_members"] == len(sources["clean"].train_y)
    assert entry["n_nonmembers"] == holdout - round(holdout * 0.2)
    shutil.rmtree(records / "unseen")
    with pytest.raises(FedauditError, match="have no unseen/ folder; records PATH holds members/"):
        audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"), records=records)


def test_audit_names_the_models_records_when_the_recording_declared_no_model(example_recording, tmp_path):
    """Recorded without start_recording(model=...), the model messages are generic records; the audit knows the
    architecture and names them from their shapes, so the deployed model and the attacks are found."""
    import shutil

    from fedaudit.api import audit_recording
    from fedaudit.interop.recording import seal_recording

    rec_dir = tmp_path / "rec"
    shutil.copytree(example_recording, rec_dir)
    manifest = json.loads((rec_dir / "manifest.json").read_text())
    manifest.pop("model_state")
    manifest.pop("ledger_sha256")  # a recording as made without a declared model: sealed once, below
    (rec_dir / "manifest.json").write_text(json.dumps(manifest))
    rows = [json.loads(line) for line in (rec_dir / "wire.jsonl").read_text().splitlines()]
    (rec_dir / "wire.jsonl").write_text("".join(json.dumps({**r, "kind": "record"} if r["kind"] == "full_model" else r)
                                                + "\n" for r in rows))
    seal_recording(rec_dir)  # as the recorder would have sealed the ledger it wrote
    assert ("record", "up") in {(k.value, d) for k, d in read_recording(rec_dir).shares()}
    _, metrics = audit_recording(rec_dir, attack="mia-loss", out=str(tmp_path / "runs"), device="cpu")
    assert metrics["communication"]["declared"] == ["full_model↑", "full_model↓", "scalars↑"]
    assert metrics["provenance"]["recording"]["deployed_model"]["round"] == 1


def test_audit_without_the_auditors_data_runs_the_attacks_unscored(example_recording, tmp_path):
    """A manifest with no data but the public prior (classes, normalisation, flips): deepinversion still runs on
    the recorded uploads and keeps its images, every score says why it is absent, every verdict row reads NOT
    ASSESSED with that reason, and membership is left out of auto (refused when named) — never a LOW."""
    import shutil

    from typer.testing import CliRunner

    from fedaudit.api import audit_recording
    from fedaudit.cli import app
    from fedaudit.data import load_dataset

    rec_dir = tmp_path / "rec"
    shutil.copytree(example_recording, rec_dir)
    digits = load_dataset("digits", 32)
    manifest = json.loads((rec_dir / "manifest.json").read_text())
    manifest.pop("data")
    (rec_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FedauditError, match="names neither the auditor's data .* nor what is public about the inputs"):
        audit_recording(rec_dir, out=str(tmp_path / "runs"))
    manifest["prior"] = {"classes": digits.classes, "mean": list(digits.mean), "std": list(digits.std), "hflip": False}
    (rec_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FedauditError, match="--attack mia-loss needs the clients' records .* drop mia-loss"):
        audit_recording(rec_dir, attack="deepinversion,mia-loss", out=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

    run_dir, metrics = audit_recording(rec_dir, out=str(tmp_path / "runs"), device="cpu", inversion_iters=5,
                                       inversion_batch=10)
    assert metrics["dataset"] == "no-data" and metrics["target_domain"] == "unknown" and metrics["auditor_data"]["status"] == "none"
    assert set(metrics["auditor_data"]["left_out"]) == {"mia-loss", "mia-artifact"}  # what auto chose and cannot run
    assert metrics["accuracy"]["status"] == "unscored" and metrics["accuracy"]["unseen_domain"] is None
    di = metrics["leakage"]["deepinversion"]
    assert "summary" not in di and "auditor" not in di
    for victim in ("clean", "colour", "rotated"):
        entry = di["full_model"][victim]
        assert entry["status"] == "attacked" and entry["metrics"]["status"] == "unscored"
        assert (run_dir / entry["image_grid"]).is_file()
        assert entry["grid_columns"][0] == "reconstruction"  # no real record beside it: the auditor has none
    rows = {r["row"]: r for r in metrics["verdict"]}
    same = rows.pop("consistency:broadcasts")  # a fact of the recording itself: judged without any record
    assert same["tier"] == "low" and "auditor holds none" not in same["reason"]
    assert {r["tier"] for r in rows.values()} == {"not_assessed"}
    assert "attacked but not scored: the auditor holds none of the clients' records" in rows["full_model↑"]["reason"]
    assert "membership inference needs the clients' records" in rows["membership:global_model"]["reason"]
    html = (run_dir / "report.html").read_text()
    assert "Not scored: the auditor holds none of the clients&#39; records" in html
    assert "mia-loss: membership inference challenges" in html
    assert "shown\nwithout real records: this run was audited without\nthem" in html
    assert "next to the nearest real training record" not in html

    assert all("the auditor holds none of the clients' records" in r["reason"] for r in rows.values())
    assert di["settings"]["iters"] == 5  # the budget is stored, as in a scored run

    command = ["audit", str(rec_dir), "--attack", "deepinversion", "--inversion-iters", "5", "--inversion-batch", "10",
               "--out", str(tmp_path / "cli"), "--device", "cpu"]
    result = CliRunner().invoke(app, [*command, "--fail-on", "medium"])
    assert "not scored: the auditor holds none" in result.output and "report:" in result.output
    assert result.exit_code == 3 and "a gate cannot pass such an audit" in result.output  # fails closed
    manifest["prior"]["std"] = [0.5, 0.0, 0.5]
    (rec_dir / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["audit", str(rec_dir), "--out", str(tmp_path / "cli")])
    assert result.exit_code == 2 and "prior std must be three numbers" in result.output


def test_an_audit_runs_its_cuda_path(example_recording, tmp_path, monkeypatch):
    """``fedaudit audit REC --device cuda``: the recording's tensors load onto the device, the model takes
    channels_last and the deployed model is scored there — up to where faking stops (tests/fake_cuda.py):
    the score's one read on the host, the count of correct predictions."""
    from fedaudit import api
    from tests.fake_cuda import CUDA, run_faked

    monkeypatch.setattr(api, "resolve_device", lambda name: CUDA)
    where = run_faked(lambda: api.audit_recording(example_recording, attack="mia-loss", out=str(tmp_path / "runs"),
                                                  device="cuda"))
    assert where == "read training.py:accuracy"


# -- a model fedaudit does not ship, and Flower's own DP -----------------------------------------------------

PLAIN = "tests.user_models:PlainCNN"


def plain_client_app(root: Path, *mods, scale: float = 1.0, spec: str = PLAIN, size: int = 16) -> ClientApp:
    """Clients training a model fedaudit does not ship (``size`` px digits-shaped inputs); ``scale`` multiplies
    the update."""
    from fedaudit.models import build_model

    app = ClientApp(mods=[recording_mod(root), *mods])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = build_model(spec, 10, size)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        start = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 3, size, size)), torch.randint(0, 10, (8,)))
        loss.backward()
        opt.step()
        state = {k: start[k] + scale * (v - start[k]) for k, v in model.state_dict().items()}
        return Message(RecordDict({"arrays": ArrayRecord(state),
                                   "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)

    return app


def run_plain(root: Path, strategy_of=lambda s: s, mods=(), rounds: int = 2, scale: float = 1.0, spec: str = PLAIN,
              size: int = 16) -> None:
    from fedaudit.models import build_model

    torch.manual_seed(0)
    model = build_model(spec, 10, size)
    strategy = strategy_of(FedAvg(fraction_evaluate=0.0, min_available_nodes=2))
    start_recording(root, model=model, architecture={"model": spec, "num_classes": 10, "image_size": size},
                    data={"dataset": "digits", "target_domain": "textured", "seed": 0}, run_id=7, strategy=strategy)
    grid = FakeGrid({node: plain_client_app(root, *mods, scale=scale, spec=spec, size=size) for node in NAMES})
    strategy.start(grid=RecordingGrid(grid, root), initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                   train_config=ConfigRecord({"lr": 0.1}))


def test_flower_recording_of_an_own_model_is_audited(tmp_path):
    """Flower's path with a model fedaudit does not ship (no normalisation layers): recorded by the mod and the
    grid, audited with --model: deepinversion not applicable and why, the membership rows, the report."""
    from fedaudit.api import audit_recording

    run_plain(tmp_path / "rec")
    run_dir, metrics = audit_recording(tmp_path / "rec", model=PLAIN, attack="deepinversion,mia-loss",
                                       out=str(tmp_path / "runs"), device="cpu", inversion_iters=4,
                                       inversion_batch=10, judge_steps=5)
    rows = {r["row"]: r for r in metrics["verdict"]}
    assert "the model carries no batch-normalisation statistics" in rows["full_model↑"]["reason"]
    assert "membership:global_model" in rows and PLAIN in (run_dir / "report.html").read_text()


def test_a_second_flower_run_into_the_same_directory_is_refused(tmp_path, caplog):
    run_plain(tmp_path / "rec", rounds=1)
    with pytest.raises(FedauditError, match="already holds the recording of another run .*run 7, not 8"):
        start_recording(tmp_path / "rec", run_id=8)
    from fedaudit.interop.flower import one_line_refusals

    @one_line_refusals  # inside a ServerApp: one line in Flower's log and status 2, not Flower's traceback
    def main(grid, context):
        start_recording(tmp_path / "rec", run_id=8)

    with pytest.raises(SystemExit) as stopped:
        main(None, None)
    assert stopped.value.code == 2
    logged = [r.getMessage() for r in caplog.records if "fedaudit:" in r.getMessage()]
    assert len(logged) == 1 and "already holds the recording of another run" in logged[0] and "\n" not in logged[0]
    with pytest.raises(FedauditError, match="records run 7, and this message belongs to run 8"):
        RecordingWriter(tmp_path / "rec", "client").message(
            src_node_id=1, dst_node_id=101, sender="server", receiver="client:clean", round=1, message_type="train",
            message_id="m", arrays={"arrays": {"w": torch.ones(1)}}, framework_run_id=8)


@pytest.mark.slow
def test_flower_recording_of_mobilenet_is_inverted_with_every_control(tmp_path):
    """Flower's path with torchvision's MobileNetV3 (batch norm throughout): deepinversion with its nulls, twin and
    positive control."""
    from fedaudit.api import audit_recording
    from tests.test_own_model import MOBILENET, SMALL_AUDIT, _assert_inverted_with_controls

    run_plain(tmp_path / "rec", spec=MOBILENET, size=32)
    run_dir, metrics = audit_recording(tmp_path / "rec", model=MOBILENET, attack="deepinversion,mia-loss",
                                       out=str(tmp_path / "runs"), **SMALL_AUDIT)
    _assert_inverted_with_controls(metrics, run_dir)


def test_flowers_client_side_fixed_clipping_is_recorded_accounted_and_checked(tmp_path):
    """Flower's DifferentialPrivacyClientSideFixedClipping with fixedclipping_mod: the recording holds the
    mechanism's parameters, the audit's privacy section gives its ε at the recorded δ beside the noise, and the
    recorded updates are measured against the clipping norm — held when the clients clip, refuted when they do not."""
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping

    from fedaudit.api import audit_recording

    def dp(strategy):
        return DifferentialPrivacyClientSideFixedClipping(strategy, noise_multiplier=1.1, clipping_norm=0.05,
                                                          num_sampled_clients=2)

    run_plain(tmp_path / "clipped", dp, mods=(fixedclipping_mod,), rounds=3)
    manifest = json.loads((tmp_path / "clipped" / "manifest.json").read_text())
    assert manifest["dp"] | {"source": None} == {
        "mechanism": "central-dp-client-side-fixed-clipping", "noise_multiplier": 1.1, "clipping_norm": 0.05,
        "num_sampled_clients": 2, "delta": 1e-5, "weighted_by_key": "num-examples", "source": None}
    run_dir, metrics = audit_recording(tmp_path / "clipped", model=PLAIN, attack="mia-loss", out=str(tmp_path / "runs"),
                                       device="cpu")
    summary = metrics["privacy"]["dp"]
    # 3 Gaussian rounds at z = 1.1 compose into one with μ = √3/1.1, no sampling amplification: ε 7.4739 at
    # δ = 1e-5, exactly (RDP's bound 8.0385)
    assert summary["epsilon"] == pytest.approx(7.4739, rel=2e-4) and summary["rounds"] == 3
    assert summary["epsilon_rdp"] == pytest.approx(8.0385, rel=2e-4) and summary["accountant"] == GAUSSIAN
    assert summary["clipping_check"]["status"] == "held" and summary["clipping_check"]["updates"] == 6
    assert summary["clipping_check"]["max_ratio"] <= 1.001
    covered = {(c["artifact"], c["direction"]): c["covered"] for c in metrics["privacy"]["coverage"]}
    assert covered[("full_model", "down")] and not covered[("full_model", "up")]
    report = (run_dir / "report.html").read_text()
    assert f"{summary['epsilon']:.3f} at δ 1e-05 over 3 rounds" in report and "noise multiplier 1.1" in report

    run_plain(tmp_path / "unclipped", dp, rounds=2, scale=50.0)  # the clients forgot the mod: nothing clips
    _, metrics = audit_recording(tmp_path / "unclipped", model=PLAIN, attack="mia-loss", out=str(tmp_path / "runs"),
                                 device="cpu")
    check = metrics["privacy"]["dp"]["clipping_check"]
    assert check["status"] == "violated" and check["over_norm"] == 4
    assert metrics["privacy"]["dp"]["claim"].startswith("refuted: 4 of 4 recorded updates exceed the clipping norm")
    from fedaudit.run.results import RunMetrics

    assert RunMetrics.from_json(metrics).to_json() == metrics  # the typed privacy block reads back whole


@pytest.mark.slow
def test_the_example_in_flowers_simulation_with_its_dp_is_accounted_and_its_clipping_measured(tmp_path):
    """The example through Flower's simulation engine with Flower's central DP (client-side fixed clipping): the
    audit's report gives ε beside the recorded noise, and measures the recorded updates against the clipping norm —
    Flower's fixedclipping_mod leaves BatchNorm's integer step counters unclipped, which the check names."""
    import subprocess
    import sys

    from fedaudit.api import audit_recording

    out = tmp_path / "rec"
    script = Path(__file__).resolve().parent.parent / "examples" / "flower_digits" / "run.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--rounds", "2", "--local-epochs", "1",
                           "--dp", "0.01", "1.0"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "manifest.json").read_text())["dp"]["noise_multiplier"] == 0.01
    run_dir, metrics = audit_recording(out, attack="mia-loss", out=str(tmp_path / "runs"), device="cpu")
    dp = metrics["privacy"]["dp"]
    assert dp["rounds"] == 2 and dp["noise_std_on_sum"] == pytest.approx(0.01) and dp["epsilon"] > 1000
    check = dp["clipping_check"]
    assert check["status"] == "violated" and check["updates"] == 6 and check["largest_tensor"].endswith("num_batches_tracked")
    report = (run_dir / "report.html").read_text()
    assert f"{dp['epsilon']:.3f} at δ 1e-05 over 2 rounds" in report and "noise multiplier 0.01" in report
    assert "refuted" in report
