"""mia end to end: every variant on both targets, the reference-logit cache, the curious client's
narrower view, the label-free (FedGaLA) signal, and a challenge that never reveals membership."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import fedaudit.attacks.mia as mia
from fedaudit.api import evaluate
from fedaudit.attack import MembershipChallenge
from fedaudit.attacks import get_attacks
from fedaudit.attacks.mia import MembershipInference, mia_variants
from fedaudit.attacks.mia.scorers import consistency
from fedaudit.audit.membership import audit_membership, make_challenge
from fedaudit.audit.session import attacker_prior
from fedaudit.errors import FedauditError
from fedaudit.run.stored.leakage import MembershipSection
from fedaudit.simulation.wire import SERVER, client_role

TINY = dict(attack="none", dataset="digits", image_size=16, rounds=1, local_epochs=2, batch_size=32, device="cpu")
RESULT_KEYS = ("loss", "lira_online", "lira_offline", "rmia", "domain")



def as_stored(section: MembershipSection) -> dict:
    """The membership section as metrics.json stores it (what these tests check)."""
    return {variant: {target: {victim: test.dump() for victim, test in by_victim.items()}
                      for target, by_victim in by_target.items()} for variant, by_target in section.items()}

def _train(tmp_path_factory, method: str, **overrides):
    """Train a tiny federation through the public API and keep the Federation the run ended with."""
    caught = []
    out = tmp_path_factory.mktemp(method)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped: runs before the function-scoped one_thread fixture
    try:
        result = evaluate(method, out=str(out), on_round_end=lambda fed, rnd: caught.append(fed), **{**TINY, **overrides})
    finally:
        torch.set_num_threads(before)
    fed = caught[-1]
    return result.run_dir, fed, attacker_prior(fed.cfg, fed.method, fed, fed.dataset)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models are launch-bound: on a shared 2-core machine a second intra-op thread
    mostly spin-waits (see tests/test_membership.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    return _train(tmp_path_factory, "fedavg")


@pytest.fixture
def spy_training(monkeypatch):
    """Count reference-model trainings (the expensive step the cache must skip)."""
    from fedaudit.attacks.mia import references

    calls = []
    real = references.train_references

    def spy(*args, **kwargs):
        calls.append(args[3].shape)  # the masks: [N, n]
        return real(*args, **kwargs)

    monkeypatch.setattr(references, "train_references", spy)
    return calls


def _check_metrics(entry: dict, members: int, nonmembers: int) -> None:
    assert 0.0 <= entry["auc"] <= 1.0
    assert (entry["members"], entry["nonmembers"]) == (members, nonmembers)
    lo, hi = entry["auc_chance_interval"]
    assert lo < 0.5 < hi
    for level in entry["tpr_at_fpr"].values():
        t_lo, t_hi = level["tpr_interval"]
        assert 0.0 <= t_lo <= level["tpr"] <= t_hi <= 1.0
        assert level["fpr_achieved"] <= level["level"] + 1e-12
    roc = entry["roc"]
    assert len(roc["fpr"]) == len(roc["tpr"]) >= 2
    assert roc["fpr"] == sorted(roc["fpr"]) and roc["tpr"] == sorted(roc["tpr"])
    assert (roc["fpr"][0], roc["fpr"][-1], roc["tpr"][-1]) == (0.0, 1.0, 1.0)


def test_server_gets_every_variant_on_both_targets_and_the_reference_logits_are_cached(fedavg_run, spy_training):
    run_dir, fed, prior = fedavg_run
    victims = [c.domain for c in fed.clients]
    first = as_stored(audit_membership(MembershipInference(4, seed=fed.cfg.seed, domain_twins=0), run_dir, fed.cfg,
                                       fed.method, fed, prior, role=SERVER, victims=victims))  # twins: test_participation
    json.dumps(first)  # stored as is in metrics.json
    assert set(first) == {*RESULT_KEYS, "artifact"}  # mia runs the artifact test too (tests/test_artifact_mia.py)
    assert set(first["artifact"]["full_model"]) == set(victims)
    for key in RESULT_KEYS[:-1]:
        assert set(first[key]) == {"global_model", "last_upload"}
        for target in ("global_model", "last_upload"):
            for c in fed.clients:
                entry = first[key][target][c.domain]
                _check_metrics(entry, c.data.train_y.numel(), c.data.holdout_y.numel())
                assert entry["reference_models"] == (0 if key == "loss" else 4)
    upload = first["loss"]["last_upload"][victims[0]]
    assert upload["round"] == fed.cfg.rounds
    assert set(upload["weights_from"]) == {f"full_model@r{fed.cfg.rounds} from {client_role(victims[0])}"}
    # domain level: each source domain's holdout vs the whole unseen domain, and pooled
    assert set(first["domain"]) == {"global_model"}
    unseen = fed.target_y.numel()
    for c in fed.clients:
        _check_metrics(first["domain"]["global_model"][c.domain], c.data.holdout_y.numel(), unseen)
    _check_metrics(first["domain"]["global_model"]["all"], sum(c.data.holdout_y.numel() for c in fed.clients), unseen)

    # One reference set per victim, replayed from the last round's start for both targets (one training, asked
    # about the upload and the released model), cached with the key that produced it.
    assert [tuple(s) for s in spy_training] == [(4, c.data.train_y.numel() + c.data.holdout_y.numel()) for c in fed.clients]
    key = json.loads((run_dir / "mia" / f"{victims[0]}-replay-logits.json").read_text())["key"]
    assert (key["victim"], key["reference_models"], key["seed"] > 0) == (victims[0], 4, True)
    assert "SGDRecipe(epochs=2" in key["recipe"] and set(key["replay"]) == {"global_model", "last_upload"}
    assert (run_dir / "mia" / f"{victims[0]}-replay-logits.safetensors").is_file()
    for target in ("global_model", "last_upload"):
        made = first["lira_online"][target][victims[0]]["reference"]
        assert (made["kind"], made["round"], made["epochs"]) == ("replay", fed.cfg.rounds, fed.cfg.local_epochs)
        # Both scored the target less the references' shift, and each figure is of that signal, raw gaps kept
        lira, rmia = first["lira_online"][target][victims[0]]["calibration"], first["rmia"][target][victims[0]]["calibration"]
        assert lira["shift"] == pytest.approx(made["shift"] / lira["sigma"]) and made["shift"] != 0
        assert first["rmia"][target][victims[0]]["reference"]["shift"] == made["shift"]
        assert rmia["out_gap"] == pytest.approx(lira["out_gap"]) and rmia["raw_out_gap"] == pytest.approx(lira["raw_out_gap"])
        assert lira["raw_out_gap"] - lira["out_gap"] == pytest.approx(lira["shift"])

    second = as_stored(audit_membership(MembershipInference(4, seed=fed.cfg.seed, domain_twins=0), run_dir, fed.cfg,
                                        fed.method, fed, prior, role=SERVER, victims=victims))
    assert len(spy_training) == len(victims)  # nothing retrained
    for key_ in RESULT_KEYS[1:4]:
        for target in ("global_model", "last_upload"):
            for v in victims:
                assert second[key_][target][v]["auc"] == first[key_][target][v]["auc"]
                assert second[key_][target][v]["reference"]["source"] == "cache"
    # Other settings (another N) do not match the key: they train afresh.
    audit_membership(MembershipInference(2, seed=fed.cfg.seed, variants=["lira"]), run_dir, fed.cfg, fed.method, fed,
                     prior, role=SERVER, victims=victims[:1])
    assert len(spy_training) == len(victims) + 1 and tuple(spy_training[-1])[0] == 2
    # From scratch: one set for both targets, the target's exposure in epochs, its own cache
    scratch = as_stored(audit_membership(MembershipInference(2, seed=fed.cfg.seed, variants=["lira"], training="scratch"),
                                         run_dir, fed.cfg, fed.method, fed, prior, role=SERVER, victims=victims[:1]))
    assert len(spy_training) == len(victims) + 2
    key = json.loads((run_dir / "mia" / f"{victims[0]}-reference-logits.json").read_text())["key"]
    assert "SGDRecipe(epochs=2" in key["recipe"]  # rounds x local epochs = 1 x 2
    # the path that ran and where, not "auto": a CPU cache (sequential) is not a GPU run's (vmap)
    assert (key["path"], key["device"]) == ("sequential", "cpu")
    made = scratch["lira_online"]["last_upload"][victims[0]]["reference"]
    assert (made["kind"], made["no_replay"]) == ("scratch", "--reference-training scratch")


def test_a_curious_client_gets_only_the_global_model_target(fedavg_run):
    run_dir, fed, prior = fedavg_run
    attacker, victim = fed.clients[0].domain, fed.clients[1].domain
    role = client_role(attacker)
    assert not [a for a in fed.wire.view(role) if a.sender == client_role(victim)]  # the premise: no victim uploads
    attack = MembershipInference(2, seed=fed.cfg.seed, variants=["loss", "lira"])
    out = as_stored(audit_membership(attack, run_dir, fed.cfg, fed.method, fed, prior, role=role, victims=[victim]))
    assert set(out) == {"loss", "lira_online", "lira_offline"}
    for _key, by_target in out.items():
        assert "auc" in by_target["global_model"][victim]
        skipped = by_target["last_upload"][victim]
        assert skipped["status"] == "not applicable" and "curious server" in skipped["reason"]
        assert "auc" not in skipped


def test_label_free_fedgala_uses_augmentation_consistency_and_rmia_is_not_applicable(tmp_path_factory):
    run_dir, fed, prior = _train(tmp_path_factory, "fedgala", local_epochs=1,
                                 method_option=["proj_hidden=64", "proj_dim=32"])
    assert fed.method.label_free and fed.method.reference_recipe(fed, fed.clients[0]).epochs == 1
    victim = fed.clients[0].domain
    attack = MembershipInference(2, seed=fed.cfg.seed, variants=["loss", "lira", "rmia", "domain"], domain_twins=0)
    out = as_stored(audit_membership(attack, run_dir, fed.cfg, fed.method, fed, prior, role=SERVER, victims=[victim]))
    for key in ("loss", "lira_online", "lira_offline"):
        for target in ("global_model", "last_upload"):
            entry = out[key][target][victim]
            _check_metrics(entry, fed.clients[0].data.train_y.numel(), fed.clients[0].data.holdout_y.numel())
            assert entry["signal"].startswith("augmentation consistency")
    assert "SimCLRRecipe" in out["lira_online"]["global_model"][victim]["reference"]["recipe"]
    for target in ("global_model", "last_upload"):
        skipped = out["rmia"][target][victim]
        assert set(skipped) == {"status", "reason"} and skipped["status"] == "not applicable"
        assert "label-free" in skipped["reason"]
    assert out["domain"]["global_model"]["all"]["signal"].startswith("augmentation consistency")


def test_consistency_pairs_views_of_the_same_record():
    # 2 pairs x 2 records, D = 2: pair k's A views then its B views. Record 0's views agree, record 1's are orthogonal.
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    emb = torch.cat([a, b, a, b])
    assert consistency(emb, 2).tolist() == pytest.approx([1.0, 0.0])
    assert consistency(torch.stack([emb, -emb]), 2).shape == (2, 2)  # reference models on a leading dim


def test_the_challenge_hides_membership_and_the_auditor_keeps_the_truth(fedavg_run):
    _, fed, _ = fedavg_run
    names = {f.name for f in dataclasses.fields(MembershipChallenge)}
    assert names == {"victim", "images", "labels", "population_images", "population_labels"}
    client = fed.clients[1]
    challenge, is_member = make_challenge(fed, client.domain, seed=fed.cfg.seed)
    n_in, n_out = client.data.train_y.numel(), client.data.holdout_y.numel()
    assert is_member.shape == (n_in + n_out,) and int(is_member.sum()) == n_in
    members_first = torch.cat([torch.ones(n_in, dtype=torch.bool), torch.zeros(n_out, dtype=torch.bool)])
    assert not torch.equal(is_member, members_first)  # shuffled: position says nothing
    assert is_member[: n_in].float().mean() < 0.75
    # The truth is right: the candidates it marks are exactly the victim's training records.
    def rows(x):
        return sorted(map(bytes, x.flatten(1).numpy()))
    assert rows(challenge.images[is_member]) == rows(client.data.train_x)
    assert rows(challenge.images[~is_member]) == rows(client.data.holdout_x)
    # The population is other domains' holdout only: nothing any model trained on.
    assert challenge.population_labels.numel() == sum(c.data.holdout_y.numel() for c in fed.clients if c is not client)
    again, truth_again = make_challenge(fed, client.domain, seed=fed.cfg.seed)
    assert torch.equal(again.images, challenge.images) and torch.equal(truth_again, is_member)  # reproducible


def test_registry_options_and_errors():
    assert mia_variants(get_attacks("mia")) == ("loss", "lira", "rmia", "domain", "artifact")
    assert mia_variants(get_attacks("mia-loss,mia-lira")) == ("loss", "lira")
    assert mia_variants(get_attacks("mia-domain")) == ("domain",)
    assert mia_variants(get_attacks("mia-artifact")) == ("artifact",)
    names = [cls.name for cls in get_attacks("all")]
    assert names.count("mia") == 1 and not any(n.startswith("mia-") for n in names)
    with pytest.raises(FedauditError, match="reference-models must be an integer from 2"):
        mia.check_reference_models(1)
    with pytest.raises(FedauditError, match="mia variant"):
        mia.check_variants(["lira", "shadow"])
    with pytest.raises(FedauditError, match="audit_membership"):
        get_attacks("mia")[0]().run_batch(None, None, ["clean"], torch.device("cpu"))
