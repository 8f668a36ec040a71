"""Differentially private local training: DP-SGD through Opacus.

The unit of privacy is one record of one client's ``train`` split (its
members). Every client is its own mechanism: its local steps in every round
are DP-SGD steps (Poisson sampling, per-sample clipping to
``max_grad_norm``, Gaussian noise) through Opacus' ``PrivacyEngine``, and
one accountant per client composes them over all rounds. The noise
multiplier is chosen once per client, before training, so that the tight
accountant's ε after the last round is at most the target:

    σ = noise_for(ε, δ, q = 1 / batches per epoch, steps = rounds × local steps)

Tight means exact where the steps are full-batch (q = 1: T Gaussian steps
compose into one Gaussian mechanism, μ = √T / σ) and Opacus' PRV accountant
(an upper bound about 0.01 above the exact ε) where they are subsampled; the RDP ε of the same
history is reported beside it (:data:`ACCOUNTANT`).

What the ε covers is what leaves the client as a function of DP-SGD's
output: trained weights (full models, partial models, heads, deltas).
Anything a method computes from the data *outside* the optimiser —
running BatchNorm statistics, style banks, amplitude spectra, validation
losses — is not covered; :func:`coverage` says which artifacts of a method
are which, and the report prints it beside ε.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.run.config import DP_STEP_NOISE_TO_SIGNAL, DP_TRAINED_PARTS
from fedaudit.simulation.gradient_canaries import CanaryGradients, GradientCanaries
from fedaudit.simulation.wire import ArtifactKind
from fedaudit.statistics.gaussian_dp import gaussian_epsilon

if TYPE_CHECKING:
    from fedaudit.run.config import RunConfig

log = logging.getLogger("fedaudit")

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
# Opacus and torch warnings that say nothing about this run: the PRNG note (the summary records
# secure_rng False) and the hook notes on the first layer, whose input needs no gradient.
QUIET = (".*Secure RNG.*", ".*non-full backward hook.*", ".*Full backward hook is firing.*",
         ".*PrivacyEngine detected new dataset object.*")  # one engine per client: each round's loader is the same records


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        for pattern in QUIET:
            warnings.filterwarnings("ignore", message=pattern)
        yield

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


def coverage(shares: tuple[tuple[ArtifactKind, str], ...], trained: str = "all") -> list[dict[str, str]]:
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
        rows.append({"artifact": kind.value, "direction": direction, "covered": covered, "why": reason})
    return rows


def check_supported(cfg: RunConfig, method_cls: type, trainable: Iterable[str]) -> None:
    """Fail early, in one line, when a run cannot be trained with DP-SGD as configured
    (``trainable``: the registered methods that can, named in the fix)."""
    if cfg.dp_epsilon is None:
        return
    reason = getattr(method_cls, "dp_incompatible", "")
    if reason:
        raise FedauditError(f"--dp-epsilon cannot be used with method {method_cls.name}: {reason}; "
                            f"choose one of {', '.join(trainable)}, or drop --dp-epsilon")


def private_config(cfg: RunConfig, method_cls: type, trainable: Iterable[str]) -> RunConfig:
    """With ``--dp-epsilon``: check the method can be trained with DP-SGD (``trainable``: the methods that
    can, named in the fix), and switch the norm layers to GroupNorm when Opacus' validator rejects the
    chosen ones (saying which)."""
    from dataclasses import replace

    from fedaudit.models import build_model

    if cfg.dp_epsilon is None:
        return cfg
    check_supported(cfg, method_cls, trainable)
    from fedaudit.models import is_factory

    bad = unsupported_layers(build_model(cfg.model, 2, cfg.image_size, norm=cfg.norm, model_args=cfg.model_args,
                                         validate=False))  # its layers only: the classes come with the data
    if not bad:
        return cfg
    if is_factory(cfg.model):  # its layers are the factory's: fedaudit cannot swap them
        raise FedauditError(f"DP-SGD cannot train {describe_layers(bad)} of --model {cfg.model}; give a factory whose "
                            "model has none (GroupNorm instead of BatchNorm: Opacus' ModuleValidator.fix does that), or "
                            "drop --dp-epsilon")
    if cfg.norm == "gn":
        raise FedauditError(f"DP-SGD cannot train {describe_layers(bad)} of --model {cfg.model}; choose another --model")
    log.warning("DP-SGD cannot train --norm %s (Opacus' validator rejects %s): training with --norm gn instead",
                cfg.norm, describe_layers(bad))
    return replace(cfg, norm="gn")


def trained_parts(model: nn.Module, which: str) -> list[nn.Module]:
    """The parts of ``model`` that DP-SGD trains under ``--dp-train which`` (all, last, head)."""
    if which == "all":
        return [model]
    head, encoder = getattr(model, "head", None), getattr(model, "encoder", None)
    if not isinstance(head, nn.Module) or not isinstance(encoder, nn.Module):
        raise FedauditError(f"--dp-train {which} needs a model made of an encoder and a head, and this method's "
                            f"{type(model).__name__} is not; use --dp-train all")
    parts = [head]
    if not isinstance(getattr(encoder, "proj", None), (nn.Identity, type(None))):
        parts.append(encoder.proj)  # a projection after the backbone belongs to the trained top
    if which == "last":
        blocks = getattr(encoder, "blocks", None)
        backbone = getattr(encoder, "backbone", None)
        if isinstance(blocks, nn.ModuleList):
            parts.append(blocks[-1])
        elif backbone is not None and isinstance(getattr(backbone, "layer4", None), nn.Module):
            parts.append(backbone.layer4)
        else:
            raise FedauditError(f"--dp-train last does not know the last stage of {type(encoder).__name__}; "
                                "use --dp-train head or all")
    return parts


def freeze_for_dp(model: nn.Module, which: str) -> dict[str, int]:
    """Freeze every weight outside :func:`trained_parts` (they keep their public initialisation: the seed's
    random init or ``--pretrained``); returns the trained and frozen parameter counts."""
    keep = {id(p) for part in trained_parts(model, which) for p in part.parameters()}
    counts = {"trained_parameters": 0, "frozen_parameters": 0}
    for p in model.parameters():
        if id(p) not in keep:
            p.requires_grad_(False)
        counts["trained_parameters" if p.requires_grad else "frozen_parameters"] += p.numel()
    return counts


def unsupported_layers(model: nn.Module) -> list[str]:
    """Opacus' validator, layer by layer: ``"name (Type)"`` for each layer DP-SGD cannot train (BatchNorm, …)."""
    from opacus.validators import ModuleValidator

    found = []
    for name, module in model.named_modules():
        validator = ModuleValidator.VALIDATORS.get(type(module))
        if validator is not None and validator(module):
            found.append(f"{name or 'model'} ({type(module).__name__})")
    return found


def describe_layers(layers: list[str], limit: int = 4) -> str:
    more = f" and {len(layers) - limit} more" if len(layers) > limit else ""
    return ", ".join(layers[:limit]) + more


@dataclass(frozen=True)
class ClientPlan:
    """One client's DP-SGD mechanism: what the accountant is told."""

    records: int
    sample_rate: float  # Poisson inclusion probability per step (1 / batches per epoch, as Opacus sets it)
    steps_per_round: int
    rounds: int
    noise_multiplier: float
    batch_size: int  # the batch the sampling rate comes from (restore fills it in for plans saved without it)
    lr_scale: float = 1.0  # the recipe's step under noise it cannot batch away (choose_batch)
    step_factor: int = 1  # local steps per round as a multiple of the method's (choose_batch, --dp-max-step-factor)

    def noise_to_signal(self, trained: int) -> float:
        """The noise vector's expected norm over the largest mean clipped gradient (the clipping norm) for
        ``trained`` parameters: σ·√trained / expected batch; above 1 noise outweighs any signal in a step."""
        return self.noise_multiplier * math.sqrt(trained) / (self.sample_rate * self.records)

    @property
    def steps(self) -> int:
        return self.steps_per_round * self.rounds


def choose_batch(records: int, batch_size: int, epochs: int | None, steps: int | None, rounds: int, epsilon: float,
                 delta: float, trained: int | None, target: float | None, max_step_factor: int = 1) -> ClientPlan:
    """A client's DP-SGD plan: ``batch_size`` and the method's local steps as given, or with a noise-to-signal
    ``target``:

    1. the batch is the smallest of ``batch_size``, 2×, 4×, …, all ``records`` whose noise-to-signal per step
       σ·√trained / expected batch is at most the target. Larger batches need more noise per step (a higher
       sampling rate) but divide it among more records, and leave fewer steps: at ε = 10,000 on digits batch 64
       (ratio 0.76) beat 32 (1.5), 128 (0.36) and all records (0.16), and at ε = 8 all records (13.7) beat
       every smaller batch — target 1 (noise per step no longer than the largest signal) picks both;
    2. where a batch meets the target, the plan may run up to ``max_step_factor`` × the method's local steps per
       round, at that batch or larger ones (at that batch only for a method that counts steps, where a bigger
       batch is more compute): of the plans still within the target, the one with the most steps, and at equal
       steps the larger batch (less noise per step). A bigger batch leaves fewer steps, and without
       noise fewer steps alone cost digits 0.956 → 0.904 (batch 32 → 64, 3 epochs); at ε = 10,000 this takes
       batch 128 for twice the passes (12 steps a round, ratio 0.49) and scored 0.926 against 0.859 for
       batch 64 at the method's passes (12 steps too, ratio 0.76). Where no batch meets the target (ε ≤ 300
       here) the data is the ceiling, more steps only add noise, and the plan is all records at the method's
       steps;
    3. the step shrinks with the ratio the chosen plan leaves, by √(DP_STEP_NOISE_TO_SIGNAL / ratio) where the
       ratio is above DP_STEP_NOISE_TO_SIGNAL (``lr_scale``): the clean step (0.5 per unit of clipping norm,
       without noise) is best at low noise and a fifth of it at ε = 8 (ratio 13.7), and this is the
       one-parameter curve through both (scripts/dp_recipe_search.py)."""

    def plan_for(batch: int, factor: int) -> ClientPlan:
        q = 1.0 / batches_per_epoch(records, batch)
        per_round = factor * steps_per_round(records, batch, epochs, steps)
        # ranked with RDP's σ (fast, and within 10% of the tight one at every plan); the chosen plan gets the tight σ
        return ClientPlan(records, q, per_round, rounds, rdp_noise_for(epsilon, delta, q, per_round * rounds), batch,
                          step_factor=factor)

    def tight(plan: ClientPlan) -> ClientPlan:
        return dataclasses.replace(plan, noise_multiplier=noise_for(epsilon, delta, plan.sample_rate, plan.steps))

    batches = [min(batch_size, records)]  # the batch, doubled, …, all the records
    while batches[-1] < records:
        batches.append(min(2 * batches[-1], records))
    plan = plan_for(batches[0], 1)
    if target is None or not trained:
        return tight(plan)
    chosen = 0
    while plan.noise_to_signal(trained) > target and chosen + 1 < len(batches):
        chosen += 1
        plan = plan_for(batches[chosen], 1)
    if plan.noise_to_signal(trained) <= target:
        # (a smaller batch misses the target with the method's steps, so with more steps too; a method counting
        # steps keeps its batch: there a bigger one is more compute, not fewer steps)
        larger = batches[chosen:] if steps is None else batches[chosen:chosen + 1]
        more = [(factor * steps_per_round(records, b, epochs, steps), b, factor)
                for b in larger for factor in range(2, max_step_factor + 1)]
        for per_round, b, factor in sorted(more, key=lambda m: (-m[0], -m[1])):  # most steps, then larger batch
            if per_round < plan.steps_per_round:
                break
            if (candidate := plan_for(b, factor)).noise_to_signal(trained) <= target:
                plan = candidate
                break
    plan = tight(plan)
    ratio = plan.noise_to_signal(trained)
    return dataclasses.replace(plan, lr_scale=min(1.0, math.sqrt(DP_STEP_NOISE_TO_SIGNAL / ratio)))


def batches_per_epoch(records: int, batch_size: int) -> int:
    return math.ceil(records / min(batch_size, records))


def steps_per_round(records: int, batch_size: int, epochs: int | None, steps: int | None) -> int:
    """A round's local steps: ``steps`` when the method counts steps, else ``epochs`` passes of batches."""
    return epochs * batches_per_epoch(records, batch_size) if steps is None else steps


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


class _PrivateStep:
    """The optimiser ``train_steps`` sees under DP: ``step`` privatises the batch gradient
    (clip, sum, noise: Opacus' ``DPOptimizer.pre_step``), then lets a method add a
    data-independent term (FedProx's proximal gradient) — post-processing, so ε is unchanged.

    With ``augmentations`` K > 1 each record came K times in a row (K augmented views): the K
    per-sample gradients are averaged into the record's one gradient *before* clipping
    (augmentation multiplicity, De et al. 2022), so a record still contributes at most the
    clipping norm and the accountant's sampling rate is unchanged."""

    def __init__(self, optimizer, after_privatise: Callable[[], None] | None, augmentations: int = 1):
        self.optimizer = optimizer
        self.after_privatise = after_privatise
        self.augmentations = augmentations

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]
        if all(getattr(p, "grad_sample", None) is None for p in params):
            # an empty Poisson batch (no backward ran): a noise-only step, as the accountant assumes
            for p in params:
                p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)
        elif self.augmentations > 1:
            for p in params:
                if p.grad_sample is not None:
                    rows = p.grad_sample
                    p.grad_sample = rows.view(rows.shape[0] // self.augmentations, self.augmentations,
                                              *rows.shape[1:]).mean(1)
        if self.optimizer.pre_step():
            if self.after_privatise is not None:
                self.after_privatise()
            self.optimizer.original_optimizer.step()


class PrivateTraining:
    """DP-SGD for every client of a federation, with one Opacus accountant each."""

    def __init__(self, cfg: RunConfig, records: dict[int, int], parameters: dict[str, int] | None = None):
        self.augmentations = int(cfg.dp_augmentations)
        self.train_which = cfg.dp_train
        self.parameters = parameters or {}
        self.epsilon = float(cfg.dp_epsilon)
        self.delta = float(cfg.dp_delta)
        self.max_grad_norm = float(cfg.dp_max_grad_norm)
        self.rounds = cfg.rounds
        self.batch_size = cfg.batch_size
        self.noise_to_signal_target = cfg.dp_noise_to_signal
        self.max_step_factor = int(cfg.dp_max_step_factor)
        self.records = dict(records)
        for index, n in self.records.items():
            if self.delta >= 1.0 / n:
                raise FedauditError(f"--dp-delta {self.delta:g} is not below 1/n = {1 / n:.2g} for a client with {n} "
                                    "training records (δ ≥ 1/n allows releasing a record outright); use --dp-delta 1e-5")
        self.plans: dict[int, ClientPlan] = {}
        self.engines = {i: new_engine() for i in self.records}
        # the auditor's white-box canaries, by client index (fedaudit.audit.canary plants them before training)
        self.canaries: dict[int, GradientCanaries] = {}
        self.injectors: dict[int, CanaryGradients] = {}

    def plan(self, index: int, epochs: int | None, steps: int | None) -> ClientPlan:
        """The client's plan, fixed at its first local training (the local steps are known then). With the
        recipe's noise-to-signal target, its batch is the smallest of --batch-size, doubled, …, all its records
        whose noise-to-signal per step is at most the target, and where one is, its local steps may grow up to
        --dp-max-step-factor × the method's within the target (:func:`choose_batch`)."""
        n = self.records[index]
        plan = self.plans.get(index)
        if plan is None:
            plan = choose_batch(n, self.batch_size, epochs, steps, self.rounds, self.epsilon, self.delta,
                                self.parameters.get("trained_parameters"), self.noise_to_signal_target,
                                self.max_step_factor)
            self.plans[index] = plan
        elif plan.steps_per_round != (now := plan.step_factor * steps_per_round(n, plan.batch_size, epochs, steps)):
            raise FedauditError(f"a client's local steps changed from {plan.steps_per_round} to {now} between "
                                "rounds; the DP-SGD noise was planned for a fixed number of steps per round")
        return plan

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, index: int, epochs: int | None, steps: int | None,
              sampler_seed: int, noise_generator: torch.Generator, run: StepLoop,
              after_privatise: Callable[[], None] | None = None) -> tuple[Tensor, int]:
        """One round of one client's DP-SGD: ``run(optimizer, batches)`` is the engine's step loop."""
        plan = self.plan(index, epochs, steps)
        for group in optimizer.param_groups:  # the recipe's smaller step under noise (1 otherwise), once per optimizer
            group["lr"] = group.setdefault("lr_before_dp_scale", group["lr"]) * plan.lr_scale
        canaries = None
        if index in self.canaries:  # one injector per client for the run: at rate 1 its sum is built once
            canaries = self.injectors.get(index)
            if canaries is None:
                canaries = self.injectors[index] = CanaryGradients(self.canaries[index], self.max_grad_norm,
                                                                   plan.sample_rate, sampler_seed)
            canaries.reseed(sampler_seed)
        return private_steps(model, optimizer, plan.records, plan.batch_size, plan.steps_per_round,
                             plan.noise_multiplier, self.max_grad_norm, self.engines[index], sampler_seed,
                             noise_generator, run, after_privatise, self.augmentations, canaries)

    # -- record and resume ---------------------------------------------------------

    def summary(self, domains: dict[int, str]) -> dict[str, Any]:
        """Per client: the planned mechanism and the ε its accountant has spent so far."""
        clients = {}
        trained = self.parameters.get("trained_parameters")
        for index, plan in sorted(self.plans.items()):
            history = self.engines[index].accountant.history
            clients[domains[index]] = {
                "epsilon_spent": spent_epsilon(history, self.delta), "epsilon_rdp": rdp_epsilon(history, self.delta),
                "accountant": accountant_name(history, self.delta), "curve": claimed_curve(history, self.delta),
                "noise_multiplier": plan.noise_multiplier,
                "batch_size": plan.batch_size, "lr_scale": plan.lr_scale, "step_factor": plan.step_factor,
                "noise_to_signal": plan.noise_to_signal(trained) if trained else None,
                "sample_rate": plan.sample_rate, "steps": sum(int(h[2]) for h in history),
                "planned_steps": plan.steps, "records": plan.records}
        return {"epsilon_target": self.epsilon, "delta": self.delta, "max_grad_norm": self.max_grad_norm,
                "augmentations": self.augmentations, "trained": self.train_which, **self.parameters,
                "noise_to_signal_target": self.noise_to_signal_target, "max_step_factor": self.max_step_factor,
                "accountant": ACCOUNTANT, "unit": "one record of one client's training split",
                "secure_rng": False, "clients": clients}

    def state(self) -> dict[str, Any]:
        return {str(i): {"plan": vars(p), "history": [list(h) for h in self.engines[i].accountant.history]}
                for i, p in self.plans.items()}

    def restore(self, state: dict[str, Any]) -> None:
        for key, item in state.items():
            index = int(key)
            self.plans[index] = ClientPlan(**{"batch_size": self.batch_size, **item["plan"]})  # older plans lack it
            self.engines[index].accountant.history = [tuple(h) for h in item["history"]]


StepLoop = Callable[[torch.optim.Optimizer, Iterator[Tensor]], tuple[Tensor, int]]


def private_steps(model: nn.Module, optimizer: torch.optim.Optimizer, records: int, batch_size: int, steps: int,
                  noise_multiplier: float, max_grad_norm: float, engine, sampler_seed: int,
                  noise_generator: torch.Generator | None, run: StepLoop,
                  after_privatise: Callable[[], None] | None = None, augmentations: int = 1,
                  canaries: CanaryGradients | None = None) -> tuple[Tensor, int]:
    """``steps`` DP-SGD steps through Opacus' ``engine`` (a PrivacyEngine, whose accountant records them):
    Poisson batches at rate 1 / ceil(records / batch_size), per-sample clipping, Gaussian noise.
    ``run(optimizer, batches)`` is the caller's step loop (:func:`fedaudit.simulation.training.train_steps`);
    with ``augmentations`` K each sampled record is in its batch K times (K views under the
    loop's augmentation), and its K gradients are averaged before clipping. ``canaries`` (the auditor's
    gradient canaries) go into each step's sum of clipped gradients before the noise."""
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(records)), batch_size=min(batch_size, records),
                        generator=torch.Generator().manual_seed(sampler_seed))
    without_inplace_ops(model)
    model.train()
    with _quiet():
        hooks, dp_optimizer, dp_loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm, poisson_sampling=True, noise_generator=noise_generator, wrap_model=False)
        if canaries is not None:
            with_canaries(dp_optimizer, model, canaries)
        try:
            device = next(model.parameters()).device
            return run(_PrivateStep(dp_optimizer, after_privatise, augmentations),
                       _poisson_batches(dp_loader, steps, device, augmentations))
        finally:
            hooks.cleanup()


def with_canaries(dp_optimizer, model: nn.Module, canaries: CanaryGradients) -> None:
    """Make ``dp_optimizer`` clip its batch's records, then add ``canaries``' step sum (clipped by the same
    ``clip_and_accumulate``) to the clipped-gradient sum before its noise (Opacus' ``pre_step``: clip and
    accumulate, then ``add_noise`` reads ``summed_grad``)."""
    names = {id(p): name for name, p in model.named_parameters()}
    params = list(dp_optimizer.params)
    param_names = [names[id(p)] for p in params]
    clip_and_accumulate = dp_optimizer.clip_and_accumulate

    def clip_factor(row: Tensor) -> Tensor:
        """The factor the optimiser's clipping scales ``row`` (the space, flat, on the host) by, as one per-sample
        gradient alone: ⟨clipped, row⟩ / ‖row‖², a 0-d tensor on the training device."""
        kept = [(p.summed_grad, p.grad_sample) for p in params]
        squared = float(row.dot(row))
        for p, name in zip(params, param_names):
            where, shape = canaries.slices[name]
            p.summed_grad = None
            p.grad_sample = row[where].view(1, *shape).to(p.device, p.dtype)
        try:
            clip_and_accumulate()
            return sum((p.summed_grad * p.grad_sample[0]).sum() for p in params) / squared
        finally:
            for p, (summed, samples) in zip(params, kept):
                p.summed_grad, p.grad_sample = summed, samples

    def clip_records_then_canaries() -> None:
        clip_and_accumulate()
        canaries.add(params, param_names, clip_factor)

    dp_optimizer.clip_and_accumulate = clip_records_then_canaries


def new_engine():
    """An Opacus PrivacyEngine with this module's accountant."""
    from opacus import PrivacyEngine

    with _quiet():
        return PrivacyEngine(accountant=RDP)  # its accountant keeps the history; ε is computed from it here


def without_inplace_ops(model: nn.Module) -> None:
    """Opacus' backward hooks forbid in-place ops on a hooked layer's output (ReLU(inplace=True));
    turning them off changes no value."""
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False


def _poisson_batches(loader, steps: int, device: torch.device, augmentations: int = 1) -> Iterator[Tensor]:
    """Exactly ``steps`` Poisson-sampled index batches (fresh passes of Opacus' DP loader as needed),
    each record repeated ``augmentations`` times in a row."""
    done = 0
    while True:
        for (idx,) in loader:
            yield idx.to(device).repeat_interleave(augmentations)
            done += 1
            if done >= steps:
                return
