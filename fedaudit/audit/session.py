"""The audit of one finished federation: who attacks whom, what each attack is granted, who scores it.

The auditor decides what is public (:func:`attacker_prior`: the architecture,
classes, normalisation and the method's public code), who the attacker is and
whom it attacks (:func:`attack_role_and_victims`), and runs each selected
attack with the access its threat model grants, scoring the answers with the
matching procedure: membership (:mod:`~fedaudit.audit.membership`), the canary
audit (:mod:`~fedaudit.audit.canary`) or reconstruction
(:mod:`~fedaudit.audit.reconstruction`) against the records it holds
(:func:`build_auditor`). The attack classes are handed in: the auditor looks
up no plug-in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from fedaudit.attack import Attack, AttackerPrior, attack_setup
from fedaudit.audit.canary import audit_canaries
from fedaudit.audit.counterfactual import TrainingRecipe, latent_encoders
from fedaudit.audit.leakage import Auditor, DomainRecords
from fedaudit.audit.membership import audit_membership
from fedaudit.audit.reconstruction import audit_reconstruction, unscored_section
from fedaudit.errors import unknown_choice
from fedaudit.run.seeds import derive_seed
from fedaudit.run.stored import AggregateSeen, Disaggregation, LeftInClear, SecureAggregation, SolvedUpdate
from fedaudit.run.stored.leakage import Leakage, MembershipSection, OneRunAudit
from fedaudit.run.stored.reconstruction import ReconstructionSection
from fedaudit.simulation.method import Method
from fedaudit.simulation.secure_aggregation import (MASKED, Disaggregated, left_in_view, participation_varies,
                                                     secure_aggregation_view)
from fedaudit.simulation.wire import SERVER, WireView, client_role

if TYPE_CHECKING:
    from fedaudit.data import MultiDomainDataset
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Federation

log = logging.getLogger("fedaudit")

SECURE_AGGREGATION_OBSERVER = "server (secure aggregation)"
RELEASED_ONLY = ("domain",)  # membership variants of the released model alone: the same with or without the mask
PRIOR_SEED_STREAM = 7_001  # the attacker's fresh model: a fixed initialisation, independent of the run's own


def attacker_prior(cfg: RunConfig, method: Method, fed: Federation, dataset: MultiDomainDataset) -> AttackerPrior:
    """Public knowledge: the method's architecture (built by the method itself, so
    norm layers and heads match), classes, domains, image shape, normalisation, and the
    method's public code (its predict, whether it is label-free, its local training recipe)."""
    seed = derive_seed(cfg.seed, PRIOR_SEED_STREAM)
    round_recipes = {} if method.replay_note else {
        c.domain: r for c in fed.clients if (r := method.round_recipe(fed, c)) is not None}

    def build() -> torch.nn.Module:
        # fork_rng: building the attacker's model must not move the run's RNG streams.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return method.build_model(fed)

    return AttackerPrior(arch=cfg.model, num_classes=len(dataset.classes), class_names=tuple(dataset.classes),
                         domains=tuple(dataset.domains), image_size=cfg.image_size, channels=3,
                         mean=tuple(dataset.mean), std=tuple(dataset.std), build_model=build,
                         num_clients=len(fed.clients), hflip=dataset.hflip, predict=method.predict,
                         label_free=method.label_free,
                         train_recipes={c.domain: r for c in fed.clients
                                        if (r := method.reference_recipe(fed, c)) is not None},
                         new_model=lambda: method.build_model(fed), round_recipes=round_recipes,
                         replay_note="" if round_recipes else method.replay_note or (
                             f"{method.name} declares no recipe for one round of its clients' local training "
                             "(Method.round_recipe)"))


def attack_role_and_victims(cfg: RunConfig, sources: list[str]) -> tuple[str, list[str]]:
    """The attacker's wire role and the victims' domains for one target (user errors name the choices)."""
    if cfg.attacker == SERVER:
        role, pool = SERVER, list(sources)
    else:
        domain = cfg.attacker[len("client:"):]
        if domain not in sources:
            raise unknown_choice("attacker", cfg.attacker, [SERVER, *(client_role(d) for d in sources)])
        role, pool = client_role(domain), [d for d in sources if d != domain]
    if cfg.victim == "all":
        return role, pool
    if cfg.victim not in pool:
        raise unknown_choice(f"victim for attacker {cfg.attacker}", cfg.victim, [*pool, "all"])
    return role, [cfg.victim]


def reconstruction_outcome(attack: str, section: ReconstructionSection) -> str:
    """What a reconstruction attack did, in one log line: scored against its controls, or on nothing at all
    (every artifact not applicable, each reason named) — never a promise of controls that did not run."""
    entries = [e for _, victims in section.tables() for e in victims.values()]
    scored = [e for e in entries if e.metrics is not None]
    if scored:
        return (f"{attack}: {len(scored)} artifact(s) scored with their nulls, holdout twin and positive control"
                + (f"; {len(entries) - len(scored)} not scored" if len(entries) > len(scored) else ""))
    reasons = sorted({f"{e.status}: {e.reason}" for e in entries if e.status})
    return f"{attack}: nothing scored ({'; '.join(reasons) or 'no artifact to attack'})"


def run_attacks(selected: Sequence[type[Attack]], run_dir: Path, cfg: RunConfig, method: Method, fed: Federation,
                dataset: MultiDomainDataset, device: torch.device, *, retrain: bool = True,
                disaggregated: Disaggregated | None = None) -> tuple[Leakage, SecureAggregation | None]:
    """Every ``selected`` attack class against the attacker's wire view, scored by the auditor, and (under
    ``--secure-aggregation``) the same against what that server sees. ``retrain``: the federation is fedaudit's own,
    so counterfactual federations (the domain twins) can be trained; a recording's cannot.

    An attack gets the view, the prior and the access its threat model grants
    (``Attack.needs``); the auditor's procedure for it follows from that grant:
    membership challenges, planted canaries, or reconstructions scored against
    the private records. One instance per attack family, membership first.
    """
    if not selected:
        return Leakage(), None
    prior = attacker_prior(cfg, method, fed, dataset)
    role, victims = attack_role_and_victims(cfg, [c.domain for c in fed.clients])
    attacks = one_per_family(selected, cfg, prior)
    attacks.sort(key=lambda a: 0 if "challenges" in a.needs else 1 if "canaries" in a.needs else 2)
    found = _Sections()
    auditor = None
    for attack in attacks:
        against = f"as {role} against {', '.join(victims)}"
        if "challenges" in attack.needs:
            refs = getattr(attack, "references_needed", 0)
            log.info("attack %s %s%s", attack.name, against, f" ({refs} reference models per victim)" if refs else "")
            found.mia.update(audit_membership(attack, run_dir, cfg, method, fed, prior, role=role, victims=victims,
                                              retrain=retrain))
            found.ran.add("mia")
        elif "canaries" in attack.needs:  # the one-run audit: the auditor scores the canaries it planted
            log.info("canary audit %s", against)
            audits = audit_canaries(attack, cfg, method, fed, prior, role=role, victims=victims)
            found.canary.update(audits.input)
            found.canary_gradient.update(audits.gradient)
            found.ran.add("canary")
        else:
            log.info("attack %s %s", attack.name, against)
            auditor = auditor or build_auditor(cfg, fed, dataset, device)  # trains the judges: only when needed
            section = audit_reconstruction(attack, fed.wire.view(role), prior, victims, auditor, run_dir, device)
            log.info("%s", reconstruction_outcome(attack.name, section))
            found.reconstructions[attack.name] = with_settings(section, attack)
    leakage = found.leakage()
    if not cfg.secure_aggregation:
        return leakage, None
    auditor = auditor or (build_auditor(cfg, fed, dataset, device) if any(not a.needs for a in attacks) else None)
    return leakage, secure_aggregation_pass(selected, leakage, run_dir, cfg, method, fed, prior, victims, auditor,
                                            device, disaggregated or {})


@dataclass
class _Sections:
    """The attack results as the attacks finish, until they are one :class:`Leakage`."""

    mia: MembershipSection = field(default_factory=dict)
    canary: dict[str, OneRunAudit] = field(default_factory=dict)
    canary_gradient: dict[str, OneRunAudit] = field(default_factory=dict)
    reconstructions: dict[str, ReconstructionSection] = field(default_factory=dict)
    ran: set[str] = field(default_factory=set)  # the sections of the families that ran (each stored, if empty)

    def leakage(self) -> Leakage:
        return Leakage(**{name: getattr(self, name) for name in ("mia", "canary", "canary_gradient", "reconstructions")
                          if name in self.ran or getattr(self, name)})


def with_settings(section: ReconstructionSection, attack: Attack) -> ReconstructionSection:
    """A reconstruction attack's section with the attack's settings as run, where it declares them."""
    settings = getattr(attack, "settings", None)
    return section if settings is None else section.with_(settings=settings.to_json())


def secure_aggregation_pass(selected: Sequence[type[Attack]], leakage: Leakage, run_dir: Path, cfg: RunConfig,
                            method: Method, fed: Federation, prior: AttackerPrior, victims: list[str],
                            auditor: Auditor | None, device: torch.device,
                            disaggregated: Disaggregated) -> SecureAggregation:
    """The same attacks, scored the same way, against what a server under secure aggregation sees of the same wire
    (:mod:`fedaudit.simulation.secure_aggregation`): the aggregate of each masked kind, and every other upload as
    it was. Only what the mask changes is attacked again — a bank or a clear scalar is the same message with or
    without it, and so is the released model — and the section holds both: the aggregate's results and, for the
    rest, the server's own (``leakage`` at the pass's end is the whole view's, as judged)."""
    clear = fed.wire.view(SERVER)

    def observe(view: WireView) -> WireView:
        return masked_only(secure_aggregation_view(view, disaggregated))

    seen = _Sections()
    for attack in one_per_family(selected, cfg, prior):
        if "canaries" in attack.needs:  # the canary audit tests a DP claim, not an observer
            continue
        if "challenges" in attack.needs:
            variants = tuple(v for v in attack.selected if v not in RELEASED_ONLY)
            if not variants:
                continue
            attack.selected = variants
            log.info("attack %s as the server under secure aggregation against %s", attack.name, ", ".join(victims))
            seen.mia.update(audit_membership(attack, run_dir, cfg, method, fed, prior, role=SERVER, victims=victims,
                                             retrain=False, observe=observe))
        elif auditor is not None:
            log.info("attack %s as the server under secure aggregation against %s", attack.name, ", ".join(victims))
            section = audit_reconstruction(attack, clear, prior, victims, auditor, run_dir, device, observe=observe,
                                           grid_suffix="-secure-aggregation")
            seen.reconstructions[attack.name] = with_settings(section, attack)
    whole = secure_aggregation_view(clear, disaggregated)
    aggregate = next((a.meta["secure_aggregate"] for a in whole if "secure_aggregate" in a.meta
                      and "disaggregated_from" not in a.meta["secure_aggregate"]), None)
    return SecureAggregation(
        observer=SECURE_AGGREGATION_OBSERVER, masked=[k.value for k in MASKED] + ["the example count"],
        leaves=[LeftInClear(**row) for row in left_in_view(whole)],
        aggregate=None if aggregate is None else AggregateSeen(**aggregate),
        disaggregation=disaggregation_status(fed.wire.ledger, disaggregated),
        leakage=merge_secure_aggregation(leakage, seen.leakage()))


def disaggregation_status(ledger: list[Any], disaggregated: Disaggregated) -> Disaggregation:
    """Whether a server could solve the rounds' aggregates for single updates (Lam et al., ICML 2021) — only where
    the set of uploading clients varied across rounds — and for whom it did."""
    if disaggregated:
        solved = {client: SolvedUpdate(rounds=[r1, r2], kind=kind.value) for (kind, client), (_, r1, r2) in
                  sorted(disaggregated.items(), key=lambda item: item[0][1])}
        return Disaggregation(status="run", reason="participation varied across rounds: the server solved two rounds' "
                              "aggregates whose clients differ by one client for that client's single update, assuming "
                              "the others' updates alike in both (Lam et al., ICML 2021); each such client's test is "
                              "against the update it recovered", clients=solved)
    rounds: dict[int, set[str]] = {}
    for e in ledger:
        if e.receiver == SERVER and e.kind in {k.value for k in MASKED}:
            rounds.setdefault(e.round, set()).add(e.sender)
    if participation_varies(rounds):
        return Disaggregation(status="not possible", reason="participation varied across rounds, but no two rounds' "
                              "clients differ by exactly one client, so no single update can be solved for this way")
    return Disaggregation(status="not applicable", reason="the same clients uploaded in every round: the rounds' "
                          "aggregates give no system to solve for a single update")


def masked_only(view: WireView) -> WireView:
    """Of a secure-aggregation view, what the mask changed (each aggregate) and the server's own broadcasts: the
    attacks re-run on these only."""
    return WireView(view.role, [a for a in view if a.sender == SERVER or "secure_aggregate" in a.meta])


def merge_secure_aggregation(clear: Leakage, seen: Leakage) -> Leakage:
    """The whole secure-aggregation view's leakage: the re-run attacks' entries for what the mask covers, the clear
    view's for everything else (the same messages, the same results)."""
    merged = _Sections(mia=_merge_membership(clear.mia, seen.mia), canary=dict(clear.canary),
                       canary_gradient=dict(clear.canary_gradient),
                       reconstructions={name: _merge_section(section, seen.reconstructions.get(name))
                                        for name, section in clear.reconstructions.items()})
    merged.ran = {name for name in ("mia", "canary") if clear.has(name)}
    return merged.leakage()


Merged = TypeVar("Merged")


def _is_masked(artifact: str) -> bool:
    return artifact.split(":")[0] in {k.value for k in MASKED}


def _merge_by_artifact(clear: Mapping[str, Merged], again: Mapping[str, Merged]) -> dict[str, Merged]:
    """Per artifact: the re-run's result for a masked artifact (none where it has none), the clear view's for the
    rest."""
    merged = {a: (again.get(a) if _is_masked(a) else v) for a, v in clear.items()}
    return {a: v for a, v in merged.items() if v is not None}


def _merge_section(clear: ReconstructionSection, again: ReconstructionSection | None) -> ReconstructionSection:
    """A reconstruction section merged, its summary too; the auditor's judges and the settings as the clear run's."""
    again = again or ReconstructionSection()
    merged = clear.with_(artifacts=_merge_by_artifact(clear.artifacts, again.artifacts))
    return merged.with_(summary=_merge_by_artifact(clear.summary, again.summary)) if clear.has("summary") else merged


def _merge_membership(clear: MembershipSection, again: MembershipSection) -> MembershipSection:
    """The membership section (``{variant: {target: {victim: test}}}``): the artifact test of a masked artifact and
    every attack on a victim's upload (now the aggregate) from the re-run; the released model's as it was."""
    merged: MembershipSection = {}
    for variant, targets in clear.items():
        fresh = again.get(variant) or {}
        if variant == "artifact":
            merged[variant] = _merge_by_artifact(targets, fresh)
        elif variant in RELEASED_ONLY:
            merged[variant] = targets
        else:
            merged[variant] = {t: (fresh.get(t, v) if t != "global_model" else v) for t, v in targets.items()}
    return merged


def one_per_family(selected: Sequence[type[Attack]], cfg: RunConfig, prior: AttackerPrior) -> list[Attack]:
    """One configured instance per attack family (``mia-loss,mia-lira`` is one mia run), in selection order."""
    families: dict[str, list[type[Attack]]] = {}
    for cls in selected:
        families.setdefault(cls.family or cls.name, []).append(cls)
    return [group[0].for_selection(group, attack_setup(group[0], cfg), prior) for group in families.values()]


def run_unscored(selected: Sequence[type[Attack]], run_dir: Path, cfg: RunConfig, method: Method, fed: Federation,
                 dataset: MultiDomainDataset, device: torch.device, why: str) -> Leakage:
    """Every ``selected`` attack against the attacker's wire view, with nothing to score it against (an
    auditor without the clients' records): each keeps its reconstructions and nulls, and says ``why`` it is
    unscored. Attacks that need the records (challenges, canaries) are refused before this."""
    prior = attacker_prior(cfg, method, fed, dataset)
    role, victims = attack_role_and_victims(cfg, [c.domain for c in fed.clients])
    found = _Sections()
    for attack in one_per_family(selected, cfg, prior):
        log.info("attack %s as %s against %s, unscored: %s", attack.name, role, ", ".join(victims), why)
        outputs = attack.run_batch(fed.wire.view(role), prior, victims, device)
        found.reconstructions[attack.name] = with_settings(unscored_section(attack.name, outputs, prior, run_dir, why),
                                                           attack)
    return found.leakage()


def build_auditor(cfg: RunConfig, fed: Federation, dataset: MultiDomainDataset, device: torch.device) -> Auditor:
    """The auditor's records: members, holdouts and judge-training records of every domain."""
    records = []
    for domain in dataset.domains:
        client = next((c for c in fed.clients if c.domain == domain), None)
        if client is None:  # the unseen target: only a reference for the domain judge
            records.append(DomainRecords(domain, None, None, None, None, fed.target_x, fed.target_y))
            continue
        d = client.data
        records.append(DomainRecords(domain, *d.members(), d.holdout_x, d.holdout_y,  # members: train minus canaries
                                     torch.cat([d.val_x, d.holdout_x]), torch.cat([d.val_y, d.holdout_y])))
    return Auditor(records, len(dataset.classes), dataset.mean, dataset.std, dataset.hflip,
                   seed=derive_seed(cfg.seed, PRIOR_SEED_STREAM + 1) % 2**31, device=device,
                   lpips_weights=cfg.lpips_weights, judge_steps=cfg.judge_steps, latent_encoders=latent_encoders(cfg, fed),
                   recipe=TrainingRecipe(fed.preprocess, cfg.augment, cfg.batch_size))


__all__ = ["attack_role_and_victims", "attacker_prior", "build_auditor", "run_attacks", "run_unscored"]
