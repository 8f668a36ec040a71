"""The auditor's half of membership inference: challenges, query access, and scoring by the kept truth.

The attack (``fedaudit.attacks.mia``) sees its role's wire view, the public
prior and the :class:`~fedaudit.attack.Access` built here: black-box queries
of the deployed model, one :class:`~fedaudit.attack.MembershipChallenge` per
victim (its members and holdout records shuffled, without saying which is
which) and, for the domain-level question, one
:class:`~fedaudit.attack.DomainChallenge`. The auditor keeps the truth, splits
the attack's scores by it and reports
:func:`fedaudit.membership.membership_metrics` with the calibration figure of
any reference models the attack trained (:func:`fedaudit.membership.lira_calibration`).

Stored shape: ``{result_key: {target: {victim: entry}}}`` with result keys
loss, lira_online, lira_offline, rmia and domain (target ``global_model``;
victims = each source domain attacked and ``all``, pooled). What could not
run is ``{"status": "not applicable", "reason": ...}`` in the victim's place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedaudit.attack import Access, Attack, AttackerPrior, AttackOutput, DomainChallenge, MembershipChallenge, Query
from fedaudit.config import target_exposure
from fedaudit.errors import unknown_choice
from fedaudit.membership import lira_calibration, membership_metrics
from fedaudit.seeds import derive_seed, stable_int

if TYPE_CHECKING:
    from fedaudit.config import RunConfig
    from fedaudit.federation import Federation
    from fedaudit.method import Method

log = logging.getLogger("fedaudit")

CHALLENGE_STREAM = 9_001  # derive_seed stream of the challenge shuffles (mia's own stream number, kept for its results)
ALL_DOMAINS = "all"  # the pooled row of the domain-level question


def make_challenge(fed: Federation, victim: str, seed: int) -> tuple[MembershipChallenge, Tensor]:
    """The victim's challenge and the truth the auditor keeps (bool [n], True = member)."""
    client = next((c for c in fed.clients if c.domain == victim), None)
    if client is None:
        raise unknown_choice("mia victim", victim, [c.domain for c in fed.clients])
    d = client.data
    train_x, train_y = d.members()  # an auditor's canaries are trained on but are not the victim's members
    images, labels = torch.cat([train_x, d.holdout_x]), torch.cat([train_y, d.holdout_y])
    is_member = torch.cat([torch.ones(train_y.shape[0], dtype=torch.bool),
                           torch.zeros(d.holdout_y.shape[0], dtype=torch.bool)])
    g = torch.Generator().manual_seed(derive_seed(seed, CHALLENGE_STREAM, 0, stable_int(victim)) % 2**63)
    order = torch.randperm(labels.shape[0], generator=g)
    others = [c.data for c in fed.clients if c.domain != victim]
    pop_x = torch.cat([o.holdout_x for o in others]) if others else images[:0]
    pop_y = torch.cat([o.holdout_y for o in others]) if others else labels[:0]
    dev = order.to(images.device)
    return MembershipChallenge(victim, images[dev], labels[dev], pop_x, pop_y), is_member[order]


def make_domain_challenge(fed: Federation, domains: Sequence[str], seed: int) -> tuple[DomainChallenge, list[str | None]]:
    """Holdouts of ``domains`` and the unseen target domain's records, shuffled; the truth (domain, None = target)."""
    parts = [(c.domain, c.data.holdout_x, c.data.holdout_y) for c in fed.clients if c.domain in domains]
    parts.append((None, fed.target_x, fed.target_y))
    images = torch.cat([p[1] for p in parts])
    labels = torch.cat([p[2] for p in parts])
    truth = [p[0] for p in parts for _ in range(p[2].shape[0])]
    g = torch.Generator().manual_seed(derive_seed(seed, CHALLENGE_STREAM, 3) % 2**63)
    order = torch.randperm(labels.shape[0], generator=g)
    dev = order.to(images.device)
    return DomainChallenge(images[dev], labels[dev]), [truth[i] for i in order.tolist()]


def black_box(method: Method, fed: Federation) -> Query | None:
    """Query access to the deployed model: normalised inputs → the method's outputs, nothing else
    (None when the method deploys no global model, e.g. gPerXAN's partial variant before assembly)."""
    model = method.global_model(fed)
    if model is None:
        return None
    model.eval()

    @torch.no_grad()
    def query(x: Tensor) -> Tensor:
        return method.predict(model, x)

    return query


def audit_membership(attack: Attack, run_dir: Path, cfg: RunConfig, method: Method, fed: Federation,
                     prior: AttackerPrior, *, role: str, victims: Sequence[str]) -> dict[str, Any]:
    """Grant ``attack`` (``fedaudit.attacks.mia``) its access as ``role`` against ``victims``, run it, and
    score its answers by the truth kept here. Reference logits are cached under ``run_dir/mia/``."""
    variants: tuple[str, ...] = getattr(attack, "selected", ())
    truths: dict[str, Tensor] = {}
    challenges: dict[str, MembershipChallenge] = {}
    for victim in victims if any(v != "domain" for v in variants) else ():
        challenges[victim], truths[victim] = make_challenge(fed, victim, cfg.seed)
    domain_challenge, domain_truth = (make_domain_challenge(fed, victims, cfg.seed) if "domain" in variants
                                      else (None, []))
    access = Access(query=black_box(method, fed), challenges=challenges, domain_challenge=domain_challenge,
                    cache_dir=Path(run_dir) / "mia")
    t0 = time.perf_counter()
    outputs = attack.run_batch(fed.wire.view(role), prior, list(victims), fed.device, access)
    result: dict[str, Any] = {}
    for out in outputs:
        key = out.info["result"]
        if key == "domain":
            result["domain"] = {out.artifact: _domain_rows(out, domain_truth, victims, fed.split.target)}
        else:
            result.setdefault(key, {}).setdefault(out.artifact, {})[out.victim] = _victim_entry(
                out, truths[out.victim], cfg)
    log.info("mia: %s as %s against %s in %.1fs (%d reference-model set(s) trained)", ", ".join(variants), role,
             ", ".join(victims), time.perf_counter() - t0, getattr(attack, "trained", 0))
    return result


def _victim_entry(out: AttackOutput, is_member: Tensor, cfg: RunConfig) -> dict[str, Any]:
    info = {k: v for k, v in out.info.items() if k not in ("result", "status", "signal", "reference", "population")}
    if out.scores is None:
        return {k: v for k, v in out.info.items() if k in ("status", "reason")}
    scores = out.scores.double().cpu()
    reference = out.info.get("reference")
    entry = scored(scores[is_member], scores[~is_member], out.info["signal"],
                   reference.get("reference_models", 0) if reference is not None else 0)
    entry.update(info)
    if reference is not None:
        if reference:  # how much the reference models saw of a record (epochs), beside how much the target did
            reference = {**reference, "target_exposure_epochs": target_exposure(cfg)}
        entry["reference"] = reference
        if out.signals:  # did the reference models stand in for this target? (the auditor knows who is a member)
            entry["calibration"] = lira_calibration(out.signals["phi"], out.signals["reference_phi"],
                                                    out.signals["reference_masks"], is_member)
    if "population" in out.info:
        entry["population"] = out.info["population"]
    return entry


def _domain_rows(out: AttackOutput, truth: list[str | None], victims: Sequence[str], unseen_domain: str) -> dict[str, Any]:
    """Per source domain and pooled (``all``): its holdout records against the unseen domain's records."""
    assert out.scores is not None
    scores = out.scores.cpu()
    unseen = scores[torch.tensor([t is None for t in truth])]
    rows: dict[str, Any] = {}
    for victim in [*victims, ALL_DOMAINS]:
        member = torch.tensor([t is not None and victim in (t, ALL_DOMAINS) for t in truth])
        rows[victim] = scored(scores[member], unseen, out.info["signal"], 0)
        rows[victim]["nonmember_domain"] = unseen_domain
    return rows


def scored(members: Tensor, nonmembers: Tensor, signal: str, n_reference: int) -> dict[str, Any]:
    """membership_metrics with the fields every entry carries."""
    out = membership_metrics(members, nonmembers)
    out.update(members=int(members.numel()), nonmembers=int(nonmembers.numel()), reference_models=int(n_reference),
               signal=signal)
    return out


__all__ = ["audit_membership", "black_box", "make_challenge", "make_domain_challenge", "scored"]
