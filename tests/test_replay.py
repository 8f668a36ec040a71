"""Issue 57: replay references train as the target trained. From every round the server kept, the weights each of a
client's rounds started from and its method's round recipe reproduce every one of that client's uploads bit for bit
when given its own records and generators; a reference's rounds move the federation as the weighted mean with it in
the victim's place and the others' recorded updates would, round after round, and the released model likewise;
where the observer cannot replay (a client, no kept rounds, a released model that is no such mean), it says why."""

from __future__ import annotations

import pytest
import torch

from fedaudit.api import run_config
from fedaudit.attacks.mia.replay import drifted, moved, release_replay, upload_replay
from fedaudit.audit.session import attacker_prior
from fedaudit.data import load_dataset, lodo_split
from fedaudit.methods import get_method
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import SERVER, ArtifactKind, Wire, client_role

CPU = torch.device("cpu")


def _federation(method: str, rounds: int = 2, **options):
    cfg, _ = run_config(method, None, None, None, dict(dataset="digits", image_size=16, rounds=rounds, local_epochs=1,
                                                        batch_size=32, device="cpu", attack="none", **options))
    ds = load_dataset("digits", 16)
    wire = Wire(None)
    fed = Federation(cfg, get_method(method)(cfg), ds, lodo_split(ds, ds.domains[-1], seed=0), CPU, wire)
    wire.keep_history({c.role for c in fed.clients})
    fed.setup()
    fed.run(None)
    return fed, wire, attacker_prior(cfg, fed.method, fed, ds)


@pytest.mark.parametrize("method", ["fedavg", "fedprox"])
def test_a_replay_with_the_victims_own_records_is_every_one_of_its_uploads(method):
    fed, wire, prior = _federation(method, rounds=3)
    view, history = wire.view(SERVER), wire.history_view(SERVER)
    client = fed.clients[1]
    replay = upload_replay(view, history, prior, client.domain, CPU)
    assert not isinstance(replay, str), replay
    assert [r.round for r in replay.rounds] == [1, 2, 3] and replay.train_size == client.num_samples
    model = prior.build_model()
    model.load_state_dict(replay.start)
    drift = None
    for step in replay.rounds:
        torch.manual_seed(derive_seed(fed.cfg.seed, step.round))  # as the round began
        replay.recipe(model, client.data.train_x, client.data.train_y, fed.preprocess, fed.generator(step.round, client))
        trained = model.state_dict()
        for key, tensor in step.upload.items():
            assert torch.equal(trained[key], tensor), (step.round, key)  # replay trains as the target did, exactly
        if step.next_start is not None:  # its own upload in its own place: no drift, the next broadcast exactly
            drift = drifted(drift, step.weight, trained, step.upload)
            model.load_state_dict(moved(step.next_start, drift))
            assert all(torch.equal(model.state_dict()[k], v) for k, v in step.next_start.items())


def test_a_references_rounds_move_the_federation_as_the_mean_with_the_others_updates_held_fixed():
    """Round 1: the next broadcast moved by the drift is the weighted mean of the round's uploads with the reference's
    model in the victim's place. Round 2: the others' recorded updates (their upload − the broadcast they trained
    from) added to the reference's own broadcast, averaged with its round-2 model: the drift carries on."""
    fed, wire, prior = _federation("fedavg", rounds=3)
    history = wire.history_view(SERVER)
    client = fed.clients[0]
    replay = upload_replay(wire.view(SERVER), history, prior, client.domain, CPU)
    full = [a for a in history if a.kind == ArtifactKind.FULL_MODEL]
    up = {(a.sender, a.round): a.tensors for a in full if a.receiver == SERVER}
    down = {(a.receiver, a.round): a.tensors for a in full if a.sender == SERVER}
    counts = {c.role: float(c.num_samples) for c in fed.clients}
    w = {r: counts[r] / sum(counts.values()) for r in counts}
    g0 = torch.Generator().manual_seed(1)
    mine = [{k: v + 0.01 * torch.randn(v.shape, generator=g0) if v.is_floating_point() else v
             for k, v in step.upload.items()} for step in replay.rounds]  # any models the reference might train
    drift, ref_start = None, None
    for i, step in enumerate(replay.rounds[:2]):
        drift = drifted(drift, step.weight, mine[i], step.upload)
        got = moved(step.next_start, drift)
        start = ref_start or down[(client.role, step.round)]  # the reference's broadcast this round
        for key, v in got.items():
            if v.is_floating_point():
                others = sum(w[r] * (start[key].double() + up[(r, step.round)][key].double()
                                     - down[(r, step.round)][key].double()) for r in counts if r != client.role)
                assert torch.allclose(v.double(), others + w[client.role] * mine[i][key].double(), atol=1e-5), key
        ref_start = got


def test_the_released_model_is_the_rounds_mean_and_a_reference_takes_the_victims_place():
    fed, wire, prior = _federation("fedavg")
    view = wire.view(SERVER)
    client = fed.clients[0]
    released = fed.deployed_model().eval()
    pre = Preprocess(prior.mean, prior.std, CPU, hflip=prior.hflip)
    probe = client.data.holdout_x[:32]
    upload = upload_replay(view, wire.history_view(SERVER), prior, client.domain, CPU)
    replay = release_replay(view, prior, client.domain, lambda x: released(x), probe, pre, upload, CPU)
    assert not isinstance(replay, str), replay
    assert replay.release.weighting == "sample counts" and replay.release.gap < 1e-4
    counts = [float(c.num_samples) for c in fed.clients]
    assert replay.release.weight == pytest.approx(counts[0] / sum(counts))
    # the victim's own upload in its own place gives the released model back
    (own,) = [a for a in view if a.sender == client.role and a.kind == ArtifactKind.FULL_MODEL]
    local = prior.build_model()
    local.load_state_dict(own.tensors)
    in_place = replay.release.model_of(local, prior.build_model())
    x = pre(probe, None)
    assert torch.allclose(in_place(x), released(x), atol=1e-5)
    # another local model moves the released one by exactly its weight times the difference
    other = prior.build_model()
    assert not torch.allclose(replay.release.model_of(other, prior.build_model())(x), released(x), atol=1e-3)


def test_where_the_observer_cannot_replay_it_says_why():
    fed, wire, prior = _federation("fedavg", rounds=2)
    client = fed.clients[0]
    assert "only the server" in upload_replay(wire.view(client_role(fed.clients[1].domain)), None, prior,
                                             client.domain, CPU)
    view = wire.view(SERVER)
    assert "holds only the newest round" in upload_replay(view, None, prior, client.domain, CPU)
    upload = upload_replay(view, wire.history_view(SERVER), prior, client.domain, CPU)
    pre = Preprocess(prior.mean, prior.std, CPU, hflip=prior.hflip)
    released = fed.deployed_model().eval()
    shifted = release_replay(view, prior, client.domain, lambda x: released(x) + 1.0, client.data.holdout_x[:8], pre,
                             upload, CPU)  # a released model that is no mean of the uploads (e.g. noise was added)
    assert isinstance(shifted, str) and "not a weighted mean of round 2's uploads" in shifted
    from dataclasses import replace

    bare = replace(prior, round_recipes={}, replay_note="no recipe here")
    assert upload_replay(view, wire.history_view(SERVER), bare, client.domain, CPU) == "no recipe here"


def test_a_method_whose_local_loss_no_recipe_replays_declares_none_and_a_recording_without_a_recipe_neither():
    from fedaudit.interop.audit_recording import undeclared_recipe

    fed, _, prior = _federation("fedsb", rounds=1)
    assert prior.round_recipes == {} and "fedsb declares no recipe" in prior.replay_note

    from fedaudit.interop.manifest import Manifest, Recipe

    class Recorded:
        def __init__(self, recipe):
            self.manifest = Manifest(run_id="r", recipe=Recipe(**recipe) if recipe is not None else None)

    assert undeclared_recipe(Recorded({"local_epochs": 1, "batch_size": 32, "lr": 0.01})) == ""
    assert "declares no batch_size, lr" in undeclared_recipe(Recorded({"local_epochs": 1}))
    assert "declares no local_epochs, batch_size, lr" in undeclared_recipe(Recorded(None))


def test_replay_masks_give_each_reference_the_targets_training_size_and_every_record_both_sides():
    """A replay reference trains on as many records as the target did (its uploaded sample count), so it takes the
    same number of steps; every record is IN for ⌊N·size/n⌋ or ⌈N·size/n⌉ of the N references."""
    from fedaudit.attacks.mia.reference_models import inclusion_masks

    masks = inclusion_masks(405, 8, torch.Generator().manual_seed(0), size=225)
    assert masks.sum(1).tolist() == [225] * 8
    ins = masks.sum(0)
    assert int(ins.min()) == 8 * 225 // 405 and int(ins.max()) == -(-8 * 225 // 405)
    with pytest.raises(Exception, match="must leave some out"):
        inclusion_masks(10, 4, torch.Generator().manual_seed(0), size=10)


def test_the_report_says_how_each_reference_set_was_made():
    """A replayed set names its round and the mean the released model was found to be; a from-scratch set says why
    no replay ran, beside the calibration figure either way."""
    from types import SimpleNamespace

    from fedaudit.reports.attack_sections import _references
    from fedaudit.run.entries import MembershipEntry
    from fedaudit.run.stored.leakage import MembershipTestResult

    calibration = {"status": "calibrated", "out_gap": 0.04, "in_gap": -0.02}
    replayed = MembershipEntry.of(MembershipTestResult.read({"reference_models": 8, "calibration": calibration,
                                                             "reference": {"kind": "replay", "round": 20, "released_as":
                                                                           "the sample counts-weighted mean of round "
                                                                           "20's uploads"}}))
    scratch = MembershipEntry.of(MembershipTestResult.read({"reference_models": 8, "calibration": calibration,
                                                            "reference": {"kind": "scratch", "no_replay": "only the "
                                                                          "server holds what a client's rounds started "
                                                                          "from"}}))
    unit = SimpleNamespace(audited=SimpleNamespace(made_by="evaluate"))
    warnings: list[str] = []
    assert _references(unit, replayed, "global_model · clean", warnings) == (
        "8 replayed from round 20's start (the sample counts-weighted mean of round 20's uploads) (calibrated: "
        "non-members 0.040 σ from the OUT models, members -0.020 σ from the IN models)")
    assert "8 from scratch (no replay: only the server holds" in _references(unit, scratch, "x", warnings)
    assert warnings == []
