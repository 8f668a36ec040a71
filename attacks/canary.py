"""canary — the attacker's half of the one-run privacy audit (Steinke, Nasr & Jagielski, NeurIPS 2023).

:class:`CanaryAudit` gets a target it may query and the canary records with
their canary labels — never whether a canary was included — and returns one
score per canary: −cross-entropy of the target on the record with its (wrong)
canary label (the loss signal, Yeom et al.; :func:`fedaudit.membership.loss_signal`).
Higher = looks trained on. Planting the canaries, holding the inclusion
truth and turning guesses into an ε lower bound is the auditor's part:
:mod:`fedaudit.audit.canary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from fedaudit.attack import Attack, AttackerPrior, AttackOutput
from fedaudit.errors import FedauditError
from fedaudit.membership import loss_signal
from fedaudit.reference_models import eval_views
from fedaudit.wire import WireView

from .mia import Query, attacker_preprocess

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

    def __init__(self, precision: str = "fp32") -> None:
        self.precision = precision

    @classmethod
    def from_config(cls, cfg: RunConfig, prior: AttackerPrior) -> CanaryAudit:
        return cls(precision=cfg.precision)

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device) -> list[AttackOutput]:
        raise FedauditError("the canary audit needs the auditor's canaries; call "
                            "fedaudit.audit.canary.audit_canaries (api.run_attacks does)")

    @torch.no_grad()
    def score(self, query: Query, images: Tensor, labels: Tensor, prior: AttackerPrior, device: torch.device) -> Tensor:
        """Per canary (uint8 ``images`` [m, C, H, W], its canary ``labels`` [m]): −CE of ``query``'s output (float64, CPU)."""
        pre = attacker_preprocess(prior, device)
        (logits,) = eval_views(query, [images.to(device)], pre, False, self.precision)
        return loss_signal(logits, labels.cpu())


__all__ = ["SIGNAL", "CanaryAudit"]
