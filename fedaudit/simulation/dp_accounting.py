"""The DP accountant fedaudit reports and chooses the noise by: the ε of a history of (noise multiplier, sample rate,
steps) per client — exact for full-batch DP-SGD (composed Gaussian mechanisms), Opacus' PRV accountant for
subsampled steps, RDP's beside it — the noise multiplier that meets a target ε, and the privacy curve a run claims
(what the canary audit tests); and which shared artifacts that ε covers."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.run.config import DP_TRAINED_PARTS
from fedaudit.run.stored import CoverageRow
from fedaudit.simulation.wire import ArtifactKind
from fedaudit.statistics.gaussian_dp import gaussian_epsilon

# The accountant fedaudit reports and chooses σ by: tight, not merely an upper bound. Full-batch DP-SGD (q = 1, the
# recipe at ε ≤ 300 on digits) composes Gaussian mechanisms into one, whose ε is exact in closed form; subsampled
# steps go to Opacus' PRV accountant (Gopi, Lee & Wutschitz 2021), an upper bound about PRV_EPS_ERROR above. RDP's ε
# (Mironov 2017) is reported beside it: an upper bound, 7.6% above the exact ε at σ = 1.913 over 9 full-batch steps
# (8.00 vs 7.44) and 7.5% at digits' recipe for ε = 8 (8.60 vs 8.00).
ACCOUNTANT = "tight"
GAUSSIAN, PRV, RDP = "gaussian (exact, q = 1)", "prv", "rdp"
PRV_EPS_ERROR = 0.01
# Above this ε the PRV's discretisation outgrows memory (measured: ε 300 over 1,000 steps at q = 0.14 exhausted
# 8 GB); a guarantee that weak gains nothing from tightness, so there σ and ε are RDP's.
TIGHT_MAX_EPSILON = 100.0
# RDP orders: the accountant's ε is the least over them, so more orders only tighten it. Opacus' defaults run
# 1.1 to 63; large ε with few steps wants higher orders, and very large ε (little noise) orders close to 1:
# at ε = 10,000 on digits (batch 32) the orders below 1.1 cut the σ needed from 0.114 to 0.069.
# The orders near 1 are costly (a slowly converging series each), so the noise search tries them only when the
# best of the others is the smallest (very large ε); elsewhere they never win and the σ is the same, bit for bit.
ALPHAS_NEAR_ONE = [1 + x / 1000.0 for x in range(1, 10)] + [1 + x / 100.0 for x in range(1, 10)]
ALPHAS_FROM_1_1 = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 192, 256, 384, 512]
ALPHAS = ALPHAS_NEAR_ONE + ALPHAS_FROM_1_1
INTEGER_ALPHAS = [a for a in ALPHAS_FROM_1_1 if float(a).is_integer() and a <= 63]  # the first, coarse search
NEAR_ORDERS = 1.0  # the fine search takes the orders this close to the best integer one (0.5 missed one plan in 56)
@functools.lru_cache(maxsize=256)  # pure, and seconds per call: clients of one size, and every batch tried, share it
def noise_for(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier (to 0.05%) whose tight ε (:func:`spent_epsilon`) after ``steps`` is ≤ ``epsilon``.

    The RDP multiplier is an upper end (RDP's ε is an upper bound on the exact one); the tight one lies below it:
    6% lower on digits' recipe at ε = 8 (4.649 against 4.941), 8% at ε = 1 (docs/results/dp_accountant.md).
    Subsampled steps above :data:`TIGHT_MAX_EPSILON` keep RDP's multiplier."""
    sigma_rdp = rdp_noise_for(epsilon, delta, sample_rate, steps)
    if epsilon > TIGHT_MAX_EPSILON and sample_rate < 1.0:  # the closed form reaches any ε; the PRV does not
        return sigma_rdp
    from scipy.optimize import brentq

    def excess(sigma: float) -> float:
        return _exact_or_prv(((sigma, sample_rate, steps),), delta) - epsilon

    lo = sigma_rdp
    while excess(lo) <= 0:  # the tight multiplier is below RDP's: bracket it from beneath
        lo *= 0.8
    sigma = brentq(excess, lo, sigma_rdp, xtol=1e-4 * sigma_rdp)
    while excess(sigma) > 0:  # the root to brentq's tolerance may sit a hair below: step up until ε is met
        sigma = min(sigma * (1 + 2e-4), sigma_rdp)
    return float(sigma)


@functools.lru_cache(maxsize=256)
def rdp_noise_for(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier (to Opacus' tolerance) whose RDP ε after ``steps`` is ≤ ``epsilon``
    (fast: :func:`choose_batch` ranks its candidate plans with it)."""
    from opacus.accountants.utils import get_noise_multiplier

    def search(alphas: list[float]) -> float:
        return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=RDP, epsilon_tolerance=0.005, alphas=alphas))

    # Opacus warns when the best order is at an end of the orders it was given: the coarse and near searches
    # have such ends by design, the final check is over all of ALPHAS_FROM_1_1 and the near-1 retry handles its
    # low end (at ε ≤ 10⁴, the option's top, the best order is inside ALPHAS: 1.006 at 10⁴), so the note is noise.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Optimal order is the (smallest|largest) alpha.*")
        try:
            # Orders between integers cost Opacus a slow series each (90 of them), and orders in the hundreds a long
            # sum: find the best integer order up to 63 first, then search with the orders within 1 of it (all of
            # ALPHAS_FROM_1_1 where it is at 63, the edge). Fewer orders can only raise ε, so the σ found still
            # meets ε under RDP; it matched the full search on all 100 plans tried (ε 0.5 … 10⁴, rates 1/16 … 1;
            # tests/test_dp.py).
            best = privacy_spent([(search(INTEGER_ALPHAS), sample_rate, steps)], delta, INTEGER_ALPHAS)[1]
            near = (ALPHAS_FROM_1_1 if best >= INTEGER_ALPHAS[-1] else
                    [a for a in ALPHAS_FROM_1_1 if abs(a - best) <= NEAR_ORDERS])
            sigma = search(near)
            if privacy_spent([(sigma, sample_rate, steps)], delta, near)[1] == ALPHAS_FROM_1_1[0]:
                # the best order is at the edge: orders nearer 1 may need less noise (the same window, extended)
                sigma = search(ALPHAS_NEAR_ONE + [a for a in ALPHAS_FROM_1_1 if a <= 1 + 2 * NEAR_ORDERS])
            return sigma
        except ValueError as exc:  # Opacus: the target cannot be met with any noise it tries
            raise FedauditError(f"--dp-epsilon {epsilon:g} cannot be met over {steps} steps at sampling rate "
                                f"{sample_rate:.4f} ({exc}); raise --dp-epsilon or train fewer rounds") from None


def privacy_spent(history: list[tuple[float, float, int]], delta: float,
                  alphas: list[float] = ALPHAS) -> tuple[float, float]:
    """The RDP accountant's (ε, best RDP order) for a history of (noise multiplier, sample rate, steps)."""
    from opacus.accountants import create_accountant

    accountant = create_accountant(RDP)
    accountant.history = [tuple(h) for h in history]
    return accountant.get_privacy_spent(delta=delta, alphas=alphas)


def rdp_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """The RDP accountant's ε for a history of (noise multiplier, sample rate, steps): an upper bound."""
    return float(privacy_spent(history, delta)[0]) if history else 0.0


def spent_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """The tight ε for a history of (noise multiplier, sample rate, steps) — the number fedaudit reports:
    exact for full-batch steps (q = 1: the composition of Gaussian mechanisms is one, :func:`gaussian_epsilon`),
    else Opacus' PRV accountant's upper bound (its discretisation error added); RDP's where that is smaller
    or the PRV accountant does not reach (:data:`TIGHT_MAX_EPSILON`)."""
    return _tight(tuple(tuple(h) for h in history), delta)[0] if history else 0.0


def accountant_name(history: list[tuple[float, float, int]], delta: float) -> str:
    """Which accountant gave :func:`spent_epsilon`'s ε for ``history`` at ``delta``."""
    return _tight(tuple(tuple(h) for h in history), delta)[1] if history else GAUSSIAN


@functools.lru_cache(maxsize=1024)
def _tight(history: tuple[tuple[float, float, int], ...], delta: float) -> tuple[float, str]:
    if _full_batch(history):
        return _exact_or_prv(history, delta), GAUSSIAN
    rdp = rdp_epsilon(list(history), delta)
    if rdp > TIGHT_MAX_EPSILON:
        return rdp, RDP
    prv = _exact_or_prv(history, delta)
    return (prv, PRV) if prv <= rdp else (rdp, RDP)


def claimed_curve(history: list[tuple[float, float, int]], delta: float) -> dict[str, Any]:
    """The privacy curve the accountant claims for one record, as a canary audit tests it: full-batch DP-SGD is
    exactly μ-GDP with μ = √(Σ steps / σ²) (the curve behind :data:`GAUSSIAN`'s ε); a subsampled one is claimed
    only as (ε, δ) at the run's δ (its exact curve is not Gaussian)."""
    key = tuple(tuple(h) for h in history)
    if key and _full_batch(key) and math.isfinite(mu := _composed_mu(key)):
        return {"curve": "gaussian", "mu": mu}
    return {"curve": "epsilon_delta", "epsilon": spent_epsilon(history, delta), "delta": delta}


def _full_batch(history: tuple[tuple[float, float, int], ...]) -> bool:
    return all(float(q) == 1.0 for _, q, _ in history)


def _composed_mu(history: tuple[tuple[float, float, int], ...]) -> float:
    """μ of the composed full-batch Gaussian steps: √(Σ steps / σ²) (infinite where a step had no noise)."""
    if any(float(sigma) == 0.0 for sigma, _, _ in history):
        return math.inf
    return math.sqrt(sum(int(n) / float(sigma) ** 2 for sigma, _, n in history))


@functools.lru_cache(maxsize=1024)
def _exact_or_prv(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """The composed Gaussian's exact ε where every step is full-batch, else the PRV accountant's (no RDP guard:
    the noise search calls it many times, and RDP costs as much as PRV here)."""
    if _full_batch(history):
        mu = _composed_mu(history)
        return gaussian_epsilon(mu, delta) if math.isfinite(mu) else math.inf
    return prv_epsilon(list(history), delta)


def prv_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """Opacus' PRV accountant's ε for ``history``: an upper bound on the exact ε (its estimate plus
    :data:`PRV_EPS_ERROR`; measured 0.010–0.012 above the exact ε where a closed form gives it)."""
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [tuple(h) for h in history]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # log(0) at the PRV's domain edge, handled there
        return float(accountant.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))


# Artifacts that are DP-SGD's output (post-processing of the noisy weights) — covered by ε.
COVERED = {
    ArtifactKind.FULL_MODEL: "weights trained with DP-SGD (a model without BatchNorm buffers)",
    ArtifactKind.MODEL_DELTA: "difference of DP-SGD-trained weights",
    ArtifactKind.PARTIAL_MODEL: "a subset of DP-SGD-trained weights",
    ArtifactKind.CLASSIFIER_HEAD: "head weights trained with DP-SGD",
    ArtifactKind.TRANSLATOR: "translator weights trained with DP-SGD",
}
# Artifacts computed from private records outside the optimiser — not covered.
NOT_COVERED = {
    ArtifactKind.BN_STATS_ALL_LAYERS: "running BatchNorm statistics are averages of the records, not DP-SGD output",
    ArtifactKind.GLOBAL_STATS: "aggregated BatchNorm statistics are averages of the records",
    ArtifactKind.STYLE_BANK: "feature means/stds of private images, computed outside DP-SGD",
    ArtifactKind.AMPLITUDE_BANK: "Fourier amplitude spectra of private images, computed outside DP-SGD",
    ArtifactKind.SCALARS: "counts and validation losses are computed from private records outside DP-SGD",
    ArtifactKind.IMPORTANCE: "importance weights are computed from private records outside DP-SGD",
}


def coverage(shares: tuple[tuple[ArtifactKind, str], ...], trained: str = "all") -> list[CoverageRow]:
    """For each (kind, direction) a method sends: whether the DP-SGD ε covers it, and why
    (``trained``: ``--dp-train``; weights it leaves frozen are covered trivially: no record touched them).

    Broadcasts are the server's aggregates of client uploads: covered exactly when what they aggregate is.
    """
    rows = []
    for kind, direction in shares:
        covered = kind in COVERED
        reason = COVERED.get(kind) or NOT_COVERED.get(kind) or "not DP-SGD output"
        if covered and trained != "all":
            reason += (f"; with --dp-train {trained} only {DP_TRAINED_PARTS[trained]} train, the other weights stay at "
                       "their public initialisation (no record touches them)")
        rows.append(CoverageRow.model_validate({"artifact": kind.value, "direction": direction, "covered": covered,
                                                "why": reason}))
    return rows
