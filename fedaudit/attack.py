"""The Attack contract: an attacker sees a wire view and public knowledge.

An attack receives what an observer in one role saw (a
:class:`~fedaudit.wire.WireView`) and an :class:`AttackerPrior` — never a
client object or its dataset. The signature is the threat model: an attack
that could touch private data would be a bug. The *auditor*, who holds the
private records, scores the :class:`AttackOutput` afterwards
(``fedaudit/leakage.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from fedaudit.wire import WireView

if TYPE_CHECKING:
    from fedaudit.config import RunConfig

ROLES = ("server", "client")


@dataclass(frozen=True)
class AttackerPrior:
    """Public knowledge: architecture, classes, image shape and normalisation.

    ``build_model`` returns a freshly initialised model of the federation's
    architecture (an attacker knows the code, not the weights); every call
    returns the same initialisation. ``num_clients`` is the federation's size
    and ``hflip`` whether the data allows horizontal flips (protocol facts,
    not private data).
    """

    arch: str
    num_classes: int
    class_names: tuple[str, ...]
    domains: tuple[str, ...]
    image_size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    build_model: Callable[[], nn.Module]
    num_clients: int = 1
    hflip: bool = True


@dataclass
class AttackOutput:
    """What an attack produced against one victim from one artifact.

    Reconstructions fill ``images`` (normalised input space) or ``latents``
    with ``targets`` (the class each was optimised for), and
    ``control_images`` / ``control_latents`` with the same attack's output
    against an untrained model of the same architecture (the untrained control), and ``nulls`` with
    other nulls the attack ran beside it (``"prior_only"``: the same optimisation with the artifact's
    matching term switched off); membership attacks fill ``scores`` for the
    records the auditor named. ``info["status"]`` is ``"attacked"``, or
    ``"not yet supported"`` / ``"not applicable"`` with ``info["reason"]``.
    """

    attack: str
    role: str
    victim: str
    artifact: str
    images: Tensor | None = None
    latents: Tensor | None = None
    targets: Tensor | None = None
    scores: Tensor | None = None
    control_images: Tensor | None = None
    control_latents: Tensor | None = None
    nulls: dict[str, Tensor] = field(default_factory=dict)
    head: nn.Module | None = None  # the attacked classifier head, for scoring latents with it
    info: dict[str, Any] = field(default_factory=dict)


class Attack:
    """Base class. Subclasses set ``name`` and implement :meth:`run`."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ("server",)

    @classmethod
    def from_config(cls, cfg: RunConfig, prior: AttackerPrior) -> Attack:
        """The attack configured from a run's options (default: no options)."""
        return cls()

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device) -> list[AttackOutput]:
        raise NotImplementedError

    def for_counterfactual(self, per_class: int | None = None) -> Attack | None:
        """The same attack, same budget, without its nulls: what the auditor re-runs on counterfactual
        artifacts (holdout twin, positive control); ``per_class`` images per class when the artifact holds
        that many (a positive control). None when the attack cannot be re-run that way."""
        return None

    def run_batch(self, view: WireView, prior: AttackerPrior, victims: list[str],
                  device: torch.device) -> list[AttackOutput]:
        """Attack several victims; attacks that batch victims together override this."""
        return [out for victim in victims for out in self.run(view, prior, victim, device)]
