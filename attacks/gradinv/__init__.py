"""gradinv — Inverting Gradients against a victim's single-round update (curious server).

Geiping et al., NeurIPS 2020, "Inverting Gradients – How easy is it to break
privacy in federated learning?". The server broadcast a ``FULL_MODEL`` to
the victim and got its trained ``FULL_MODEL`` back in the same round; their
difference over the trainable parameters is the victim's update. The attack
recovers the labels from the last layer's update (iDLG), then optimises
``inversion_batch`` dummy images until the update they would produce points
the same way (engine: :mod:`fedaudit.attacks.gradinv.engine`).

Threat model and scope:

* **server only**: a client never sees another client's upload, so a
  client-role attacker gets ``"not applicable"``.
* **the last round**: the wire keeps the newest artifact per (kind, sender,
  receiver), so the last broadcast to the victim and its last upload are
  both in the view. If either is missing (methods that ship a
  ``PARTIAL_MODEL``, or no ``FULL_MODEL`` at all) or their rounds differ, the
  output says ``"not applicable"`` and names what is missing.
* **one simulated step**: the victim ran E epochs of minibatch SGD; the
  attacker simulates one full-batch SGD step on the dummies, a first-order
  stand-in (the cosine ignores the update's scale, so the learning rate only
  weighs the gradient against weight decay). ``info.local_steps`` records
  the victim's real step count beside the simulated one. The victim's
  augmentation (shifts, flips) is not simulated either.
* labels: recovered counts are a heuristic for more than one image
  (:func:`~fedaudit.attacks.gradinv.engine.recover_labels`).

Control: the same attack against a random update with the real update's
shapes and per-tensor norms (Gaussian, fixed seed), with the same recovered
labels and the same initial dummies, so it differs from the attack only in
the update it matches. Scoring matches each reconstruction to a distinct
member of the victim (Hungarian matching, ``batch_matching``): the control's
matched scores are what that matching finds by chance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from fedaudit.attack import NO_ACCESS, Access, Attack, AttackerPrior, AttackOutput, AttackSetup
from fedaudit.attacks.budget import InversionBudget
from fedaudit.attacks.gradinv.engine import (
    GradInvSettings,
    LocalRecipe,
    invert_update,
    last_linear,
    random_update,
    recover_labels,
)
from fedaudit.run.options import option
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role
from fedaudit.simulation.wire_views import overlay_state

ARTIFACT = "full_model:update"  # the difference of the full_model broadcast and upload; the verdict files it under full_model ↑
NOT_APPLICABLE = "not applicable"
CONTROL_SEED_OFFSET = 1  # the control's random update draws from seed + 1; the dummies from seed
LABEL_METHOD = ("iDLG: classes whose last-layer bias update (or weight-row sum without a bias) is positive; "
                "counts in proportion to it for more than one image (heuristic)")


@dataclass(frozen=True)
class GradInvOptions(InversionBudget):
    gradinv_tv_weight: float = option(GradInvSettings.tv_weight, "Weight of gradinv's TV prior (DeepInversion's 1e-3 "
                                      "blurs a one-image reconstruction: 21 dB instead of 35).", kind=float, low=0.0,
                                      high=1e6)


class GradInv(Attack):
    name = "gradinv"
    summary = "Inverting Gradients (Geiping et al. 2020): images from a victim's last-round model update, random-update control"
    roles: ClassVar[tuple[str, ...]] = ("server",)

    def __init__(self, recipe: LocalRecipe, settings: GradInvSettings | None = None, num_images: int = 40,
                 local_epochs: int | None = None, batch_size: int | None = None, optimizer: str = "sgd",
                 seed: int = 0) -> None:
        self.recipe = recipe
        self.settings = settings or GradInvSettings()
        self.num_images = num_images
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.seed = seed

    Options: ClassVar[type] = GradInvOptions

    @classmethod
    def from_config(cls, setup: AttackSetup, prior: AttackerPrior) -> GradInv:
        """The victim's local recipe (lr, momentum, weight decay, epochs, batch size: public protocol
        facts), ``inversion_iters``/``inversion_lr``, ``gradinv_tv_weight``; ``inversion_batch`` dummy images per victim."""
        o: GradInvOptions = setup.options
        p = setup.protocol
        return cls(
            LocalRecipe(lr=p.lr, momentum=p.momentum, weight_decay=p.weight_decay, steps=1),
            GradInvSettings(iters=o.inversion_iters, lr=o.inversion_lr, tv_weight=o.gradinv_tv_weight,
                            mean=tuple(prior.mean), std=tuple(prior.std)),
            num_images=o.inversion_batch, local_epochs=p.local_epochs, batch_size=p.batch_size,
            optimizer=p.optimizer, seed=setup.seed,
        )

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        if view.role != SERVER:
            return [self._skip(view.role, victim, "gradient inversion needs the victim's own upload, which only the "
                                                  "server sees; run it with --attacker server")]
        me = client_role(victim)
        sent = [a for a in view if a.kind == ArtifactKind.FULL_MODEL and a.sender == SERVER and a.receiver == me]
        got = [a for a in view if a.kind == ArtifactKind.FULL_MODEL and a.sender == me and a.receiver == SERVER]
        if not sent or not got:
            return [self._skip(view.role, victim, self._missing(view, me, bool(sent), bool(got)))]
        before, after = max(sent, key=lambda a: a.round), max(got, key=lambda a: a.round)
        if before.round != after.round:
            return [self._skip(view.role, victim, f"the newest full_model broadcast to {me} is from round {before.round} "
                                                  f"but its newest upload from round {after.round}; one round's update "
                                                  "cannot be isolated")]
        return [self._attack(view.role, victim, before, after, self._num_samples(view, me), prior, device)]

    def _attack(self, role: str, victim: str, before: Artifact, after: Artifact, num_samples: int | None,
                prior: AttackerPrior, device: torch.device) -> AttackOutput:
        model = prior.build_model().to(device)
        base = {k: v.detach().to(device) for k, v in model.state_dict().items()}
        start, _ = overlay_state(base, [before], device)
        names = [k for k, p in model.named_parameters()
                 if k in before.tensors and k in after.tensors and after.tensors[k].shape == p.shape]
        if not names:
            return self._skip(role, victim, f"the full_model artifacts name no parameter of the {prior.arch} architecture")
        delta = {k: after.tensors[k].to(device).float() - before.tensors[k].to(device).float() for k in names}
        # A parameter the victim did not move was frozen (or got no gradient): simulating it would
        # only add a direction the target lacks.
        moved = torch.stack([d.any() for d in delta.values()]).tolist()  # one host read, not one per tensor
        unchanged = [k for k, m in zip(delta, moved) if not m]
        delta = {k: d for k, d in delta.items() if k not in unchanged}
        try:
            weight, bias = last_linear(model, prior.num_classes)
        except ValueError as exc:
            return self._skip(role, victim, f"no label signal: {exc}")
        if weight not in delta:
            return self._skip(role, victim, f"the last layer ({weight}) did not change in the victim's update")
        labels = recover_labels(delta[weight], delta.get(bias) if bias else None, self.num_images, prior.num_classes)
        shape = (self.num_images, prior.channels, prior.image_size, prior.image_size)
        try:
            images, info = invert_update(model, start, delta, labels, self.recipe, shape, self.settings,
                                         torch.Generator().manual_seed(self.seed))
        except ValueError as exc:
            if "more than 1 value per channel" not in str(exc):
                raise
            # BatchNorm in train mode cannot normalise one dummy whose feature map is 1x1.
            return self._skip(role, victim, f"one dummy image cannot pass BatchNorm in train mode ({exc}); "
                                            "use --inversion-batch 2 or more")
        control = random_update(delta, torch.Generator().manual_seed(self.seed + CONTROL_SEED_OFFSET))
        control_images, cinfo = invert_update(model, start, control, labels, self.recipe, shape, self.settings,
                                              torch.Generator().manual_seed(self.seed))
        entry: dict[str, Any] = {
            "status": "attacked", "batch_matching": True, "round": after.round, "sender": after.sender,
            "parameters": len(delta), "unchanged_parameters": len(unchanged),
            "labels": {"method": LABEL_METHOD, "counts": torch.bincount(labels.cpu(), minlength=prior.num_classes).tolist()},
            "local_steps": {"victim": self._victim_steps(num_samples), "simulated": self.recipe.steps,
                            "victim_num_samples": num_samples, "victim_epochs": self.local_epochs,
                            "victim_batch_size": self.batch_size,
                            "basis": "victim: local_epochs × floor(num_samples / batch_size) (the engine drops a short "
                                     "last batch); simulated: full-batch SGD on the dummies"},
            "recipe": {**asdict(self.recipe), "victim_optimizer": self.optimizer},
            "final_loss": {"attack": info["final_loss"], "control": cinfo["final_loss"]},
            "cosine": {"attack": info["cosine"], "control": cinfo["cosine"]},
            "iterations": info["iterations"], "restarts": info["restarts"],
            "seconds": info["seconds"] + cinfo["seconds"],
            "control_artifact": "Gaussian update with the real update's shapes and per-tensor norms "
                                f"(seed {self.seed + CONTROL_SEED_OFFSET}), same labels and initial dummies",
        }
        if self.optimizer != "sgd":
            entry["recipe"]["note"] = f"the victim trains with {self.optimizer}; the attacker simulates SGD"
        return AttackOutput(self.name, role, victim, ARTIFACT, images=images, control_images=control_images,
                            targets=labels, info=entry)

    def _victim_steps(self, num_samples: int | None) -> int | None:
        """The victim's SGD steps in the round, as fedaudit's engine runs them (None when unknown)."""
        if num_samples is None or self.local_epochs is None or self.batch_size is None:
            return None
        bs = min(self.batch_size, num_samples)
        return self.local_epochs * max(1, num_samples // bs) if bs else None

    @staticmethod
    def _num_samples(view: WireView, me: str) -> int | None:
        counts = [a for a in view if a.kind == ArtifactKind.SCALARS and a.sender == me and "num_samples" in a.tensors]
        return int(max(counts, key=lambda a: a.round).tensors["num_samples"]) if counts else None

    @staticmethod
    def _missing(view: WireView, me: str, sent: bool, got: bool) -> str:
        def kinds(arts: list[Artifact]) -> str:
            return ", ".join(sorted({a.kind.value for a in arts})) or "nothing"

        ups = kinds([a for a in view if a.sender == me])
        downs = kinds([a for a in view if a.sender == SERVER and a.receiver == me])
        missing = []
        if not got:
            missing.append(f"no full_model upload from {me} (it uploaded {ups})")
        if not sent:
            missing.append(f"no full_model broadcast to {me} (the server sent it {downs})")
        return ("the server's view holds " + " and ".join(missing) +
                "; gradient inversion needs the victim's whole trainable state before and after one round")

    def _skip(self, role: str, victim: str, reason: str) -> AttackOutput:
        return AttackOutput(self.name, role, victim, ARTIFACT, info={"status": NOT_APPLICABLE, "reason": reason})

