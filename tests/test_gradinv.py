"""gradinv: the gradient-inversion engine, label recovery, Hungarian-matched scoring, and the attack on the wire."""

import copy
import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from fedaudit.attack import AttackerPrior
from fedaudit.attacks import get_attacks
from fedaudit.attacks.gradinv import GradInv
from fedaudit.attacks.gradinv.engine import GradInvSettings, LocalRecipe, recover_labels, simulate_update, split_state
from fedaudit.audit.judges import psnr, ssim
from fedaudit.audit.scoring import matched_fidelity
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, Wire, client_role

SIZE, CLASSES = 16, 10
MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
RECIPE = LocalRecipe(lr=0.01, momentum=0.9, weight_decay=5e-4)

# Single image, one SGD step, the tiny conv net below, 300 iterations of signed Adam (step decay), TV 3e-5.
# Measured on the 2-core dev machine: 34.7 dB (SSIM 0.99) for the attack, 7.6 dB for the random-update
# control; the threshold leaves ~5 dB for BLAS differences between machines while still failing a broken attack.
PSNR_THRESHOLD_DB = 30.0
# Under DP-SGD (clip 1, noise multiplier 1, batch 1) the update is noise: measured 6.8 dB against 7.1 dB for
# the control. The attack must sit within this margin of its control (and far below the threshold).
DP_MARGIN_DB = 3.0


@pytest.fixture(autouse=True)
def _one_thread():
    # Double backward through tiny nets is launch-bound; on a shared 2-core machine a second
    # OpenMP thread made these tests an order of magnitude slower, not faster.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_net(seed=0, width=32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(width * 16, CLASSES))


def _digit(index=0):
    """A real handwritten digit (sklearn's bundled set), upsampled to SIZE and coloured, in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    img = torch.tensor(digits.images[index], dtype=torch.float32)[None, None] / 16.0
    img = F.interpolate(img, size=SIZE, mode="bilinear", align_corners=False).clamp(0, 1)
    return torch.cat([img, 0.5 * img + 0.2, 1 - img], 1).clamp(0, 1), torch.tensor([int(digits.target[index])])


def _prior(build=_tiny_net):
    return AttackerPrior("tiny", CLASSES, tuple(map(str, range(CLASSES))), ("a", "b"), SIZE, 3, MEAN, STD,
                         lambda: build(), num_clients=2, hflip=False)


def _wire(before, after, rnd=1, after_round=None, num_samples=None):
    wire = Wire()
    wire.send(Artifact(ArtifactKind.FULL_MODEL, SERVER, client_role("a"), rnd, before))
    wire.send(Artifact(ArtifactKind.FULL_MODEL, client_role("a"), SERVER, after_round or rnd, after))
    if num_samples is not None:
        wire.send(Artifact(ArtifactKind.SCALARS, client_role("a"), SERVER, rnd, {"num_samples": torch.tensor(num_samples)}))
    return wire


def _attack(iters=300, num_images=1):
    return GradInv(RECIPE, GradInvSettings(iters=iters, lr=0.1, tv_weight=3e-5, mean=MEAN, std=STD),
                   num_images=num_images, local_epochs=1, batch_size=32, seed=0)


def _one_step_upload(x, y, dp_noise=None):
    """The victim's state before and after one real torch.optim.SGD step on (x, y); with ``dp_noise``,
    an Opacus DP-SGD step (per-sample clip 1, that noise multiplier, expected batch 1)."""
    model = _tiny_net()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    victim = copy.deepcopy(model)
    sgd = torch.optim.SGD(victim.parameters(), lr=RECIPE.lr, momentum=RECIPE.momentum, weight_decay=RECIPE.weight_decay)
    if dp_noise is None:
        net, opt = victim, sgd
    else:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        with warnings.catch_warnings():  # opacus warns about secure RNG; a seeded generator is the point here
            warnings.simplefilter("ignore")
            net = GradSampleModule(victim)
            opt = DPOptimizer(sgd, noise_multiplier=dp_noise, max_grad_norm=1.0, expected_batch_size=1,
                              generator=torch.Generator().manual_seed(0))
    loss = F.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return before, {k: v.detach().clone() for k, v in victim.state_dict().items()}


def _invert(before, after):
    (out,) = _attack().run(_wire(before, after).view(SERVER), _prior(), "a", torch.device("cpu"))
    assert out.info["status"] == "attacked", out.info
    return out


def _fidelity(images, truth01):
    unit = (images * 0.5 + 0.5).clamp(0, 1)
    return float(psnr(unit, truth01)[0]), float(ssim(unit, truth01)[0])


# -- acceptance --------------------------------------------------------------------


def test_one_sgd_step_on_one_image_gives_the_image_and_its_label_back():
    truth01, y = _digit(0)
    before, after = _one_step_upload((truth01 - 0.5) / 0.5, y)
    out = _invert(before, after)
    attack, control = _fidelity(out.images, truth01), _fidelity(out.control_images, truth01)
    print(f"\none step, one image: attack PSNR {attack[0]:.1f} dB SSIM {attack[1]:.3f}; "
          f"control PSNR {control[0]:.1f} dB SSIM {control[1]:.3f}; cosine {out.info['cosine']}")
    assert out.targets.tolist() == y.tolist()
    assert attack[0] >= PSNR_THRESHOLD_DB, attack
    assert control[0] < PSNR_THRESHOLD_DB - 15, control  # the random update carries no image
    assert out.info["local_steps"]["simulated"] == 1 and out.info["batch_matching"]


@pytest.mark.filterwarnings("ignore:Full backward hook")  # opacus' hooks on an input that needs no gradient
def test_dp_sgd_noise_drops_the_reconstruction_to_its_control():
    truth01, y = _digit(0)
    x = (truth01 - 0.5) / 0.5
    # Clipping alone does not protect: the cosine ignores the update's scale.
    clipped = _fidelity(_invert(*_one_step_upload(x, y, dp_noise=0.0)).images, truth01)
    noisy = _invert(*_one_step_upload(x, y, dp_noise=1.0))
    attack, control = _fidelity(noisy.images, truth01), _fidelity(noisy.control_images, truth01)
    print(f"\nDP-SGD: clip only {clipped[0]:.1f} dB; clip + noise 1.0: attack {attack[0]:.1f} dB, "
          f"control {control[0]:.1f} dB")
    assert clipped[0] >= PSNR_THRESHOLD_DB, clipped
    assert attack[0] <= control[0] + DP_MARGIN_DB, (attack, control)
    assert attack[0] < PSNR_THRESHOLD_DB - 15, attack


# -- the engine ----------------------------------------------------------------------


def test_simulate_update_matches_two_real_sgd_steps_with_momentum_and_weight_decay():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, CLASSES))
    x, y = torch.randn(6, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    recipe = LocalRecipe(lr=0.1, momentum=0.9, weight_decay=0.01, steps=2, batch_size=3)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params, buffers = split_state(model, state)
    simulated = simulate_update(model, params, buffers, x, y, recipe)
    assert torch.equal(model.state_dict()["1.running_mean"], state["1.running_mean"])  # buffers untouched
    real = copy.deepcopy(model).train()
    opt = torch.optim.SGD(real.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for idx in (slice(0, 3), slice(3, 6)):  # consecutive batches, as the recipe splits the dummies
        opt.zero_grad()
        F.cross_entropy(real(x[idx]), y[idx]).backward()
        opt.step()
    assert set(simulated) == {k for k, _ in model.named_parameters()}
    for k, p in real.named_parameters():
        torch.testing.assert_close(simulated[k], p.detach() - state[k], rtol=1e-5, atol=1e-5)
    # ... and it is differentiable in the images.
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(sum(d.sum() for d in simulate_update(model, params, buffers, xg, y, recipe).values()), [xg])
    assert g.abs().sum() > 0


def _real_update(model, x, y):
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {k: v.detach() for k, v in simulate_update(model, *split_state(model, state), x, y, RECIPE).items()}


def test_recover_labels_is_exact_for_one_image_and_finds_the_set_of_distinct_classes():
    torch.manual_seed(1)
    x = torch.randn(4, 3, SIZE, SIZE)
    with_bias = _tiny_net(seed=2, width=8)
    no_bias = nn.Sequential(*list(with_bias)[:-1], nn.Linear(8 * 16, CLASSES, bias=False))  # post-ReLU features
    for label in range(CLASSES):
        d = _real_update(with_bias, x[:1], torch.tensor([label]))
        assert recover_labels(d["6.weight"], d["6.bias"], 1, CLASSES).tolist() == [label]
        d = _real_update(no_bias, x[:1], torch.tensor([label]))
        assert recover_labels(d["6.weight"], None, 1, CLASSES).tolist() == [label]
    y = torch.tensor([7, 2, 9, 4])
    d = _real_update(with_bias, x, y)
    assert recover_labels(d["6.weight"], d["6.bias"], 4, CLASSES).tolist() == sorted(y.tolist())
    # Counts follow the update's magnitude: class 3 twice as often as 5 -> 4 of 6 vs 2 of 6.
    assert recover_labels(torch.zeros(CLASSES, 2), torch.tensor([0, 0, 0, 2.0, 0, 1.0, 0, 0, 0, -1]), 6,
                          CLASSES).tolist() == [3, 3, 3, 3, 5, 5]


def test_matched_fidelity_pairs_each_reconstruction_with_a_distinct_record():
    g = torch.Generator().manual_seed(0)
    records = torch.rand(12, 3, 8, 8, generator=g)
    order = torch.tensor([5, 0, 9, 3])
    recon = (records[order] + 0.01 * torch.randn(4, 3, 8, 8, generator=g)).clamp(0, 1)
    m = matched_fidelity(recon, records)  # rectangular: 4 reconstructions, 12 records
    assert m.n == 4 and [j for _, j in m.assignment] == order.tolist()
    assert m.psnr_mean > 35 and m.ssim_best > 0.9
    # Two copies of one record: the second must take another record, so its match is poor.
    twice = matched_fidelity(recon[[0, 0]], records)
    assert len({j for _, j in twice.assignment}) == 2 and twice.psnr_best > 35 > twice.psnr_mean


# -- the attack on the wire ------------------------------------------------------------


def test_attack_reports_what_it_needs_when_it_cannot_run():
    before = _tiny_net().state_dict()
    after = {k: v + 0.01 for k, v in before.items()}
    cpu = torch.device("cpu")
    (stale,) = _attack(iters=1).run(_wire(before, after, rnd=2, after_round=1).view(SERVER), _prior(), "a", cpu)
    assert stale.info["status"] == "not applicable" and "round 2" in stale.info["reason"]
    (client,) = _attack(iters=1).run(_wire(before, after).view(client_role("b")), _prior(), "a", cpu)
    assert client.info["status"] == "not applicable" and "--attacker server" in client.info["reason"]
    wire = Wire()
    wire.send(Artifact(ArtifactKind.PARTIAL_MODEL, client_role("a"), SERVER, 1, after))
    (partial,) = _attack(iters=1).run(wire.view(SERVER), _prior(), "a", cpu)
    assert "no full_model upload from client:a (it uploaded partial_model)" in partial.info["reason"]
    assert "no full_model broadcast" in partial.info["reason"]
    (ok,) = _attack(iters=1, num_images=3).run(_wire(before, after, num_samples=100).view(SERVER), _prior(), "a", cpu)
    steps = ok.info["local_steps"]
    assert steps == {**steps, "victim": 3, "simulated": 1, "victim_num_samples": 100}  # 1 epoch x floor(100 / 32)
    assert ok.images.shape == ok.control_images.shape == (3, 3, SIZE, SIZE) and ok.targets.shape == (3,)


def test_gradinv_on_a_fedavg_run_is_scored_with_matching_and_a_partial_model_method_is_not_applicable(tiny_run):
    result = tiny_run("fedavg", rounds=1, local_epochs=1, attack="gradinv", inversion_iters=5, inversion_batch=10, judge_steps=40,
                      victim="clean")
    metrics = json.loads((result.run_dir / "metrics.json").read_text())
    entry = metrics["leakage"]["gradinv"]["full_model:update"]["clean"]
    assert entry["status"] == "attacked" and entry["local_steps"]["victim"] >= 1
    matched = entry["metrics"]["matched"]
    for side in ("attack", "control"):
        assert set(matched[side]) == {"psnr_mean", "ssim_mean", "psnr_best", "ssim_best"}
        assert matched[side]["psnr_best"] >= matched[side]["psnr_mean"] > 0
    assert sum(entry["labels"]["counts"]) == 10 and metrics["leakage"]["gradinv"]["settings"]["iters"] == 5
    assert (result.run_dir / entry["image_grid"]).is_file()
    # the stored verdict files the update under the upload it was computed from
    row = next(r for r in metrics["verdict"] if r["row"] == "full_model↑")
    assert row["tier"] != "not_assessed" and any("gradinv" in e["source"] for e in row["evidence"]), row

    # gperxan's upload=partial variant sends partial_model only (its default, the paper's, uploads full_model)
    gperxan = tiny_run("gperxan", rounds=1, local_epochs=1, attack="gradinv", inversion_iters=5, victim="clean",
                       out=str(result.run_dir.parent / "gperxan"), method_option=["upload=partial"])
    skipped = gperxan.metrics["leakage"]["gradinv"]["full_model:update"]["clean"]
    assert skipped["status"] == "not applicable" and "partial_model" in skipped["reason"]


def test_gradinv_is_registered_listed_and_in_all():
    from fedaudit.cli import app

    assert GradInv in get_attacks("all") and get_attacks("gradinv") == [GradInv]
    result = CliRunner().invoke(app, ["list", "attacks"])
    assert result.exit_code == 0 and "gradinv" in result.output
