"""The Method contract: what a FedDG algorithm must say and do.

A method is a small class with a registry ``name`` and hooks that read like
its paper's algorithm box. The server side (``setup``, ``setup_aggregate``,
``broadcast``, ``aggregate``, ``global_model``) is kept apart from the client
side (``setup_upload``, ``setup_receive``, ``receive``, ``local_train``,
``upload``); everything that crosses between them is an
:class:`~fedaudit.simulation.wire.Artifact` sent through the wire by the engine, never a
shared Python object. A client hook gets its client's
:class:`~fedaudit.simulation.federation.ClientContext` (its own silo, the shared model,
the engine's services bound to it), a server hook a
:class:`~fedaudit.simulation.federation.ServerContext` (the clients' addresses, the
global model, the config); neither gets the federation, so a client cannot
reach another client's data or the target domain, and the server can reach
no client's data at all. Round 0 (``setup`` .. ``setup_receive``) is the
one-time exchange before training: style and amplitude banks, FedLSI's
stage-1 heads and translator.

``shares`` documents which artifact kinds travel in which direction; tests
compare it with what the ledger actually recorded, so the documentation
cannot drift from the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.models.factory import is_factory
from fedaudit.registry import Registry
from fedaudit.run.options import Option
from fedaudit.tensor_ops.aggregation import StateDict, clone_state, load_state_, model_state
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind

if TYPE_CHECKING:
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Client, ClientContext, Federation, ServerContext
    from fedaudit.simulation.recipes import TrainOne

UP, DOWN = "up", "down"


@dataclass
class Scores:
    """One evaluation of the deployed model: accuracy per source val split, on
    the target domain, and method-specific extras (e.g. a 30% linear probe)."""

    val: dict[str, float]
    target: float
    extra: dict[str, float] = field(default_factory=dict)


# Every method by name: a subclass that declares ``name`` joins when it is made (fedaudit.registry); the package
# ``fedaudit.methods`` imports its modules so that the built-in ones have joined.
METHODS: Registry[type[Method]] = Registry("method")


def any_model_methods() -> list[str]:
    """The registered methods that train any classifier (a --model factory's included)."""
    return [name for name, cls in METHODS.items() if not cls.needs_architecture]


def sample_count(client: Client, rnd: int) -> Artifact:
    """The client's training-record count as a ``SCALARS`` upload: sample-weighted
    averaging needs it at the server, so it crosses the wire and is counted."""
    count = torch.tensor(client.num_samples, dtype=torch.int64)
    return Artifact(ArtifactKind.SCALARS, client.role, SERVER, rnd, {"num_samples": count})


def sample_weight(artifacts: list[Artifact]) -> float:
    """The sample count a client uploaded with :func:`sample_count`."""
    return float(next(a for a in artifacts if a.kind == ArtifactKind.SCALARS).tensors["num_samples"])


def fold_option_profiles(defaults: dict[str, dict[str, Any]], options: dict[str, Option],
                         owner: str) -> dict[str, dict[str, Any]]:
    """``defaults`` with each option's per-profile default (``Option.profiles``) under its profile's
    ``method_options``: one declaration per option, and the resolved run records the value it used."""
    out = {profile: dict(values) for profile, values in defaults.items()}
    for name, option in options.items():
        for profile, value in option.profiles.items():
            table = dict(out.setdefault(profile, {}).get("method_options", {}))
            if name in table and table[name] != value:
                raise TypeError(f"{owner}: the {profile} default of option {name!r} is declared twice")
            table[name] = value
            out[profile]["method_options"] = table
    return out


class Method:
    """Base class. Subclasses set the class attributes and override hooks."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    shares: ClassVar[tuple[tuple[ArtifactKind, str], ...]] = ()
    # Scalars it sends up beyond the example count, which secure aggregation leaves in clear ("" where none)
    clear_scalars: ClassVar[str] = ""
    # Method-specific options, each declared as an attack's are: its default, per-profile defaults, range or choices
    # and help; each gets the flag --<method>-<option>, the TOML key [method_options] <option>, and its one-line
    # range error.
    options: ClassVar[dict[str, Option]] = {}
    # Per-profile overrides of RunConfig fields, e.g. {"paper": {"lr": 1e-4}}; each option's own profile defaults
    # (Option.profiles) join them under "method_options" when the class is made, so the run records them.
    profile_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    # True when ``model(x)`` is an embedding with no class scores (an unsupervised
    # encoder): membership attacks then use augmentation consistency, not p(y|x).
    label_free: ClassVar[bool] = False
    # Why this method cannot train with DP-SGD (--dp-epsilon), or "" when its local training runs
    # through Federation.train_local with a per-sample loss (the only loop the engine privatises).
    dp_incompatible: ClassVar[str] = "its local training does not run through the engine's DP-SGD loop"
    # Why this method cannot aggregate with client-level DP (--client-dp-epsilon), or "" when its server averages
    # whole models with fixed weights through ServerContext.client_dp (fedaudit/simulation/client_dp.py).
    client_dp_incompatible: ClassVar[str] = "its server does not aggregate a fixed-weight mean of whole models"
    # How the method's own options keep per-client statistics out of the whole model it uploads, which the report
    # advises for that upload's rows; "" where it has no such option (the report then advises --norm gn).
    upload_mitigation: ClassVar[str] = ""
    # What the algorithm needs from fedaudit's own architectures (XAN layers, a particular head, a block to insert
    # into), or "" when it trains any classifier, a --model factory's included.
    needs_architecture: ClassVar[str] = ""
    # True when the clients' local round is the engine's training (FedAvg's round_recipe gives it, so LiRA's and
    # RMIA's reference models can replay it); a subclass that trains otherwise sets it False or gives its own recipe.
    replays: ClassVar[bool] = False

    def __init_subclass__(cls, register: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.profile_defaults = fold_option_profiles(cls.profile_defaults, cls.options, cls.__name__)
        METHODS.join(cls, register)

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        if self.needs_architecture and is_factory(cfg.model):
            raise FedauditError(f"method {self.name} needs {self.needs_architecture}, which --model {cfg.model} does "
                                "not have; choose --model cnn, resnet18 or resnet50, or a method that trains any model "
                                f"({', '.join(any_model_methods())})")
        unknown = set(cfg.method_options) - set(self.options)
        if unknown:
            valid = ", ".join(sorted(self.options)) or "none"
            raise FedauditError(f"method {self.name!r} has no option {sorted(unknown)[0]!r}; its options: {valid}")
        self.opts: dict[str, Any] = {key: option.check(f"{self.name}_{key}", cfg.method_options.get(key, option.default))
                                     for key, option in self.options.items()}
        self.global_state: StateDict = {}
        # Why replay references cannot run though round_recipe gives a recipe (a recording that declared none sets
        # it); "" where nothing stops them.
        self.replay_note = ""

    # -- model ---------------------------------------------------------------

    def build_model(self, fed: Federation) -> nn.Module:
        """The architecture from the config; methods override to change norm layers or the head."""
        return fed.build_default_model()

    # -- server side ---------------------------------------------------------

    def setup(self, server: ServerContext) -> list[Artifact]:
        """Round 0, before any client works: the server's one-time initialisation, and what it sends
        the clients then (FedLSI's initial model). Default: the initial global model is the shared
        model's random initialisation, and nothing is sent."""
        self.global_state = clone_state(model_state(server.model))
        return []

    def setup_aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]]) -> list[Artifact]:
        """Round 0, from the clients' ``setup_upload`` artifacts (keyed by sender): what the server sends
        back before round 1 (CCST's style bank, ELCFS's amplitude bank, FedLSI's translator)."""
        return []

    def broadcast(self, server: ServerContext, rnd: int) -> list[Artifact]:
        """What the server sends to the clients at the start of round ``rnd``."""
        raise NotImplementedError

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        """Update the server state from the round's uploads (keyed by sender)."""
        raise NotImplementedError

    # -- client side: each hook gets its client's context (ClientContext), not the federation -------

    def setup_upload(self, ctx: ClientContext, got: list[Artifact]) -> list[Artifact]:
        """Round 0, client side, with what the server's ``setup`` sent it: what the client computes from
        its own data before round 1 and uploads (its style statistics, amplitude spectra, a stage-1 head)."""
        return []

    def setup_receive(self, ctx: ClientContext, got: list[Artifact]) -> None:
        """Round 0, client side: keep what ``setup_aggregate`` sent it (a bank, a translator) in its private state."""

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        """Load what the client got into the shared model (and the client's state)."""
        raise NotImplementedError

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        raise NotImplementedError

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        raise NotImplementedError

    # -- inference -----------------------------------------------------------

    def global_model(self, server: ServerContext) -> nn.Module | None:
        """The model the federation deploys, loaded into the shared module.

        None when the server holds no deployable model after this round: one
        assembled only from what crossed the wire (gPerXAN's ``upload=partial``
        before its final round, which sends the BN side only then). The engine
        records that round's accuracy as missing and never selects it; after
        the final round a method must return a model."""
        load_state_(server.model, self.global_state)
        return server.model

    def predict(self, model: nn.Module, x: Tensor) -> Tensor:
        out: Tensor = model(x)
        return out

    def score(self, fed: Federation, model: nn.Module) -> Scores:
        """The experimenter's hook, not the server's (it measures on every held-out split, so it sees the
        federation): accuracy of the deployed ``model`` on every source val split and the
        target domain. Methods whose deployed model is not a classifier (an
        unsupervised encoder scored by a linear probe) override this; ``extra``
        holds method-specific figures, reported at the selected round."""
        val = {c.domain: fed.accuracy(model, c.data.val_x, c.data.val_y) for c in fed.clients}
        return Scores(val=val, target=fed.accuracy(model, fed.target_x, fed.target_y))

    def head_encoder(self, fed: Federation, client: Client) -> nn.Module | None:
        """Auditor-side, never on the wire: the model whose ``features`` produced
        the latents that ``client``'s ``CLASSIFIER_HEAD`` upload summarises, so
        latent inversions can be scored against real latents. None when the
        method shares no head or keeps no record of that encoder."""
        return None

    def reference_recipe(self, fed: Federation, client: Client) -> TrainOne | None:
        """Public code, handed to attackers in the prior: how ``client`` trains locally, as a recipe for
        membership-inference reference models (:func:`attacks.mia.reference_models.train_reference_models`), at
        the target's exposure (rounds x local epochs, x the extra passes a DP plan takes; the attack may cap
        it). Default: the run's cross-entropy SGD; under ``--dp-epsilon`` DP-SGD with that client's mechanism
        (its noise, batch, step and passes: public, as a DP analysis is), so an informed attacker trains its
        reference models as that victim trained. Methods with another local loss override this; None means
        no recipe (LiRA and RMIA are then not applicable)."""
        return self.engine_recipe(fed, client, self.cfg.rounds)

    def round_recipe(self, fed: Federation, client: Client) -> TrainOne | None:
        """Public code, handed to attackers in the prior: one round of ``client``'s local training exactly as this
        method runs it, from whatever weights it is given — what a replay reference model runs from the round's
        broadcast (:mod:`fedaudit.attacks.mia.replay`), so it trains as the target did. None (the default): the
        method declares none, and LiRA and RMIA fall back to from-scratch reference models, which the audit says are
        not calibrated to the target. A method whose clients run the engine's cross-entropy SGD returns
        :meth:`engine_recipe` for one round (FedAvg); one with its own local loss returns its own recipe or
        None."""
        return None

    def engine_recipe(self, fed: Federation, client: Client, rounds: int) -> TrainOne | None:
        """The engine's local training (:meth:`Federation.train_local`) over ``rounds`` rounds of the run's local
        epochs: cross-entropy SGD, or under ``--dp-epsilon`` DP-SGD with the client's plan (None where the client
        never trained, so its mechanism is not known)."""
        from fedaudit.simulation.recipes import DPSGDRecipe, SGDRecipe

        recipe = SGDRecipe.from_config(self.cfg)
        if fed.dp is None:
            return replace(recipe, epochs=self.cfg.local_epochs * rounds)
        plan = fed.dp.plans.get(client.index)
        if plan is None:  # the client never trained: its mechanism is not known
            return None
        recipe = replace(recipe, epochs=self.cfg.local_epochs * rounds * plan.step_factor, batch_size=plan.batch_size,
                         lr=recipe.lr * plan.lr_scale)
        return DPSGDRecipe(**vars(recipe), noise_multiplier=plan.noise_multiplier, max_grad_norm=fed.dp.max_grad_norm,
                           augmentations=fed.dp.augmentations, trained=fed.dp.train_which)

    def declared_shares(self) -> tuple[tuple[ArtifactKind, str], ...]:
        """The (kind, direction) pairs this configured instance sends; options
        that change the protocol (gPerXAN's upload mode) override this."""
        return self.shares

    # -- checkpoint ----------------------------------------------------------

    def checkpoint(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Server state to save after a round: (tensors, JSON-able extras)."""
        return {f"global/{k}": v for k, v in self.global_state.items()}, {}

    def restore(self, tensors: dict[str, Tensor], extras: dict[str, Any]) -> None:
        self.global_state = {k[len("global/"):]: v for k, v in tensors.items() if k.startswith("global/")}

