"""Auditing the federation a team runs: its own model (``--model PKG.MODULE:CALLABLE``), its own loop (the
core :class:`~fedaudit.interop.recording.Recorder`), one run per recording, and nothing imported that the command did
not name."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedaudit.api import audit_recording, evaluate
from fedaudit.cli import app
from fedaudit.data import load_dataset, lodo_split
from fedaudit.errors import FedauditError
from fedaudit.interop.recording import Recorder
from fedaudit.interop.recording_reader import read_recording
from fedaudit.models import bn_layers, build_model, head_layer
from fedaudit.simulation.training import Preprocess, cross_entropy_loss, index_batches, make_optimizer, train_steps

runner = CliRunner()
PLAIN = "tests.user_models:PlainCNN"
MOBILENET = "torchvision.models:mobilenet_v3_small"
FAST_CLI = ["--dataset", "digits", "--image-size", "16", "--rounds", "1", "--device", "cpu", "--quiet", "--attack", "none"]
# attack budgets small enough for a test, large enough that every control runs
SMALL_AUDIT = dict(device="cpu", inversion_iters=4, inversion_batch=10, judge_steps=5)


def record_loop(root: Path, spec: str, image_size: int = 16, rounds: int = 1, **manifest) -> Path:
    """A hand-written FedAvg loop over fedaudit's digits split (sources clean, colour, rotated), recorded message
    by message with the Recorder — no Flower, no fedaudit engine."""
    dataset = load_dataset("digits", image_size, seed=0)
    split = lodo_split(dataset, "textured", seed=0)
    pre = Preprocess(dataset.mean, dataset.std, torch.device("cpu"), hflip=False)
    torch.manual_seed(0)
    model = build_model(spec, len(dataset.classes), image_size)
    recorder = Recorder(root, model=model,
                        architecture={"model": spec, "num_classes": len(dataset.classes), "image_size": image_size},
                        data={"dataset": "digits", "target_domain": "textured", "seed": 0},
                        recipe={"lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "batch_size": 32, "local_epochs": 1,
                                "augment": False, "rounds": rounds}, **manifest)
    for rnd in range(1, rounds + 1):
        states = []
        for i, c in enumerate(split.sources):
            recorder.send(rnd, "server", c.domain, model.state_dict())
            local = copy.deepcopy(model)
            g = torch.Generator().manual_seed(rnd * 10 + i)
            train_steps(local, make_optimizer(local.parameters(), "sgd", 0.05, 0.0, 0.0),
                        index_batches(len(c.train_y), 32, g, torch.device("cpu"), epochs=1), c.train_x, c.train_y, pre,
                        cross_entropy_loss, None, "fp32")
            states.append(local.state_dict())
            recorder.send(rnd, c.domain, "server", states[-1])
            recorder.send(rnd, c.domain, "server", {"num_samples": len(c.train_y)}, kind="scalars")
        model.load_state_dict({k: (sum(s[k].double() for s in states) / len(states)).to(states[0][k].dtype)
                               for k in states[0]})
    return root


# -- what the attacks find in a model they did not build --------------------------------------------------


def test_parts_are_found_in_any_model():
    """Batch-norm layers by their running buffers (whatever the class: torchvision's FrozenBatchNorm2d too), the
    head as the last Linear; a model without either says so."""
    from torchvision.ops import FrozenBatchNorm2d

    mobilenet = build_model(MOBILENET, 10, 32)
    assert len(bn_layers(mobilenet)) == sum(isinstance(m, torch.nn.BatchNorm2d) for m in mobilenet.modules()) > 0
    assert head_layer(mobilenet) == "classifier.3"
    mixed = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), FrozenBatchNorm2d(4), torch.nn.SyncBatchNorm(4),
                                torch.nn.InstanceNorm2d(4, track_running_stats=True))
    # pretrained statistics that never update, and instance norms' per-image ones, are not the clients' batches
    assert [name for name, _ in bn_layers(mixed)] == ["2"]
    plain = build_model(PLAIN, 10, 16)
    assert bn_layers(plain) == [] and head_layer(plain) == "classify"
    assert head_layer(build_model("cnn", 10, 16)) == "head"


# -- bad factories: one line, status 2, nothing written ---------------------------------------------------


@pytest.mark.parametrize("spec,needle", [
    ("tests.no_such_module:Net", "cannot import tests.no_such_module"),
    ("tests.user_models:Missing", "has no attribute 'Missing'"),
    ("tests.user_models:NOT_CALLABLE", "NOT_CALLABLE is a int, not callable"),
    ("tests.user_models:not_a_module", "returned a str, not a torch nn.Module"),
    ("tests.user_models:wrong_width", "returned (2, 11) for a batch of 2 images; fedaudit needs class logits of shape [batch, 10]"),
    ("tests.user_models:", "is not a model factory's import path"),
])
def test_a_bad_factory_is_one_line_and_writes_nothing(tmp_path, spec, needle):
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", "--model", spec, "--out", str(out), *FAST_CLI])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and needle in result.output, result.output
    assert not out.exists() or not any(out.iterdir())


def test_factory_arguments_and_the_methods_that_need_fedaudits_architectures(tmp_path):
    result = runner.invoke(app, ["evaluate", "--model", "tests.user_models:plain_cnn", "--model-arg", "depth=3",
                                 "--out", str(tmp_path), *FAST_CLI])
    assert result.exit_code == 2 and "could not be called with num_classes=10, depth=3" in result.output, result.output
    result = runner.invoke(app, ["evaluate", "--method", "gperxan", "--model", PLAIN, "--out", str(tmp_path), *FAST_CLI])
    assert result.exit_code == 2 and "method gperxan needs XAN norm layers" in result.output, result.output
    assert "(elcfs, fedavg, feddg_ga, fedprox)" in result.output
    result = runner.invoke(app, ["evaluate", "--model", PLAIN, "--norm", "gn", "--out", str(tmp_path), *FAST_CLI])
    assert result.exit_code == 2 and "builds its own normalisation layers: drop --norm" in result.output
    result = runner.invoke(app, ["evaluate", "--model-arg", "width=4", "--out", str(tmp_path), *FAST_CLI])
    assert result.exit_code == 2 and "--model-arg is for a --model factory" in result.output


def test_evaluate_trains_a_factory_model_and_records_where_it_came_from(tmp_path):
    """The factory's model trains like fedaudit's own; config.json and provenance name the factory, its
    arguments, the file that defines it with its sha256, and the layer taken as the head."""
    result = evaluate("fedavg", model=PLAIN, model_args={"width": 4}, dataset="digits", image_size=16, rounds=1,
                      attack="mia-loss", device="cpu", out=str(tmp_path))
    model = result.metrics["provenance"]["model"]
    source = Path("tests/user_models.py").resolve()
    assert model["factory"] == PLAIN and model["args"] == {"width": 4} and model["head_layer"] == "classify"
    assert Path(model["module_file"]).resolve() == source
    import hashlib
    assert model["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    config = json.loads((result.run_dir / "config.json").read_text())["config"]
    assert config["model"] == PLAIN and config["model_args"] == {"width": 4} and config["norm"] == "own"
    assert PLAIN in (result.run_dir / "report.html").read_text()


def test_a_file_never_makes_fedaudit_import_a_factory(tmp_path, monkeypatch):
    """A recording's manifest, a TOML file, a run directory being resumed, a sweep's folder and a grid file may name
    a factory; fedaudit imports it only when the command names it (the module's import writes a marker: it must not
    appear)."""
    marker = tmp_path / "imported.marker"
    monkeypatch.setenv("FEDAUDIT_TEST_MARKER", str(marker))
    spec = "tests.side_effect_model:build"
    rec = tmp_path / "rec"
    recorder = Recorder(rec, architecture={"model": spec, "num_classes": 10, "image_size": 16},
                        data={"dataset": "digits", "target_domain": "textured", "seed": 0})
    recorder.send(1, "server", "clean", {"w": torch.ones(2)})
    recorder.send(1, "clean", "server", {"w": torch.ones(2)})
    with pytest.raises(FedauditError, match=f"names the model factory {spec}; fedaudit imports code only when you "
                                            f"name it: .*pass --model {spec}"):
        audit_recording(rec, out=str(tmp_path / "runs"))
    config = tmp_path / "run.toml"
    config.write_text(f'model = "{spec}"\n')
    result = runner.invoke(app, ["evaluate", "--config", str(config), "--out", str(tmp_path / "runs"), *FAST_CLI])
    assert result.exit_code == 2 and f"pass --model {spec}" in result.output, result.output
    run_dir = tmp_path / "runs" / "interrupted"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"config": {"model": spec, "dataset": "digits"}, "targets": ["textured"],
                                                     "command": "x", "config_hash": "x"}))
    with pytest.raises(FedauditError, match=f"trains the model factory {spec}; .*add --model {spec} to --resume"):
        evaluate(resume=run_dir)
    from fedaudit.sweeps.grid import run_grid

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"grid": {"fixed": {"model": spec, "dataset": "digits"},
                                                           "grid": {"seed": [0]}}, "points": []}))
    with pytest.raises(FedauditError, match=f"trains the model factory {spec}; .*add --model {spec} to --resume"):
        run_grid(None, sweep, resume=True)
    grid = tmp_path / "grid.toml"
    grid.write_text(f'[fixed]\nmodel = "{spec}"\n[grid]\nseed = [0, 1]\n')
    result = runner.invoke(app, ["sweep", str(grid), "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 2 and f"names the model factory {spec}" in result.output, result.output
    assert not marker.exists()


# -- a recording is one run ---------------------------------------------------------------------------------


def test_a_recording_directory_holds_one_run(tmp_path):
    root = tmp_path / "rec"
    first = Recorder(root)
    first.send(1, "server", "clean", {"w": torch.ones(2)})
    with pytest.raises(FedauditError, match="already holds a recorded run .*record into a new directory, or, to "
                                            "continue that run with its rounds numbered on, pass append=True"):
        Recorder(root)
    Recorder(root, append=True).send(2, "server", "clean", {"w": torch.ones(2)})  # a resumed deployment continues it
    assert [r["round"] for r in read_recording(root).rows] == [1, 2]
    assert len({json.loads(line)["run_id"] for line in (root / "wire.jsonl").read_text().splitlines()}) == 1


def test_reading_refuses_a_recording_that_mixes_runs(tmp_path):
    root = tmp_path / "rec"
    Recorder(root).send(1, "server", "clean", {"w": torch.ones(2)})
    ledger = root / "wire.jsonl"
    row = json.loads(ledger.read_text())
    ledger.write_text(ledger.read_text() + json.dumps({**row, "run_id": "another"}) + "\n")
    with pytest.raises(FedauditError, match="line 2 belongs to run another.*the recording mixes runs"):
        read_recording(root)
    ledger.write_text(ledger.read_text().splitlines()[0] + "\n" + json.dumps({**row, "time": row["time"] + 1}) + "\n")
    with pytest.raises(FedauditError, match=r"records 'arrays' from server to client:clean in round 1 \(train\) twice"):
        read_recording(root)
    result = runner.invoke(app, ["audit", str(root), "--out", str(tmp_path / "runs")])  # the command: one line, status 2
    assert result.exit_code == 2 and "Traceback" not in result.output and "twice" in result.output, result.output
    assert not (tmp_path / "runs").exists()
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**manifest, "framework_run_id": 7}))
    ledger.write_text(json.dumps({**row, "framework_run_id": 7}) + "\n"
                      + json.dumps({**row, "round": 2, "framework_run_id": 8}) + "\n")
    with pytest.raises(FedauditError, match=r"holds messages of 2 framework runs \(7, 8\)"):
        read_recording(root)


def test_recorder_refuses_what_is_not_a_message(tmp_path):
    recorder = Recorder(tmp_path / "rec")
    with pytest.raises(FedauditError, match="a message goes between the server and a client"):
        recorder.send(1, "clean", "colour", {"w": torch.ones(1)})
    with pytest.raises(FedauditError, match="round must be an integer >= 0"):
        recorder.send(-1, "server", "clean", {"w": torch.ones(1)})
    with pytest.raises(FedauditError, match="unknown kind 'styel_bank'"):
        recorder.send(1, "clean", "server", {"mean": torch.ones(1)}, kind="styel_bank")


# -- record and audit a model fedaudit does not ship ----------------------------------------------------------


def test_a_loop_recording_of_a_model_without_normalisation_is_audited(tmp_path):
    """A plain loop, a CNN with no normalisation layer: deepinversion is not applicable and says why, the
    membership rows are there, the state_dict of another model is refused naming its first tensor, the report
    renders."""
    rec = record_loop(tmp_path / "rec", PLAIN)
    with pytest.raises(FedauditError, match=r"holds tensor 'stem.0.weight', which --model cnn \(norm bn\) does not have"):
        audit_recording(rec, model="cnn", out=str(tmp_path / "runs"), device="cpu")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    run_dir, metrics = audit_recording(rec, model=PLAIN, attack="deepinversion,mia-loss", out=str(tmp_path / "runs"),
                                       **SMALL_AUDIT)
    rows = {r["row"]: r for r in metrics["verdict"]}
    assert "the model carries no batch-normalisation statistics" in rows["full_model↑"]["reason"]
    assert rows["full_model↑"]["tier"] == "not_assessed"
    assert {"membership:global_model", "membership:full_model↑"} <= set(rows)
    assert metrics["provenance"]["model"]["factory"] == PLAIN
    report = (run_dir / "report.html").read_text()
    assert PLAIN in report and "batch-normalisation statistics" in report


@pytest.mark.slow
def test_a_loop_recording_of_mobilenet_is_inverted_with_every_control(tmp_path):
    """torchvision's MobileNetV3 (batch norm throughout), recorded by a plain loop and audited: deepinversion
    runs against its uploads with its nulls, the holdout twin and the positive control."""
    rec = record_loop(tmp_path / "rec", MOBILENET, image_size=32)
    run_dir, metrics = audit_recording(rec, model=MOBILENET, attack="deepinversion,mia-loss",
                                       out=str(tmp_path / "runs"), **SMALL_AUDIT)
    _assert_inverted_with_controls(metrics, run_dir)


def _assert_inverted_with_controls(metrics: dict, run_dir: Path) -> None:
    """Every victim's upload attacked, with its holdout twin and positive control measured; the verdict row's
    evidence holds the tests against their named nulls."""
    uploads = metrics["leakage"]["deepinversion"]["full_model"]
    assert uploads and all(e["status"] == "attacked" for e in uploads.values()), uploads
    assert all(e["twin"]["status"] == "scored" and e["power"]["status"] == "measured" for e in uploads.values())
    for e in uploads.values():  # every score beside its nulls: the untrained model, the prior alone, the twin
        assert {"attack", "control", "prior_only", "twin"} <= set(e["metrics"]["class_fidelity"]), e["metrics"]
    rows = {r["row"]: r for r in metrics["verdict"]}  # each test in the row of its level (issue 47)
    records, whole = rows["full_model↑"], rows["client_data:full_model↑"]
    assert {e["test"] for e in records["evidence"]} == {"identifiability"}
    assert {e["test"] for e in whole["evidence"]} == {"class_fidelity", "domain_attribution"}
    assert all(e["baseline_name"] for e in records["evidence"] + whole["evidence"])
    assert MOBILENET in (run_dir / "report.html").read_text()


@pytest.mark.slow
def test_evaluate_trains_and_audits_mobilenet(tmp_path):
    """The README's command, at a test's budget: fedavg on digits with torchvision's MobileNetV3 completes, its
    report names the factory."""
    result = evaluate("fedavg", model=MOBILENET, dataset="digits", rounds=1, attack="auto", out=str(tmp_path),
                      reference_models=2, **SMALL_AUDIT)
    assert (result.run_dir / "COMPLETE").exists()
    _assert_inverted_with_controls(result.metrics, result.run_dir)


@pytest.mark.slow
def test_the_plain_pytorch_example_records_and_audits_offline(tmp_path, monkeypatch):
    """examples/pytorch_fedavg: a hand-written loop, no Flower, recorded and audited end to end as the README says."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # --model imports the example's model from the repository root
    rec = tmp_path / "pt-fedavg"
    subprocess.run([sys.executable, "-m", "examples.pytorch_fedavg.run", "--out", str(rec), "--rounds", "2",
                    "--local-epochs", "1"], check=True, cwd=repo)
    again = subprocess.run([sys.executable, "-m", "examples.pytorch_fedavg.run", "--out", str(rec), "--rounds", "1"],
                           cwd=repo, capture_output=True, text=True)
    assert again.returncode == 2 and "already holds a recorded run" in again.stderr and "Traceback" not in again.stderr
    result = runner.invoke(app, ["audit", str(rec), "--model", "examples.pytorch_fedavg.net:Net", "--out",
                                 str(tmp_path / "runs"), "--device", "cpu", "--inversion-iters", "4",
                                 "--inversion-batch", "10", "--judge-steps", "5", "--quiet"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["auditor_data"]["status"] == "held" and metrics["provenance"]["model"]["head_layer"] == "fc2"
    assert {r["row"] for r in metrics["verdict"]} >= {"full_model↑", "membership:global_model"}
    assert (run_dir / "report.html").exists()
    verification = metrics["provenance"]["recording"]["verification"]  # issue 37: sealed by Recorder.close()
    assert verification["status"] == "verified" and verification["ledger_sha256"] in (run_dir / "report.html").read_text()
    # the domain-level attack on a recording: fedaudit cannot retrain the deployment without a domain, so its
    # participation row has no twins and says so (issue 47), never a finding from the domain's difficulty alone
    domain = runner.invoke(app, ["audit", str(rec), "--model", "examples.pytorch_fedavg.net:Net", "--out",
                                 str(tmp_path / "domain"), "--device", "cpu", "--attack", "mia-domain", "--quiet"])
    assert domain.exit_code == 0, domain.output
    (domain_dir,) = (tmp_path / "domain").iterdir()
    rows = {r["row"]: r for r in json.loads((domain_dir / "metrics.json").read_text())["verdict"]}
    participation = rows["participation:global_model"]
    assert participation["tier"] in ("inconclusive", "not_assessed") and "recording" in participation["reason"]


def test_a_loop_recordings_declared_dp_counts_its_rounds_and_the_weight_of_each_client(tmp_path):
    """Central DP declared by a hand-written loop: ε over the rounds recorded (numbered from 0 here), and a client
    whose weight exceeds 1/m of the average is protected by a smaller multiplier, which the accountant is given."""
    from fedaudit.interop.recorded_dp import recorded_privacy
    from fedaudit.simulation.wire import ArtifactKind

    dp = {"mechanism": "central-dp-client-side-fixed-clipping", "noise_multiplier": 1.1, "clipping_norm": 10.0,
          "num_sampled_clients": 2, "delta": 1e-5, "weighted_by_key": "num_samples"}
    shares = ((ArtifactKind.FULL_MODEL, "up"), (ArtifactKind.FULL_MODEL, "down"))
    for name, sizes, expected in (("equal", (10, 10), 7.4739), ("unequal", (30, 10), None)):
        recorder = Recorder(tmp_path / name, dp=dp)
        for rnd in range(3):  # rounds 0, 1, 2
            for client, n in zip(("clean", "colour"), sizes):
                recorder.send(rnd, "server", client, {"w": torch.zeros(3)}, kind="full_model")
                recorder.send(rnd, client, "server", {"w": torch.ones(3)}, kind="full_model")
                recorder.send(rnd, client, "server", {"num_samples": n}, kind="scalars")
        summary = recorded_privacy(read_recording(tmp_path / name), shares).dp
        assert summary.rounds == 3 and summary.clipping_check.status == "held"
        if expected is not None:  # 3 Gaussian rounds at z = 1.1 are one with μ = √3/1.1: ε 7.4739 at δ = 1e-5 (RDP: 8.0385)
            assert summary.epsilon == pytest.approx(expected, rel=2e-4) and summary.weaker_rounds is None
            assert summary.epsilon_rdp == pytest.approx(8.0385, rel=2e-4)
        else:  # the larger client weighs 3/4: z / (2 · 0.75)
            assert [r.noise_multiplier for r in summary.per_round] == pytest.approx([1.1 / 1.5] * 3)
            assert summary.epsilon > 8.04 * 1.5 and "in 3 of 3 rounds one client weighed more" in summary.weaker_rounds
