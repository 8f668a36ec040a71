"""Membership inference core: signals, LiRA / RMIA scores, ROC statistics, reference models.

1. Golden: a synthetic problem with a closed-form optimum — LiRA's AUC and
   TPR at FPR 1% / 10% match the analytic values.
2. Overfitting: on a small over-trained MLP, LiRA and RMIA find members
   (beating the loss attack at low FPR) and find nothing against a control
   model trained on none of them.
3. The vmapped and sequential reference-model paths give the same logits;
   BatchNorm models and custom recipes fall back to sequential.
4. Inclusion masks are balanced.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import norm
from torch import nn

from fedaudit.attacks.mia import MembershipInference
from fedaudit.attacks.mia.reference_models import inclusion_masks, train_reference_models
from fedaudit.data import load_dataset
from fedaudit.statistics.membership_statistics import auc, auc_null_interval, membership_metrics, roc, tpr_at_fpr
from fedaudit.attacks.mia.scorers import (lira_offline, lira_online, lira_signal, loss_signal, reference_offset, rmia_prob,
                                          rmia_score)
from fedaudit.models import build_model
from fedaudit.simulation.recipes import SGDRecipe
from fedaudit.simulation.training import Preprocess


@pytest.fixture
def one_thread():
    """Tiny models are launch-bound: on a shared 2-core machine a second
    intra-op thread spin-waits (measured 17-30 ms vs 1.9 ms an MLP step)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- 1. golden: Gaussian signals with a known optimum --------------------------------


def gaussian_problem(n_members: int, n_nonmembers: int, n_models: int, delta: float, sigma, seed: int):
    """Per-record signals: OUT ~ N(μ_r, σ_r²), IN ~ N(μ_r + Δ, σ_r²), with μ_r spread wide
    (records differ in difficulty, which only per-record calibration can remove)."""
    g = torch.Generator().manual_seed(seed)
    n = n_members + n_nonmembers
    mu_out = 3.0 * torch.randn(n, generator=g, dtype=torch.float64)
    mu_in = mu_out + delta
    sigma = torch.as_tensor(sigma, dtype=torch.float64).expand(n)
    masks = inclusion_masks(n, n_models, g)
    ref = torch.where(masks, mu_in, mu_out) + sigma * torch.randn(n_models, n, generator=g, dtype=torch.float64)
    member = torch.zeros(n, dtype=torch.bool)
    member[:n_members] = True
    target = torch.where(member, mu_in, mu_out) + sigma * torch.randn(n, generator=g, dtype=torch.float64)
    return target, ref, masks, member


def test_lira_matches_the_analytic_optimum(one_thread):
    """Δ = σ = 1: the optimal test has AUC Φ(Δ/(σ√2)) = 0.760 and TPR(α) = Φ(Δ/σ + Φ⁻¹(α)):
    0.092 at 1%, 0.389 at 10%. With 256 reference models LiRA is within 0.015 of that AUC
    (its standard error here is ~0.005) and each analytic TPR lies inside the measured
    TPR's Clopper–Pearson 95% interval. 40,000 non-members keep the noise of the
    empirical FPR threshold below the members' binomial noise the interval describes."""
    delta = 1.0
    target, ref, masks, member = gaussian_problem(2_000, 40_000, 256, delta, 1.0, seed=0)
    analytic_auc = norm.cdf(delta / math.sqrt(2))
    for score in (lira_online(target, ref, masks, global_variance=True),
                  lira_offline(target, ref, masks, global_variance=True)):
        m = membership_metrics(score[member], score[~member])
        assert m["auc"] == pytest.approx(analytic_auc, abs=0.015)
        for level in (0.01, 0.1):
            point = m["tpr_at_fpr"][f"{level:g}"]
            assert point["resolvable"]
            lo, hi = point["tpr_interval"]
            assert lo <= norm.cdf(delta + norm.ppf(level)) <= hi, (level, point)
    # Without per-record calibration the same signals are nearly useless: the mechanism matters.
    raw = membership_metrics(target[member], target[~member])
    assert raw["auc"] < analytic_auc - 0.1


def test_lira_variance_choice():
    """Below 64 reference models the variance is pooled (spec); with records of
    very different spread, per-record variances must win at 128 models."""
    target, ref, masks, member = gaussian_problem(300, 300, 32, 1.0, 1.0, seed=1)
    assert torch.equal(lira_online(target, ref, masks), lira_online(target, ref, masks, global_variance=True))
    assert torch.equal(lira_offline(target, ref, masks), lira_offline(target, ref, masks, global_variance=True))

    sigma = torch.where(torch.arange(4_000) % 2 == 0, 0.25, 2.0)
    target, ref, masks, member = gaussian_problem(2_000, 2_000, 128, 0.5, sigma, seed=2)
    auc_auto = membership_metrics(*_split(lira_online(target, ref, masks), member))["auc"]
    auc_pooled = membership_metrics(*_split(lira_online(target, ref, masks, global_variance=True), member))["auc"]
    assert auc_auto > auc_pooled + 0.05, (auc_auto, auc_pooled)


def _split(score: torch.Tensor, member: torch.Tensor):
    return score[member], score[~member]


def test_lira_record_without_in_models_gets_a_finite_score():
    target, ref, masks, member = gaussian_problem(50, 50, 8, 1.0, 1.0, seed=3)
    masks[:, 0] = False  # record 0 is OUT for every reference model
    with pytest.warns(UserWarning, match="IN \\(or OUT\\) for no reference model"):
        score = lira_online(target, ref, masks)
    assert torch.isfinite(score).all()


# -- ROC statistics on a hand-computed example ---------------------------------------


def test_tpr_at_fpr_auc_and_advantage_by_hand():
    members, nonmembers = [0.9, 0.8, 0.4], [0.7, 0.3, 0.2, 0.1]
    fpr, tpr, _ = roc(members, nonmembers)
    # Pairs ranked right: 4 + 4 + 3 of 12.
    assert auc(fpr, tpr) == pytest.approx(11 / 12)
    at_zero = tpr_at_fpr(fpr, tpr, 0.2, 3, 4)  # 4 non-members allow no false positive at 20%
    assert (at_zero["tpr"], at_zero["fpr_achieved"], at_zero["true_positives"]) == (pytest.approx(2 / 3), 0.0, 2)
    at_quarter = tpr_at_fpr(fpr, tpr, 0.25, 3, 4)
    assert (at_quarter["tpr"], at_quarter["fpr_achieved"], at_quarter["false_positives"]) == (1.0, 0.25, 1)
    lo, hi = at_quarter["tpr_interval"]
    assert lo == pytest.approx(0.025 ** (1 / 3)) and hi == 1.0  # Clopper–Pearson for 3 of 3
    m = membership_metrics(members, nonmembers, levels=(0.25,))
    assert m["advantage"] == pytest.approx(0.75)  # TPR 1 at FPR 1/4
    assert m["n_members"] == 3 and m["n_nonmembers"] == 4


def test_unresolvable_levels_are_flagged():
    rng = np.random.default_rng(0)
    m = membership_metrics(rng.normal(1, 1, 500), rng.normal(0, 1, 500))
    assert not m["tpr_at_fpr"]["0.001"]["resolvable"]  # needs 10,000 non-members
    assert "0.001" in m["tpr_at_fpr"]["0.001"]["warning"] and "10000" in m["tpr_at_fpr"]["0.001"]["warning"]
    assert not m["tpr_at_fpr"]["0.01"]["resolvable"]  # needs 1,000
    assert m["tpr_at_fpr"]["0.1"]["resolvable"] and m["tpr_at_fpr"]["0.1"]["warning"] == ""
    assert len(m["warnings"]) == 2


def test_roc_is_thinned_for_the_report_and_keeps_the_low_fpr_end():
    import json

    rng = np.random.default_rng(1)
    m = membership_metrics(rng.normal(1, 1, 20_000), rng.normal(0, 1, 20_000))
    json.dumps(m)  # the report writes it as is
    fpr = np.array(m["roc"]["fpr"])
    assert m["roc"]["points"] > 10_000 and len(fpr) <= 201
    assert (fpr[fpr > 0] < 1e-3).sum() >= 5  # a log-log plot from 1e-4 still has points
    assert np.all(np.diff(fpr) >= 0)


# -- signals and RMIA by hand --------------------------------------------------------


def test_signals_are_stable_and_broadcast():
    logits = torch.tensor([[2.0, 1.0, 0.0], [1000.0, 0.0, 0.0]])
    y = torch.tensor([0, 0])
    phi = lira_signal(logits, y)
    assert phi[0].item() == pytest.approx(2.0 - math.log(math.e + 1.0))
    assert phi[1].item() == pytest.approx(1000.0 - math.log(2.0))  # softmax-then-log would give inf
    flipped = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(lira_signal(logits, y, flipped), 0.5 * (phi + lira_signal(flipped, y)))
    stacked = torch.stack([logits, flipped])  # [N, n, C] from reference models
    assert lira_signal(stacked, y).shape == (2, 2)
    assert torch.allclose(loss_signal(logits, y), -F.cross_entropy(logits, y, reduction="none").double())
    assert rmia_prob(logits, y, temperature=2.0)[0].item() == pytest.approx(torch.softmax(logits[0] / 2, 0)[0].item())


def test_rmia_score_by_hand():
    ref_px = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    mask = torch.tensor([[True, False], [False, True]])
    px = torch.tensor([0.9, 0.3])
    ref_pz = torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.2, 0.4]])
    pz = torch.tensor([0.2, 0.3, 0.6])
    # Online: Pr(x) = (0.6, 0.4), ratios (1.5, 0.75); Pr(z) = (0.4, 0.2, 0.4), ratios (0.5, 1.5, 1.5).
    # LR >= 2 needs ratio_z <= ratio_x / 2 = (0.75, 0.375): one of three z, then none.
    assert rmia_score(px, ref_px, mask, pz, ref_pz).tolist() == pytest.approx([1 / 3, 0.0])
    # Offline, a = 0.3: Pr(x) = ½(1.3·Pr_OUT + 0.7) = (0.61, 0.48), ratios (1.475, 0.625);
    # Pr(z) = (0.61, 0.48, 0.61), ratios (0.328, 0.625, 0.984): two of three, then none.
    assert rmia_score(px, ref_px, mask, pz, ref_pz, offline=True).tolist() == pytest.approx([2 / 3, 0.0])


# -- 2. overfitting: real models ------------------------------------------------------


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10))


def test_lira_and_rmia_find_members_of_an_overfit_model_and_nothing_in_a_control(one_thread):
    """All four digits domains at 8 px (1,797 real records): pool of 800 (400 members,
    400 holdout), 400 fresh records, 597 population records (RMIA's z). The target MLP
    trains 30 epochs on the members only (accuracy 0.92 on them, 0.74 on the holdout),
    the control on the fresh records only, 16 reference models on random halves of the
    pool, all with the same recipe.

    Margins: against the target, online LiRA, offline LiRA and RMIA AUC exceed the top of
    the 99% no-signal band (0.553) by 0.1 (measured 0.77 / 0.74 / 0.78, loss 0.64) and
    their TPR at 1% FPR is at least the loss attack's (measured 0.11 / 0.11 / 0.17 vs
    0.01); against the control every attack's AUC stays inside that band (measured
    0.51-0.54)."""
    ds = load_dataset("digits", 16)
    x = F.avg_pool2d(torch.cat([ds.images[d] for d in ds.domains]).float(), 2).round().to(torch.uint8)
    y = torch.cat([ds.labels[d] for d in ds.domains])
    perm = torch.randperm(y.numel(), generator=torch.Generator().manual_seed(0))
    pool, fresh, population = perm[:800], perm[800:1200], perm[1200:]
    member = torch.arange(800) < 400
    prep = Preprocess(ds.mean, ds.std, torch.device("cpu"), hflip=False)
    recipe = SGDRecipe(epochs=30, batch_size=64, lr=0.05, momentum=0.9, weight_decay=0.0, augment=False)

    masks = inclusion_masks(800, 16, torch.Generator().manual_seed(1))
    ref = train_reference_models(mlp, x[pool], y[pool], masks, recipe, preprocess=prep, population=x[population],
                                 seed=1, path="sequential")
    yp, yz = y[pool], y[population]
    ref_phi, ref_px, ref_pz = lira_signal(ref.logits, yp), rmia_prob(ref.logits, yp), rmia_prob(ref.population_logits, yz)
    band = auc_null_interval(400, 400, level=0.99)

    def attack(train_idx: torch.Tensor) -> dict[str, dict]:
        torch.manual_seed(123)
        model = mlp()
        recipe(model, x[train_idx], y[train_idx], prep, torch.Generator().manual_seed(123))
        with torch.no_grad():
            model.eval()
            lp, lz = model(prep(x[pool])), model(prep(x[population]))
        scores = {
            "loss": loss_signal(lp, yp),
            "lira": lira_online(lira_signal(lp, yp), ref_phi, masks),
            "lira_offline": lira_offline(lira_signal(lp, yp), ref_phi, masks),
            "rmia": rmia_score(rmia_prob(lp, yp), ref_px, masks, rmia_prob(lz, yz), ref_pz),
        }
        return {k: membership_metrics(s[member], s[~member]) for k, s in scores.items()}

    target = attack(pool[member])
    for name in ("lira", "lira_offline", "rmia"):
        assert target[name]["auc"] > band[1] + 0.1, (name, target[name]["auc"])
        assert target[name]["tpr_at_fpr"]["0.01"]["tpr"] >= target["loss"]["tpr_at_fpr"]["0.01"]["tpr"], name
    control = attack(fresh)
    for name, m in control.items():
        assert band[0] < m["auc"] < band[1], (name, m["auc"], band)


# -- 3. reference-model paths ---------------------------------------------------------


def tiny_pool(n: int = 24, size: int = 16):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8), torch.randint(0, 10, (n,), generator=g)


def test_vmap_and_sequential_paths_agree_on_a_groupnorm_cnn(one_thread):
    """Same init, same batches, same augmentation draws per model: the logits (and
    the flipped-view logits) agree to float error, and the models did train apart."""
    images, labels = tiny_pool()
    masks = inclusion_masks(24, 3, torch.Generator().manual_seed(0))
    prep = Preprocess((0.5,) * 3, (0.5,) * 3, torch.device("cpu"), hflip=True)
    recipe = SGDRecipe(epochs=2, batch_size=4, lr=0.05)  # augmentation on: shift + flip draws

    def build() -> nn.Module:
        return build_model("cnn", 10, 16, norm="gn")

    seq = train_reference_models(build, images, labels, masks, recipe, preprocess=prep, population=images[:5],
                                 path="sequential")
    fast = train_reference_models(build, images, labels, masks, recipe, preprocess=prep, population=images[:5],
                                  path="vmap")
    assert (seq.path, fast.path) == ("sequential", "vmap")
    assert seq.logits.shape == (3, 24, 10) and seq.flipped is not None and seq.population_flipped is not None
    for a, b in [(seq.logits, fast.logits), (seq.flipped, fast.flipped), (seq.population_logits, fast.population_logits)]:
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    assert (seq.logits[0] - seq.logits[1]).abs().max() > 1e-2  # different models, not one copied
    assert torch.allclose(seq.population_logits, seq.logits[:, :5], atol=1e-5)  # the same records, evaluated alike

    auto = train_reference_models(build, images, labels, masks, recipe, preprocess=prep)
    assert auto.path == "sequential" and "cpu" in auto.reason  # the CPU default


def test_batchnorm_and_custom_recipes_fall_back_to_sequential(one_thread):
    images, labels = tiny_pool()
    masks = inclusion_masks(24, 2, torch.Generator().manual_seed(0))
    prep = Preprocess((0.5,) * 3, (0.5,) * 3, torch.device("cpu"), hflip=False)
    bn = train_reference_models(lambda: build_model("cnn", 10, 16, norm="bn"), images, labels, masks,
                                SGDRecipe(epochs=1, batch_size=4), preprocess=prep, path="vmap")
    assert bn.path == "sequential" and "BatchNorm" in bn.reason and bn.flipped is None

    seen = []

    def custom(model, x, y, preprocess, generator):  # a method's own local loop
        seen.append(x.shape[0])

    out = train_reference_models(mlp_16px, images, labels, masks, custom, preprocess=prep, path="vmap")
    assert out.path == "sequential" and "custom" in out.reason
    assert seen == masks.sum(1).tolist()  # called once per model, on that model's half


def mlp_16px() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))


# -- 4. inclusion masks -------------------------------------------------------------


def test_inclusion_masks_are_balanced():
    masks = inclusion_masks(101, 8, torch.Generator().manual_seed(0))
    assert masks.shape == (8, 101) and masks.dtype == torch.bool
    assert (masks.sum(0) == 4).all()  # every record IN for exactly half the models
    assert set(masks.sum(1).tolist()) == {50, 51}  # every model trains on half the pool
    assert len({tuple(r.tolist()) for r in masks}) == 8  # eight different halves
    odd = inclusion_masks(100, 7, torch.Generator().manual_seed(0))
    assert set(odd.sum(0).tolist()) <= {3, 4} and (odd.sum(1) == 50).all()
    other = inclusion_masks(101, 8, torch.Generator().manual_seed(1))
    assert not torch.equal(masks, other)


def test_lira_calibration_flags_reference_models_that_do_not_stand_in_for_the_target():
    """Reference models whose OUT signals sit where the target's non-members sit are calibrated; a target
    that is two reference spreads more confident on every record (trained longer) is not."""
    from fedaudit.statistics.membership_statistics import lira_calibration

    g = torch.Generator().manual_seed(0)
    n, models = 400, 16
    base = torch.randn(n, generator=g)
    masks = torch.rand(models, n, generator=g) < 0.5
    ref = base + 1.0 * masks + 0.3 * torch.randn(models, n, generator=g)  # IN models +1 on a record
    member = torch.arange(n) < n // 2
    target = base + 1.0 * member + 0.3 * torch.randn(n, generator=g)
    good = lira_calibration(target, ref, masks, member)
    assert good["status"] == "calibrated" and abs(good["out_gap"]) < 0.3 and abs(good["in_gap"]) < 0.3
    longer = lira_calibration(target + 0.6, ref, masks, member)
    assert longer["status"] == "miscalibrated" and longer["out_gap"] > 1 and longer["in_gap"] > 1
    # The attacker's shift, estimated without the truth, takes off what both gaps share; the raw gaps stay stored.
    shifted = lira_calibration(target + 0.6, ref, masks, member, reference_offset(target + 0.6, ref))
    assert shifted["status"] == "calibrated" and abs(shifted["out_gap"]) < 0.3 and abs(shifted["in_gap"]) < 0.3
    assert shifted["raw_out_gap"] == longer["out_gap"] and shifted["raw_in_gap"] == longer["in_gap"]
    assert 1.5 < shifted["shift"] < 2.5  # 0.6 over a spread of ~0.3
    # A shift cannot hide references whose IN and OUT sit apart from the target's members and non-members unequally.
    skewed = lira_calibration(target + 1.2 * member, ref, masks, member, reference_offset(target + 1.2 * member, ref))
    assert skewed["status"] == "miscalibrated"


def test_lira_scores_a_target_less_its_uniform_lift_over_the_references(one_thread):
    """A target uniformly more confident than its references (a rebuilt federation that cannot reproduce the
    others' training exactly) looks like a member everywhere to LiRA online's likelihood ratio, most where a
    record's IN and OUT sit far apart. Taking off the lift the attacker estimates from the unlabelled challenge
    gives back the power of references that stand in for the target; scoring the raw signal loses it."""
    g = torch.Generator().manual_seed(0)
    n, models = 2_000, 16
    base = 2.0 * torch.randn(n, generator=g, dtype=torch.float64)
    effect = 2.0 * torch.rand(n, generator=g, dtype=torch.float64)  # records differ in how much training moves them
    masks = inclusion_masks(n, models, g)
    ref = base + effect * masks + 0.5 * torch.randn(models, n, generator=g, dtype=torch.float64)
    member = torch.rand(n, generator=g) < 0.5
    target = base + effect * member + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    lifted = target + 1.5

    def lira_auc(phi: torch.Tensor) -> float:
        return membership_metrics(*_split(lira_online(phi, ref, masks), member))["auc"]

    calibrated, raw = lira_auc(target), lira_auc(lifted)  # 0.894 and 0.748
    assert abs(reference_offset(lifted, ref) - 1.5) < 0.1
    assert abs(lira_auc(lifted - reference_offset(lifted, ref)) - calibrated) < 0.01
    assert raw < calibrated - 0.05
    # The attack scores that way: LiRA (online and offline) gets φ less the references' shift.
    attack, ref_set = MembershipInference(), {"phi": ref, "masks": masks, "shift": 1.5}
    for key, statistic in (("lira_online", lira_online), ("lira_offline", lira_offline)):
        ours = attack._score(key, {"phi": lifted}, ref_set, None, None)  # type: ignore[arg-type]
        assert torch.equal(ours, statistic(lifted - 1.5, ref, masks))


def test_rmia_scores_the_target_less_the_same_shift_as_lira(one_thread):
    """RMIA's Pr(x|θ) comes from the challenge's logits with the shift taken off the true label's logit: the same
    shifted target LiRA scores (its φ lower by exactly the shift), the population records left as they are."""
    g = torch.Generator().manual_seed(1)
    n, k, c, models = 40, 30, 5, 4
    logits, flipped = torch.randn(n, c, generator=g), torch.randn(n, c, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    shifted, shifted_flip = logits.double().clone(), flipped.double().clone()
    shifted[torch.arange(n), y] -= 0.7
    shifted_flip[torch.arange(n), y] -= 0.7
    assert torch.allclose(lira_signal(shifted, y, shifted_flip), lira_signal(logits, y, flipped) - 0.7)
    assert torch.allclose(rmia_prob(logits, y, flipped_logits=flipped, shift=0.7), rmia_prob(shifted, y, flipped_logits=shifted_flip))

    masks = inclusion_masks(n, models, g)
    ref = {"p_x": torch.rand(models, n, generator=g, dtype=torch.float64), "masks": masks, "shift": 0.7,
           "p_z": torch.rand(models, k, generator=g, dtype=torch.float64)}
    p_z = torch.rand(k, generator=g, dtype=torch.float64)

    class Challenge:
        labels, population_labels = y, torch.zeros(k)

    class Prior:
        label_free = False

    ours = MembershipInference()._score("rmia", {"logits": logits, "flipped": flipped, "p_z": p_z}, ref, Challenge(),  # type: ignore[arg-type]
                                        Prior())  # type: ignore[arg-type]
    expected = rmia_score(rmia_prob(shifted, y, flipped_logits=shifted_flip), ref["p_x"], masks, p_z, ref["p_z"])
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, rmia_score(rmia_prob(logits, y, flipped_logits=flipped), ref["p_x"], masks, p_z, ref["p_z"]))
