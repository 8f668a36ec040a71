"""``metrics.json → leakage.<attack>``: one reconstruction attack's results as typed models — per attacked artifact
and victim its scores beside every null (:class:`ReconstructionEntry`), the summary over victims, the auditor's
judges and the attack's settings (:class:`ReconstructionSection`).

The auditor builds them (:mod:`fedaudit.audit.reconstruction`); the verdict reads them through
:mod:`fedaudit.run.entries`, the report as they are. What an attack reports of its own run (its recipe, losses,
timing, which uploads it inverted) is declared here too, field by field, where fedaudit's attacks report it.
"""

from __future__ import annotations


from pydantic import ConfigDict, Field, JsonValue

from fedaudit.run.stored.core import Keyed, Stored

BOOKKEEPING = ("summary", "auditor", "settings")  # keys of an attack's section that are not results


class Score(Stored):
    """A metric of the reconstructions beside its nulls: the untrained control (``control``), the prior-only
    control, the holdout twin and the computed chance — or the status of a judge that could not score it."""

    stored_nulls = frozenset({"attack", "control", "prior_only", "twin", "chance"})

    attack: float | None = None
    control: float | None = None
    prior_only: float | None = None
    twin: float | None = None
    chance: float | None = None
    chance_name: str | None = None
    p_value: float | None = None  # a positive control's lift over the prior-only control (one-sided Fisher)
    counts: dict[str, list[int]] = Field(default_factory=dict, description="the (hits, total) behind each rate")
    # a judge that could not score (LPIPS without its weights): why, and the fix
    status: str | None = None
    reason: str | None = None
    looked_for: str | None = None
    fix: str | None = None
    weights: str | None = None


class Balanced(Stored):
    """How the record-level test balanced its members and non-members."""

    per_class: dict[str, int] = Field(default_factory=dict, description="records per class, each side")
    permutations: int | None = None
    members: int | None = None
    nonmembers: int | None = None


class Identified(Stored):
    """The record-level test: are the reconstructions nearer the victim's training records than fresh records of
    their class? The attack's rate with its interval and permutation p-value, and each null's."""

    stored_nulls = frozenset({"attack", "chance", "control", "prior_only", "twin", "null_q95", "attack_p_value"})

    attack: float | None = None
    attack_ci95: list[float] | None = None
    attack_k: float | None = None
    attack_p_value: float | None = None
    n: int | None = None
    excluded: int | None = None
    chance: float | None = None
    null_q95: float | None = None
    balanced: Balanced | None = None
    control: float | None = None
    control_ci95: list[float] | None = None
    control_p_value: float | None = None
    prior_only: float | None = None
    prior_only_ci95: list[float] | None = None
    prior_only_p_value: float | None = None
    twin: float | None = None
    twin_ci95: list[float] | None = None
    twin_p_value: float | None = None


class MatchedScores(Stored):
    psnr_mean: float | None = None
    ssim_mean: float | None = None
    psnr_best: float | None = None
    ssim_best: float | None = None


class Matched(Stored):
    """Batch inversions (gradinv): each reconstruction paired with a distinct member, and the control's."""

    attack: MatchedScores | None = None
    control: MatchedScores | None = None


class VictimScores(Stored):
    """A victim's reconstruction scores (``entry.metrics``), or why there are none."""

    status: str | None = None  # unavailable, unscored
    reason: str | None = None
    identifiability: Identified | None = None
    domain_attribution: Score | None = None
    class_fidelity: Score | None = None
    psnr_mean: Score | None = None
    psnr_best: Score | None = None
    ssim_mean: Score | None = None
    ssim_best: Score | None = None
    l2_to_member_mean: Score | None = None
    lpips_mean: Score | None = None
    head_agreement: Score | None = None
    moment_gap: Score | None = None
    matched: Matched | None = None


class Lift(Stored):
    """A positive control's rate beside the prior-only control's, and the one-sided Fisher p of the lift."""

    attack: float | None = None
    prior_only: float | None = None
    p_value: float | None = None


class PsnrToSources(Stored):
    attack_mean: float | None = None
    attack_best: float | None = None
    prior_only_mean: float | None = None


class PowerSize(Stored):
    """The positive control at one size (images per class, or one image alone): what its reconstructions reveal
    against the prior-only control's, one p-value per question — or why it did not run."""

    status: str | None = None
    reason: str | None = None
    per_class: int | None = None
    images: int | None = None
    records_per_artifact: int | None = None
    domain_attribution: Lift | None = None
    class_fidelity: Lift | None = None
    identifiability: float | None = None
    ci95: list[float] | None = None
    p_value: float | None = None
    chance: float | None = None
    prior_only: float | None = None
    psnr_to_sources: PsnrToSources | None = None
    p_reveals: float | None = None
    p_record_level: float | None = None


POWER_SINGLE = "single"  # a positive control's size key: the artifact of one member image alone (else per class)


class Power(Stored):
    """A victim's positive control: the attack on artifacts recomputed from a few of its member images."""

    status: str | None = None  # measured, not available
    reason: str | None = None
    p_value: float | None = None
    p_reveals: float | None = None
    p_record_level: float | None = None
    reached: bool | None = None
    record_level: bool | None = None
    sizes: dict[str, PowerSize] = Field(default_factory=dict)
    rule: str | None = None


class Twin(Stored):
    """The holdout twin: the attack on the artifact recomputed from records the victim never trained on."""

    status: str | None = None  # scored, not available
    reason: str | None = None
    records: int | None = None
    source: str | None = None


class ReconstructionEntry(Stored):
    """One reconstruction of one victim's artifact (``leakage.<attack>.<artifact>.<victim>``): its scores against
    their nulls, holdout twin and positive control, or the status and reason it was not attacked."""

    model_config = ConfigDict(json_schema_extra={"required": ["status"]})

    status: str | None = None  # attacked, not applicable, not yet supported
    reason: str | None = None
    metrics: VictimScores | None = None
    twin: Twin | None = None
    power: Power | None = None
    predicted_domain: dict[str, dict[str, float]] = Field(default_factory=dict, description="per set (attack, each "
                                                          "null): the share of its reconstructions each domain got")
    image_grid: str | None = None  # the grid's path in the run directory
    grid_columns: list[str] = Field(default_factory=list)
    # what the attack reports of its run
    sender: str | None = None
    round: int | None = None
    weights_from: dict[str, JsonValue] | str | None = None
    mode: str | None = None
    space: str | None = None
    variant: str | None = Field(None, description="global (the statistics as sent) or differencing (the other "
                                "clients' mean, from the global ones and the attacker's own)")
    ce: bool | None = None
    batch_matching: bool | None = None
    styles: int | None = None
    spectra: int | None = Field(None, description="phase retrieval from an amplitude bank: the spectra inverted")
    latent_dim: int | None = None
    labels: JsonValue = None
    recipe: JsonValue = None
    local_steps: JsonValue = None
    parameters: int | None = None
    unchanged_parameters: int | None = None
    control_artifact: str | None = None
    clients: int | None = Field(None, description="differencing: the clients the global statistics average over")
    own_round: int | None = Field(None, description="differencing: the round of the attacker's own upload used")
    own_weight: float | None = Field(None, description="differencing: the attacker's assumed aggregation weight")
    pooled: bool | None = Field(None, description="differencing: whether the statistics were pooled (second moments)")
    exact_round: bool | None = Field(None, description="differencing: whether that upload is the one the global "
                                     "statistics were aggregated from")
    iterations: int | None = None
    restarts: int | None = None
    final_loss: JsonValue = None
    cosine: JsonValue = None
    seconds: float | None = None
    seconds_shared: float | None = None
    victims_batched: str | None = None
    victims_per_launch: int | None = None


class DomainAttribution(Stored):
    """The victim × predicted-domain matrix of every set and its macro diagonal, with the counts behind it."""

    victims: list[str] = Field(default_factory=list)
    domains: list[str] = Field(default_factory=list)
    matrix: dict[str, list[list[float]]] = Field(default_factory=dict)
    macro: Score | None = None
    counts: dict[str, list[int]] = Field(default_factory=dict)


class ReconstructionSummary(Stored):
    """The headline over an artifact's victims (macro over victims)."""

    domain_attribution: DomainAttribution | None = None
    class_fidelity: Score | None = None


class Judge(Stored):
    """One of the auditor's judges (a classifier, LPIPS, a latent probe) and its status."""

    status: str | None = None
    looked_for: str | None = None
    fix: str | None = None
    weights: str | None = None
    trained_on: str | None = None
    accuracy_on_members: float | None = None
    class_accuracy_on_members: float | None = None
    domain_accuracy_on_members: float | None = None


class Judges(Stored):
    """The auditor's judges of one attack's reconstructions."""

    lpips: Judge | None = None
    domain_classifier: Judge | None = None
    class_classifier: dict[str, Judge] = Field(default_factory=dict)
    latent_probes: dict[str, Judge] = Field(default_factory=dict)


class ReconstructionSection(Keyed):
    """artifact → victim → entry, beside summary (macro over victims), auditor and settings; each artifact's table
    is stored under the artifact's name."""

    keyed = "artifacts"

    artifacts: dict[str, dict[str, ReconstructionEntry]] = Field(default_factory=dict)
    summary: dict[str, ReconstructionSummary] = Field(default_factory=dict)
    auditor: Judges | None = Field(None, description="the auditor's judges (classifiers, LPIPS) and their status")
    settings: dict[str, JsonValue] | None = Field(None, description="the attack's settings as run")

    def tables(self) -> list[tuple[str, dict[str, ReconstructionEntry]]]:
        """(artifact, {victim: entry}) of every attacked artifact, in the order the attack wrote them."""
        return list(self.artifacts.items())


__all__ = ["BOOKKEEPING", "POWER_SINGLE", "Balanced", "DomainAttribution", "Identified", "Judge", "Judges", "Lift",
           "Matched", "MatchedScores", "Power", "PowerSize", "PsnrToSources", "ReconstructionEntry",
           "ReconstructionSection", "ReconstructionSummary", "Score", "Twin", "VictimScores"]
