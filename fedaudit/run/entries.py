"""What the verdict judges of the attack results, and the report shows beside them: one frozen object per entry —
a membership test, a reconstruction and its summary, a canary audit, a positive control, a twin — built from the
stored models (:mod:`fedaudit.run.stored.leakage`, :mod:`fedaudit.run.stored.reconstruction`), with anything not a
finite number read as ``None``. The verdict's rules take these types only (``tests/test_layout.py`` holds it);
:class:`~fedaudit.run.audited_run.AuditedRun` gathers them, with one target's other blocks, as the verdict sees them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from fedaudit.run.blocks import ReferenceTraining
from fedaudit.run.evidence_detail import PowerMeasured, PowerSummary, PowerUnmeasured
from fedaudit.run.stored.leakage import (Calibration, Control, GdpBound, Leakage, MembershipTestResult, OneRunAudit,
                                         RocCurve, Separation)
from fedaudit.run.stored.leakage import OperatingPoint as StoredPoint
from fedaudit.run.stored.reconstruction import (Balanced, DomainAttribution, Identified, Power, ReconstructionSummary, Score, Twin,
                                                VictimScores)
from fedaudit.run.stored.reconstruction import ReconstructionEntry as StoredReconstruction

def number(x: Any) -> float | None:
    """A finite number as a float; anything else (missing, null, NaN, a string, a bool) is None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def number_or(x: Any, default: float) -> float:
    found = number(x)
    return default if found is None else found


def finite_pair(x: Any) -> tuple[float, float] | None:
    """Two finite numbers (an interval, or a (count, total) pair), else None."""
    if isinstance(x, (list, tuple)) and len(x) == 2 and all(number(v) is not None for v in x):
        return x[0], x[1]  # as stored (counts stay integers)
    return None


def whole(x: Any) -> int:
    """A stored count (0 where none is stored)."""
    return int(x or 0) if number(x) is not None else 0


def text(x: Any) -> str | None:
    return None if x is None else str(x)


# -- membership ------------------------------------------------------------------------------------------


def stored_points(entry: Separation) -> list[tuple[float, StoredPoint]]:
    """Every stored operating point (FPR keys as strings), once each: the first one stored at an FPR wins."""
    found: list[tuple[float, StoredPoint]] = []
    for key, value in entry.tpr_at_fpr.items():
        try:
            fpr = float(key)
        except ValueError:
            continue
        if not any(math.isclose(fpr, f) for f, _ in found):
            found.append((fpr, value))
    return found


def mia_level(entry: Separation, level: float) -> StoredPoint | None:
    """The stored operating point at FPR ``level``, or None."""
    return next((value for fpr, value in stored_points(entry) if math.isclose(fpr, level)), None)


@dataclass(frozen=True)
class OperatingPoint:
    """A membership test's stored TPR at one target FPR."""

    tpr: float | None
    fpr_achieved: float
    p_value: float | None
    interval: tuple[float, float] | None
    resolvable: bool
    warning: str | None

    @classmethod
    def of(cls, value: StoredPoint) -> OperatingPoint:
        return cls(number(value.tpr), 0.01 if value.fpr_achieved is None else value.fpr_achieved,
                   number(value.p_value), finite_pair(value.tpr_interval),
                   True if value.resolvable is None else value.resolvable, value.warning or None)


@dataclass(frozen=True)
class SeparationTest:
    """How well one score separates two sets (a positive control, a holdout twin): AUC and the KS advantage."""

    stored: bool  # whether the test ran and stored its advantage
    scored: bool  # whether it stored an AUC
    auc: float | None  # as stored
    advantage_p_value: float | None
    records: int | str
    status: str | None
    reason: str | None

    @classmethod
    def of(cls, data: Control | None) -> SeparationTest | None:
        if data is None:
            return None
        return cls(data.has("advantage"), data.has("auc"), data.auc, number(data.advantage_p_value),
                   "?" if data.records is None else data.records, data.status, data.reason)

    def significant(self, alpha: float) -> bool:
        return self.advantage_p_value is not None and self.advantage_p_value <= alpha


@dataclass(frozen=True)
class ExactMatches:
    """Records whose own entry a per-record bank holds exactly (within ``tolerance``)."""

    members: int
    nonmembers: int
    tolerance: float | None


@dataclass(frozen=True)
class MembershipEntry:
    """One stored membership test (``leakage.mia.<variant>.<target>.<victim>``)."""

    status: str
    reason: str
    scored: bool  # an advantage was stored: the attack scored members against non-members
    advantage: float | None
    advantage_p_value: float | None
    advantage_null_95: float | None
    members: int | None  # None: the file stores no count
    nonmembers: int | None
    auc: float | None
    operating_points: tuple[tuple[float, OperatingPoint], ...]  # every stored FPR level, as stored
    signal: str  # the artifact test's signal: "tracing …", "nearest entry …"
    exact: ExactMatches | None
    control: SeparationTest | None  # the artifact test's positive control (stored as ``power``)
    controls: str | None  # why the artifact test has no control, where it says
    twin: SeparationTest | None  # the artifact test's holdout twin
    weights_from: tuple[str, ...]  # what the last-upload model was built from ("full_model@r2 from client:a", …)
    miscalibrated: bool  # the reference models did not stand in for the target
    twin_aucs: tuple[float, ...]  # the domain-level attack's AUCs on its measured domain twins
    twin_reason: str | None  # why there are none, where stored
    nonmember_domain: str | None
    # what the report shows beside the scores
    stored_keys: frozenset[str]
    stored_auc: float | None  # as stored (the page prints it)
    stored_advantage: float | None
    auc_chance_interval: list[float] | None
    roc: RocCurve | None
    calibration: Calibration | None
    reference: ReferenceTraining
    reference_models: int | None

    def at_fpr(self, level: float) -> OperatingPoint | None:
        return next((p for fpr, p in self.operating_points if math.isclose(fpr, level)), None)

    @property
    def at_1pct_fpr(self) -> OperatingPoint | None:
        """The operating point the verdict's TPR test reads."""
        return self.at_fpr(0.01)

    @classmethod
    def of(cls, e: MembershipTestResult) -> MembershipEntry:
        twin = e.domain_twin
        aucs = twin.aucs if twin is not None and twin.status == "measured" else []
        return cls(
            status=e.status or "not run", reason=e.reason or "no reason stored",
            scored=e.scored, advantage=number(e.advantage),
            advantage_p_value=number(e.advantage_p_value), advantage_null_95=e.advantage_null_95,
            members=_count(e.n_members if e.has("n_members") else e.members),
            nonmembers=_count(e.n_nonmembers if e.has("n_nonmembers") else e.nonmembers),
            auc=number(e.auc),
            operating_points=tuple((fpr, OperatingPoint.of(value)) for fpr, value in stored_points(e)),
            signal=e.signal or "",
            exact=(None if e.exact_matches is None else
                   ExactMatches(whole(e.exact_matches.members), whole(e.exact_matches.nonmembers),
                                number(e.exact_tolerance))),
            control=SeparationTest.of(e.power), controls=e.controls, twin=SeparationTest.of(e.twin),
            weights_from=tuple(e.weights_from) if isinstance(e.weights_from, dict) else (),
            miscalibrated=e.calibration is not None and e.calibration.status == "miscalibrated",
            twin_aucs=tuple(a for a in aucs if number(a) is not None),
            twin_reason=None if twin is None else twin.reason, nonmember_domain=e.nonmember_domain,
            stored_keys=frozenset(e.model_fields_set), stored_auc=e.auc, stored_advantage=e.advantage,
            auc_chance_interval=e.auc_chance_interval, roc=e.roc if e.roc is not None and e.roc.model_fields_set else None,
            calibration=e.calibration if e.calibration is not None and e.calibration.model_fields_set else None,
            reference=ReferenceTraining.of(e.reference), reference_models=e.reference_models)


@dataclass(frozen=True)
class MembershipTest:
    """One stored membership test and where it sits: ``leakage.mia.<variant>.<target>.<victim>``."""

    variant: str  # loss, lira_online, lira_offline, rmia, domain, artifact
    target: str  # global_model, last_upload, or the artifact kind a shared-artifact test read
    victim: str
    entry: MembershipEntry


# -- reconstruction ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identifiability:
    """The record-level test of one victim's reconstructions: nearer its training records than fresh ones?"""

    attack: float | None
    attack_k: float | None
    attack_p_value: float | None
    nulls: dict[str, float]  # chance, control, prior_only, twin: those stored as finite numbers
    ci95: tuple[float, float] | None
    n: int
    balanced: Balanced | None
    null_q95: float | None

    @classmethod
    def of(cls, stored: Identified) -> Identifiability:
        """The stored test's finite numbers (what the verdict judges; the page prints ``stored`` as it is)."""
        nulls = {k: number(getattr(stored, k)) for k in ("chance", "control", "prior_only", "twin")}
        return cls(number(stored.attack), number(stored.attack_k), number(stored.attack_p_value),
                   {k: v for k, v in nulls.items() if v is not None}, finite_pair(stored.attack_ci95),
                   int(stored.n or 0), stored.balanced, stored.null_q95)

    @property
    def chance(self) -> float | None:
        return self.nulls.get("chance")


@dataclass(frozen=True)
class ReconstructionPower:
    """A victim's positive control: the attack on an artifact recomputed from a few of its member images."""

    status: str | None
    reason: str | None
    reached: bool
    record_level: bool
    p_value: float | None
    p_reveals: float | None  # revealed their domain or class (issue 47; before, p_value was the smaller of both)
    p_record_level: float  # singled them out
    sizes: dict[str, dict[str, JsonValue]]  # per control size: its tests, as the row's evidence shows them

    @classmethod
    def of(cls, p: Power | None) -> ReconstructionPower | None:
        if p is None:
            return None
        sizes: dict[str, dict[str, JsonValue]] = {
            k: {**{m: lift.dump() for m, lift in (("domain_attribution", v.domain_attribution),
                                                  ("class_fidelity", v.class_fidelity)) if lift is not None},
                "identifiability": v.identifiability, "identifiability_p_value": v.p_value}
            for k, v in p.sizes.items() if v.has("p_reveals")}
        p_value = number(p.p_value)
        return cls(p.status, p.reason, bool(p.reached), bool(p.record_level), p_value,
                   number(p.p_reveals) if p.has("p_reveals") else p_value, number_or(p.p_record_level, 1.0), sizes)

    @property
    def measured(self) -> bool:
        return self.status == "measured" and self.p_value is not None

    @property
    def record_size(self) -> str | None:
        """The control size whose reconstructions singled out their members most clearly (smallest p), if any."""
        found = {k: float(x) for k, v in self.sizes.items()
                 if isinstance(x := v.get("identifiability_p_value"), (int, float))}
        return min(found, key=found.__getitem__) if found else None

    def summary(self) -> PowerSummary:
        """What the verdict's evidence stores of it."""
        if self.status != "measured":
            return PowerUnmeasured(self.status, self.reason)
        return PowerMeasured(self.reached, self.record_level, self.p_value, self.sizes)


@dataclass(frozen=True)
class ReconstructionEntry:
    """One victim's stored reconstruction (``leakage.<attack>.<artifact>.<victim>``)."""

    status: str
    reason: str
    record_test: bool  # the auditor ran the record-level test on it (so its positive control counts for the row)
    identifiability: Identifiability | None  # that test's result, where the victim was attacked
    power: ReconstructionPower | None
    images: bool  # synthesised images (a grid), not latent features
    # what the report shows
    stored_status: str | None
    stored_reason: str | None
    scored: bool  # the victim was attacked and its scores stored (``metrics``)
    scores: VictimScores
    image_grid: str | None
    grid_columns: list[str]
    power_shown: Power | None
    twin: Twin | None

    @classmethod
    def of(cls, e: StoredReconstruction) -> ReconstructionEntry:
        scores = e.metrics if e.metrics is not None else VictimScores()
        record_test = scores.has("identifiability")
        ident = scores.identifiability if record_test and e.status == "attacked" else None
        return cls(e.status or "unknown", e.reason or scores.reason or "no reason stored",
                   record_test, Identifiability.of(ident) if ident is not None else None,
                   ReconstructionPower.of(e.power), e.has("image_grid"), e.status, e.reason, e.metrics is not None,
                   scores, e.image_grid, e.grid_columns, e.power, e.twin)


@dataclass(frozen=True)
class LiftTest:
    """A distribution-level test over a share's victims (domain attribution, class fidelity): the attack's rate and
    its nulls, with the counts behind them."""

    attack: float | None
    nulls: dict[str, float]  # chance, control, prior_only: those stored as finite numbers
    twin: float | None
    counts: Mapping[str, list[int]]  # "attack" / a null's name → (hits, total)

    @classmethod
    def of(cls, metric: Score | None, counts: Mapping[str, list[int]]) -> LiftTest:
        metric = metric if metric is not None else Score()
        nulls = {k: number(getattr(metric, k)) for k in ("chance", "control", "prior_only")}
        return cls(number(metric.attack), {k: v for k, v in nulls.items() if v is not None}, number(metric.twin),
                   counts)

    def count(self, name: str) -> tuple[float, float] | None:
        """The (hits, total) behind the attack's rate or a null's."""
        return finite_pair(self.counts.get(name))

    def null(self, name: str) -> float | None:
        return self.nulls.get(name)


@dataclass(frozen=True)
class ReconstructionTable:
    """One attack on one artifact: every victim's entry, and the summary over them (None: not scored)."""

    attack: str
    artifact: str  # "full_model", "head:<client>", …
    entries: dict[str, ReconstructionEntry]
    scored: bool
    victims: tuple[str, ...]  # the victims the summary is over, as it stored them
    domain_attribution: LiftTest | None
    class_fidelity: LiftTest | None
    shown_attribution: Score | None  # the same two as stored, for the page
    shown_fidelity: Score | None

    @classmethod
    def of(cls, attack: str, artifact: str, by_victim: Mapping[str, StoredReconstruction],
           summary: ReconstructionSummary | None) -> ReconstructionTable:
        entries = {v: ReconstructionEntry.of(e) for v, e in by_victim.items()}
        attribution = summary.domain_attribution if summary is not None else None
        attribution = attribution if attribution is not None else DomainAttribution()
        fidelity = summary.class_fidelity if summary is not None else None
        return cls(attack, artifact, entries, summary is not None, tuple(attribution.victims),
                   LiftTest.of(attribution.macro, attribution.counts) if summary is not None else None,
                   LiftTest.of(fidelity, fidelity.counts if fidelity is not None else {}) if summary is not None else None,
                   _shown(attribution.macro), _shown(fidelity))


def _shown(score: Score | None) -> Score | None:
    """A stored score, or None where the file stores none (an empty block)."""
    return score if score is not None and score.model_fields_set else None


# -- the canary audit ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedCurve:
    """The accountant's claimed privacy curve a canary audit tested: μ-GDP (``gaussian``) or (ε, δ)."""

    curve: str | None
    mu: float | None
    epsilon: float | None
    delta: Any


@dataclass(frozen=True)
class CanaryAudit:
    """One victim's one-run ε audit (input canaries, or gradient canaries in its DP-SGD)."""

    variant: str  # input, gradient
    victim: str
    status: str | None  # as stored (None: none stored)
    reason: str | None
    has_bound: bool  # the audit stored a bound (it ran to the end)
    bound: float | None  # the proven ε lower bound
    canaries: int | None
    guesses: int | None
    correct: int | None
    delta: float  # for the tests: the stored δ, else 1e-5
    stored_delta: float | None  # as stored, for the page
    k_grid: int  # how many k the audit searched (its Bonferroni factor)
    stored_per_k: list[dict[str, int | None]] | None
    epsilon_spent: float | None  # the accountant's claim
    claim: Mapping[str, str | float] | None  # the claimed privacy curve, where recorded (as the tests take it)
    curve: ClaimedCurve | None
    p_claim: float | None  # the claim's test, before the correction across audits
    ceiling: float | None  # the largest ε these canaries could certify
    target: str | None
    confidence: float | None
    rounds: int | None  # gradient canaries: over how many rounds of updates
    exceeds_claimed: bool
    can_refute_claim: bool | None  # False: too few canaries to test the claim
    warning: str | None
    ideal_bound: float | None
    ideal_gdp_mu: float | None
    estimate: float | None
    mu: float | None
    mu_as_epsilon: float | None
    mu_ceiling: float | None

    @classmethod
    def of(cls, variant: str, victim: str, e: OneRunAudit) -> CanaryAudit:
        gdp, claim = e.gdp or GdpBound(), e.claim
        return cls(variant, victim, e.status, e.reason, e.has("epsilon_lower_bound"), number(e.epsilon_lower_bound),
                   _count(e.canaries), _count(e.guesses), _count(e.correct),
                   1e-5 if e.delta is None else e.delta, e.delta, len(e.k_grid or [1]),
                   [{"guesses": row.guesses, "correct": row.correct} for row in e.per_k] or None,
                   number(e.epsilon_spent), claim,
                   (None if claim is None else
                    ClaimedCurve(text(claim.get("curve")), number(claim.get("mu")), number(claim.get("epsilon")),
                                 claim.get("delta"))),
                   number(e.p_claim), number(e.epsilon_max_certifiable), e.target, e.confidence, e.rounds,
                   bool(e.exceeds_claimed), e.can_refute_claim, e.warning, number(e.ideal_bound),
                   number(e.ideal_gdp_mu), number(None if e.estimate is None else e.estimate.epsilon),
                   number(gdp.mu_lower_bound), number(gdp.epsilon_if_gaussian), number(gdp.mu_max_certifiable))

    @property
    def per_k(self) -> list[Any]:
        """The guesses and correct guesses at each k the audit searched (one entry per k)."""
        return self.stored_per_k or [{"guesses": self.guesses, "correct": self.correct}] * self.k_grid


def canary_audits(leakage: Leakage) -> list[CanaryAudit]:
    """Every stored canary audit: the input canaries' (``leakage.canary``), then the gradient canaries'."""
    return [CanaryAudit.of(variant, victim, e) for variant, victim, e in leakage.canary_audits()]


def _count(x: Any) -> int | None:
    return int(x) if number(x) is not None else None
