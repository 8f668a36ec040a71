"""The auditor's half of membership inference: challenges, query access, and scoring by the kept truth.

The attack (``fedaudit.attacks.mia``) sees its role's wire view, the public
prior and the :class:`~fedaudit.attack.Access` built here: black-box queries
of the deployed model, one :class:`~fedaudit.attack.MembershipChallenge` per
victim (its members and holdout records shuffled, without saying which is
which) and, for the domain-level question, one
:class:`~fedaudit.attack.DomainChallenge`. The auditor keeps the truth, splits
the attack's scores by it and reports
:func:`fedaudit.statistics.membership_statistics.membership_metrics` with the calibration figure of
any reference models the attack trained (:func:`fedaudit.statistics.membership_statistics.lira_calibration`).

Stored shape: ``{result_key: {target: {victim: entry}}}`` with result keys
loss, lira_online, lira_offline, rmia and domain (target ``global_model``;
victims = each source domain attacked and ``all``, pooled), and artifact
(targets = the shared artifacts; each entry also holds ``twin`` and
``power``, the same test on the auditor's counterfactual artifacts, and for a
per-record bank ``exact_matches``). What could not run is ``{"status": "not
applicable", "reason": ...}`` in the victim's place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedaudit.attack import Access, Attack, AttackerPrior, AttackOutput, DomainChallenge, MembershipChallenge, Query
from fedaudit.audit.counterfactual import (
    TWIN,
    Counterfactual,
    TrainingRecipe,
    counterfactual_view,
    latent_encoders,
    power_case,
    pseudo_name,
)
from fedaudit.errors import unknown_choice
from fedaudit.run.config import target_exposure
from fedaudit.run.seeds import derive_seed, stable_int
from fedaudit.run.stored.leakage import Control, DomainTwin, ExactMatches, MembershipSection, MembershipTestResult
from fedaudit.simulation.wire import SERVER, ArtifactKind, WireView, client_role
from fedaudit.statistics.membership_statistics import lira_calibration, membership_metrics

if TYPE_CHECKING:
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Federation
    from fedaudit.simulation.method import Method

log = logging.getLogger("fedaudit")

CHALLENGE_STREAM = 9_001  # derive_seed stream of the challenge shuffles (mia's own stream number, kept for its results)
ALL_DOMAINS = "all"  # the pooled row of the domain-level question
ARTIFACT = "artifact"  # the artifact-level variant's result key (fedaudit.attacks.mia.artifact)
ARTIFACT_POWER_PER_CLASS = 2  # member records per class behind the artifact test's positive control
NOT_APPLICABLE = "not applicable"


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
    parts: list[tuple[str | None, Tensor, Tensor]] = [(c.domain, c.data.holdout_x, c.data.holdout_y)
                                                      for c in fed.clients if c.domain in domains]
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
    model = fed.deployed_model()
    if model is None:
        return None
    model.eval()

    @torch.no_grad()
    def query(x: Tensor) -> Tensor:
        return method.predict(model, x)

    return query


def audit_membership(attack: Attack, run_dir: Path, cfg: RunConfig, method: Method, fed: Federation,
                     prior: AttackerPrior, *, role: str, victims: Sequence[str], retrain: bool = True,
                     observe: Callable[[WireView], WireView] | None = None) -> MembershipSection:
    """Grant ``attack`` (``fedaudit.attacks.mia``) its access as ``role`` against ``victims``, run it, and
    score its answers by the truth kept here. Reference logits are cached under ``run_dir/mia/``. The domain-level
    answers get their domain twins (:mod:`fedaudit.audit.domain_twin`) when ``retrain``: the federation is fedaudit's
    own and can be trained again without a domain (a recording's cannot). ``observe`` turns the role's view into
    another observer's (secure aggregation's): the attack and its counterfactual controls see it through that."""
    variants = attack.selected
    truths: dict[str, Tensor] = {}
    challenges: dict[str, MembershipChallenge] = {}
    for victim in victims if any(v != "domain" for v in variants) else ():
        challenges[victim], truths[victim] = make_challenge(fed, victim, cfg.seed)
    domain_challenge, domain_truth = (make_domain_challenge(fed, victims, cfg.seed) if "domain" in variants
                                      else (None, []))
    view = fed.wire.view(role)
    # every round the wire kept, as this observer saw it; none where another observer's view is judged (secure
    # aggregation masks the single uploads of every round)
    history = fed.wire.history_view(role) if fed.wire.history_roles and observe is None else None
    access = Access(query=black_box(method, fed), challenges=challenges, domain_challenge=domain_challenge,
                    cache_dir=Path(run_dir) / "mia", history=history)
    t0 = time.perf_counter()
    outputs = attack.run_batch(observe(view) if observe else view, prior, list(victims), fed.device, access)
    result: MembershipSection = {}
    # how many passes each victim's training made over a member (DP plans may add passes)
    plans = fed.dp.plans if fed.dp is not None else {}
    exposure = {c.domain: target_exposure(cfg, plans[c.index].step_factor if c.index in plans else 1)
                for c in fed.clients}
    for out in outputs:
        key = out.info["result"]
        if key == "domain":
            rows = _domain_rows(out, domain_truth, victims, fed.split.target)
            scorable = [v for v in victims if rows[v].has("auc")]
            for domain, twin in _twins(attack, domain_challenge, domain_truth, cfg, method, fed, prior, scorable,
                                       retrain).items():
                rows[domain] = rows[domain].with_(domain_twin=twin)
            result["domain"] = {out.artifact: rows}
        else:
            result.setdefault(key, {}).setdefault(out.artifact, {})[out.victim] = _victim_entry(
                out, truths[out.victim], exposure[out.victim])
    if ARTIFACT in variants and ARTIFACT in result:
        result[ARTIFACT] = _artifact_controls(attack, result[ARTIFACT], view, prior, fed, cfg, challenges, truths,
                                              observe)
    trained = (f" ({getattr(attack, 'trained', 0)} reference-model set(s) trained, the rest from the cache)"
               if getattr(attack, "references_needed", 0) else "")
    log.info("mia: %s as %s against %s in %.1fs%s", ", ".join(variants), role, ", ".join(victims),
             time.perf_counter() - t0, trained)
    return result


NO_TWIN_RECORDING = ("a recording: fedaudit cannot train the deployment again without a domain, so the domain's own "
                     "difficulty has no measured null")


def _twins(attack: Attack, challenge: DomainChallenge | None, truth: list[str | None], cfg: RunConfig,
           method: Method, fed: Federation, prior: AttackerPrior, victims: Sequence[str],
           retrain: bool) -> dict[str, DomainTwin]:
    """Each source domain's domain twin (its entry), or why there is none."""
    if not retrain:
        return {d: DomainTwin(status=NOT_APPLICABLE, reason=NO_TWIN_RECORDING) for d in victims}
    from fedaudit.audit.domain_twin import domain_twins

    t0 = time.perf_counter()
    assert challenge is not None  # the domain-level test ran on it
    twins = domain_twins(lambda query: attack.attack_domain(challenge, query, prior, fed.device), truth, cfg, method,
                         fed, victims, getattr(attack, "domain_twins", 0), black_box)
    fed.timings["train_domain_twins"] = time.perf_counter() - t0
    return twins


def power_records(fed: Federation, victim: str, per_class: int, seed: int) -> Tensor:
    """``per_class`` of the victim's members per class (fewer where a class has fewer), chosen with a seeded
    shuffle: the records a positive-control artifact is computed from."""
    client = next(c for c in fed.clients if c.domain == victim)
    x, y = client.data.members()
    g = torch.Generator().manual_seed(derive_seed(seed, CHALLENGE_STREAM, 5, stable_int(victim)) % 2**63)
    order = torch.randperm(y.shape[0], generator=g)
    labels = y.tolist()  # one host read, not one per record
    taken: dict[int, int] = {}
    picked = []
    for i in order.tolist():
        label = labels[i]
        if taken.get(label, 0) < per_class:
            taken[label] = taken.get(label, 0) + 1
            picked.append(i)
    return x[torch.tensor(sorted(picked), device=x.device)]


def _artifact_controls(attack: Attack, section: dict[str, dict[str, MembershipTestResult]], view: WireView,
                       prior: AttackerPrior, fed: Federation, cfg: RunConfig, challenges: dict[str, MembershipChallenge],
                       truths: dict[str, Tensor], observe: Callable[[WireView], WireView] | None = None
                       ) -> dict[str, dict[str, MembershipTestResult]]:
    """The section with the artifact test re-run on two counterfactuals of every victim's artifacts, stored beside
    each entry:

    * ``twin`` — the artifact with the victim's members swapped for its ``val`` records (same domain, never
      trained on, in neither half of the challenge), scored on the same challenge: it must sit in the null band;
    * ``power`` — the artifact of :data:`ARTIFACT_POWER_PER_CLASS` members per class alone, scored on those
      records against the victim's holdout: the positive control a LOW needs.

    Counterfactual artifacts are built for the server's view only (:mod:`fedaudit.audit.counterfactual`)."""
    entries = [(artifact, victim, e) for artifact, by_victim in section.items() for victim, e in by_victim.items()
               if e.scored]
    done = {artifact: dict(by_victim) for artifact, by_victim in section.items()}
    if not entries:
        return done
    if view.role != SERVER:
        for artifact, victim, e in entries:
            done[artifact][victim] = e.with_(controls=(
                "not available: counterfactual artifacts are built for the server's view only; a client sees "
                "aggregates whose counterfactual would need the server's aggregation rule"))
        return done
    cases, pseudo_challenges, pseudo_truths, trimmed = _control_cases(sorted({v for _, v, _ in entries}), view, fed,
                                                                       cfg, challenges, truths)
    recipe = TrainingRecipe(fed.preprocess, cfg.augment, cfg.batch_size)
    cf_view, skipped = counterfactual_view(view, prior, cases, fed.device, recipe, seed=cfg.seed,
                                           latent_encoders=latent_encoders(cfg, fed))
    cf_view = observe(cf_view) if observe else cf_view  # built from the clear uploads, then seen as the observer sees it
    controls = attack.for_artifact_controls()  # type: ignore[attr-defined]
    outs = controls.run_batch(cf_view, prior, list(pseudo_challenges), fed.device, Access(challenges=pseudo_challenges))
    by_key = {(o.victim, o.artifact): o for o in outs}
    for artifact, victim, e in entries:
        found = {}
        for case, name in (("twin", pseudo_name(victim, TWIN)),
                           ("power", pseudo_name(victim, power_case(ARTIFACT_POWER_PER_CLASS)))):
            why = (skipped.get(name) or {}).get(artifact.split(":")[0])
            control = _control_entry(case, name in pseudo_challenges, why, by_key.get((name, artifact)),
                                     pseudo_truths.get(name))
            if case == "power" and control.has("records") and victim not in trimmed:
                control = control.with_(per_class=ARTIFACT_POWER_PER_CLASS)
            found[case] = control
        done[artifact][victim] = e.with_(**found)
    return done


def _control_cases(victims: list[str], view: WireView, fed: Federation, cfg: RunConfig,
                   challenges: dict[str, MembershipChallenge], truths: dict[str, Tensor]
                   ) -> tuple[list[Counterfactual], dict[str, MembershipChallenge], dict[str, Tensor], set[str]]:
    """Each victim's twin (where it has val records) and positive control: the counterfactual artifacts to build,
    the challenges that score them with their truths, and the victims whose power records were cut to a bank."""
    cases, pseudo_challenges, pseudo_truths = [], {}, {}
    trimmed: set[str] = set()
    for victim in victims:
        client = next(c for c in fed.clients if c.domain == victim)
        real = challenges[victim]
        if client.data.val_x.shape[0] > 0:
            members, _ = client.data.members()
            twin = pseudo_name(victim, TWIN)
            cases.append(Counterfactual(victim, TWIN, client.data.val_x.to(fed.device), swap_out=members.to(fed.device)))
            pseudo_challenges[twin] = MembershipChallenge(twin, real.images, real.labels, real.population_images,
                                                          real.population_labels)
            pseudo_truths[twin] = truths[victim]
        case, challenge, truth, cut = _power_case(victim, client, real, view, fed, cfg)
        cases.append(case)
        pseudo_challenges[challenge.victim], pseudo_truths[challenge.victim] = challenge, truth
        if cut:
            trimmed.add(victim)
    return cases, pseudo_challenges, pseudo_truths, trimmed


def _power_case(victim: str, client: Any, real: MembershipChallenge, view: WireView, fed: Federation, cfg: RunConfig
                ) -> tuple[Counterfactual, MembershipChallenge, Tensor, bool]:
    """The positive control of one victim: the artifact of a few members per class alone (cut to a per-record
    bank's size), and the challenge that scores those members against the victim's holdout. Also whether the
    records were cut."""
    power = pseudo_name(victim, power_case(ARTIFACT_POWER_PER_CLASS))
    chosen = power_records(fed, victim, ARTIFACT_POWER_PER_CLASS, cfg.seed)
    rows = _bank_rows(view, victim)
    cut = rows is not None and rows < chosen.shape[0]  # a bank of k single-record entries holds k power records
    if cut:
        chosen = chosen[:rows]
    holdout = client.data.holdout_x
    images = torch.cat([chosen, holdout.to(chosen.device)])
    truth = torch.cat([torch.ones(chosen.shape[0], dtype=torch.bool), torch.zeros(holdout.shape[0], dtype=torch.bool)])
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, CHALLENGE_STREAM, 6, stable_int(victim)) % 2**63)
    order = torch.randperm(truth.shape[0], generator=g)
    labels = torch.zeros(truth.shape[0], dtype=torch.long, device=images.device)  # unused by the artifact test
    challenge = MembershipChallenge(power, images[order.to(images.device)], labels, real.population_images,
                                    real.population_labels)
    case = Counterfactual(victim, power_case(ARTIFACT_POWER_PER_CLASS), chosen.to(fed.device))
    return case, challenge, truth[order], cut


def _control_entry(case: str, built: bool, why: str | None, out: AttackOutput | None, truth: Tensor | None
                   ) -> Control:
    """One control's entry beside the artifact test's: its scores split by the kept truth, or why there are none."""
    if not built:
        return Control(status=NOT_APPLICABLE, reason="the victim has no val records to build the twin from")
    if why is not None:
        return Control(status=NOT_APPLICABLE, reason=f"not a counterfactual: {why}")
    if out is None or out.scores is None or truth is None:
        return Control(status=str((out.info.get("status") if out else None) or NOT_APPLICABLE),
                       reason=str((out.info.get("reason") if out else None) or "the control produced no scores"))
    scores = out.scores.double().cpu()
    return Control.reported(out.attack, {**scored(scores[truth], scores[~truth], str(out.info.get("signal", "")), 0),
                                         "records": int(truth.sum()) if case == "power" else "val"})


def _bank_rows(view: WireView, victim: str) -> int | None:
    """The fewest entries of the victim's per-record banks in the view (None without one; a pooled style
    bank, one row, is an aggregate)."""
    rows = [int(next(iter(a.tensors.values())).shape[0]) for a in view
            if a.sender == client_role(victim) and a.kind in (ArtifactKind.AMPLITUDE_BANK, ArtifactKind.STYLE_BANK)]
    rows = [r for r in rows if r > 1]
    return min(rows) if rows else None


def _victim_entry(out: AttackOutput, is_member: Tensor, exposure: int) -> MembershipTestResult:
    if out.scores is None:
        return MembershipTestResult.model_validate({k: str(out.info[k]) for k in ("status", "reason") if k in out.info})
    scores = out.scores.double().cpu()
    unscorable = not_finite(scores)
    if unscorable:
        return MembershipTestResult(status=NOT_APPLICABLE, reason=unscorable)
    info = {k: v for k, v in out.info.items() if k not in ("result", "status", "signal", "reference", "population")}
    reference = out.info.get("reference")
    found: dict[str, object] = {**scored(scores[is_member], scores[~is_member], str(out.info["signal"]),
                                      reference.get("reference_models", 0) if reference is not None else 0), **info}
    if reference is not None:
        if reference and reference.get("kind") != "replay":
            # how much a from-scratch reference saw of a record (epochs), beside how much the target did
            reference = {**reference, "target_exposure_epochs": exposure}
        found["reference"] = reference
        if out.signals:  # did the reference models stand in for this target? (the auditor knows who is a member)
            # the signal the attack scored: less the references' shift where it took one (LiRA, RMIA), else as is
            shift = float(reference["shift"]) if "shift" in reference else None
            found["calibration"] = lira_calibration(out.signals["phi"], out.signals["reference_phi"],
                                                    out.signals["reference_masks"], is_member, shift)
    if "population" in out.info:
        found["population"] = out.info["population"]
    if "exact_tolerance" in out.info:  # per-record banks: candidates whose own entry is in the bank, verbatim
        exact = scores >= -float(out.info["exact_tolerance"])
        found["exact_matches"] = ExactMatches(members=int(exact[is_member].sum()), nonmembers=int(exact[~is_member].sum()))
    return MembershipTestResult.reported(out.attack, found)


def _domain_rows(out: AttackOutput, truth: list[str | None], victims: Sequence[str],
                 unseen_domain: str) -> dict[str, MembershipTestResult]:
    """Per source domain and pooled (``all``): its holdout records against the unseen domain's records."""
    assert out.scores is not None
    scores = out.scores.cpu()
    unscorable = not_finite(scores)
    if unscorable:
        return {victim: MembershipTestResult(status=NOT_APPLICABLE, reason=unscorable)
                for victim in [*victims, ALL_DOMAINS]}
    unseen = scores[torch.tensor([t is None for t in truth])]
    rows: dict[str, MembershipTestResult] = {}
    for victim in [*victims, ALL_DOMAINS]:
        member = torch.tensor([t is not None and victim in (t, ALL_DOMAINS) for t in truth])
        found = scored(scores[member], unseen, str(out.info["signal"]), 0)
        rows[victim] = MembershipTestResult.reported(out.attack, {**found, "nonmember_domain": unseen_domain})
    return rows


def not_finite(scores: Tensor) -> str | None:
    """Why scores that are not all finite cannot be ranked (the attacked model's outputs overflowed: weights that
    noise or divergence destroyed), the reason that stands in for a score; None when they can."""
    bad = int((~torch.isfinite(scores)).sum())
    if not bad:
        return None
    return (f"{bad} of {scores.numel()} scores are not finite: the attacked model's outputs overflow (its weights "
            "destroyed by noise, or diverged), so there is nothing to rank")


def scored(members: Tensor, nonmembers: Tensor, signal: str, n_reference: int) -> dict[str, object]:
    """membership_metrics with the fields every entry carries: the scorer's half of a
    :class:`~fedaudit.run.stored.leakage.Separation`."""
    out = membership_metrics(members, nonmembers)
    out.update(members=int(members.numel()), nonmembers=int(nonmembers.numel()), reference_models=int(n_reference),
               signal=signal)
    return out


__all__ = ["audit_membership", "black_box", "make_challenge", "make_domain_challenge", "scored"]
