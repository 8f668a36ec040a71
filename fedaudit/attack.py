"""The Attack contract: an attacker sees a wire view and public knowledge.

An attack receives what an observer in one role saw (a
:class:`~fedaudit.simulation.wire.WireView`), an :class:`AttackerPrior` (the public code
and protocol facts) and, only where its threat model grants them, the
:class:`Access` the auditor hands it: black-box queries of the deployed model
and unlabeled challenges (candidate records without their membership). Never
a client object, its dataset or the federation. The signature is the threat
model, and ``tests/test_layout.py`` holds it over the import graph: nothing
under ``attacks/`` imports the federation, a method, the data or the auditor.
The *auditor* (:mod:`fedaudit.audit`), who holds the private records, builds
the access and scores the :class:`AttackOutput` afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from fedaudit.registry import Registry
from fedaudit.run.options import Option, declared
from fedaudit.simulation.wire import WireView

if TYPE_CHECKING:
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.recipes import TrainOne

ROLES = ("server", "client")

Query = Callable[[Tensor], Tensor]  # normalised inputs [B, C, H, W] → the model's outputs (logits or embeddings)
Predict = Callable[[nn.Module, Tensor], Tensor]  # a method's public inference path on a model


def plain_forward(model: nn.Module, x: Tensor) -> Tensor:
    out: Tensor = model(x)
    return out


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
    # The method's public code: its inference path (e.g. FedFD-A's test-time adapter), whether its model is a
    # label-free encoder (embeddings, no classes), each client's local training recipe by domain (under DP-SGD
    # with that client's public mechanism: noise, batch, step, passes), and its model constructor initialised
    # from torch's RNG as the caller seeded it (reference models each draw their own init).
    predict: Predict = plain_forward
    label_free: bool = False
    train_recipes: Mapping[str, TrainOne] = field(default_factory=dict)
    new_model: Callable[[], nn.Module] | None = None
    # One round of each client's local training exactly as the method runs it (Method.round_recipe), from whatever
    # weights it is given: what replay reference models run from the round's broadcast (attacks/mia/replay.py);
    # ``replay_note`` says why there are none where the method or a recording declares none.
    round_recipes: Mapping[str, TrainOne] = field(default_factory=dict)
    replay_note: str = ""


@dataclass(frozen=True, eq=False)
class MembershipChallenge:
    """Candidates for one victim. Deliberately no membership field: the auditor keeps the truth.

    ``images`` uint8 [n, C, H, W] and ``labels`` [n]: the victim's members and
    holdout records, shuffled together; ``population_images`` /
    ``population_labels``: records of other domains that no model trained on
    (RMIA's z).
    """

    victim: str
    images: Tensor
    labels: Tensor
    population_images: Tensor
    population_labels: Tensor


@dataclass(frozen=True, eq=False)
class DomainChallenge:
    """Records of member domains (their holdouts) and of the unseen domain, shuffled, without saying which."""

    images: Tensor
    labels: Tensor


@dataclass(frozen=True, eq=False)
class CanaryChallenge:
    """One victim's canary records with their canary labels, never whether each was trained on."""

    victim: str
    images: Tensor
    labels: Tensor


# The canary audit's two variants, as an attack output's ``info["variant"]``: mislabelled input records scored by
# the model, and gradient canaries read off the victim's updates.
INPUT_CANARIES, GRADIENT_CANARIES = "input", "gradient"


@dataclass(frozen=True)
class GradientCanaryChallenge:
    """One victim's gradient canaries as the auditor hands them to the attacker: their count, the seed their
    directions come from and the space they live in (trained parameters by name and shape) — never which
    were included."""

    victim: str
    count: int
    seed: int
    space: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Access:
    """What the auditor grants an attack beyond the wire view and the prior, and only what the
    attack's :attr:`Attack.needs` names: ``query``, black-box access to the deployed model (any role
    may query it); ``challenges`` per victim and ``domain_challenge`` for membership inference;
    ``canaries`` per victim for the canary audit and ``gradient_canaries`` for its white-box variant (with a
    view of every round, not only the newest); ``cache_dir``, where the attack may keep its own
    work (reference-model logits) between runs; ``history``, every round of what the attacker's role saw, where the
    auditor kept it (the wire keeps only the newest otherwise): what replay reference models re-live."""

    query: Query | None = None
    challenges: Mapping[str, MembershipChallenge] = field(default_factory=dict)
    domain_challenge: DomainChallenge | None = None
    canaries: Mapping[str, CanaryChallenge] = field(default_factory=dict)
    gradient_canaries: Mapping[str, GradientCanaryChallenge] = field(default_factory=dict)
    cache_dir: Path | None = None
    history: WireView | None = None  # every round of the attacker's view, where the auditor kept it (replay references)


NO_ACCESS = Access()


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
    # Per-record signals behind ``scores`` that the auditor checks (LiRA's φ of the target and of the
    # reference models with their inclusion masks, for the calibration figure).
    signals: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """The options of an attack that declares none."""


@dataclass(frozen=True)
class LocalProtocol:
    """The clients' local training as the protocol publishes it (what a server-side gradient attack replays)."""

    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    local_epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"


@dataclass(frozen=True)
class AttackSetup:
    """What an attack is configured from: its own options, typed (its ``Options`` dataclass as the run resolved it),
    and the few facts of the run it may know — never the run's whole configuration."""

    options: Any  # the attack class's Options instance
    seed: int = 0
    precision: str = "fp32"
    attacker: str = "server"  # the attacker's role: server, or client:<domain>
    protocol: LocalProtocol = field(default_factory=LocalProtocol)


def attack_setup(cls: type[Attack], cfg: RunConfig) -> AttackSetup:
    """``cls``'s setup from a run's configuration: its family's options (``cfg.attack_options``), the declared
    defaults of the run's profile where the run holds none."""
    given = cfg.attack_options.get(cls.family or cls.name, {})
    values = {name: given.get(name, opt.default_for(cfg.profile)) for name, opt in cls.options.items()}
    return AttackSetup(cls.Options(**values), seed=cfg.seed, precision=cfg.precision, attacker=cfg.attacker,
                       protocol=LocalProtocol(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                              local_epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                                              optimizer=cfg.optimizer))


# Every attack by name: a subclass that declares ``name`` joins when it is made (fedaudit.registry); the package
# ``fedaudit.attacks`` imports its modules so that the built-in ones have joined.
ATTACKS: Registry[type[Attack]] = Registry("attack")


class Attack:
    """Base class. Subclasses set ``name`` and implement :meth:`run` (or :meth:`run_batch`).

    ``needs`` names the :class:`Access` fields the threat model grants the attack (empty: the
    wire view and the prior only); the auditor fills those and no others. ``family`` groups
    registry names that one instance runs together (``mia-loss,mia-lira`` is one mia run). ``Options`` is a
    frozen dataclass whose fields declare the attack's settings (:func:`fedaudit.run.options.option`);
    :meth:`from_config` receives them typed, in an :class:`AttackSetup`.
    """

    name: ClassVar[str]
    family: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ("server",)
    needs: ClassVar[frozenset[str]] = frozenset()
    plants_canaries: ClassVar[bool] = False  # the auditor must plant records in the training split before training
    # The attack's options, one field each (flag, TOML key, range, recorded value: fedaudit.run.options); ``options``
    # is read from them when the class is made.
    Options: ClassVar[type] = NoOptions
    options: ClassVar[dict[str, Option]] = {}
    # The variants of its family this instance runs (membership: loss, lira_online, …, domain, artifact); the auditor
    # reads it to build what each needs and narrows it for an observer that sees less (secure aggregation).
    selected: tuple[str, ...] = ()

    def __init_subclass__(cls, register: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options" in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} sets options; declare them as the fields of a frozen dataclass "
                            "named by Options (fedaudit.run.options.option), which options is read from")
        cls.options = declared(cls.Options)
        ATTACKS.join(cls, register)

    @classmethod
    def from_config(cls, setup: AttackSetup, prior: AttackerPrior) -> Attack:
        """The attack configured from its setup (default: no options)."""
        return cls()

    @classmethod
    def for_selection(cls, selected: Sequence[type[Attack]], setup: AttackSetup, prior: AttackerPrior) -> Attack:
        """One instance for the selected registry names of this family (default: this class's own)."""
        return cls.from_config(setup, prior)

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        raise NotImplementedError

    @classmethod
    def keeps_rounds(cls, setup: AttackSetup) -> bool:
        """Whether the auditor must keep every round of the attacker's view for this attack (``Access.history``), set
        before training; the wire keeps only the newest round otherwise."""
        return False

    def for_counterfactual(self, per_class: int | None = None, images: int | None = None) -> Attack | None:
        """The same attack, same budget, without its nulls: what the auditor re-runs on counterfactual
        artifacts (holdout twin, positive control); ``per_class`` images per class when the artifact holds
        that many (a positive control), or ``images`` of classes it is not told (one record's own statistics).
        None when the attack cannot be re-run that way."""
        return None

    def attack_domain(self, challenge: DomainChallenge, query: Query, prior: AttackerPrior,
                      device: torch.device) -> Tensor:
        """The domain-level membership test (granted ``domain_challenge``): one score per record of ``challenge``,
        higher = from a source domain, by ``query`` — the auditor re-runs it on its domain twins."""
        raise NotImplementedError(f"{self.name} has no domain-level membership test")

    def run_batch(self, view: WireView, prior: AttackerPrior, victims: list[str], device: torch.device,
                  access: Access = NO_ACCESS) -> list[AttackOutput]:
        """Attack several victims; attacks that batch victims together override this."""
        return [out for victim in victims for out in self.run(view, prior, victim, device, access)]
