"""``metrics.json → leakage``: the attack results as typed models — a membership test, a one-run ε audit, and the
section of every attack that ran (:class:`Leakage`).

The auditor builds them (:mod:`fedaudit.audit.membership`, :mod:`fedaudit.audit.canary`), metrics.json stores their
dump, and the verdict and the report read the same models back (:mod:`fedaudit.run.entries` turns them into what
the rules judge). What fedaudit computes is declared here field by field; what an attack reports of its own
workings (how it trained its reference models, which uploads a model was built from) is the attack's account, kept
as JSON values under one field each. Reconstruction sections are still mappings, their schema kept by hand, until
their models land (issue 59).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import AliasChoices, ConfigDict, Field, JsonValue

from fedaudit.run.stored.core import Keyed, Stored
from fedaudit.run.stored.reconstruction import ReconstructionEntry, ReconstructionSection

MIA = "mia"
CANARY = "canary"  # the one-run ε audit: a bound per victim, not a reconstruction section
CANARY_GRADIENT = "canary_gradient"  # its white-box variant: gradient canaries inside the victim's DP-SGD


# -- membership ------------------------------------------------------------------------------------------


class OperatingPoint(Stored):
    """The largest TPR whose FPR is at most ``level`` (:func:`fedaudit.statistics.membership_statistics.tpr_at_fpr`):
    its Clopper-Pearson interval, the FPR it achieved and the p-value of that many true positives."""

    stored_nulls = frozenset({"tpr", "p_value"})

    level: float | None = None
    tpr: float | None = None
    tpr_interval: list[float] | None = Field(None, validation_alias=AliasChoices("tpr_interval", "tpr_ci95"))
    fpr_achieved: float | None = None
    fpr_interval: list[float] | None = None
    true_positives: int | None = None
    false_positives: int | None = None
    allowed_false_positives: int | None = None
    p_value: float | None = None
    resolvable: bool | None = None
    warning: str | None = None


class RocCurve(Stored):
    """The ROC curve, thinned to about 200 points (``points``: the full curve's length)."""

    fpr: list[float] = Field(default_factory=list)
    tpr: list[float] = Field(default_factory=list)
    points: int | None = None


class Calibration(Stored):
    """How well the reference models stood in for the target (the auditor's check: it needs the truth), in σ of
    the signal the attack scored; ``raw_*``: before the attacker's shift."""

    status: str | None = None  # calibrated, miscalibrated
    out_gap: float | None = None
    in_gap: float | None = None
    sigma: float | None = None
    limit: float | None = None
    raw_out_gap: float | None = None
    raw_in_gap: float | None = None
    shift: float | None = None  # σ


class Separation(Stored):
    """How one score separates members from non-members (:func:`fedaudit.audit.membership.scored`): the counts,
    AUC with its band under no signal, the KS advantage with its null, every operating point, the ROC — or the
    status and why there is none."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["auc", "advantage", "advantage_p_value",
                                                                          "members", "nonmembers"]},
                                                           {"required": ["status"]}]})
    stored_nulls = frozenset({"advantage", "advantage_null_95", "advantage_p_value", "auc", "auc_p_value"})

    status: str | None = None  # where it was not scored: "not applicable", …
    reason: str | None = None
    n_members: int | None = None
    n_nonmembers: int | None = None
    members: int | None = None
    nonmembers: int | None = None
    auc: float | None = None
    auc_chance_interval: list[float] | None = None
    auc_p_value: float | None = None
    advantage: float | None = None
    advantage_p_value: float | None = None
    advantage_null_95: float | None = None
    tpr_at_fpr: dict[str, OperatingPoint] = Field(default_factory=dict, validation_alias=AliasChoices("tpr_at_fpr", "levels"),
                                                  description="per FPR level (\"0.01\")")
    warnings: list[str] = Field(default_factory=list)
    roc: RocCurve | None = None
    reference_models: int | None = None
    signal: str | None = None

    @property
    def scored(self) -> bool:
        return self.has("advantage")


class Control(Separation):
    """A counterfactual of a shared-artifact test (``twin``: the victim's members swapped for records it never
    trained on; ``power``: the artifact of a few members alone), scored the same way."""

    records: int | str | None = None  # power: how many members; twin: "val"
    per_class: int | None = None


class ExactMatches(Stored):
    """Candidates whose own entry a per-record bank holds exactly (within the entry's ``exact_tolerance``)."""

    members: int | None = None
    nonmembers: int | None = None


class DomainTwin(Stored):
    """The domain-level attack on federations trained again without the domain: its null, measured."""

    status: str | None = None  # measured, not available
    reason: str | None = None
    aucs: list[float] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=list)
    clients: list[str] = Field(default_factory=list)
    unseen_domain_accuracy: list[float | None] = Field(default_factory=list)


class MembershipTestResult(Separation):
    """One membership test (``leakage.mia.<variant>.<target>.<victim>``): a scored test, or a status and why it
    was not scored."""

    variant: str | None = None  # the shared-artifact test's: what the bank held
    sender: str | None = None
    round: int | None = None
    weights_from: dict[str, JsonValue] | str | None = Field(None, description="the attack's account of the uploads "
                                                             "the attacked weights came from")
    layers: int | None = None
    statistics: int | None = None
    bank_entries: int | None = None
    encoder_round: int | None = None
    exact_tolerance: float | None = None
    exact_matches: ExactMatches | None = None
    population: int | None = None
    reference: dict[str, JsonValue] | None = Field(None, description="the attack's account of its reference models "
                                                    "(kind, epochs, recipe, …), with the target's exposure in epochs")
    calibration: Calibration | None = None
    nonmember_domain: str | None = None
    domain_twin: DomainTwin | None = None
    twin: Control | None = None
    power: Control | None = None
    controls: str | None = None  # why the shared-artifact test has no counterfactual controls


# variant → target (global_model, last_upload, or the artifact a shared-artifact test read) → victim → test
MembershipSection = dict[str, dict[str, dict[str, MembershipTestResult]]]


# -- the one-run ε audit ---------------------------------------------------------------------------------


class KRow(Stored):
    """The audit at one k (guesses "in" for the k highest scores, "out" for the k lowest)."""

    k: int | None = None
    guesses: int | None = None
    correct: int | None = None
    epsilon_lower_bound: float | None = None
    epsilon_max_certifiable: float | None = None
    mu_lower_bound: float | None = None
    mu_max_certifiable: float | None = None


class GdpBound(Stored):
    """The f-DP one-run bound in the Gaussian family (Mahloujifar et al. 2025) at its best k."""

    mu_lower_bound: float | None = None
    epsilon_if_gaussian: float | None = None
    mu_max_certifiable: float | None = None
    epsilon_max_if_gaussian: float | None = None
    k: int | None = None
    guesses: int | None = None
    correct: int | None = None
    kind: str | None = None


class CanaryEstimate(Stored):
    """The one-shot Gaussian fit of the scores (Andrew et al. 2024): an estimate, not a bound."""

    epsilon: float | None = None
    kind: str | None = None
    mu: float | None = None
    mean_included: float | None = None
    mean_excluded: float | None = None
    pooled_std: float | None = None


class OneRunAudit(Stored):
    """One victim's one-run ε audit: the lower bound, its confidence and the claim it tests, or the status and why
    there is none."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["epsilon_lower_bound", "confidence"]},
                                                           {"required": ["status"]}]})
    stored_nulls = frozenset({"auc", "can_refute_claim", "epsilon_spent", "target_round", "rounds", "ideal_bound",
                              "ideal_gdp_mu", "ideal_mu", "p_claim"})

    status: str | None = None
    reason: str | None = None
    variant: str | None = None  # gradient (the input canaries' entries name none)
    epsilon_lower_bound: float | None = None
    confidence: float | None = None
    delta: float | None = None
    canaries: int | None = None
    included: int | None = None
    guesses: int | None = None
    correct: int | None = None
    k: int | None = None
    k_grid: list[int] = Field(default_factory=list)
    k_fractions: list[float] = Field(default_factory=list)
    correction: str | None = None
    confidence_per_k: float | None = None
    epsilon_max_certifiable: float | None = None
    gdp: GdpBound | None = None
    per_k: list[KRow] = Field(default_factory=list)
    signal: str | None = None
    target: str | None = None
    target_round: int | None = None
    target_note: str | None = None  # why the deployed model stood in for the last upload
    weights_from: dict[str, JsonValue] | str | None = None
    canary_kind: str | None = None
    rounds: int | None = None
    canary_steps: int | None = None
    directions_seed: int | None = None
    space_dim: int | None = None
    estimate: CanaryEstimate | None = None
    auc: float | None = None
    epsilon_spent: float | None = None  # the accountant's claim (null: no DP)
    claim: dict[str, str | float] | None = None  # its privacy curve: μ-GDP ("gaussian") or (ε, δ)
    p_claim: float | None = None
    can_refute_claim: bool | None = None
    exceeds_claimed: bool | None = None
    warning: str | None = None
    ideal_bound: float | None = None
    ideal_gdp_mu: float | None = None
    ideal_mu: float | None = None


# -- the whole block -------------------------------------------------------------------------------------


class Leakage(Keyed):
    """One section per attack that ran: ``mia``, ``canary``, ``canary_gradient``, and one per reconstruction attack
    (``deepinversion``, ``gradinv``), stored under the attack's name."""

    keyed = "reconstructions"

    mia: MembershipSection = Field(default_factory=dict)
    canary: dict[str, OneRunAudit] = Field(default_factory=dict)
    canary_gradient: dict[str, OneRunAudit] = Field(default_factory=dict)
    reconstructions: dict[str, ReconstructionSection] = Field(default_factory=dict)

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> Leakage:
        """A metrics.json's leakage block, read (for scripts holding the file's dict)."""
        return cls.read(metrics.get("leakage"))

    def membership(self, *, ordered: bool = False) -> list[MembershipResult]:
        """Every membership test, in the order the attack wrote them or, ``ordered``, sorted by (variant, target,
        victim) (a verdict judged from a reloaded metrics.json must equal the one judged before it was written)."""
        out = [MembershipResult(variant, target, victim, test) for variant, by_target in self.mia.items()
               for target, by_victim in by_target.items() for victim, test in by_victim.items()]
        return sorted(out, key=lambda r: r[:3]) if ordered else out

    def attacked_artifacts(self) -> list[tuple[str, str, dict[str, ReconstructionEntry]]]:
        """(attack, artifact, {victim: entry}) of every reconstruction attack's result table."""
        return [(name, key, by_victim) for name, section in self.reconstructions.items()
                for key, by_victim in section.tables()]

    def canary_audits(self) -> list[tuple[str, str, OneRunAudit]]:
        """(variant, victim, audit) of every canary audit: the input canaries' (``canary``), then the gradient
        canaries'."""
        return [*(("input", v, a) for v, a in self.canary.items()),
                *(("gradient", v, a) for v, a in self.canary_gradient.items())]


class MembershipResult(NamedTuple):
    """One membership test and where it sits: ``leakage.mia.<variant>.<target>.<victim>``."""

    variant: str  # loss, lira_online, lira_offline, rmia, domain, artifact
    target: str  # global_model, last_upload, or the artifact kind a shared-artifact test read
    victim: str  # a source domain, or "all"
    entry: MembershipTestResult


__all__ = ["CANARY", "CANARY_GRADIENT", "MIA", "MembershipResult", "Calibration", "CanaryEstimate",
           "Control", "DomainTwin", "ExactMatches", "GdpBound", "KRow", "Leakage", "MembershipSection",
           "MembershipTestResult", "OneRunAudit", "OperatingPoint", "RocCurve", "Separation"]
