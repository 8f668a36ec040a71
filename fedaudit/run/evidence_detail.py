"""Each verdict test family's own block beside its numbers (``Evidence.detail``): what the rule that built the test
counted and against whom, typed per family — the rules and their sentences read attributes, and a stored row's
block is read back into the same type by its test's name (:data:`DETAILS`).

Field order is the stored key order; a field named in ``optional`` is left out of metrics.json while None (a test
that never had it, as older runs stored it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Self, TypeVar

from pydantic import JsonValue


@dataclass
class Detail:
    """A test family's block (see the module's doc)."""

    optional: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not (v is None and k in self.optional)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """A stored block: the fields it holds (another version's extra keys left out, missing ones None)."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass
class MembershipDetail(Detail):
    """A membership test (``mia_advantage``): which attack, on which target, against whose records, at what counts."""

    attack: str
    variant: str
    target: str
    victim: str
    members: int
    nonmembers: int
    auc: float | None


@dataclass
class MembershipTprDetail(MembershipDetail):
    """TPR at 1% FPR (``mia_tpr``): also whether the counts can resolve that rate, and why not."""

    resolvable: bool
    warning: str | None


@dataclass
class ParticipationDetail(Detail):
    """The released model's domain-level AUC for one source domain (``participation_auc``) beside its domain twins."""

    optional = frozenset({"spread", "se"})

    victim: str
    attack: str
    twin_aucs: list[float]
    df: int
    twin_reason: str | None
    members: int
    nonmembers: int
    nonmember_domain: str | None
    twin: bool
    spread: float | None = None  # the twins' pooled spread, where there are twins to compare with
    se: float | None = None


@dataclass
class CanaryDetail(Detail):
    """One canary audit (``canary_epsilon``): the bound's claim beside it, and the claim's test before and after the
    row's correction."""

    optional = frozenset({"p_claim_adjusted"})

    attack: str
    victim: str
    target: str | None
    epsilon_spent: float | None
    epsilon_max_certifiable: float | None
    p_claim: float
    variant: str
    ideal_bound: float | None
    estimate: float | None
    p_claim_adjusted: float | None = None  # set by the row, over every audit's claim test


@dataclass
class BroadcastDetail(Detail):
    """A broadcast whose clients received different content (``broadcast_content``)."""

    groups: list[list[str]]
    exact: str


@dataclass
class LiftDetail(Detail):
    """A distribution-level reconstruction test (``domain_attribution``, ``class_fidelity``): its counts, the null's
    counts or chance level, and the lift MEDIUM needs."""

    n: int | None
    null_counts: list[float] | None
    chance: float | None
    medium: float


@dataclass
class IdentifiabilityDetail(Detail):
    """A victim's record-level reconstruction test (``identifiability``): its p-value against each null."""

    p_against: dict[str, float]
    balanced: dict[str, JsonValue] | None  # how the test balanced members and non-members, as stored
    null_q95: float | None
    n: int
    chance: float | None
    measured: dict[str, float]
    victim: str


# The family of each test, by the name Evidence.test stores.
DETAILS: dict[str, type[Detail]] = {
    "mia_tpr": MembershipTprDetail, "mia_advantage": MembershipDetail, "participation_auc": ParticipationDetail,
    "canary_epsilon": CanaryDetail, "broadcast_content": BroadcastDetail, "identifiability": IdentifiabilityDetail,
    "domain_attribution": LiftDetail, "class_fidelity": LiftDetail}


D = TypeVar("D", bound=Detail)


def expect(detail: Detail | None, family: type[D]) -> D:
    """``detail`` as the family a rule built it as (a rule's own tests: anything else is a bug, said as one)."""
    if not isinstance(detail, family):
        raise TypeError(f"expected a {family.__name__}, got {type(detail).__name__}")
    return detail


@dataclass(frozen=True)
class PowerMeasured:
    """A victim's positive control as its row's evidence keeps it: whether the control's reconstructions revealed
    what the tests look for (``reached``) or singled out their records (``record_level``), and each size's tests."""

    reached: bool
    record_level: bool
    p_value: float | None  # stored as null where the control's p was not finite
    sizes: dict[str, dict[str, JsonValue]]

    def to_json(self) -> dict[str, JsonValue]:
        return {"reached": self.reached, "record_level": self.record_level, "p_value": self.p_value,
                "sizes": dict(self.sizes)}


@dataclass(frozen=True)
class PowerUnmeasured:
    """A positive control that did not run, and why."""

    status: str | None
    reason: str | None
    reached: ClassVar[bool] = False

    def to_json(self) -> dict[str, JsonValue]:
        return {"reached": False, "status": self.status, "reason": self.reason}


PowerSummary = PowerMeasured | PowerUnmeasured


def power_of(stored: Any) -> PowerSummary | None:
    """A stored evidence's positive control, in the shape it was stored (None: none stored)."""
    if not isinstance(stored, Mapping):
        return None
    if "sizes" not in stored:
        status, reason = stored.get("status"), stored.get("reason")
        return PowerUnmeasured(None if status is None else str(status), None if reason is None else str(reason))
    sizes = stored.get("sizes")
    p = stored.get("p_value")
    return PowerMeasured(bool(stored.get("reached")), bool(stored.get("record_level")),
                         float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else None,
                         {str(k): dict(v) for k, v in sizes.items() if isinstance(v, Mapping)}
                         if isinstance(sizes, Mapping) else {})


def detail_of(test: str, stored: Any) -> Detail | None:
    """A stored row's block as its test's family (None: not stored, or a test this version does not know)."""
    family = DETAILS.get(test)
    return family.from_json(stored) if family is not None and isinstance(stored, Mapping) else None


__all__ = ["DETAILS", "BroadcastDetail", "CanaryDetail", "Detail", "IdentifiabilityDetail", "LiftDetail",
           "MembershipDetail", "MembershipTprDetail", "ParticipationDetail", "PowerMeasured", "PowerSummary",
           "PowerUnmeasured", "detail_of", "expect", "power_of"]
