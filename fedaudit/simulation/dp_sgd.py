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
history is reported beside it (:mod:`fedaudit.simulation.dp_accounting`).

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
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.run.config import DP_STEP_NOISE_TO_SIGNAL
from fedaudit.run.stored import DP, DPClient
from fedaudit.simulation.dp_accounting import (ACCOUNTANT, RDP, accountant_name, claimed_curve, noise_for, rdp_epsilon,
                                               rdp_noise_for, spent_epsilon)
from fedaudit.simulation.gradient_canaries import CanaryGradients, GradientCanaries

if TYPE_CHECKING:
    from fedaudit.run.config import RunConfig

log = logging.getLogger("fedaudit")

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
        for n in self.records.values():
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

    def summary(self, domains: dict[int, str]) -> DP:
        """Per client: the planned mechanism and the ε its accountant has spent so far."""
        clients = {}
        trained = self.parameters.get("trained_parameters")
        for index, plan in sorted(self.plans.items()):
            history = self.engines[index].accountant.history
            clients[domains[index]] = DPClient(
                epsilon_spent=spent_epsilon(history, self.delta), epsilon_rdp=rdp_epsilon(history, self.delta),
                accountant=accountant_name(history, self.delta), curve=claimed_curve(history, self.delta),
                noise_multiplier=plan.noise_multiplier,
                batch_size=plan.batch_size, lr_scale=plan.lr_scale, step_factor=plan.step_factor,
                noise_to_signal=plan.noise_to_signal(trained) if trained else None,
                sample_rate=plan.sample_rate, steps=sum(int(h[2]) for h in history),
                planned_steps=plan.steps, records=plan.records)
        return DP(epsilon_target=self.epsilon, delta=self.delta, max_grad_norm=self.max_grad_norm,
                  augmentations=self.augmentations, trained=self.train_which, **self.parameters,
                  noise_to_signal_target=self.noise_to_signal_target, max_step_factor=self.max_step_factor,
                  accountant=ACCOUNTANT, unit="one record of one client's training split",
                  secure_rng=False, clients=clients)

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
