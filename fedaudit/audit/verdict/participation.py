"""Does the released model reveal which domains took part? One row, from the domain-level attack (issue 47).

The domain-level attack scores a source domain's holdout records (never trained on themselves) against the unseen
domain's records on the released model: its AUC. A domain that is merely easier than the unseen one shows a gap
without having taken part, so the test's null is that domain's **twins**: the same federation trained without it,
each with its own seed, scored by the same attack on the same records (:mod:`fedaudit.audit.domain_twin`). Under the
null the released model is one more federation of that kind, so its AUC is compared with the twins' mean against
their spread — a one-sided t test with the prediction interval's standard error s·√(1 + 1/R) for R twins, s pooled
over the row's domains (the training noise of a federation is much the same whichever domain it leaves out).

Rules, in order (each a small function returning a :class:`Decision` or None):

* ``significant`` — a domain's AUC beat its twins after Holm: MEDIUM at a lift of ``participation_auc_lift_medium``
  over their mean, HIGH at ``participation_auc_lift_high``;
* ``no_twin`` — a domain has no twin (a recording, whose loop fedaudit cannot re-run), or no domain has two (no
  spread to measure the training noise by): its gap cannot be told from the domain's own difficulty, INCONCLUSIVE;
* ``undetectable`` — at this spread a lift of ``participation_auc_lift_medium`` could not have been detected after
  the correction: INCONCLUSIVE;
* otherwise LOW.

The pooled row (``all``) the attack also stores has no single twin and is not a test here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fedaudit.run.audited_run import AuditedRun
from fedaudit.run.entries import MembershipEntry
from fedaudit.run.evidence_detail import ParticipationDetail, expect

from .evidence import (VerdictRow, Detectable, Strongest, ANYONE, DOMAIN, GLOBAL, HIGH, INCONCLUSIVE, LOW, MEDIUM, PARTICIPATION, Decision, Evidence,
                       Rule, Significant, Unscored, closest, decide, deciding, first, row)
from .thresholds import CORRECTION, RiskThresholds
from .unassessed import NO_ATTACK, NO_RECORDS, NO_SCORE, NO_TARGET, Unseen
from .wording import clause, fmt, level_title, participation_finding, quiet_short, short

KEY = f"{PARTICIPATION}:{GLOBAL}"
POOLED = "all"


@dataclass
class Case:
    """What the rules of the participation row look at."""

    evidence: list[Evidence]
    df: int  # degrees of freedom of the twins' pooled spread
    t: RiskThresholds


def participation_row(run: AuditedRun, t: RiskThresholds) -> VerdictRow:
    """The released model's participation row."""

    def made(d: Decision[Any], case: object, evidence: Sequence[Evidence] = ()) -> VerdictRow:
        return row(KEY, level_title(GLOBAL, PARTICIPATION), PARTICIPATION, "released model", ANYONE, d, case, evidence,
                   t.alpha)

    domain = [test for test in run.membership if test.variant == DOMAIN]
    entries = {test.victim: test.entry for test in domain if test.victim != POOLED}
    unseen = Unseen(PARTICIPATION, GLOBAL, ANYONE, run.attacker, True, run.no_records,
                    run.membership_ran and bool(domain), bool(entries))
    if (d := deciding((NO_RECORDS, NO_ATTACK, NO_TARGET), unseen)) is not None:
        return made(d, unseen)
    spread, df = twin_spread(entries.values())
    evidence = [e for victim, entry in entries.items()
                if (e := participation_evidence(victim, entry, spread, df, t)) is not None]
    if not evidence:
        unseen.skipped[:] = [Unscored(f"domain/{v}", e.status, e.reason) for v, e in entries.items()]
        return made(NO_SCORE.decide(unseen), unseen)
    decide(evidence, t)
    case = Case(evidence, df, t)
    return made(first(RULES, case), case, evidence)


def twin_spread(entries: Iterable[MembershipEntry]) -> tuple[float | None, int]:
    """The twins' standard deviation around their domain's mean, pooled over the domains, and its degrees of
    freedom (None and 0 where no domain has two twins)."""
    squares, df = 0.0, 0
    for entry in entries:
        aucs = entry.twin_aucs
        if len(aucs) >= 2:
            mean = sum(aucs) / len(aucs)
            squares += sum((a - mean) ** 2 for a in aucs)
            df += len(aucs) - 1
    return (math.sqrt(squares / df) if df else None), df


def twins_of(e: Evidence) -> ParticipationDetail:
    """A participation test's block (every test of this row is one)."""
    return expect(e.detail, ParticipationDetail)


def participation_evidence(victim: str, entry: MembershipEntry, spread: float | None, df: int,
                           t: RiskThresholds) -> Evidence | None:
    """One source domain's test: the released model's AUC against its twins' mean, by their pooled spread."""
    from scipy.stats import t as student

    if entry.auc is None:
        return None
    aucs = list(entry.twin_aucs)
    detail = ParticipationDetail(victim=victim, attack="domain-level attack", twin_aucs=aucs, df=df,
                                 twin_reason=None if aucs else (entry.twin_reason or "no domain twin was trained"),
                                 members=entry.members or 0, nonmembers=entry.nonmembers or 0,
                                 nonmember_domain=entry.nonmember_domain, twin=False)
    if not aucs or spread is None:  # nothing to compare with: the row says so (rule no_twin)
        e = Evidence("participation_auc", f"domain-level attack on {GLOBAL} / {victim}", entry.auc, None,
                     "domain twins", 1.0, tier=LOW, detail=detail)
        e.text = participation_finding(e)
        return e
    base = sum(aucs) / len(aucs)
    se = spread * math.sqrt(1.0 + 1.0 / len(aucs))
    lift = entry.auc - base
    p = float(student.sf(lift / se, df)) if se > 0 else (0.0 if lift > 0 else 1.0)
    tier = (HIGH if lift >= t.participation_auc_lift_high - 1e-9 else
            MEDIUM if lift >= t.participation_auc_lift_medium - 1e-9 else LOW)
    e = Evidence("participation_auc", f"domain-level attack on {GLOBAL} / {victim}", entry.auc, base,
                 "domain twins", p, nulls={"domain_twins": base}, tier=tier, effect=lift,
                 detail=replace(detail, twin=True, spread=spread, se=se))
    e.text = participation_finding(e)
    return e


# -- rules --------------------------------------------------------------------------------------------


class RowSignificant(Significant):
    def reason(self, d: Decision[Strongest], case: Case) -> str:
        top = d.facts.top
        return (f"{clause(top, len(case.evidence))}. {top.text} The released model's AUC is {top.effect:+.2f} over "
                f"its twins': it reveals that {top.victim} took part, beyond that domain's own difficulty and the "
                "training noise of the federation.")

    def short(self, d: Decision[Strongest], case: Case) -> str:
        return short(d.facts.top)


@dataclass(frozen=True)
class Untwinned:
    """The domains' tests without twins to judge them by."""

    missing: list[Evidence]


class NoTwin(Rule[Untwinned]):
    """A domain has no twin (a recording, whose loop fedaudit cannot re-run), or no domain has two: its gap cannot be
    told from the domain's own difficulty."""

    name = "no_twin"

    def decide(self, case: Case) -> Decision[Untwinned] | None:
        missing = [e for e in case.evidence if not twins_of(e).twin]
        return self(INCONCLUSIVE, Untwinned(missing)) if missing else None

    def reason(self, d: Decision[Untwinned], case: Case) -> str:
        names = ", ".join(str(e.victim) for e in d.facts.missing)
        why = twins_of(d.facts.missing[0]).twin_reason or "one twin per domain: no spread to judge by"
        seen = ", ".join(f"{fmt(e.value)} on {e.victim}" for e in case.evidence)
        return (f"the domain-level attack: AUC {seen}, but no domain twins for {names} ({why}): a gap between a "
                "source domain and the unseen one may be that domain's own difficulty, not its participation, and "
                "cannot be told apart without federations trained without it.")

    def short(self, d: Decision[Untwinned], case: Case) -> str:
        return f"{short(closest(case.evidence))}; no domain twin"

    def to_conclude(self, made_by: str) -> str:
        return ("at least two federations trained without each source domain (its domain twins, --domain-twins), "
                "which fedaudit evaluate trains itself; a recording cannot supply them, since fedaudit cannot re-run "
                "the deployment's loop")


class Undetectable(Rule[Detectable]):
    """At this spread a lift of ``participation_auc_lift_medium`` could not have been detected after the correction."""

    name = "undetectable"

    def decide(self, case: Case) -> Decision[Detectable] | None:
        detectable = _detectable(case)
        if detectable <= case.t.participation_auc_lift_medium:
            return None
        return self(INCONCLUSIVE, Detectable(detectable, len(case.evidence)))

    def reason(self, d: Decision[Detectable], case: Case) -> str:
        m = len(case.evidence)
        return (f"no domain's AUC beat its twins' after {CORRECTION} correction over {m} test(s) (closest "
                f"{clause(closest(case.evidence), m)}), but the twins spread so widely that an AUC lift below "
                f"{d.facts.detectable:.2f} could not have been detected (the medium threshold is "
                f"{case.t.participation_auc_lift_medium:g}): more twins (--domain-twins) narrow it.")

    def short(self, d: Decision[Detectable], case: Case) -> str:
        return quiet_short(case.evidence, d.facts.detectable, seen=False)

    def to_conclude(self, made_by: str) -> str:
        return ("more domain twins (--domain-twins), so that their spread can show a lift of 0.05 in AUC over their "
                "mean")


class Low(Rule[Detectable]):
    name = "low"

    def decide(self, case: Case) -> Decision[Detectable]:
        return self(LOW, Detectable(_detectable(case), len(case.evidence)))

    def reason(self, d: Decision[Detectable], case: Case) -> str:
        m = len(case.evidence)
        return (f"no domain's AUC beat its twins' after {CORRECTION} correction over {m} test(s) (closest "
                f"{clause(closest(case.evidence), m)}); a lift of {d.facts.detectable:.2f} in AUC over the twins would have "
                "been detected.")

    def short(self, d: Decision[Detectable], case: Case) -> str:
        return quiet_short(case.evidence, d.facts.detectable, seen=True)


RULES: tuple[Rule[Any], ...] = (RowSignificant(), NoTwin(), Undetectable(), Low())



def _detectable(case: Case) -> float:
    """The smallest AUC lift over the twins the row's tests could have detected after Holm's first step (the
    one-sided t quantile times the largest standard error)."""
    from scipy.stats import t as student

    ses = [float(d.se) for e in case.evidence if (d := twins_of(e)).twin and d.se is not None]
    if not ses or case.df < 1:
        return float("inf")
    return float(student.isf(case.t.alpha / len(case.evidence), case.df)) * max(ses)
