"""DP-SGD (``--dp-epsilon``): the accountant's ε, what DP reduces, and what it does not cover.

1. The issue's command runs; every client's recorded ε is ≤ the target and equals
   Opacus' RDP accountant for the run's sampling rate, steps and noise.
2. On an overfitting setup, LiRA's TPR at 1% FPR at ε = 1 is lower than without DP.
3. Norm layers DP-SGD cannot train are switched to GroupNorm with a message naming
   them; methods that cannot be privatised are one-line user errors.
4. The coverage table says which shared artifacts ε covers.
5. ``--dp-sweep``: a resumed sweep keeps each client's accountant history and draws the curve.
6. The DP recipe: its defaults apply only under DP and yield to given options; augmentation
   multiplicity clips each record's mean gradient over its views.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import RDPAccountant
from torch import nn
from typer.testing import CliRunner

from fedaudit.attacks.mia.reference_models import inclusion_masks, train_reference_models
from fedaudit.run.results import RunMetrics
from fedaudit.cli import app
from fedaudit.data import load_dataset
from fedaudit.run import run_directory
from fedaudit.run.config import DP_LR_TIMES_NORM, DP_MAX_STEP_FACTOR, DP_NOISE_TO_SIGNAL, DP_RECIPE, resolve
from fedaudit.simulation.dp_accounting import ALPHAS, GAUSSIAN, coverage, noise_for, rdp_epsilon, spent_epsilon
from fedaudit.simulation.dp_sgd import batches_per_epoch
from fedaudit.simulation.recipes import DPSGDRecipe, SGDRecipe
from fedaudit.statistics.gaussian_dp import gaussian_epsilon
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import ArtifactKind
from fedaudit.statistics.membership_statistics import membership_metrics
from fedaudit.attacks.mia.scorers import lira_online, lira_signal

runner = CliRunner()


def test_the_issue_command_records_the_accountants_epsilon(tmp_path):
    """``fedaudit evaluate --method fedavg --model cnn --norm gn --dp-epsilon 8 --attack mia``, shrunk to
    two rounds on 16-px digits and 2 reference models against one victim, and to LiRA alone: what it checks of the
    attack is that the references trained as the victim did (the domain twins ``mia`` also trains are federations
    without a domain, held by tests/test_mia.py)."""
    result = runner.invoke(app, ["evaluate", "--method", "fedavg", "--model", "cnn", "--norm", "gn", "--dp-epsilon", "8",
                                 "--attack", "mia-lira", "--dataset", "digits", "--image-size", "16", "--rounds", "2",
                                 "--local-epochs", "1", "--reference-models", "2", "--victim", "clean",
                                 "--device", "cpu", "--quiet", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run_dir = next(tmp_path.iterdir())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    dp = metrics["privacy"]["dp"]
    assert dp["epsilon_target"] == 8 and dp["delta"] == 1e-5 and dp["accountant"] == "tight"
    assert set(dp["clients"]) == set(metrics["source_domains"])
    assert dp["noise_to_signal_target"] == DP_NOISE_TO_SIGNAL  # the recipe's, as no batch size was given
    for domain, c in dp["clients"].items():
        per_epoch = batches_per_epoch(c["records"], c["batch_size"])
        assert c["sample_rate"] == 1 / per_epoch
        assert c["step_factor"] == 1  # ε = 8 on 16-px digits: no batch meets the noise target, no extra steps
        assert c["steps"] == c["planned_steps"] == 2 * per_epoch  # 2 rounds × 1 epoch of Poisson batches
        opacus = RDPAccountant()
        opacus.history = [(c["noise_multiplier"], c["sample_rate"], c["steps"])]
        assert math.isclose(c["epsilon_rdp"], opacus.get_epsilon(1e-5, alphas=ALPHAS), rel_tol=1e-9), domain
        assert 7.99 < c["epsilon_spent"] <= 8.0, domain  # the noise is the smallest that meets the target
        # full batches (q = 1): ε is the composed Gaussian's, exactly; RDP's bound on the same σ is looser
        assert c["sample_rate"] == 1.0 and c["accountant"] == GAUSSIAN
        mu = math.sqrt(c["steps"]) / c["noise_multiplier"]
        assert math.isclose(c["epsilon_spent"], gaussian_epsilon(mu, 1e-5), rel_tol=1e-9)
        assert c["epsilon_rdp"] > 1.05 * c["epsilon_spent"]
    mia = metrics["leakage"]["mia"]
    assert "DPSGDRecipe" in mia["lira_online"]["global_model"]["clean"]["reference"]["recipe"]  # references trained as the victim was
    assert metrics["provenance"]["config"]["norm"] == "gn"


def test_methods_that_cannot_be_privatised_are_user_errors():
    for method, needle in (("gperxan", "BatchNorm"), ("fedgala", "contrasts"), ("fedsb", "MixStyle"), ("fedlsi", "BatchNorm1d")):
        result = runner.invoke(app, ["evaluate", "--method", method, "--dp-epsilon", "8", "--dataset", "digits", "--quiet"])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and needle in result.output and "drop --dp-epsilon" in result.output
    for args, needle in ((["--dp-epsilon", "0"], "--dp-epsilon"), (["--dp-epsilon", "8", "--dp-delta", "0.5"], "--dp-delta"),
                         (["--dp-epsilon", "8", "--precision", "bf16"], "fp32")):
        result = runner.invoke(app, ["evaluate", *args, "--dataset", "digits", "--quiet"])
        assert result.exit_code == 2 and needle in result.output, result.output


def test_delta_must_be_below_one_over_n(tmp_path):
    result = runner.invoke(app, ["evaluate", "--dp-epsilon", "8", "--dp-delta", "0.01", "--dataset", "digits",
                                 "--image-size", "16", "--rounds", "1", "--quiet", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "1/n" in result.output, result.output


def test_coverage_says_what_epsilon_covers():
    rows = {(r.artifact, r.direction): r for r in coverage((
        (ArtifactKind.FULL_MODEL, "up"), (ArtifactKind.STYLE_BANK, "up"), (ArtifactKind.BN_STATS_ALL_LAYERS, "up"),
        (ArtifactKind.AMPLITUDE_BANK, "down"), (ArtifactKind.SCALARS, "up")))}
    assert rows[("full_model", "up")].covered
    for key in (("style_bank", "up"), ("bn_stats_all_layers", "up"), ("amplitude_bank", "down"), ("scalars", "up")):
        assert not rows[key].covered and rows[key].why, key


def test_ccst_under_dp_switches_to_group_norm_and_flags_its_style_bank(tiny_run, caplog):
    """The default --norm bn is switched to gn with the rejected layers named; CCST's style bank
    (feature statistics computed outside DP-SGD) is reported as not covered."""
    result = tiny_run("ccst", rounds=1, local_epochs=1, dp_epsilon=20.0)
    assert "training with --norm gn" in caplog.text and "BatchNorm2d" in caplog.text
    assert json.loads((result.run_dir / "config.json").read_text())["config"]["norm"] == "gn"
    rows = {(r["artifact"], r["direction"]): r["covered"] for r in result.metrics["privacy"]["coverage"]}
    assert RunMetrics.from_json(result.metrics).to_json() == result.metrics  # DP-SGD's typed block reads back whole
    assert rows[("style_bank", "up")] is False and rows[("full_model", "up")] is True


def test_the_rdp_noise_search_over_orders_near_the_best_integer_one_finds_the_full_searchs_sigma():
    """rdp_noise_for searches the integer orders first and then only the orders within 1 of the best (and, where
    the best is the smallest, the orders near 1): 1.65× faster plan ranking. Opacus' own search over every order
    returns the same σ, to the last bit, on subsampled plans whose best order is small (3.4) and large (17).
    Measured on 100 plans (ε 0.5 … 10⁴, rates 1/16 … 1, the near-1 retry included): no difference."""
    import warnings

    from opacus.accountants.utils import get_noise_multiplier

    from fedaudit.simulation.dp_accounting import ALPHAS_FROM_1_1, rdp_noise_for

    for epsilon, rate, steps in ((8.0, 0.25, 60), (1.0, 1 / 8, 120)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full = get_noise_multiplier(target_epsilon=epsilon, target_delta=1e-5, sample_rate=rate, steps=steps,
                                        accountant="rdp", epsilon_tolerance=0.005, alphas=ALPHAS_FROM_1_1)
        assert rdp_noise_for(epsilon, 1e-5, rate, steps) == float(full)


def test_the_tight_accountant_is_exact_where_a_closed_form_exists_and_never_above_rdp():
    """q = 1: T Gaussian steps at σ are one Gaussian mechanism with μ = √T/σ, whose ε is exact (δ(ε) solved); the
    PRV accountant must sit above it by no more than twice its stated error, and every tight ε must sit at or below RDP's bound."""
    from scipy.stats import norm

    from fedaudit.simulation.dp_accounting import PRV_EPS_ERROR, prv_epsilon

    eps = gaussian_epsilon(3 / 1.913, 1e-5)  # the recipe's σ at ε = 8 under RDP, 9 full-batch steps
    assert round(eps, 2) == 7.44 and round(rdp_epsilon([(1.913, 1.0, 9)], 1e-5), 2) == 8.00
    mu = 3 / 1.913
    assert math.isclose(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2), 1e-5, rel_tol=1e-6)
    for sigma, steps in ((1.913, 9), (11.2, 9), (0.8, 30), (5.0, 400)):
        exact = gaussian_epsilon(math.sqrt(steps) / sigma, 1e-5)
        assert spent_epsilon([(sigma, 1.0, steps)], 1e-5) == pytest.approx(exact, abs=1e-9)
        prv = prv_epsilon([(sigma, 1.0, steps)], 1e-5)
        assert exact - 1e-6 <= prv <= exact + 2 * PRV_EPS_ERROR, (sigma, steps, prv, exact)  # measured +0.010–0.012
        assert exact < rdp_epsilon([(sigma, 1.0, steps)], 1e-5)
    for history in ([(1.0, 0.1, 300)], [(0.909, 32 / 225, 42)], [(3.75, 32 / 225, 42), (2.0, 1.0, 3)]):
        assert spent_epsilon(history, 1e-5) <= rdp_epsilon(history, 1e-5) + 1e-12
    # the name stored beside ε says which accountant gave it: PRV for subsampled steps, RDP past the PRV's reach
    from fedaudit.simulation.dp_accounting import PRV, RDP, TIGHT_MAX_EPSILON, accountant_name

    assert accountant_name([(0.909, 32 / 225, 42)], 1e-5) == PRV
    weak = [(0.1656, 32 / 225, 42)]  # ε ≈ 300
    assert rdp_epsilon(weak, 1e-5) > TIGHT_MAX_EPSILON and accountant_name(weak, 1e-5) == RDP
    assert spent_epsilon(weak, 1e-5) == rdp_epsilon(weak, 1e-5)
    # σ chosen by the tight accountant: ε = 8 met with 6% less noise than RDP's σ for the same steps
    sigma = noise_for(8.0, 1e-5, 1.0, 9)
    assert 7.99 < spent_epsilon([(sigma, 1.0, 9)], 1e-5) <= 8.0 and sigma < 0.95 * 1.9135


def test_noise_is_planned_for_every_step_of_every_round():
    sigma = noise_for(4.0, 1e-5, 0.1, 300)
    assert spent_epsilon([(sigma, 0.1, 300)], 1e-5) <= 4.0
    assert spent_epsilon([(sigma * 0.97, 0.1, 300)], 1e-5) > 4.0 - 0.05  # and not much more than needed


# -- 2. what DP reduces: LiRA on an overfit MLP ----------------------------------------------


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10))


def lira_on_overfit_mlp(recipe: SGDRecipe) -> dict:
    """The overfitting setup of tests/test_membership.py (8-px digits, 400 members, 400 holdouts),
    with the target and its 8 reference models all trained with ``recipe``."""
    ds = load_dataset("digits", 16)
    x = F.avg_pool2d(torch.cat([ds.images[d] for d in ds.domains]).float(), 2).round().to(torch.uint8)
    y = torch.cat([ds.labels[d] for d in ds.domains])
    pool = torch.randperm(y.numel(), generator=torch.Generator().manual_seed(0))[:800]
    member = torch.arange(800) < 400
    prep = Preprocess(ds.mean, ds.std, torch.device("cpu"), hflip=False)
    masks = inclusion_masks(800, 8, torch.Generator().manual_seed(1))
    ref = train_reference_models(mlp, x[pool], y[pool], masks, recipe, preprocess=prep, seed=1, path="sequential")
    torch.manual_seed(123)
    model = mlp()
    recipe(model, x[pool[member]], y[pool[member]], prep, torch.Generator().manual_seed(123))
    with torch.no_grad():
        model.eval()
        phi = lira_signal(model(prep(x[pool])), y[pool])
    scores = lira_online(phi, lira_signal(ref.logits, y[pool]), masks)
    return membership_metrics(scores[member], scores[~member])


@pytest.mark.slow  # suite budget (16 s): a measured effect; the default suite keeps DP-SGD's end-to-end canary checks
def test_dp_at_epsilon_1_lowers_liras_tpr_at_low_fpr():
    """Measured (8 reference models): without DP LiRA's TPR at 1% FPR is 0.09 (AUC 0.76); at ε = 1
    (clipping 1) it falls to the FPR itself (0.0075, AUC 0.49). The test asks for a strictly lower
    TPR and an AUC no longer clearly above 0.5."""
    torch.set_num_threads(1)
    plain = SGDRecipe(epochs=30, batch_size=64, lr=0.05, momentum=0.9, weight_decay=0.0, augment=False)
    steps = plain.epochs * batches_per_epoch(400, plain.batch_size)
    sigma = noise_for(1.0, 1e-5, 1 / batches_per_epoch(400, plain.batch_size), steps)
    private = DPSGDRecipe(**vars(plain), noise_multiplier=sigma, max_grad_norm=1.0)
    without = lira_on_overfit_mlp(plain)
    with_dp = lira_on_overfit_mlp(private)
    print("no DP", without["auc"], without["tpr_at_fpr"]["0.01"], "| ε=1", with_dp["auc"], with_dp["tpr_at_fpr"]["0.01"])
    assert with_dp["tpr_at_fpr"]["0.01"]["tpr"] < without["tpr_at_fpr"]["0.01"]["tpr"]
    assert with_dp["auc"] < 0.6 < without["auc"]
    # The verdict's rules on the same scores: a finding without DP, never one at ε = 1 (issue 14, 1c).
    from fedaudit.audit.verdict import judge

    def tier(entry: dict) -> str:
        metrics = {"communication": {"declared": []}, "leakage": {"mia": {"lira_online": {"global_model": {"v": entry}}}}}
        return judge(metrics, {"attacker": "server"})[0]["tier"]

    assert tier(without) in ("medium", "high")
    assert tier(with_dp) in ("low", "inconclusive")


# -- the sweep ----------------------------------------------------------------------------


def test_dp_sweep_resumes_with_the_accountants_history_and_draws_the_curve(tmp_path):
    """``--dp-sweep 20,inf`` cut off after round 1 of the private point and resumed from the sweep folder:
    each client's accountant holds both rounds' steps (its ε is theirs, not one round's); the ∞ point
    trains with the norm the private point resolved to; only then is the sweep complete."""
    import pytest

    from fedaudit.sweeps.dp_sweep import sweep_dp

    class Stop(KeyboardInterrupt):  # an interruption: a sweep records a point's errors, but stops on these
        pass

    def stop_after_first_private_round(fed, rnd):
        if fed.cfg.dp_epsilon is not None and rnd == 1:
            raise Stop

    with pytest.raises(Stop):
        sweep_dp([20.0, None], "fedavg", dataset="digits", image_size=16, rounds=2, local_epochs=1, device="cpu", attack="none",
                 out=str(tmp_path), on_round_end=stop_after_first_private_round)
    root = next(tmp_path.iterdir())
    assert not run_directory.is_complete(root) and not (root / "sweep.html").exists()
    result = runner.invoke(app, ["evaluate", "--resume", str(root), "--quiet"])
    assert result.exit_code == 0, result.output
    assert run_directory.is_complete(root)
    dirs = [next((root / "points" / name).iterdir()) for name in ("dp_epsilon=20.0", "dp_epsilon=none")]
    assert [json.loads((d / "config.json").read_text())["config"]["norm"] for d in dirs] == ["gn", "gn"]
    assert [json.loads((d / "config.json").read_text())["config"]["dp_epsilon"] for d in dirs] == [20.0, None]
    # the private point trains with the DP recipe, the ∞ point with the non-private defaults
    assert [json.loads((d / "config.json").read_text())["config"]["lr"] for d in dirs] == [DP_LR_TIMES_NORM, 0.01]
    for domain, c in json.loads((dirs[0] / "metrics.json").read_text())["privacy"]["dp"]["clients"].items():
        # the batch the recipe chose in round 1 held after the resume: steps are what that batch plans
        assert c["steps"] == c["planned_steps"] == 2 * batches_per_epoch(c["records"], c["batch_size"]), domain
        expected = spent_epsilon([(c["noise_multiplier"], c["sample_rate"], c["steps"])], 1e-5)
        assert math.isclose(c["epsilon_spent"], expected, rel_tol=1e-12) and 19.5 < expected <= 20.0, domain
    html = (root / "sweep.html").read_text()
    assert "Against the DP-SGD ε" in html and "ε 20" in html and "no DP" in html and "NOT covered" in html
    # each point's row: the ε the accountant spent, and where the canary bound would stand
    assert "ε spent (accountant, max over clients)" in html and "no canary audit in this run" in html


def test_an_empty_poisson_batch_is_a_noise_only_step():
    """With a sampling rate that draws no record, every step still adds noise (the accountant counts it)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from fedaudit.simulation.dp_sgd import _PrivateStep

    model = nn.Linear(4, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=10)
    hooks, dp_opt, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0, wrap_model=False,
        noise_generator=torch.Generator().manual_seed(0))
    step = _PrivateStep(dp_opt, None)
    step.zero_grad()
    step.step()  # no backward: an empty batch
    hooks.cleanup()
    moved = [float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before)]
    assert all(m > 0 for m in moved), moved  # noise only, scaled by 1 / expected batch size


def test_the_dp_recipe_sets_defaults_only_under_dp_and_yields_to_given_options():
    from fedaudit.errors import FedauditError

    plain = resolve({})
    private = resolve({"dp_epsilon": 8})
    assert (plain.lr, plain.batch_size) == (0.01, 32)  # no DP: the non-private defaults
    assert private.lr == DP_LR_TIMES_NORM and all(getattr(private, k) == v for k, v in DP_RECIPE.items())
    assert private.dp_noise_to_signal == DP_NOISE_TO_SIGNAL and plain.dp_noise_to_signal is None
    assert resolve({"dp_epsilon": 8, "batch_size": 64}).dp_noise_to_signal is None  # a given batch is used as given
    # the step length is fixed per unit of clipping norm: half the norm, twice the learning rate
    assert resolve({"dp_epsilon": 8, "dp_max_grad_norm": 0.5}).lr == 2 * DP_LR_TIMES_NORM
    # the recipe replaces a method's non-private defaults, but not a config file or an explicit option
    assert resolve({"dp_epsilon": 8}, method_defaults={"quick": {"lr": 0.05}}).lr == DP_LR_TIMES_NORM
    assert resolve({"dp_epsilon": 8, "lr": 0.03}).lr == 0.03
    assert resolve({}, {"dp_epsilon": 8, "batch_size": 16}).batch_size == 16
    assert resolve({"dp_epsilon": 8, "dp_recipe": False}).lr == plain.lr
    # views need augmentation: the default multiplicity falls to 1 without it, a given one is an error
    assert resolve({"dp_epsilon": 8, "augment": False}).dp_augmentations == 1
    try:
        resolve({"dp_epsilon": 8, "augment": False, "dp_augmentations": 2})
    except FedauditError as exc:
        assert "--no-augment" in str(exc)
    else:
        raise AssertionError("--dp-augmentations 2 with --no-augment was accepted")
    # more steps only within a noise target: the recipe's factor goes with a given batch; a given one needs a target
    assert private.dp_max_step_factor == DP_MAX_STEP_FACTOR > 1 and plain.dp_max_step_factor == 1
    assert resolve({"dp_epsilon": 8, "batch_size": 64}).dp_max_step_factor == 1
    assert resolve({"dp_epsilon": 8, "local_epochs": 6}).dp_max_step_factor == 1  # given epochs are as given
    assert resolve({"dp_epsilon": 8, "batch_size": 64, "dp_noise_to_signal": 1.0}).dp_max_step_factor == 1
    assert resolve({"dp_epsilon": 8, "local_epochs": 6, "dp_max_step_factor": 2}).dp_max_step_factor == 2
    try:
        resolve({"dp_epsilon": 8, "batch_size": 64, "dp_max_step_factor": 2})
    except FedauditError as exc:
        assert "--dp-noise-to-signal" in str(exc)
    else:
        raise AssertionError("--dp-max-step-factor 2 without a noise target was accepted")


def test_none_on_the_command_line_turns_a_recipe_option_off():
    """`--dp-noise-to-signal none` is the documented way to keep --batch-size and --lr as given under the
    recipe; an absent flag (None) lets the recipe decide, the word `none` must not."""
    from fedaudit.cli import parsed_options

    given = parsed_options({"dp_epsilon": "8", "dp_noise_to_signal": "none", "lr": None}, None)
    cfg = resolve(given)
    assert cfg.dp_epsilon == 8 and cfg.dp_noise_to_signal is None and cfg.dp_max_step_factor == 1
    assert cfg.lr == DP_LR_TIMES_NORM  # the rest of the recipe stands
    assert resolve(parsed_options({"dp_epsilon": "none"}, None), {"dp_epsilon": 8}).dp_epsilon is None
    # a config file's "none" is the same word: None over the recipe, not text that fails later
    from_file = resolve({"dp_epsilon": 8}, {"dp_noise_to_signal": "none"})
    assert from_file.dp_noise_to_signal is None and from_file.dp_max_step_factor == 1
    assert resolve({}, {"dp_epsilon": "none"}).dp_epsilon is None


def test_augmentation_multiplicity_clips_each_records_mean_gradient():
    """Two views per record: the update is the clipped *mean over views* of each record's gradient,
    summed and scaled by the batch size — not the mean of separately clipped views."""
    from fedaudit.simulation.dp_sgd import new_engine, private_steps

    torch.manual_seed(0)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 0, 1])
    shifts = torch.randn(2, 4) * 3  # view 0 and view 1 of every record
    model = nn.Linear(4, 2, bias=False)
    w0 = model.weight.detach().clone()
    norm = 0.1  # small enough that every record is clipped

    def run(optimizer, batches):
        for idx in batches:
            views = torch.arange(idx.numel()) % 2  # a record's copies come in a row
            loss = F.cross_entropy(model(x[idx] + shifts[views]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return torch.zeros(()), 1

    private_steps(model, torch.optim.SGD(model.parameters(), lr=1.0), records=6, batch_size=6, steps=1,
                  noise_multiplier=0.0, max_grad_norm=norm, engine=new_engine(), sampler_seed=0,
                  noise_generator=torch.Generator().manual_seed(0), run=run, augmentations=2)

    def grad(i, v):
        w = w0.clone().requires_grad_(True)
        F.cross_entropy((x[i] + shifts[v]) @ w.T, y[i]).backward()
        return w.grad

    def clip(g):
        return g * min(1.0, norm / (float(g.norm()) + 1e-6))

    mean_then_clip = sum(clip((grad(i, 0) + grad(i, 1)) / 2) for i in range(6)) / 6
    clip_then_mean = sum((clip(grad(i, 0)) + clip(grad(i, 1))) / 2 for i in range(6)) / 6
    assert torch.allclose(w0 - model.weight.detach(), mean_then_clip, atol=1e-6)
    assert not torch.allclose(mean_then_clip, clip_then_mean, atol=1e-4)  # the test tells the two apart


def test_dp_train_head_trains_only_the_head_and_says_so_in_the_coverage():
    from fedaudit.models import build_model
    from fedaudit.simulation.dp_sgd import freeze_for_dp, new_engine, private_steps

    model = build_model("cnn", 10, 16, norm="gn")
    head = sum(p.numel() for p in model.head.parameters())
    last = sum(p.numel() for p in model.encoder.blocks[-1].parameters())
    total = sum(p.numel() for p in model.parameters())
    assert freeze_for_dp(build_model("cnn", 10, 16, norm="gn"), "last") == {
        "trained_parameters": head + last, "frozen_parameters": total - head - last}
    assert freeze_for_dp(model, "head") == {"trained_parameters": head, "frozen_parameters": total - head}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 10

    def run(optimizer, batches):
        for idx in batches:
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return torch.zeros(()), 1

    private_steps(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0), records=8,
                  batch_size=8, steps=2, noise_multiplier=1.0, max_grad_norm=1.0, engine=new_engine(), sampler_seed=0,
                  noise_generator=torch.Generator().manual_seed(0), run=run)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("encoder."))
    assert not torch.equal(before["head.weight"], after["head.weight"])
    full = coverage(((ArtifactKind.FULL_MODEL, "up"),), "head")[0]
    assert full.covered and "--dp-train head" in full.why and "public initialisation" in full.why


def test_dp_train_head_on_pretrained_features_keeps_them_through_the_rounds(tiny_run, tmp_path):
    """The fewer-parameters route (Tramèr & Boneh 2021) from the command's options: `--pretrained` features
    stay as loaded through every DP-SGD round, only the head moves, and privacy.dp counts the head
    alone as trained (the noise grows as √ of that)."""
    from safetensors.torch import save_file

    from fedaudit.models import build_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)  # "public" weights: not the run's own seeded init
        public = build_model("cnn", 10, 16, norm="gn").state_dict()
    backbone = {k: v.contiguous() for k, v in public.items() if k.startswith("encoder.")}
    save_file(backbone, str(tmp_path / "public.safetensors"))
    models = {}

    def keep(fed, rnd):
        models[rnd] = {k: v.detach().clone() for k, v in fed.model.state_dict().items()}

    result = tiny_run("fedavg", rounds=2, local_epochs=1, norm="gn", dp_epsilon=8.0, dp_train="head",
                      pretrained=str(tmp_path / "public.safetensors"), on_round_end=keep)
    dp = result.metrics["privacy"]["dp"]
    assert dp["trained"] == "head"
    assert dp["trained_parameters"] == sum(v.numel() for k, v in public.items() if k.startswith("head."))
    assert set(models) == {1, 2}
    for rnd, state in models.items():  # to the float rounding of averaging identical uploads (~1e-8)
        assert all(torch.allclose(state[k], v, rtol=0, atol=1e-6) for k, v in backbone.items()), rnd
    assert (models[1]["head.weight"] - models[2]["head.weight"]).abs().max() > 1e-3


def test_the_privacy_utility_table_puts_the_canary_bound_beside_each_point(tmp_path):
    """sweep.html's table: per ε, the accountant's ε (the worst client) beside the canary audit's lower bound
    and the accuracies; a point without a canary audit says so instead of showing nothing."""
    from fedaudit.reports.load import Unit
    from fedaudit.reports.render import dp_curve_section

    def unit(eps, bound):
        dp = None if eps is None else {"epsilon_target": eps, "clients": {"a": {"epsilon_spent": eps - 0.01},
                                                                           "b": {"epsilon_spent": eps - 0.02}}}
        leakage = {} if bound is None else {"canary": {"clean": {
            "epsilon_lower_bound": bound, "confidence": 0.95, "delta": 1e-5, "correct": 30, "guesses": 32,
            "canaries": 64, "target": "final", "epsilon_max_certifiable": 2.7, "epsilon_spent": eps}}}
        metrics = {"method": "fedavg", "dataset": "digits", "target_domain": "textured", "privacy": {"dp": dp},
                   "accuracy": {"source_val": {"mean": 0.5}, "unseen_domain": 0.4,
                                "final_round": {"round": 20, "source_val_mean": 0.45}}, "leakage": leakage}
        return Unit(tmp_path / f"eps-{eps}", {}, metrics, [], [])

    section = dp_curve_section([unit(None, 1.25), unit(8.0, 0.0), unit(1.0, None)])
    rows = dict(section["table"].rows)
    assert list(rows) == ["ε 1", "ε 8", "ε ∞ (no DP)"]  # ascending ε, no DP last
    assert rows["ε 8"][0] == "7.990" and rows["ε ∞ (no DP)"][0] == "no DP"
    assert rows["ε 8"][1].startswith("clean: ε ≥ 0.000 at 95% confidence")
    assert "ε ≥ 1.250" in rows["ε ∞ (no DP)"][1] and "no DP: nothing claimed" in rows["ε ∞ (no DP)"][1]
    assert rows["ε 1"][1].startswith("no canary audit in this run")
    assert rows["ε 8"][2:4] == ["0.500", "0.450"]  # the selected round's source-val beside the last round's


def test_the_recipe_doubles_the_batch_until_the_noise_no_longer_outweighs_the_signal():
    """225 records, the cnn's ~390k parameters, 20 rounds × 3 epochs: at ε = 10,000 the accountant still
    needs σ ≈ 0.07, which on batches of 32 is a noise vector 1.5× the largest signal; with the recipe's
    target 1 it doubles the batch to 64 (0.76). At ε = 8 no batch gets there, and it takes all the records
    (one step per epoch). The step follows the chosen batch's ratio: the clean one up to
    DP_STEP_NOISE_TO_SIGNAL, then shrinking as √(that / ratio)."""
    from fedaudit.run.config import DP_NOISE_TO_SIGNAL, DP_STEP_NOISE_TO_SIGNAL
    from fedaudit.simulation.dp_sgd import choose_batch

    def plan(eps, target, batch=32):
        return choose_batch(225, batch, 3, None, 20, eps, 1e-5, 390_000, target)

    def ratio(p):
        return p.noise_to_signal(390_000)

    assert plan(10_000, None).batch_size == 32 and ratio(plan(10_000, None)) > 1  # no target: as given
    chosen = plan(10_000, DP_NOISE_TO_SIGNAL)
    assert chosen.batch_size == 64 and ratio(chosen) <= DP_NOISE_TO_SIGNAL < ratio(plan(10_000, None, batch=32))
    assert chosen.steps_per_round == 3 * 4 and chosen.sample_rate == 0.25
    eight = plan(8, DP_NOISE_TO_SIGNAL)
    assert eight.batch_size == 225 and eight.sample_rate == 1.0 and ratio(eight) > 10
    # the step shrinks with the noise the batch leaves; without a target it is the clean one, as given
    assert plan(10_000, None).lr_scale == 1.0 and plan(10_000, 0.1).lr_scale == 1.0  # all records: 0.16, below 0.5
    assert math.isclose(chosen.lr_scale, math.sqrt(DP_STEP_NOISE_TO_SIGNAL / ratio(chosen)))
    assert math.isclose(eight.lr_scale, math.sqrt(DP_STEP_NOISE_TO_SIGNAL / ratio(eight)))
    assert eight.lr_scale < chosen.lr_scale < 1  # more noise, a smaller step


def test_where_a_batch_meets_the_target_the_plan_takes_more_steps_within_it():
    """Allowed twice the method's local steps, a plan that meets the noise target looks for more steps still
    within it: the most steps first, and at equal steps the larger batch (less noise per step). Where no
    batch meets the target, more steps would only add noise: the plan is the method's steps on all records.
    (1,000 records, 5 rounds × 1 epoch, ε = 8: small σ-searches; on digits at ε = 10,000 the same rule takes
    batch 128 over two passes, 0.926 against batch 64's 0.859, README.)"""
    from fedaudit.simulation.dp_sgd import choose_batch

    def plan(trained, factor, batch=32, epochs=1, target=1.0):
        return choose_batch(1000, batch, epochs, None, 5, 8.0, 1e-5, trained, target, factor)

    # 2,000 trained parameters: batch 32 meets the target over 32 steps a round; twice the steps at batch 32
    # miss it, and batch 64 over two passes is as many steps with less noise per step: the plan takes it
    one, two = plan(2_000, 1), plan(2_000, 2)
    assert (one.batch_size, one.steps_per_round, one.step_factor) == (32, 32, 1)
    assert (two.batch_size, two.steps_per_round, two.step_factor) == (64, 32, 2)
    assert two.noise_to_signal(2_000) < one.noise_to_signal(2_000) <= 1.0
    passed_over = plan(2_000, 1, epochs=2, target=None)  # batch 32 over 64 steps, as given
    assert passed_over.steps_per_round == 64 and passed_over.noise_to_signal(2_000) > 1.0
    assert two.noise_multiplier > one.noise_multiplier  # more passes cost noise per step, never ε
    assert plan(2_000, 1, target=0.7).batch_size == 64  # a stricter target: a bigger batch
    # a federation's clients keep that plan round after round (the local steps it checks are the method's × 2)
    from types import SimpleNamespace

    from fedaudit.simulation.dp_sgd import PrivateTraining

    cfg = SimpleNamespace(dp_augmentations=1, dp_train="all", dp_epsilon=8.0, dp_delta=1e-5, dp_max_grad_norm=1.0,
                          rounds=5, batch_size=32, dp_noise_to_signal=1.0, dp_max_step_factor=2)
    dp = PrivateTraining(cfg, {0: 1000}, {"trained_parameters": 2_000, "frozen_parameters": 0})
    assert dp.plan(0, 1, None) == two and dp.plan(0, 1, None) == two
    # 5,000: batch 64 meets it over 16 steps, and over 32 too: more steps win
    five = plan(5_000, 2)
    assert (plan(5_000, 1).steps_per_round, five.batch_size, five.steps_per_round) == (16, 64, 32)
    assert five.noise_to_signal(5_000) <= 1.0
    # a method that counts steps (16 a round): more steps at the batch chosen, not a bigger batch (more compute)
    counted = choose_batch(1000, 32, None, 16, 5, 8.0, 1e-5, 5_000, 1.0, 2)
    assert (counted.batch_size, counted.steps_per_round, counted.step_factor) == (64, 32, 2)
    # 10⁷: even all the records leave noise above the signal: the method's steps, as without the factor
    ceiling = plan(10_000_000, 2, batch=1000)
    assert ceiling == plan(10_000_000, 1, batch=1000) and ceiling.noise_to_signal(10_000_000) > 1.0
    assert (ceiling.step_factor, ceiling.steps_per_round) == (1, 1)


def test_each_victims_reference_models_train_with_that_clients_mechanism():
    """Clients of different sizes get different DP-SGD mechanisms at one ε (sampling rate, batch, noise, extra
    passes); the informed attacker's reference models for a victim train with that victim's plan — its
    noise, batch, step and passes (the exposure) — not an average over the clients (no client's mechanism)."""
    from types import SimpleNamespace

    from fedaudit.simulation.dp_sgd import PrivateTraining
    from fedaudit.methods import get_method

    cfg = resolve({"dp_epsilon": 8, "rounds": 5, "local_epochs": 1, "dp_max_step_factor": 2})  # target 1 (recipe)
    big, small = SimpleNamespace(index=0, domain="big"), SimpleNamespace(index=1, domain="small")
    dp = PrivateTraining(cfg, {0: 1000, 1: 400}, {"trained_parameters": 2_000, "frozen_parameters": 0})
    plans = {c.domain: dp.plan(c.index, 1, None) for c in (big, small)}
    method, fed = get_method("fedavg")(cfg), SimpleNamespace(dp=dp)
    recipes = {c.domain: method.reference_recipe(fed, c) for c in (big, small)}
    assert plans["big"].step_factor == 2 and plans["big"].noise_multiplier != plans["small"].noise_multiplier
    for domain, recipe in recipes.items():
        plan = plans[domain]
        assert isinstance(recipe, DPSGDRecipe) and recipe.noise_multiplier == plan.noise_multiplier
        assert recipe.batch_size == plan.batch_size and recipe.lr == cfg.lr * plan.lr_scale
        assert recipe.epochs == 5 * 1 * plan.step_factor  # rounds × local epochs × the plan's passes
        # and the noise is the accountant's for the steps the plan runs
        assert plan.noise_multiplier == noise_for(8.0, 1e-5, plan.sample_rate, plan.steps)
    assert method.reference_recipe(fed, SimpleNamespace(index=2, domain="idle")) is None  # never trained: unknown


def test_the_recipes_smaller_step_is_applied_once_per_optimizer():
    """A method that keeps its optimizer across rounds gets the scaled step every round, not the scale
    compounded round after round."""
    from types import SimpleNamespace

    from fedaudit.simulation.dp_sgd import PrivateTraining

    cfg = SimpleNamespace(dp_augmentations=1, dp_train="all", dp_epsilon=1.0, dp_delta=1e-5, dp_max_grad_norm=1.0,
                          rounds=2, batch_size=4, dp_noise_to_signal=0.5, dp_max_step_factor=1)
    model = nn.Linear(4, 2)
    dp = PrivateTraining(cfg, {0: 8}, {"trained_parameters": 10, "frozen_parameters": 0})
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(8, 4), torch.arange(8) % 2

    def run(optimizer, batches):
        for idx in batches:
            optimizer.zero_grad()
            if idx.numel():
                F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
        return torch.zeros(()), 1

    for rnd in range(2):
        dp.train(model, opt, 0, 1, None, rnd, torch.Generator().manual_seed(rnd), run)
        scale = dp.plans[0].lr_scale
        assert scale < 1 and math.isclose(opt.param_groups[0]["lr"], 0.5 * scale)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")  # Opacus, while it doubles σ
def test_an_epsilon_no_noise_can_meet_is_a_one_line_error():
    """Opacus gives up (σ beyond 10⁶) when no noise reaches the target over the steps; the user gets the
    ε, steps and rate named and what to change, not Opacus' ValueError."""
    from fedaudit.errors import FedauditError

    with pytest.raises(FedauditError, match=r"--dp-epsilon 0\.0001 cannot be met over 1000 steps .*raise --dp-epsilon"):
        noise_for(1e-4, 1e-5, 1.0, 1000)
