"""FedDG-GA: the weight-update rule, the wire, GA-weighted aggregation, resume."""

import csv
import json

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedaudit.errors import FedauditError
from fedaudit.methods import METHODS
from fedaudit.methods.feddg_ga import FedDGGA, ga_step, ga_update, val_loss
from fedaudit.models import build_model
from fedaudit.run import run_directory
from fedaudit.run.config import resolve
from fedaudit.tensor_ops.aggregation import load_state_, state_nbytes
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind

finite = st.floats(-50, 50, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(raw=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8), gaps=st.lists(finite, min_size=8, max_size=8),
       step=st.floats(0.0, 1.0))
def test_ga_update_keeps_any_weights_on_the_simplex(raw, gaps, step):
    weights = torch.tensor(raw, dtype=torch.float64) + 1e-3
    weights /= weights.sum()
    new = ga_update(weights, torch.tensor(gaps[:len(raw)], dtype=torch.float64), step)
    assert (new >= 0).all() and (new <= 1).all()
    assert new.sum().item() == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(finite, min_size=2, max_size=8, unique=True), step=st.floats(0.01, 0.5))
def test_from_uniform_weights_the_largest_gap_gains_and_the_smallest_loses(gaps, step):
    # Gaps that differ only by subnormal amounts (0 vs 5e-324) move the weights by less than a float64 ulp.
    assume(max(gaps) - min(gaps) > 1e-9)
    g = torch.tensor(gaps, dtype=torch.float64)
    uniform = torch.full_like(g, 1 / len(gaps))
    new = ga_update(uniform, g, step)
    assert new[g.argmax()] > uniform[0]
    assert new[g.argmin()] < uniform[0]


def test_ga_update_is_the_mean_centred_rule_and_zero_step_or_equal_gaps_change_nothing():
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    gaps = torch.tensor([3.0, 1.0, 1.5], dtype=torch.float64)
    # by hand: mean 11/6, centred (7/6, -5/6, -2/6), max |.| = 7/6 -> moves 0.2*(1, -5/7, -2/7); sum 0, no clipping
    expected = uniform + 0.2 * torch.tensor([1.0, -5 / 7, -2 / 7], dtype=torch.float64)
    assert torch.allclose(ga_update(uniform, gaps, 0.2), expected, atol=1e-12)
    # the released code's uncentred gaps/max|gaps| would give a different answer
    uncentred = uniform + 0.2 * gaps / gaps.abs().max()
    assert not torch.allclose(ga_update(uniform, gaps, 0.2), uncentred / uncentred.sum(), atol=1e-3)
    skewed = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    assert torch.equal(ga_update(skewed, gaps, 0.0), skewed)
    assert torch.equal(ga_update(skewed, torch.full((3,), 0.4, dtype=torch.float64), 0.2), skewed)
    # a step large enough to push a weight below 0 clips it and renormalises
    clipped = ga_update(uniform, gaps, 0.9)
    assert clipped[1] == 0 and clipped.sum().item() == pytest.approx(1.0)


def test_step_decays_linearly_to_zero_at_the_last_round():
    assert ga_step(0, 40) == pytest.approx(0.2)
    assert ga_step(10, 40) == pytest.approx(0.15)
    assert ga_step(40, 40) == 0.0
    steps = [ga_step(r, 40) for r in range(41)]
    assert all(a > b for a, b in zip(steps, steps[1:]))
    assert ga_step(2, 4, step_size=0.1) == pytest.approx(0.05)


def test_options_are_validated_early():
    with pytest.raises(FedauditError, match="--feddg-ga-step-size must be between 0 and 1"):
        FedDGGA(resolve({"method": "feddg_ga", "method_options": {"step_size": 1.5}}))
    paper = resolve({"method": "feddg_ga", "profile": "paper"}, method_defaults=FedDGGA.profile_defaults)
    assert (paper.optimizer, paper.lr, paper.local_epochs, paper.rounds) == ("sgd", 1e-3, 5, 40)


def _uploads(values, sizes, losses_local, losses_global, rnd):
    out = {}
    for i, (v, _n, lo, gl) in enumerate(zip(values, sizes, losses_local, losses_global)):
        role = f"client:d{i}"
        state = {"w": torch.full((3,), float(v)), "n": torch.tensor(v)}
        scalars = {"val_loss_local": torch.tensor(lo), "val_loss_global": torch.tensor(gl)}
        out[role] = [Artifact(ArtifactKind.FULL_MODEL, role, SERVER, rnd, state),
                     Artifact(ArtifactKind.SCALARS, role, SERVER, rnd, scalars)]
    return out


def test_aggregation_uses_the_ga_weights_not_uniform_or_sample_weights():
    method = FedDGGA(resolve({"method": "feddg_ga", "rounds": 4}))
    method.global_state = {"w": torch.zeros(3), "n": torch.zeros((), dtype=torch.long)}
    sizes, values = (10, 20, 70), (1, 2, 6)
    # round 1: no gap yet -> the uniform mean, although the clients differ in size
    method.aggregate(None, _uploads(values, sizes, (1.0, 1.0, 1.0), (2.3, 2.3, 2.3), 1), 1)
    assert torch.allclose(method.global_state["w"], torch.full((3,), 3.0))
    # round 2 carries after_1: gaps after_1 - before_1 = (0.5, 0.0, 2.0)
    method.aggregate(None, _uploads(values, sizes, (0.9, 0.8, 0.7), (1.5, 1.0, 3.0), 2), 2)
    a = ga_update(torch.full((3,), 1 / 3, dtype=torch.float64), torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64), ga_step(1, 4))
    assert list(method.ga_weights.values()) == pytest.approx(a.tolist())
    assert method.ga_weights["client:d2"] > 1 / 3 > method.ga_weights["client:d1"]
    expected = sum(ai * v for ai, v in zip(a.tolist(), values))
    assert method.global_state["w"][0].item() == pytest.approx(expected, rel=1e-6)
    assert expected != pytest.approx(3.0, rel=1e-3)  # not uniform
    assert expected != pytest.approx(sum(n * v for n, v in zip(sizes, values)) / sum(sizes), rel=1e-3)  # not by samples
    assert method.global_state["n"].item() == round(expected)
    # round 2's before-losses are kept for round 3's gap
    assert method.val_loss_before == pytest.approx({"client:d0": 0.9, "client:d1": 0.8, "client:d2": 0.7})


def test_wire_carries_both_val_losses_every_round_and_they_are_the_promised_models(tiny_run):
    rounds = 3
    seen, global_losses = {}, {}

    def record(fed, rnd):
        view = fed.wire.view(SERVER)
        seen[rnd] = {c.role: view.latest(ArtifactKind.SCALARS, c.role) for c in fed.clients}
        # the loss of this round's aggregate on each client's val split: next round's val_loss_global
        model = fed.deployed_model()
        global_losses[rnd] = {c.role: val_loss(model, fed.method.predict, c.data.val_x, c.data.val_y, fed.preprocess,
                                          fed.cfg.precision).item()
                              for c in fed.clients}
        load_state_(fed.model, fed.method.global_state)

    result = tiny_run("feddg_ga", rounds=rounds, local_epochs=1, on_round_end=record)
    clients = result.metrics["source_domains"]
    for rnd in range(1, rounds + 1):
        for role, art in seen[rnd].items():
            assert art.round == rnd
            t = art.tensors
            assert set(t) == {"val_loss_local", "val_loss_global"}  # no sample count: the GA weights never read one
            assert t["val_loss_local"].dtype == torch.float32 and t["val_loss_global"].dtype == torch.float32
            assert all(v.dim() == 0 for v in t.values())
            assert 0 < t["val_loss_local"].item() < 20 and 0 < t["val_loss_global"].item() < 20
            if rnd > 1:  # the re-ordering: what the client reports as "after" is the previous aggregate's loss
                assert t["val_loss_global"].item() == pytest.approx(global_losses[rnd - 1][role], rel=1e-5)

    rows = [json.loads(line) for line in (result.run_dir / "wire.jsonl").read_text().splitlines()]
    sd_bytes = state_nbytes(build_model("cnn", 10, 16).state_dict())
    for rnd in range(1, rounds + 1):
        scalars = [r for r in rows if r["round"] == rnd and r["kind"] == "scalars"]
        assert sorted(r["sender"] for r in scalars) == sorted(f"client:{d}" for d in clients)
        assert all(r["direction"] == "up" and r["bytes"] == 4 + 4 and r["tensors"] == 2 for r in scalars)
        for direction in ("up", "down"):
            full = [r for r in rows if r["round"] == rnd and r["kind"] == "full_model" and r["direction"] == direction]
            assert len(full) == len(clients) and all(r["bytes"] == sd_bytes for r in full)
    comm = result.metrics["communication"]["by_kind"]
    assert comm["scalars"] == {"up": 8 * len(clients) * rounds, "down": 0}
    assert {(r["kind"], r["direction"]) for r in rows} == {(k.value, d) for k, d in METHODS["feddg_ga"].shares}
    # the weights are visible to the user, per round and at the selected round
    weights = result.metrics["accuracy"]["method_specific"]
    assert set(weights) == {f"ga_weight/{d}" for d in clients}
    assert sum(weights.values()) == pytest.approx(1.0)


def _weights_per_round(run_dir):
    with open(run_dir / "history.csv") as f:
        return [{k: float(v) for k, v in row.items() if k.startswith("extra/ga_weight/")} for row in csv.DictReader(f)]


def test_killed_run_resumes_to_the_same_weights(tiny_run, tmp_path):
    whole = tiny_run("feddg_ga", rounds=3, local_epochs=1, out=str(tmp_path / "whole"))
    per_round = _weights_per_round(whole.run_dir)
    # round 3's weights depend on the state a resume must restore (round 2's weights and before-losses)
    assert max(abs(per_round[2][k] - per_round[1][k]) for k in per_round[2]) > 1e-3

    def kill_after_round_2(fed, rnd):
        if rnd == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny_run("feddg_ga", rounds=3, local_epochs=1, out=str(tmp_path / "cut"), on_round_end=kill_after_round_2)
    (cut_dir,) = (tmp_path / "cut").iterdir()

    from fedaudit.api import evaluate

    resumed = evaluate(resume=cut_dir)
    assert run_directory.is_complete(cut_dir)
    assert _weights_per_round(cut_dir) == _weights_per_round(whole.run_dir)
    assert resumed.metrics["accuracy"] == whole.metrics["accuracy"]
    assert (cut_dir / "history.csv").read_text() == (whole.run_dir / "history.csv").read_text()
