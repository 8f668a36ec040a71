"""Local training recipes: how a client of a method trains a model on its records, as a callable.

A method hands its recipe to the attacker as public code (``Method.reference_recipe``, in the
:class:`~fedaudit.attack.AttackerPrior`): membership inference trains reference models with it
(:mod:`fedaudit.attacks.mia.reference_models`). It lives below both, so neither the engine nor an
attack imports the other to use it.

``train_one(model, images, labels, preprocess, generator)`` trains ``model`` in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.simulation.training import Preprocess, cross_entropy_loss, index_batches, make_optimizer, train_steps

TrainOne = Callable[[nn.Module, Tensor, Tensor, Preprocess, torch.Generator], None]


@dataclass(frozen=True)
class SGDRecipe:
    """The default local recipe: cross-entropy SGD for ``epochs`` epochs, as a client trains.

    Field names and defaults are :class:`fedaudit.run.config.RunConfig`'s.
    """

    epochs: int = 3
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    augment: bool = True
    precision: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FedauditError(f"reference-model {name} must be a positive integer, got {value!r}; "
                                    f"use the run's local {name.replace('_', ' ')}")
        if not self.lr > 0:
            raise FedauditError(f"reference-model lr must be > 0, got {self.lr!r}; use the run's --lr (e.g. 0.01)")

    @classmethod
    def from_config(cls, cfg) -> SGDRecipe:
        """The recipe of a :class:`~fedaudit.run.config.RunConfig` (its local epochs, batch size, optimizer)."""
        return cls(epochs=cfg.local_epochs, batch_size=cfg.batch_size, optimizer=cfg.optimizer, lr=cfg.lr,
                   momentum=cfg.momentum, weight_decay=cfg.weight_decay, augment=cfg.augment, precision=cfg.precision)

    def batches(self, n: int, generator: torch.Generator, device: torch.device):
        return index_batches(n, self.batch_size, generator, device, epochs=self.epochs)

    def __call__(self, model: nn.Module, images: Tensor, labels: Tensor, preprocess: Preprocess,
                 generator: torch.Generator) -> None:
        opt = make_optimizer(model.parameters(), self.optimizer, self.lr, self.momentum, self.weight_decay)
        train_steps(model, opt, self.batches(labels.shape[0], generator, images.device), images, labels, preprocess,
                    cross_entropy_loss, generator if self.augment else None, self.precision)


@dataclass(frozen=True)
class ProximalRecipe(SGDRecipe):
    """:class:`SGDRecipe` with FedProx's proximal term μ/2·‖θ − θ₀‖² toward the weights training starts from: one round
    of a FedProx client's local training when it starts from the round's broadcast (a replay reference), whose
    weights are that round's θ_global. The proximal gradient μ·(θ − θ₀) is added after each backward pass, as
    :mod:`fedaudit.methods.fedprox` adds it."""

    mu: float = 0.01

    def __call__(self, model: nn.Module, images: Tensor, labels: Tensor, preprocess: Preprocess,
                 generator: torch.Generator) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        anchor = [p.detach().clone() for p in params]

        @torch.no_grad()
        def add_proximal_gradient() -> None:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            torch._foreach_add_(grads, torch._foreach_sub(params, anchor), alpha=self.mu)
            for p, g in zip(params, grads):
                p.grad = g

        opt = make_optimizer(model.parameters(), self.optimizer, self.lr, self.momentum, self.weight_decay)
        train_steps(model, opt, self.batches(labels.shape[0], generator, images.device), images, labels, preprocess,
                    cross_entropy_loss, generator if self.augment else None, self.precision, add_proximal_gradient)


@dataclass(frozen=True)
class DPSGDRecipe(SGDRecipe):
    """:class:`SGDRecipe` with DP-SGD: the local recipe of a client under
    ``--dp-epsilon``, for reference models (an informed attacker trains them as the victim did)."""

    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    augmentations: int = 1  # augmentation multiplicity (views per record, gradients averaged before clipping)
    trained: str = "all"  # --dp-train: which weights DP-SGD trains (the rest keep their initialisation)

    def __call__(self, model: nn.Module, images: Tensor, labels: Tensor, preprocess, generator: torch.Generator) -> None:
        from fedaudit.simulation.dp_sgd import batches_per_epoch, freeze_for_dp, new_engine, private_steps

        freeze_for_dp(model, self.trained)
        n = labels.shape[0]
        opt = make_optimizer(model.parameters(), self.optimizer, self.lr, self.momentum, self.weight_decay)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))

        def run(optimizer, batches):
            return train_steps(model, optimizer, batches, images, labels, preprocess, cross_entropy_loss,
                               generator if self.augment else None, self.precision)

        private_steps(model, opt, n, self.batch_size, self.epochs * batches_per_epoch(n, self.batch_size),
                      self.noise_multiplier, self.max_grad_norm, new_engine(), seed, generator, run,
                      augmentations=self.augmentations if self.augment else 1)
