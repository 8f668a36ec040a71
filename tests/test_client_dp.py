"""Client-level DP on the aggregate (issue 47): the accountant against the closed form, the mechanism's clipping and
noise, and a run that says what the guarantee covers."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from fedaudit.cli import app
from fedaudit.simulation.client_dp import ClientLevelDP, mu_for
from fedaudit.statistics.gaussian_dp import gaussian_epsilon

runner = CliRunner()


def _delta_closed_form(epsilon: float, mu: float) -> float:
    """The Gaussian mechanism's δ(ε) at μ (Balle & Wang 2018, Thm 8), written out here independently."""
    from scipy.stats import norm

    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2))


@pytest.mark.parametrize(("epsilon", "delta", "rounds"), [(1.0, 1e-5, 20), (4.0, 1e-5, 40), (8.0, 1e-6, 3)])
def test_the_noise_multiplier_spends_exactly_the_target_by_the_closed_form(epsilon, delta, rounds):
    mech = ClientLevelDP.for_target(epsilon, delta, rounds, clip=1.0)
    # T Gaussian mechanisms of sensitivity C and noise σC compose to μ = √T/σ (GDP), whose δ at ε is the closed form
    assert _delta_closed_form(epsilon, math.sqrt(rounds) / mech.noise_multiplier) == pytest.approx(delta, rel=1e-6)
    assert _delta_closed_form(epsilon, mech.mu) == pytest.approx(delta, rel=1e-6)
    assert gaussian_epsilon(mech.mu, delta) == pytest.approx(epsilon, rel=1e-8)
    # more rounds at the same ε need proportionally more noise per round: σ grows as √T
    twice = ClientLevelDP.for_target(epsilon, delta, 4 * rounds, clip=1.0)
    assert twice.noise_multiplier == pytest.approx(2 * mech.noise_multiplier)
    assert mu_for(epsilon, delta) < mu_for(2 * epsilon, delta)


def _states(*updates: torch.Tensor) -> tuple[dict, list[dict]]:
    base = {"w": torch.zeros(updates[0].numel()), "n": torch.tensor(4)}
    return base, [{"w": u.clone(), "n": torch.tensor(6)} for u in updates]


def test_each_update_is_clipped_weighted_equally_and_the_mean_gets_noise_of_sigma_c_over_k():
    g = torch.Generator().manual_seed(0)
    quiet = ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=10.0, noise_multiplier=1e-9)
    base, states = _states(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0]))
    quiet.mean_(base, states, g)
    assert torch.allclose(base["w"], torch.tensor([1.5, 2.5]))  # norms 5 and 1 under the clip: the plain mean
    assert int(base["n"]) == 4 and quiet.clipped == 0  # an integer buffer keeps the global state's value
    clipped = ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=1.0, noise_multiplier=1e-9)
    base, states = _states(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0]))
    clipped.mean_(base, states, g)
    assert torch.allclose(base["w"], torch.tensor([0.3, 0.9]))  # (3,4)/5 and (0,1), averaged with weight 1/2 each
    assert (clipped.clipped, clipped.updates) == (1, 2)
    noisy = ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=2.0, noise_multiplier=3.0)
    base, states = _states(*(torch.zeros(200_000) for _ in range(4)))
    noisy.mean_(base, states, g)
    assert float(base["w"].std()) == pytest.approx(3.0 * 2.0 / 4, rel=0.01)  # σC/K
    assert abs(float(base["w"].mean())) < 0.01


def test_a_fixed_denominator_divides_the_sum_by_the_full_federations_k():
    """DP-FedAvg's fixed denominator: a round with one client fewer (a domain twin, DP's neighbour) divides the sum of
    its clipped updates and the noise σC by the same K as the full federation, not by its own count."""
    g = torch.Generator().manual_seed(0)
    neighbour = ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=10.0, noise_multiplier=1e-9, denominator=3)
    base, states = _states(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0]))
    neighbour.mean_(base, states, g)
    assert torch.allclose(base["w"], torch.tensor([1.0, 5.0 / 3]))  # (3+0, 4+1) / 3, not / 2
    assert int(base["n"]) == 4  # integer buffers: the global state's, whoever took part
    noisy = ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=2.0, noise_multiplier=3.0, denominator=4)
    base, states = _states(*(torch.zeros(200_000) for _ in range(3)))
    noisy.mean_(base, states, g)
    assert float(base["w"].std()) == pytest.approx(3.0 * 2.0 / 4, rel=0.01)  # σC/K with K the full federation's


def _client_states(batches: list[int]) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """A BatchNorm model's start and each client's state after local training on its own number of batches (a client
    of more records counts more batches in ``num_batches_tracked``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    start = {k: t.clone() for k, t in model.state_dict().items()}
    states = []
    for k, n in enumerate(batches):
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(n):
            x = torch.randn(8, 4) + k
            loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 2, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
        states.append({key: t.clone() for key, t in model.state_dict().items()})
    return start, states


def test_neighbouring_broadcasts_of_unequal_clients_differ_only_in_the_noised_floats():
    """Issue 56: clients of unequal size count different numbers of batches; the broadcast of a federation with and
    without one of them (DP's neighbours, same noise draw) may differ only in tensors that carry the mechanism's
    noise — an integer buffer that followed the clients' counts would move deterministically with one client's
    presence, outside the guarantee."""
    start, states = _client_states([2, 5, 11])
    assert len({int(s["1.num_batches_tracked"]) for s in states}) == 3  # the clients' counts differ
    broadcasts = []
    for present in (states, states[:2]):
        mech = ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=1.0, noise_multiplier=2.0, denominator=3)
        state = {k: t.clone() for k, t in start.items()}
        mech.mean_(state, present, torch.Generator().manual_seed(7))
        broadcasts.append(state)
        noiseless = {k: t.clone() for k, t in start.items()}
        ClientLevelDP(epsilon=1.0, delta=1e-5, rounds=1, clip=1.0, noise_multiplier=0.0,
                      denominator=3).mean_(noiseless, present, torch.Generator().manual_seed(7))
        # every float tensor the broadcast carries got the noise; every other one is the global state's own
        for k, t in state.items():
            assert not torch.equal(t, noiseless[k]) if t.is_floating_point() else torch.equal(t, start[k]), k
    full, neighbour = broadcasts
    differ = {k for k in full if not torch.equal(full[k], neighbour[k])}
    assert differ and all(full[k].is_floating_point() for k in differ), differ


def test_a_domain_twin_under_client_dp_is_the_mechanisms_neighbour():
    """The participation row's null under client-level DP is the federation without the domain run through the same
    mechanism: the sum over the remaining clients divided by the full K (a twin dividing by K − 1 gets more noise on
    its mean than the released model did, and its spread was no null: a false MEDIUM at chance accuracy)."""
    from fedaudit.api import run_config
    from fedaudit.audit.domain_twin import train_domain_twin
    from fedaudit.data import load_dataset, lodo_split
    from fedaudit.methods import get_method
    from fedaudit.simulation.federation import Federation
    from fedaudit.simulation.wire import Wire

    cfg, _ = run_config("fedavg", None, None, None, dict(dataset="digits", image_size=16, rounds=1, local_epochs=1,
                                                          batch_size=32, device="cpu", client_dp_epsilon=8.0))
    ds = load_dataset("digits", 16)
    fed = Federation(cfg, get_method("fedavg")(cfg), ds, lodo_split(ds, ds.domains[-1], seed=0), torch.device("cpu"),
                     Wire(None))
    twin = train_domain_twin(cfg, fed.method, fed, "clean", 0)
    assert len(twin.clients) == 2 and twin.client_dp.denominator == 3
    assert twin.client_dp.noise_multiplier == fed.client_dp.noise_multiplier


FAST = ["--dataset", "digits", "--image-size", "16", "--rounds", "2", "--local-epochs", "1", "--device", "cpu",
        "--quiet", "--attack", "none"]


def test_a_run_stores_its_client_level_guarantee_and_what_it_covers(tmp_path):
    result = runner.invoke(app, ["evaluate", *FAST, "--client-dp-epsilon", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    privacy = json.loads((run_dir / "metrics.json").read_text())["privacy"]
    client = privacy["client_dp"]
    assert client["epsilon"] == pytest.approx(2.0, rel=1e-6) and client["rounds"] == 2 and client["clients"] == 3
    assert client["noise_std_on_mean"] == pytest.approx(client["noise_multiplier"] * client["clip"] / 3)
    assert client["updates"] == 6
    covered = {(r["artifact"], r["direction"]): r["covered"] for r in privacy["client_coverage"]}
    assert covered == {("full_model", "down"): True, ("full_model", "up"): False, ("scalars", "up"): False}
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "Client-level DP on the aggregate: ε 2" in page and "covered by the client-level guarantee" in page


def test_a_method_that_cannot_aggregate_privately_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["evaluate", *FAST, "--method", "feddg_ga", "--client-dp-epsilon", "2",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--client-dp-epsilon: feddg_ga cannot aggregate with client-level DP" in result.output
    assert "Traceback" not in result.output and not any(tmp_path.iterdir())
