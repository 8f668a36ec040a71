"""What a verdict row is made of: the tiers and levels, a rule and its decision, and the row a decision makes
(:class:`~fedaudit.run.results.VerdictRow`, the one row type, with its tests as
:class:`~fedaudit.run.results.Evidence`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedaudit.run.results import Evidence as Evidence  # re-exported: the rules' one import of the row's parts
from fedaudit.run.results import VerdictRow as VerdictRow

from fedaudit.statistics.membership_statistics import holm

from .thresholds import CORRECTION, RiskThresholds, _num

HIGH, MEDIUM, LOW, INCONCLUSIVE, NOT_ASSESSED = "high", "medium", "low", "inconclusive", "not_assessed"
TIER_ORDER = {HIGH: 4, MEDIUM: 3, LOW: 2, INCONCLUSIVE: 1, NOT_ASSESSED: 0}
DOMAIN = "domain"  # the domain-level membership variant: an attack on the released model
ARTIFACT = "artifact"  # the artifact-level variant: membership from a shared bank or statistics, with twin and power
GLOBAL, LAST_UPLOAD = "global_model", "last_upload"  # the model-based attacks' targets
NULL_NAMES = {"chance": "chance", "control": "untrained-model control", "prior_only": "prior-only control",
              "twin": "holdout twin"}
POWER_ALPHA = 0.05  # level of the positive control (fedaudit.audit.reconstruction) after its corrections

# The questions a row answers, and the observer a row about the released model is judged for.
INVERSION, MEMBERSHIP, DP_AUDIT = "inversion", "membership", "dp_audit"
CLIENT_DATA, PARTICIPATION = "client_data", "participation"
CONSISTENCY = "consistency"  # did every client of a round receive the same model? (recordings: a malicious server)
ANYONE = "anyone holding the released model"
SECURE_AGGREGATION_ROW = "@secure_aggregation"  # the suffix of a row judged from that observer's view

# The level a question is asked at, and so the kind of evidence that may decide it and the mitigation that can lower
# it (issue 47): individual records (reconstructing or singling them out; record-level DP bounds it), what a
# client's data is like as a whole (its domain, classes, style), or which domains took part at all.
RECORDS = "records"
# A server that sends one client another model isolates that client's update (model-inconsistency attacks
# reconstruct its records): the question is asked at the level of the records it exposes.
LEVEL_OF = {INVERSION: RECORDS, MEMBERSHIP: RECORDS, DP_AUDIT: RECORDS, CONSISTENCY: RECORDS, CLIENT_DATA: CLIENT_DATA,
            PARTICIPATION: PARTICIPATION}
LEVELS = (RECORDS, CLIENT_DATA, PARTICIPATION)


@dataclass(frozen=True)
class Unscored:
    """An attack that ran on a row's subject and stored no score: which (``<variant>/<victim>``), its status and why."""

    what: str
    status: str
    reason: str


F = TypeVar("F")  # a rule's facts: a small frozen dataclass of its own (None for a rule that needs none)


@dataclass(frozen=True)
class Decision(Generic[F]):
    """What a rule decided: the tier, the rule, and the facts its sentences are written from (typed per rule)."""

    tier: str
    rule: Rule[F]
    facts: F


@dataclass(frozen=True)
class Strongest:
    """The test that decided the row."""

    top: Evidence


@dataclass(frozen=True)
class Detectable:
    """The smallest effect the row's tests could have detected after its correction, and how many there were."""

    detectable: float
    tests: int


class Rule(Generic[F]):
    """One rule of a row. ``decide`` looks at the row's case (its tests, counts, controls: typed, never a stored
    dict) and returns a :class:`Decision`, or None to let the next rule in the row's chain decide; ``reason`` and
    ``short`` write the row's sentence and its few words from that decision's facts and the case; ``to_conclude``
    says what would make an INCONCLUSIVE row conclusive, in the words of the command that made the run. A rule is
    one class beside the rules of its question, and the chain its question runs is the module's ``RULES``: adding
    a rule is adding a class there and its place in the chain (docs/architecture.md)."""

    name: str = ""
    judges = True  # False: a rule that finds nothing to judge (NOT ASSESSED); the row stores no rule name

    def decide(self, case: Any) -> Decision[F] | None:
        raise NotImplementedError

    def reason(self, d: Decision[F], case: Any) -> str:
        raise NotImplementedError

    def short(self, d: Decision[F], case: Any) -> str:
        raise NotImplementedError

    def to_conclude(self, made_by: str) -> str:
        return "see the row's reason in the verdict"

    def __call__(self, tier: str, facts: F) -> Decision[F]:
        return Decision(tier, self, facts)


class Significant(Rule[Strongest]):
    """The strongest test, after the row's correction, reached MEDIUM or HIGH: its tier is the row's."""

    name = "significant"

    def decide(self, case: Any) -> Decision[Strongest] | None:
        top = strongest(case.evidence)
        return self(top.tier, Strongest(top)) if top.tier in (HIGH, MEDIUM) else None


def closest(evidence: Sequence[Evidence]) -> Evidence:
    """The test nearest significance after the row's correction: what a quiet row quotes."""
    return min(evidence, key=lambda e: e.p_adjusted)


def deciding(rules: Sequence[Rule[Any]], case: Any) -> Decision[Any] | None:
    """The decision of the first rule in ``rules`` that decides, or None."""
    for rule in rules:
        found = rule.decide(case)
        if found is not None:
            return found
    return None


def first(rules: Sequence[Rule[Any]], case: Any) -> Decision[Any]:
    """The decision of the first rule in the chain that decides (the last rule of every chain always does)."""
    found = deciding(rules, case)
    if found is None:
        raise AssertionError(f"no rule decided: the chain {[r.name for r in rules]} has no last rule that always does")
    return found


def decide(evidence: list[Evidence], t: RiskThresholds) -> None:
    """Holm-adjust the row's p-values; a test not significant after correction is LOW whatever its effect."""
    for e, adj in zip(evidence, holm([e.p_value for e in evidence])):
        e.p_adjusted = adj
        if adj > t.alpha:
            e.tier = LOW


def strongest(evidence: list[Evidence]) -> Evidence:
    """The test that decides a row: highest tier, then largest effect."""
    return max(evidence, key=lambda e: (TIER_ORDER[e.tier], e.effect or 0.0))


# -- numbers ----------------------------------------------------------------------------------------


def isnum(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def row(key: str, title: str, question: str, artifact: str, observer: str, d: Decision[Any], case: Any,
        evidence: Sequence[Evidence], alpha: float) -> VerdictRow:
    """The row a decision makes: its tier, its rule's name, and the sentences that rule writes from its facts."""
    return VerdictRow(key, title, question, artifact, observer, d.tier, d.rule.reason(d, case), d.rule.short(d, case),
                      d.rule.name if d.rule.judges else None, (f"{CORRECTION} over {len(evidence)} test(s) at family-wise alpha {_num(alpha)}"
                                    if evidence else None), tuple(evidence), level=LEVEL_OF[question])
