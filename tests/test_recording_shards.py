"""A run recorded by many processes, the released model named, and a failed run refused or listed (issue 48).

Each process records its own shard of one run; sealing checks the shards belong together and merges them, or
refuses in one line — never a node-id collision that verifies."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedaudit.cli import app
from fedaudit.errors import FedauditError
from fedaudit.interop.recording import Recorder, node_id_for, seal_recording
from fedaudit.interop.recording_reader import read_recording
from fedaudit.interop.recording_verify import verify_recording

runner = CliRunner()
RUN = "job-7"


def _site(root: str, site: str, rounds: int = 3, shard: str | None = None, run_id: str = RUN) -> None:
    """One site's process, as a site script records it: the model it received, the update it sent."""
    recorder = Recorder(root, shard=shard or site, run_id=run_id)
    for rnd in range(1, rounds + 1):
        recorder.send(rnd, "server", site, {"w": torch.full((4,), float(rnd))})
        recorder.send(rnd, site, "server", {"w": torch.full((4,), rnd + 0.5)})
    recorder.close()


def _processes(*args: tuple) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_site, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0


def test_two_processes_record_one_run_as_shards_with_distinct_nodes(tmp_path):
    root = tmp_path / "rec"
    _processes((str(root), "site-1"), (str(root), "site-2"))
    with pytest.raises(FedauditError, match=r"holds 2 shard\(s\) not sealed into one recording .*fedaudit seal"):
        read_recording(root)  # never a silent merge
    result = runner.invoke(app, ["seal", str(root)])
    assert result.exit_code == 0 and "2 shard(s) merged (site-1, site-2)" in " ".join(result.output.split())
    rec = read_recording(root)
    assert rec.nodes == {node_id_for("site-1"): "site-1", node_id_for("site-2"): "site-2"}
    assert len({node_id_for("site-1"), node_id_for("site-2")}) == 2
    assert {(r["sender"], r["receiver"], r["round"]) for r in rec.rows} == {
        *((f"client:{s}", "server", n) for s in ("site-1", "site-2") for n in (1, 2, 3)),
        *(("server", f"client:{s}", n) for s in ("site-1", "site-2") for n in (1, 2, 3))}
    for row in rec.rows:  # each message's tensors are the ones its process sent
        sent = row["round"] + (0.5 if row["direction"] == "up" else 0.0)
        assert torch.equal(rec.artifact(row).tensors["w"], torch.full((4,), sent))
    assert verify_recording(rec)["status"] == "verified"
    assert seal_recording(root) == rec.manifest.ledger_sha256  # sealing again changes nothing


def test_two_processes_appending_into_one_ledger_get_distinct_nodes(tmp_path):
    """The issue's case: two site processes into one directory with append=True. Node ids come from the client's
    name, so the recording that verifies is the right one."""
    root = tmp_path / "rec"
    Recorder(root, run_id=RUN)  # the directory is started once, before the sites
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_site, args=(str(root), s)) for s in ("site-1", "site-2")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    seal_recording(root)
    rec = read_recording(root)
    assert sorted(rec.nodes.values()) == ["site-1", "site-2"] and len(rec.nodes) == 2
    assert {r["sender"] for r in rec.rows if r["direction"] == "up"} == {"client:site-1", "client:site-2"}


def _append_site(root: str, site: str) -> None:
    recorder = Recorder(root, append=True)
    for rnd in (1, 2):
        recorder.send(rnd, "server", site, {"w": torch.ones(2)})
        recorder.send(rnd, site, "server", {"w": torch.ones(2)})


def test_a_node_id_two_clients_claim_is_refused_as_it_is_recorded_and_when_read(tmp_path):
    root = tmp_path / "rec"
    first = Recorder(root)
    first.send(1, "server", "site-1", {"w": torch.ones(2)})
    node = node_id_for("site-1")
    (root / "nodes" / f"{node}.json").write_text(json.dumps({"node_id": node, "name": "site-2"}))
    with pytest.raises(FedauditError, match=f"node {node} is already named 'site-2'.*this process names it 'site-1'"):
        Recorder(root, append=True).send(2, "server", "site-1", {"w": torch.ones(2)})
    with pytest.raises(FedauditError, match=f"node {node} is 'site-2' in the recording's node names but "
                                            "'client:site-1' in a ledger row"):
        read_recording(root)


@pytest.mark.parametrize(("damage", "needle"), [
    ("open", "shard 'site-2' was never closed"),
    ("other_run", "shard 'site-2' belongs to run job-8, the recording to run job-7"),
    ("missing_server_side", "uploaded in round 1, but no shard (site-1, site-2) holds the model the server sent it"),
    ("same_client_twice", "both hold the client's copy of the round 1 train message"),
    ("two_names", "two clients share a node id"),
    ("rounds_go_back", "shard 'site-2' goes back from round 3 to round 1"),
])
def test_shards_that_do_not_belong_together_are_refused_in_one_line(tmp_path, damage, needle):
    root = tmp_path / "rec"
    _site(str(root), "site-1")
    if damage == "open":
        recorder = Recorder(root, shard="site-2", run_id=RUN)
        recorder.send(1, "server", "site-2", {"w": torch.ones(4)})
    elif damage == "other_run":
        _site(str(root), "site-2")
        info = root / "shards" / "site-2" / "shard.json"
        info.write_text(json.dumps({**json.loads(info.read_text()), "run_id": "job-8"}))
    elif damage == "missing_server_side":
        recorder = Recorder(root, shard="site-2", run_id=RUN)
        recorder.send(1, "site-2", "server", {"w": torch.ones(4)})  # its broadcast recorded nowhere
        recorder.close()
    elif damage == "same_client_twice":
        _site(str(root), "site-1", shard="site-1-again")
    elif damage == "two_names":
        _site(str(root), "site-2")
        node_file = next((root / "shards" / "site-2" / "nodes").glob("*.json"))
        node_file.write_text(json.dumps({"node_id": node_id_for("site-1"), "name": "site-2"}))
    elif damage == "rounds_go_back":
        recorder = Recorder(root, shard="site-2", run_id=RUN)
        for rnd in (3, 1):
            recorder.send(rnd, "server", "site-2", {"w": torch.ones(4)})
            recorder.send(rnd, "site-2", "server", {"w": torch.ones(4)})
        recorder.close()
    with pytest.raises(FedauditError) as caught:
        seal_recording(root)
    assert needle in str(caught.value) and "\n" not in str(caught.value), caught.value
    result = runner.invoke(app, ["seal", str(root)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert not (root / "wire.jsonl").exists()  # nothing merged


def test_a_shard_needs_a_run_id_and_its_own_name(tmp_path):
    root = tmp_path / "rec"
    with pytest.raises(FedauditError, match="give run_id=, a string every process of the run shares"):
        Recorder(root, shard="site-1")
    Recorder(root, shard="site-1", run_id=RUN).send(1, "server", "site-1", {"w": torch.ones(1)})
    with pytest.raises(FedauditError, match="already holds shard 'site-1' of run job-7; give each process its own"):
        Recorder(root, shard="site-1", run_id=RUN)
    with pytest.raises(FedauditError, match="records run job-7, and shard 'site-2' belongs to run job-9"):
        Recorder(root, shard="site-2", run_id="job-9")
    with pytest.raises(FedauditError, match="declares recipe .* but another process of run job-7 declared"):
        Recorder(root, shard="site-3", run_id=RUN, recipe={"lr": 0.1})
        Recorder(root, shard="site-4", run_id=RUN, recipe={"lr": 0.5})
    with pytest.raises(FedauditError, match="shard name '../x' must be a plain folder name"):
        Recorder(root, shard="../x", run_id=RUN)


def test_shards_declaring_the_same_blocks_in_another_form_agree(tmp_path):
    """Each process's declarations are compared in the form the manifest holds them (issue 71): a framework block
    given as a model and the same block as a mapping, or a learning rate 1 and 1.0, are one declaration."""
    from fedaudit.interop.recording_writer import start_recording
    from fedaudit.run.stored.provenance import Framework

    root = tmp_path / "rec"
    start_recording(root, shard="site-1", run_id=RUN, framework=Framework(name="x", version="1"), recipe={"lr": 1})
    start_recording(root, shard="site-2", run_id=RUN, framework={"name": "x", "version": "1"}, recipe={"lr": 1.0})
    with pytest.raises(FedauditError, match="shard 'site-3' declares framework"):
        start_recording(root, shard="site-3", run_id=RUN, framework=Framework(name="x", version="2"))


def test_a_sealed_recordings_shards_cannot_change(tmp_path):
    root = tmp_path / "rec"
    _site(str(root), "site-1")  # in this process: what is tested is the seal, not the processes
    _site(str(root), "site-2")
    seal_recording(root)
    _site(str(root), "site-3")
    with pytest.raises(FedauditError, match="shard 'site-3' changed or was added after the shards were merged"):
        seal_recording(root)


# -- the released model, failed clients ------------------------------------------------------------------------


PLAIN = "tests.user_models:PlainCNN"  # a small CNN without normalisation (tests/user_models.py)


def _loop(root: Path, *, release: bool, skip: tuple[str, int] | None = None, uploads: bool = True,
          other_model: tuple[str, int] | None = None) -> Path:
    """Two rounds of a loop over digits' three source clients (no training: the messages are what matters)."""
    from fedaudit.models import build_model

    torch.manual_seed(0)
    model = build_model(PLAIN, 10, 16)
    recorder = Recorder(root, model=model, architecture={"model": PLAIN, "num_classes": 10, "image_size": 16},
                        data={"dataset": "digits", "target_domain": "textured", "seed": 0})
    for rnd in (1, 2):
        for client in ("clean", "colour", "rotated"):
            sent = model.state_dict()
            if (client, rnd) == other_model:  # a malicious server: this client alone gets another model
                sent = {k: v + 0.5 if v.is_floating_point() else v for k, v in sent.items()}
            recorder.send(rnd, "server", client, sent)
            if uploads and (client, rnd) != skip:
                recorder.send(rnd, client, "server", model.state_dict())
    if release:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        recorder.release(model.state_dict())
    recorder.close()
    return root


def test_the_released_model_is_the_one_judged_and_a_recording_without_one_says_what_was(tmp_path):
    released = _loop(tmp_path / "released", release=True)
    rec = read_recording(released)
    artifact, judged = rec.deployed()
    assert judged["released"] and judged["round"] == 2 and "released after round 2" in judged["what"]
    assert len(rec.wire().ledger) == len(rec.rows) - 1  # it crossed no wire: no ledger row, no bytes counted
    broadcast = rec.artifact([r for r in rec.rows if r["round"] == 2 and r["message_type"] == "train"
                              and r["direction"] == "down"][-1]).tensors
    for name, value in artifact.tensors.items():  # the model after the last step, not the last broadcast
        if value.is_floating_point():
            assert torch.allclose(value, broadcast[name] + 0.01), name
    result = runner.invoke(app, ["audit", str(_loop(tmp_path / "guessed", release=False)), "--model", PLAIN,
                                 "--attack", "mia-loss", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "model judged: NOT the released model" in text and "its round 2 train broadcast" in text
    report = next((tmp_path / "runs").rglob("report.html")).read_text()
    assert "NOT the released model" in report


def test_a_run_where_no_client_answered_is_refused_and_a_missed_round_is_listed(tmp_path):
    result = runner.invoke(app, ["audit", str(_loop(tmp_path / "none", release=True, uploads=False)), "--model", PLAIN,
                                 "--attack", "mia-loss", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "no client sent back a training update in any round" in " ".join(result.output.split())
    assert not (tmp_path / "runs").exists()
    rec = _loop(tmp_path / "gap", release=True, skip=("colour", 2))
    assert read_recording(rec).participation()["missed"] == {"client:colour": [2]}
    result = runner.invoke(app, ["audit", str(rec), "--model", PLAIN, "--attack", "mia-loss",
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "clients that failed: sent a model to train and sent no update back" in text and "colour in round 2" in text
    assert "recording: VERIFIED: every message matches the sha256" in text  # the terminal says it, as the report does
    report = " ".join(next((tmp_path / "runs").rglob("report.html")).read_text().split())
    assert "colour in round 2" in report


def test_a_client_sent_another_model_than_the_rest_is_named_with_its_round(tmp_path):
    """Every client of a round should receive the same model; one that got another (the signature of a
    model-inconsistency attack) reads HIGH naming its round and clients, on the first screen. Identical broadcasts
    recorded by the server alone read INCONCLUSIVE (a lying server could record one model); recorded by the
    clients, LOW."""
    rec = _loop(tmp_path / "other", release=True, other_model=("colour", 2))
    same = verify_recording(read_recording(rec))["broadcasts"]
    assert same["different"] == [{"round": 2, "record": "arrays", "message_type": "train", "recorded_by": "server",
                                  "groups": [["client:clean", "client:rotated"], ["client:colour"]]}]
    result = runner.invoke(app, ["audit", str(rec), "--model", PLAIN, "--attack", "mia-loss",
                                 "--out", str(tmp_path / "runs"), "--fail-on", "high:records"])
    assert result.exit_code == 3, result.output  # the gate sees it: a records-level HIGH
    text = " ".join(result.output.split())
    assert "NOT THE SAME MODEL: the server sent different models" in text and "round 2 (train arrays): clean, rotated / colour" in text
    metrics = json.loads(next((tmp_path / "runs").rglob("metrics.json")).read_text())
    row = {r["row"]: r for r in metrics["verdict"]}["consistency:broadcasts"]
    assert (row["tier"], row["level"], row["rule"]) == ("high", "records", "different")
    assert "round 2 (train arrays): clean, rotated / colour" in row["reason"]
    report = " ".join(next((tmp_path / "runs").rglob("report.html")).read_text().split())
    assert "round 2 (train arrays): clean, rotated / colour" in report and "secure aggregation alone does not stop" in report
    honest = _loop(tmp_path / "honest", release=True)
    assert verify_recording(read_recording(honest))["broadcasts"] == {"compared": 2, "recorded_by": "server",
                                                                       "different": []}
    from fedaudit.audit.verdict import judge

    def verdict_of(broadcasts: dict) -> dict:
        metrics = {"provenance": {"recording": {"verification": {"broadcasts": broadcasts}}}}
        return {r["row"]: r for r in judge(metrics, {})}["consistency:broadcasts"]

    assert verdict_of({"compared": 2, "recorded_by": "server", "different": []})["tier"] == "inconclusive"
    assert verdict_of({"compared": 2, "recorded_by": "client", "different": []})["tier"] == "low"
    assert verdict_of({"compared": 0, "recorded_by": "client", "different": []})["tier"] == "not_assessed"
    assert "consistency:broadcasts" not in {r["row"] for r in judge({}, {})}  # fedaudit's own runs: one model


def test_sealing_again_never_approves_an_edit_and_a_resumed_run_reopens_the_seal(tmp_path):
    root = tmp_path / "rec"
    recorder = Recorder(root)
    recorder.send(1, "server", "clean", {"w": torch.ones(2)})
    digest = recorder.close()
    assert seal_recording(root) == digest  # again, unchanged: nothing to do
    ledger = root / "wire.jsonl"
    ledger.write_text(ledger.read_text() + ledger.read_text().replace('"round": 1', '"round": 2'))
    with pytest.raises(FedauditError, match="sealed when its run ended, and its ledger has changed since"):
        seal_recording(root)
    result = runner.invoke(app, ["seal", str(root)])
    assert result.exit_code == 2 and "would approve the change" in " ".join(result.output.split())
    ledger.write_text(ledger.read_text().splitlines(keepends=True)[0])  # as it was
    resumed = Recorder(root, append=True)  # a deployment resumed reopens its recording, and seals it again
    resumed.send(2, "server", "clean", {"w": torch.ones(2)})
    assert resumed.close() != digest
    run_id = json.loads((root / "manifest.json").read_text())["run_id"]
    _site(str(root), "site-1", run_id=run_id)  # a shard of this run, added after the seal
    with pytest.raises(FedauditError, match="shard 'site-1' was added after the recording was sealed"):
        seal_recording(root)


def test_a_merge_cut_short_is_merged_again_without_repeating_rows(tmp_path):
    """The ledger written, the manifest not (the process died between them): sealing again merges the shards once."""
    root = tmp_path / "rec"
    _site(str(root), "site-1")
    _site(str(root), "site-2")
    seal_recording(root)
    manifest = json.loads((root / "manifest.json").read_text())
    for key in ("shards", "ledger_sha256", "sealed_at"):
        manifest.pop(key)
    (root / "manifest.json").write_text(json.dumps(manifest))
    seal_recording(root)
    assert len(read_recording(root).rows) == 12  # 2 sites × 3 rounds × (broadcast, upload), each once
