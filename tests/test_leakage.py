"""Leakage metrics on constructed inputs, where the right answer is known."""

import math

import pytest
import torch

from fedaudit.audit.identifiability import identifiability_test
from fedaudit.audit.judges import PSNR_CAP_DB, load_lpips, nearest_in_class, psnr, ssim
from fedaudit.audit.scoring import domain_matrix, macro_diagonal
from fedaudit.statistics.intervals import clopper_pearson


def _images(n=6, seed=0, size=16):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g)


def test_psnr_of_identical_images_is_capped_and_of_a_known_error_is_exact():
    a = _images()
    assert torch.all(psnr(a, a) == PSNR_CAP_DB)
    zeros, tenth = torch.zeros(2, 3, 8, 8), torch.full((2, 3, 8, 8), 0.1)
    assert psnr(zeros, tenth) == pytest.approx(torch.tensor([20.0, 20.0]), abs=1e-4)  # mse 0.01 -> 20 dB


def test_ssim_is_one_for_identical_images_symmetric_and_lower_for_noise():
    a, b = _images(seed=0), _images(seed=1)
    assert ssim(a, a) == pytest.approx(torch.ones(6), abs=1e-5)
    assert ssim(a, b) == pytest.approx(ssim(b, a), abs=1e-6)
    noisy = (a + 0.2 * torch.randn_like(a)).clamp(0, 1)
    assert torch.all(ssim(a, b) < ssim(a, noisy)) and torch.all(ssim(a, noisy) < 0.99)


def test_nearest_neighbour_is_searched_within_the_target_class_only():
    refs = torch.stack([torch.zeros(3, 4, 4), torch.full((3, 4, 4), 0.5)])
    ref_y = torch.tensor([0, 1])
    r = torch.zeros(1, 3, 4, 4)  # identical to ref 0, but optimised for class 1
    d, i = nearest_in_class(r, torch.tensor([1]), refs, ref_y)
    assert int(i) == 1 and float(d) == pytest.approx(0.5 * math.sqrt(48))
    d, _ = nearest_in_class(r, torch.tensor([7]), refs, ref_y)
    assert math.isinf(float(d))  # a class without references cannot be judged


def test_identifiability_chance_is_measured_and_a_half_with_unequal_sets():
    """Random images against 225 members and 90 holdouts: a naive nearest-neighbour vote would
    favour members 5/7 of the time; balanced draws bring chance to 1/2 and the test does not fire."""
    g = torch.Generator().manual_seed(0)
    recon, y = torch.rand(40, 3, 8, 8, generator=g), torch.arange(40) % 10
    members, my = torch.rand(225, 3, 8, 8, generator=g), torch.arange(225) % 10
    holdout, hy = torch.rand(90, 3, 8, 8, generator=g), torch.arange(90) % 10
    out = identifiability_test(recon, y, members, my, holdout, hy)
    assert out.chance == pytest.approx(0.5, abs=0.03) and out.per_class["3"] == 9
    assert out.p_value > 0.05 and out.members == 225 and out.nonmembers == 90
    naive = (torch.cdist(recon.flatten(1), members.flatten(1)).min(1).values <
             torch.cdist(recon.flatten(1), holdout.flatten(1)).min(1).values).float().mean()
    assert naive > 0.6  # what balancing fixes


def test_identifiability_p_values_are_calibrated_under_no_signal():
    """Over seeds, random reconstructions are significant at 5% about 5% of the time, not more."""
    hits = 0
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        recon = torch.rand(20, 3, 6, 6, generator=g)
        out = identifiability_test(recon, None, torch.rand(60, 3, 6, 6, generator=g), None,
                                   torch.rand(30, 3, 6, 6, generator=g), None, seed=seed, permutations=200)
        hits += out.p_value <= 0.05
    assert hits <= 5  # 2 expected; 5 or more has probability < 5%


def test_identifiability_finds_copies_of_members_and_not_of_holdouts():
    members, holdout = _images(40, seed=2), _images(40, seed=3)
    y = torch.arange(40) % 4
    hit = identifiability_test(members[:20], y[:20], members, y, holdout, y)
    assert hit.value > 0.7 and hit.p_value < 0.01
    miss = identifiability_test(holdout[:20], y[:20], members, y, holdout, y)
    assert miss.value < 0.3 and miss.p_value > 0.5


def test_identifiability_leaves_out_reconstructions_that_cannot_be_judged():
    members, holdout = _images(6, seed=4), _images(6, seed=5)
    out = identifiability_test(_images(3, seed=6), torch.tensor([0, 1, 7]), members, torch.tensor([0, 0, 0, 1, 1, 1]),
                               holdout, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert out.n == 2 and out.excluded == 1


def test_clopper_pearson_matches_known_values():
    assert clopper_pearson(5, 10) == pytest.approx((0.1871, 0.8129), abs=1e-4)
    assert clopper_pearson(0, 20)[0] == 0.0 and clopper_pearson(0, 20)[1] == pytest.approx(0.1684, abs=1e-4)
    assert clopper_pearson(20, 20)[1] == 1.0
    lo, hi = clopper_pearson(50, 100)
    assert lo < 0.5 < hi and hi - lo < 0.21


def test_domain_matrix_rows_and_macro_diagonal():
    domains = ["a", "b", "c", "d"]
    rows = {"a": torch.tensor([0, 0, 0, 1]), "b": torch.tensor([3, 3, 3, 3])}
    m = domain_matrix(rows, domains)
    assert m == [[0.75, 0.25, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    # One victim sent wholesale to a default domain cannot lift the macro average.
    assert macro_diagonal(m, [0, 1]) == pytest.approx(0.375)


def test_lpips_is_unavailable_without_its_backbone_file_and_names_the_path(tmp_path):
    missing = tmp_path / "alexnet.pth"
    scorer, status = load_lpips(str(missing), torch.device("cpu"))
    assert scorer is None and status.status == "unavailable" and status.looked_for == str(missing)


def test_lpips_loads_a_local_backbone_file(tmp_path):
    import torchvision

    # Random weights here only exercise the loading path; a user-facing number needs the real file.
    path = tmp_path / "alexnet.pth"
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), path)
    scorer, status = load_lpips(str(path), torch.device("cpu"))
    assert status.status == "available"
    a, b = _images(2, seed=4), _images(2, seed=5)
    assert scorer(a, a) == pytest.approx(torch.zeros(2), abs=1e-6)
    assert torch.all(scorer(a, b) > 0)
