"""The deployed model's accuracy: at the selected round, at the final one, per target, and without the canary audit's
canaries."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedaudit.run.stored.core import Stored


class SourceVal(Stored):
    """The deployed model's accuracy on the source domains' validation splits."""

    model_config = ConfigDict(json_schema_extra={"required": ["mean"]})
    stored_nulls = frozenset({"mean"})

    mean: float | None = None  # null: no model was scored
    per_domain: dict[str, float | None] = Field(default_factory=dict)


class FinalRound(Stored):
    """The last round's scores, beside the selected round's."""

    model_config = ConfigDict(json_schema_extra={"required": ["round"]})
    stored_nulls = frozenset({"unseen_domain", "source_val_mean"})

    round: int | None = None
    unseen_domain: float | None = None
    source_val_mean: float | None = None


class TargetAccuracy(Stored):
    """One target's headline accuracy in a --target-domain all run."""

    model_config = ConfigDict(json_schema_extra={"required": ["unseen_domain", "source_val_mean", "selected_round"]})
    stored_nulls = frozenset({"unseen_domain", "source_val_mean"})

    unseen_domain: float | None = None
    source_val_mean: float | None = None
    selected_round: int | None = None


class CanaryChange(Stored):
    """What the canaries changed: with − without."""

    unseen_domain: float | None = None
    source_val_mean: float | None = None


class Accuracy(Stored):
    """Accuracy at the selected round (the mean over targets in a --target-domain all run). ``status: unscored``
    (fedaudit audit without the clients' records): the deployed model was not scored."""

    model_config = ConfigDict(json_schema_extra={"required": ["unseen_domain", "source_val"]})
    stored_nulls = frozenset({"unseen_domain"})

    unseen_domain: float | None = None
    source_val: SourceVal = Field(default_factory=lambda: SourceVal.read({}))
    selected_round: int | None = None
    final_round: FinalRound | None = None
    rounds_without_deployed_model: list[int] = Field(
        default_factory=list, description="rounds after which the server held no deployable model: not scored, "
                                          "never selectable")
    method_specific: dict[str, float] = Field(default_factory=dict)
    without_canaries: WithoutCanaries | None = None
    note: str | None = None
    status: Literal["unscored"] | None = None
    why: str | None = None
    per_target: dict[str, TargetAccuracy] | None = None


class WithoutCanaries(Accuracy):
    """The same run (seeds, recipe) trained without the canary audit's canaries, and what they changed."""

    model_config = ConfigDict(json_schema_extra={"required": ["unseen_domain", "source_val", "change_with_canaries"]})

    change_with_canaries: CanaryChange = Field(default_factory=lambda: CanaryChange.read({}))


Accuracy.model_rebuild()  # its without_canaries block is declared after it


__all__ = ["Accuracy", "CanaryChange", "FinalRound", "SourceVal", "TargetAccuracy", "WithoutCanaries"]
