"""What a verdict row is made of: the tests behind it (``Evidence``), the row itself (``Row``), the tiers, and
readers of the stored metrics every rule shares."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

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

# The level a question is asked at, and so the kind of evidence that may decide it and the mitigation that can lower
# it (issue 47): individual records (reconstructing or singling them out; record-level DP bounds it), what a
# client's data is like as a whole (its domain, classes, style), or which domains took part at all.
RECORDS = "records"
# A server that sends one client another model isolates that client's update (model-inconsistency attacks
# reconstruct its records): the question is asked at the level of the records it exposes.
LEVEL_OF = {INVERSION: RECORDS, MEMBERSHIP: RECORDS, DP_AUDIT: RECORDS, CONSISTENCY: RECORDS, CLIENT_DATA: CLIENT_DATA,
            PARTICIPATION: PARTICIPATION}
LEVELS = (RECORDS, CLIENT_DATA, PARTICIPATION)


@dataclass
class Evidence:
    """One test behind a verdict row."""

    test: str
    source: str  # "deepinversion full_model / clean", "lira_online on global_model / clean"
    value: float
    baseline: float | None
    baseline_name: str
    p_value: float
    interval: list[float] | None = None
    nulls: dict[str, float] | None = None
    power: dict[str, Any] | None = None
    p_adjusted: float = 1.0
    tier: str = LOW
    text: str = ""  # the plain-language sentence if this test decides the row
    effect: float | None = None  # what the effect-size rule compares (lift, or the interval's low end)
    detail: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and k != "text"}


@dataclass
class Row:
    """One verdict row: one question about one artifact, judged from one observer's view.

    ``reason`` leads with what decided (the attack, its number, the null it beat or failed to beat, p);
    ``short`` is the same fact in a few words, for a terminal."""

    # stable key: "full_model↑" (records: reconstruction), "client_data:full_model↑", "membership:full_model↑",
    # "membership:global_model", "participation:global_model", "membership:canary"
    row: str
    title: str
    question: str  # INVERSION, MEMBERSHIP, DP_AUDIT, CONSISTENCY (records), CLIENT_DATA or PARTICIPATION
    artifact: str  # "full_model↑", "released model", ...
    observer: str  # "server", "client:<domain>", ANYONE
    tier: str
    reason: str
    short: str
    evidence: list[Evidence] = field(default_factory=list)
    alpha: float = 0.05
    rule: str | None = None  # the rule that set the tier

    @property
    def level(self) -> str:
        return LEVEL_OF[self.question]

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row, "title": self.title, "question": self.question, "level": self.level,
                "artifact": self.artifact,
                "observer": self.observer, "tier": self.tier, "reason": self.reason, "short": self.short,
                "rule": self.rule,
                "correction": (f"{CORRECTION} over {len(self.evidence)} test(s) at family-wise alpha {_num(self.alpha)}"
                               if self.evidence else None),
                "evidence": [e.to_json() for e in self.evidence]}


@dataclass(frozen=True)
class Unscored:
    """An attack that ran on a row's subject and stored no score: which (``<variant>/<victim>``), its status and why."""

    what: str
    status: str
    reason: str

    @classmethod
    def of(cls, what: str, entry: dict[str, Any]) -> Unscored:
        return cls(what, str(entry.get("status", "not run")), str(entry.get("reason", "no reason stored")))


@dataclass(frozen=True)
class Decision:
    """What a rule decided: the tier, the rule's name, and the facts the sentence is written from."""

    tier: str
    rule: str
    facts: dict[str, Any] = field(default_factory=dict)


def decide(evidence: list[Evidence], t: RiskThresholds) -> None:
    """Holm-adjust the row's p-values; a test not significant after correction is LOW whatever its effect."""
    for e, adj in zip(evidence, holm([e.p_value for e in evidence])):
        e.p_adjusted = adj
        if adj > t.alpha:
            e.tier = LOW


def strongest(evidence: list[Evidence]) -> Evidence:
    """The test that decides a row: highest tier, then largest effect."""
    return max(evidence, key=lambda e: (TIER_ORDER[e.tier], e.effect or 0.0))


# -- readers of a stored membership entry -----------------------------------------------------


def mia_level(entry: dict[str, Any], level: float) -> dict[str, Any] | None:
    """The stored operating point at FPR ``level`` (``tpr_at_fpr``; keys as strings)."""
    for name in ("levels", "tpr_at_fpr"):
        table = entry.get(name)
        if isinstance(table, dict):
            for key, value in table.items():
                try:
                    if math.isclose(float(key), level) and isinstance(value, dict):
                        return value
                except ValueError:
                    continue
    return None


def isnum(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def interval(ci: Any) -> bool:
    return isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isnum(v) for v in ci)


def pair(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(isnum(v) for v in x)
