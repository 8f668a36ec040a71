"""The auditor's half of the canary audit: the one-run privacy audit of Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023).

An *auditor* procedure, not a wire-view attack: the auditor plants m
canaries in each victim's ``train`` split before training, each with
probability ½ (:func:`fedaudit.canary.plant_canaries`, called through
:func:`canary_split` before the federation is built), the federation trains
once, and afterwards the auditor scores every canary with the membership
signal and turns the guesses into an empirical ε lower bound
(:mod:`fedaudit.canary_bound`). The split of knowledge is kept in the code:

* ``fedaudit.attacks.canary.CanaryAudit`` is the attacker's part. Through the
  attack contract it gets the deployed model to query and the canary records
  with their canary labels (:class:`~fedaudit.attack.CanaryChallenge`) —
  never whether a canary was included — and returns one score per canary:
  −cross-entropy of the target on the record with its (wrong) canary label
  (the loss signal, Yeom et al.; :func:`fedaudit.membership.loss_signal`).
  Higher = looks trained on. Its target, for a curious server, is the
  victim's last upload (its newest weights, overlaid as the server saw them);
  for a curious client, or a server that saw no weight-bearing upload from
  the victim (``target_note`` says why), the deployed global model queried as
  a black box.
* :func:`audit_canaries` is the auditor's part: it holds the inclusion truth
  (``LODOSplit.canaries``), grants the attack its access, guesses "in" for
  the k highest scores and "out" for the k lowest, and computes the bound.

Stored per victim under ``leakage.canary.<victim>``: the bound
(``epsilon_lower_bound``) at ``confidence`` and ``delta`` (the run's
``--dp-delta``, also without DP), the counts behind it, the k grid and its
Bonferroni correction, the audit's power (``epsilon_max_certifiable``),
``epsilon_spent`` (the accountant's ε for that client under DP, else null),
``can_refute_claim`` (whether the power exceeds ε spent at all: if not, the
comparison cannot fail and proves nothing) and ``exceeds_claimed``: a bound
above the accountant's ε means the DP implementation, its accounting or the
audit is broken, and is logged as a warning and stored as ``warning``.

Choices, with reasons:

* ``--attack all`` does not include the canary audit: it changes what is
  trained (m/2 mislabelled records per victim), and ``all`` should audit the
  run as the method would train it. Name it: ``--attack canary`` or
  ``--attack mia,canary``.
* Label-free encoders (FedGaLA) output embeddings, so a wrong label carries
  no signal: the audit is reported as not applicable.
* The bound is on the privacy of one record of the victim's ``train`` split
  in whatever the target is — the accountant's unit. A target that carries
  something DP-SGD does not cover (BatchNorm statistics; see
  ``privacy.coverage``) may legitimately exceed ε; the warning says so.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedaudit.attack import Access, Attack, AttackerPrior, CanaryChallenge
from fedaudit.audit.membership import black_box
from fedaudit.canary import KIND, plant_canaries
from fedaudit.canary_bound import audit

if TYPE_CHECKING:
    from fedaudit.config import RunConfig
    from fedaudit.data import LODOSplit
    from fedaudit.federation import Federation
    from fedaudit.method import Method

log = logging.getLogger("fedaudit")

CONFIDENCE = 0.95


def canary_split(cfg: RunConfig, split: LODOSplit, num_classes: int,
                 victims_of: Callable[[list[str]], list[str]]) -> LODOSplit:
    """``split`` with the auditor's canaries planted in every victim's ``train`` (``victims_of(source
    domains)`` names the victims); called only when the run asks for the canary audit."""
    victims = victims_of([c.domain for c in split.sources])
    m = cfg.attack_option("canary", "canaries")
    split = plant_canaries(split, victims, m, cfg.seed, num_classes)
    log.info("canary audit: %d canaries drawn from the holdout of %s, %s of them in training", m,
             ", ".join(victims), "/".join(str(int(split.canaries[v].included.sum())) for v in victims))
    return split


def epsilon_spent(fed: Federation) -> dict[str, float]:
    """The accountant's ε per client domain (empty without DP)."""
    if fed.dp is None:
        return {}
    clients = fed.dp.summary({c.index: c.domain for c in fed.clients})["clients"]
    return {d: float(c["epsilon_spent"]) for d, c in clients.items()}


def audit_canaries(attack: Attack, cfg: RunConfig, method: Method, fed: Federation, prior: AttackerPrior, *,
                   role: str, victims: Sequence[str], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The one-run audit of every victim's canaries by ``attack`` (``--attack canary``): ``{victim: entry}``
    (JSON-able; see the module docstring)."""
    planted = {v: fed.split.canaries[v] for v in victims if v in fed.split.canaries}
    access = Access(query=black_box(method, fed),
                    canaries={v: CanaryChallenge(v, c.images, c.labels) for v, c in planted.items()})
    outputs = {o.victim: o for o in attack.run_batch(fed.wire.view(role), prior, list(victims), fed.device, access)}
    spent = epsilon_spent(fed)
    out: dict[str, Any] = {}
    for victim in victims:
        answer = outputs[victim]
        if answer.scores is None:
            out[victim] = dict(answer.info)
            continue
        scores = answer.scores.numpy()
        included = planted[victim].included.cpu().numpy()
        entry = audit(scores, included, float(cfg.dp_delta), confidence)
        target = {k: v for k, v in answer.info.items() if k != "status"}
        entry.update(signal=getattr(attack, "signal", ""), **target, canary_kind=KIND, auc=_auc(scores, included))
        eps = spent.get(victim)
        entry["epsilon_spent"] = eps
        entry["can_refute_claim"] = None if eps is None else entry["epsilon_max_certifiable"] > eps
        entry["exceeds_claimed"] = eps is not None and entry["epsilon_lower_bound"] > eps
        if entry["exceeds_claimed"]:
            entry["warning"] = (
                f"the canary audit's ε lower bound {entry['epsilon_lower_bound']:.3f} for {victim} exceeds the ε the "
                f"accountant spent ({eps:.3f}) at {confidence:.0%} confidence: the DP-SGD implementation or its "
                "accounting is broken, or the audit is (or the target carries something ε does not cover: see "
                "privacy.coverage)")
            log.warning("canary audit: PRIVACY CLAIM REFUTED: %s", entry["warning"])
        out[victim] = entry
        log.info("canary audit, %s (%s): ε ≥ %.3f at %.0f%% (δ %g; %d/%d correct at k=%d; at most %.3f certifiable)%s",
                 victim, entry["target"], entry["epsilon_lower_bound"], 100 * confidence, entry["delta"],
                 entry["correct"], entry["guesses"], entry["k"], entry["epsilon_max_certifiable"],
                 "" if eps is None else f"; accountant's ε {eps:.3f}")
    return out


def _auc(scores: np.ndarray, included: np.ndarray) -> float | None:
    """Descriptive only (the bound does not use it): AUC of the scores for included vs excluded canaries."""
    if included.all() or not included.any():
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(included, scores))


__all__ = ["CONFIDENCE", "audit_canaries", "canary_split"]
