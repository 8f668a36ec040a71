"""canary — the attacker's half of the one-run privacy audit (Steinke, Nasr & Jagielski, NeurIPS 2023).

:class:`CanaryAudit` gets the deployed model to query and, per victim, the
canary records with their canary labels (a :class:`~fedaudit.attack.CanaryChallenge`)
— never whether a canary was included — and returns one score per canary:
−cross-entropy of the target on the record with its (wrong) canary label (the
loss signal, Yeom et al.; :func:`fedaudit.attacks.mia.scorers.loss_signal`). Higher =
looks trained on. The target is the victim's last upload where the attacker
(a curious server) sees one, else the deployed model. Where the auditor planted gradient canaries in the
victim's DP-SGD (white-box; :mod:`fedaudit.simulation.gradient_canaries`), it also scores each by the victim's summed update
over every round projected on the canary's direction (:func:`gradient_scores`; only the server sees uploads).
Planting the canaries, holding the inclusion
truth and turning guesses into an ε lower bound is the auditor's part:
:mod:`fedaudit.audit.canary`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from fedaudit.attack import (GRADIENT_CANARIES as GRADIENT, INPUT_CANARIES as INPUT, NO_ACCESS, Access, Attack, AttackerPrior,
                             AttackOutput, AttackSetup, GradientCanaryChallenge, Query)
from fedaudit.attacks.mia.reference_models import eval_views
from fedaudit.errors import FedauditError
from fedaudit.run.options import option
from fedaudit.simulation.gradient_canaries import unit_direction
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role
from fedaudit.attacks.mia.scorers import loss_signal

from .mia import GLOBAL, LAST_UPLOAD
from .mia.signals import NOT_APPLICABLE, Skipped, attacker_preprocess, last_upload

SIGNAL = "-cross-entropy of the target on the canary with its canary (wrong) label (Yeom et al.)"


# The auditor plants and counts these (fedaudit.audit.canary); declared here, beside the attack they serve.
@dataclass(frozen=True)
class CanaryOptions:
    # 64 leaves digits' ~180-record holdouts 116 >= 100 non-members, so mia's TPR at 10% FPR stays resolvable.
    canaries: int = option(64, "--attack canary: mislabelled canaries per victim, drawn from its holdout, each "
                           "trained on with probability 1/2.", low=2, high=100_000)
    gradient_canaries: int = option(0, "--attack canary under --dp-epsilon: white-box gradient canaries per victim, "
                                    "each a record of its DP-SGD with probability 1/2; 0 chooses the fewest (256 to "
                                    "4096) whose audit could certify the claimed epsilon.", low=0, high=100_000)
    canary_cost: bool = option(True, "--attack canary: also train the same federation without any canaries and "
                               "report what planting them cost in accuracy (about doubles the training time).")


class CanaryAudit(Attack):
    """The attacker's half of the one-run audit: score canary records against a target it can query."""

    name = "canary"
    family: ClassVar[str] = "canary"
    summary = ("one-run privacy audit (Steinke et al. 2023): plants --canaries mislabelled records in each victim's "
               "training split, each with probability 1/2, and reports an empirical epsilon lower bound beside "
               "the accountant's (changes what is trained; not part of 'all')")
    roles: ClassVar[tuple[str, ...]] = ("server", "client")
    plants_canaries: ClassVar[bool] = True  # the run's training split must be prepared before training
    Options: ClassVar[type] = CanaryOptions
    signal: ClassVar[str] = SIGNAL
    needs: ClassVar[frozenset[str]] = frozenset({"query", "canaries", "gradient_canaries"})

    def __init__(self, precision: str = "fp32") -> None:
        self.precision = precision

    @classmethod
    def from_config(cls, setup: AttackSetup, prior: AttackerPrior) -> CanaryAudit:
        return cls(precision=setup.precision)

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        """The victim's input canaries scored (``info``: the target and where its weights came from), and its
        gradient canaries where the auditor planted them (``info["variant"]``: ``input`` / ``gradient``)."""
        outputs = [self._input(view, prior, victim, device, access)]
        if victim in access.gradient_canaries:
            outputs.append(self._gradient(view, victim, access.gradient_canaries[victim]))
        return outputs

    def _gradient(self, view: WireView, victim: str, challenge: GradientCanaryChallenge) -> AttackOutput:
        scores = gradient_scores(view, victim, challenge)
        if isinstance(scores, Skipped):
            return AttackOutput(self.name, view.role, victim, "", info={**scores.to_json(), "variant": GRADIENT})
        values, info = scores
        return AttackOutput(self.name, view.role, victim, "model updates", scores=values,
                            info={"status": "attacked", "variant": GRADIENT, **info})

    def _input(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
               access: Access) -> AttackOutput:
        canaries = access.canaries.get(victim)
        if canaries is None:
            return self._skip(view, victim, Skipped("no canaries were planted in this victim's training split"))
        if prior.label_free:
            return self._skip(view, victim, Skipped("label-free encoder: the model outputs embeddings, so a canary's "
                                                    "wrong label carries no membership signal", NOT_APPLICABLE))
        query, target = self._target(view, prior, victim, device, access)
        scores = self.score(query, canaries.images, canaries.labels, prior, device)
        return AttackOutput(self.name, view.role, victim, target["target"], scores=scores,
                            info={"status": "attacked", "variant": INPUT, **target})

    def _skip(self, view: WireView, victim: str, why: Skipped) -> AttackOutput:
        return AttackOutput(self.name, view.role, victim, "", info={**why.to_json(), "variant": INPUT})

    @staticmethod
    def _target(view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
                access: Access) -> tuple[Query, dict[str, object]]:
        if access.query is None:
            raise FedauditError("the canary audit needs query access to the deployed model; run it through "
                                "fedaudit.audit.canary.audit_canaries")
        if view.role == SERVER:
            query, info = last_upload(view, prior, victim, device)
            if not isinstance(query, Skipped):
                return query, {"target": LAST_UPLOAD, "target_round": info["round"], "weights_from": info["weights_from"]}
            return access.query, {"target": GLOBAL, "target_note": f"last upload not available: {query.reason}"}
        return access.query, {"target": GLOBAL}

    @torch.no_grad()
    def score(self, query: Query, images: Tensor, labels: Tensor, prior: AttackerPrior, device: torch.device) -> Tensor:
        """Per canary (uint8 ``images`` [m, C, H, W], its canary ``labels`` [m]): −CE of ``query``'s output (float64, CPU)."""
        pre = attacker_preprocess(prior, device)
        (logits,) = eval_views(query, [images.to(device)], pre, False, self.precision)
        return loss_signal(logits, labels.cpu())


# What carries a client's trained weights both ways: the update is the upload minus the broadcast it started from.
WEIGHT_KINDS = (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL)
GRADIENT_SIGNAL = ("−⟨Σ over rounds of (upload − broadcast), canary direction⟩: how far the victim's own updates moved "
                   "the weights against the canary's direction (an included canary adds C × its direction to the "
                   "gradient sum of the steps that sample it)")


def gradient_scores(view: WireView, victim: str, challenge: GradientCanaryChallenge) -> tuple[Tensor, dict] | Skipped:
    """Per gradient canary, what the server computes from the victim's uploads and the broadcasts they started from:
    the projection of the victim's summed update onto the canary's direction, sign-flipped (a descent step moves
    the weights against the gradient). Float64 on the CPU; higher = looks included."""
    pairs = _update_pairs(view, victim, [name for name, _ in challenge.space])
    if isinstance(pairs, Skipped):
        return pairs
    ups, downs, rounds = pairs
    names = [name for name, _ in challenge.space]
    total = torch.zeros(sum(math.prod(shape) for _, shape in challenge.space), dtype=torch.float64)
    for r in rounds:
        total += torch.cat([(ups[r].tensors[n].double().cpu() - downs[r].tensors[n].double().cpu()).flatten()
                            for n in names])
    total32 = total.float()
    scores = torch.tensor([-float(unit_direction(challenge.seed, i, total.numel()) @ total32)
                           for i in range(challenge.count)], dtype=torch.float64)
    return scores, {"target": "model updates", "rounds": len(rounds), "signal": GRADIENT_SIGNAL}


def _update_pairs(view: WireView, victim: str, names: list[str]
                  ) -> tuple[dict[int, Artifact], dict[int, Artifact], list[int]] | Skipped:
    """The victim's weight uploads and the broadcasts they started from, by round, for the rounds that hold both
    and carry every canary weight; or why there are none."""
    role = client_role(victim)
    if view.role != SERVER:
        return Skipped(f"a gradient canary is read from {victim}'s uploads, which only the server sees", NOT_APPLICABLE)
    ups = {a.round: a for a in view if a.sender == role and a.kind in WEIGHT_KINDS}
    downs = {a.round: a for a in view if a.receiver == role and a.kind in WEIGHT_KINDS}
    rounds = sorted(set(ups) & set(downs))
    if not rounds:
        return Skipped(f"no round holds both a broadcast to {victim} and its weight upload (kinds "
                       f"{', '.join(k.value for k in WEIGHT_KINDS)})", NOT_APPLICABLE)
    missing = sorted({n for r in rounds for n in names if n not in ups[r].tensors or n not in downs[r].tensors})
    if missing:
        return Skipped(f"the canaries live in weights the wire does not carry both ways ({', '.join(missing[:3])}"
                       f"{' …' if len(missing) > 3 else ''})", NOT_APPLICABLE)
    return ups, downs, rounds


__all__ = ["GRADIENT_SIGNAL", "SIGNAL", "CanaryAudit", "gradient_scores"]
