"""canary — the attacker's half of the one-run privacy audit (Steinke, Nasr & Jagielski, NeurIPS 2023).

:class:`CanaryAudit` gets the deployed model to query and, per victim, the
canary records with their canary labels (a :class:`~fedaudit.attack.CanaryChallenge`)
— never whether a canary was included — and returns one score per canary:
−cross-entropy of the target on the record with its (wrong) canary label (the
loss signal, Yeom et al.; :func:`fedaudit.membership.loss_signal`). Higher =
looks trained on. The target is the victim's last upload where the attacker
(a curious server) sees one, else the deployed model. Planting the canaries, holding the inclusion
truth and turning guesses into an ε lower bound is the auditor's part:
:mod:`fedaudit.audit.canary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from fedaudit.attack import NO_ACCESS, Access, Attack, AttackerPrior, AttackOutput, Query
from fedaudit.attacks.mia.reference_models import eval_views
from fedaudit.errors import FedauditError
from fedaudit.membership import loss_signal
from fedaudit.options import Option
from fedaudit.wire import SERVER, WireView

from .mia import GLOBAL, LAST_UPLOAD, NOT_APPLICABLE, Skipped, attacker_preprocess, last_upload

if TYPE_CHECKING:
    from fedaudit.config import RunConfig

SIGNAL = "-cross-entropy of the target on the canary with its canary (wrong) label (Yeom et al.)"


class CanaryAudit(Attack):
    """The attacker's half of the one-run audit: score canary records against a target it can query."""

    name = "canary"
    family: ClassVar[str] = "canary"
    summary = ("one-run privacy audit (Steinke et al. 2023): plants --canaries mislabelled records in each victim's "
               "training split, each with probability 1/2, and reports an empirical epsilon lower bound beside "
               "the accountant's (changes what is trained; not part of 'all')")
    roles: ClassVar[tuple[str, ...]] = ("server", "client")
    plants_canaries: ClassVar[bool] = True  # the run's training split must be prepared before training
    # 64 leaves digits' ~180-record holdouts 116 >= 100 non-members, so mia's TPR at 10% FPR stays resolvable.
    options: ClassVar[dict[str, Option]] = {
        "canaries": Option(64, "--attack canary: mislabelled canaries per victim, drawn from its holdout, each trained "
                           "on with probability 1/2.", kind=int, low=2, high=100_000),
    }
    signal: ClassVar[str] = SIGNAL
    needs: ClassVar[frozenset[str]] = frozenset({"query", "canaries"})

    def __init__(self, precision: str = "fp32") -> None:
        self.precision = precision

    @classmethod
    def from_config(cls, cfg: RunConfig, prior: AttackerPrior) -> CanaryAudit:
        return cls(precision=cfg.precision)

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        """One output: the victim's canaries scored (``info``: the target and where its weights came from)."""
        canaries = access.canaries.get(victim)
        if canaries is None:
            return [self._skip(view, victim, Skipped("no canaries were planted in this victim's training split"))]
        if prior.label_free:
            return [self._skip(view, victim, Skipped("label-free encoder: the model outputs embeddings, so a canary's "
                                                     "wrong label carries no membership signal", NOT_APPLICABLE))]
        query, target = self._target(view, prior, victim, device, access)
        scores = self.score(query, canaries.images, canaries.labels, prior, device)
        return [AttackOutput(self.name, view.role, victim, target["target"], scores=scores,
                             info={"status": "attacked", **target})]

    def _skip(self, view: WireView, victim: str, why: Skipped) -> AttackOutput:
        return AttackOutput(self.name, view.role, victim, "", info=why.to_json())

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


__all__ = ["SIGNAL", "CanaryAudit"]
