"""Rows with nothing to judge: why, in the words of the question they could not answer (NOT ASSESSED).

Every question's chain starts with these, in the order its module lists them: ``other_view`` (the row is judged
from a view this run's attacker does not hold), ``no_records`` (the auditor holds none of the clients' records),
``no_attack`` (no attack of the kind ran), ``no_target`` (attacks ran, none on this subject), and — once the tests
are gathered — ``no_score`` (attacks ran on it and stored no score with its nulls)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .evidence import CLIENT_DATA, INVERSION, NOT_ASSESSED, PARTICIPATION, Decision, Rule, Unscored
from .wording import subject_name


@dataclass(frozen=True)
class Unseen:
    """What the not-assessed rules look at: the row's question and subject, whose view it is, and what ran."""

    question: str
    subject: str  # a share key ("full_model↑"), global_model or last_upload
    observer: str
    attacker: str
    sees: bool  # this run's attacker holds the row's view
    no_records: str | None  # why the auditor held no records (None: it held them)
    attack_ran: bool  # an attack of the row's kind ran in this run
    targeted: bool  # one of them read this row's subject
    # no_score: each membership or participation attack that stored no score; for a reconstruction row, why its
    # artifacts stored none, one sentence each
    skipped: list[Unscored] = field(default_factory=list)
    not_scored: list[str] = field(default_factory=list)

    @property
    def reconstruction(self) -> bool:
        return self.question in (INVERSION, CLIENT_DATA)


class Unassessed(Rule[None]):
    """A rule that finds nothing to judge: the row is NOT ASSESSED and says why."""

    judges = False


class OtherView(Unassessed):
    name = "other_view"

    def decide(self, case: Unseen) -> Decision[None] | None:
        return None if case.sees else self(NOT_ASSESSED, None)

    def reason(self, d: Decision[None], case: Unseen) -> str:
        other = "--attacker client:<domain>" if case.attacker == "server" else "--attacker server"
        if case.reconstruction:
            sees = "uploads" if case.attacker == "server" else "broadcasts"
            flags = other + ("" if case.attack_ran else " --attack deepinversion")  # no inversion ran
            return (f"judged from {case.observer}'s view, which this run's attacker ({case.attacker}) does not hold "
                    f"(it sees {sees} only); assess it with {flags}")
        return (f"judged from {case.observer}'s view, which this run's attacker ({case.attacker}) does not hold; "
                f"assess it with {other} --attack mia")

    def short(self, d: Decision[None], case: Unseen) -> str:
        other = "--attacker client:<domain>" if case.attacker == "server" else "--attacker server"
        return f"{case.observer}'s view: {other}"


class NoRecords(Unassessed):
    name = "no_records"

    def decide(self, case: Unseen) -> Decision[None] | None:
        return self(NOT_ASSESSED, None) if case.no_records is not None and not case.targeted else None

    def reason(self, d: Decision[None], case: Unseen) -> str:
        return f"membership inference needs the clients' records: {case.no_records or 'the auditor holds none'}"

    def short(self, d: Decision[None], case: Unseen) -> str:
        return "no records to test"


class NoAttack(Unassessed):
    name = "no_attack"

    def decide(self, case: Unseen) -> Decision[None] | None:
        return None if case.attack_ran else self(NOT_ASSESSED, None)

    def reason(self, d: Decision[None], case: Unseen) -> str:
        if case.reconstruction:
            return "no reconstruction attack ran in this run; run with --attack deepinversion"
        if case.question == PARTICIPATION:
            return ("no domain-level attack in this run; run with --attack mia-domain (it trains domain twins, the "
                    "federation without each source domain, as its null)")
        return "no membership attack in this run; run with --attack mia"

    def short(self, d: Decision[None], case: Unseen) -> str:
        return ("no inversion attack ran" if case.reconstruction else
                "no domain-level attack ran" if case.question == PARTICIPATION else "no membership attack ran")


class NoTarget(Unassessed):
    name = "no_target"

    def decide(self, case: Unseen) -> Decision[None] | None:
        return None if case.targeted else self(NOT_ASSESSED, None)

    def reason(self, d: Decision[None], case: Unseen) -> str:
        if case.reconstruction:
            return f"no attack in this run targets {case.subject}"
        return f"no membership attack in this run takes {subject_name(case.subject)} as its input"

    def short(self, d: Decision[None], case: Unseen) -> str:
        return "no attack targets it" if case.reconstruction else "no attack reads it"


class NoScore(Unassessed):
    """Attacks ran on the subject and none stored a score with its nulls: each one's status and why."""

    name = "no_score"

    def decide(self, case: Unseen) -> Decision[None]:
        return self(NOT_ASSESSED, None)

    def reason(self, d: Decision[None], case: Unseen) -> str:
        if case.reconstruction:
            return "; ".join(case.not_scored) or f"no score with nulls stored for {case.subject}"
        full = "; ".join(f"{u.what}: {u.status} — {u.reason}" for u in case.skipped)
        return f"no membership result for {subject_name(case.subject)}: {full or 'none stored'}"

    def short(self, d: Decision[None], case: Unseen) -> str:
        if case.reconstruction:
            why = case.not_scored
            return "not applicable" if why and all(s.startswith("not applicable") for s in why) else "not scored"
        skipped = case.skipped
        if not skipped:  # membership, participation: the first one's status and its reason's first clause
            return "no result stored"
        clause = skipped[0].reason.split(":")[0].split(";")[0].strip()
        return f"{skipped[0].status}: {clause}" if clause else skipped[0].status


OTHER_VIEW, NO_RECORDS, NO_ATTACK, NO_TARGET, NO_SCORE = OtherView(), NoRecords(), NoAttack(), NoTarget(), NoScore()
