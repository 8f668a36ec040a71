"""--secure-aggregation: what a server under secure aggregation sees, what the mask leaves, and whether the rounds'
aggregates could be solved for single updates."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedaudit.run.stored.core import Stored
from fedaudit.run.stored.leakage import Leakage




class LeftInClear(Stored):
    """An upload kind the mask does not cover, and why."""

    model_config = ConfigDict(json_schema_extra={"required": ["kind", "direction", "why"]})

    kind: str | None = None
    direction: str | None = None
    why: str | None = None


class AggregateSeen(Stored):
    """The first round's aggregate that server read: whose uploads it sums, and their total weight."""

    round: int | None = None
    clients: list[str] = Field(default_factory=list)
    total_weight: float | None = None


class SolvedUpdate(Stored):
    """A client's single update that disaggregation solved for, from two rounds' aggregates."""

    kind: str | None = None
    rounds: list[int] = Field(default_factory=list)


class Disaggregation(Stored):
    """Whether a server could solve the rounds' aggregates for single updates (Lam et al., ICML 2021)."""

    model_config = ConfigDict(json_schema_extra={"required": ["status", "reason"]})

    status: Literal["run", "not possible", "not applicable", "not run"] = "not run"  # not run: the file stores none
    reason: str = ""
    clients: dict[str, SolvedUpdate] = Field(default_factory=dict, description="run: whose update it solved for")


class SecureAggregation(Stored):
    """--secure-aggregation: what a server under secure aggregation sees of the same wire (the masked uploads'
    aggregate, every other message in clear), the attacks on it, and what the mask leaves."""

    model_config = ConfigDict(json_schema_extra={"required": ["observer", "masked", "leaves", "leakage"]})
    stored_nulls = frozenset({"aggregate"})

    observer: str | None = None
    masked: list[str] = Field(default_factory=list)
    leaves: list[LeftInClear] = Field(default_factory=list)
    aggregate: AggregateSeen | None = None  # null: no upload was masked
    disaggregation: Disaggregation = Field(default_factory=lambda: Disaggregation.read({}))
    leakage: Leakage = Field(default_factory=Leakage)


__all__ = ["AggregateSeen", "Disaggregation", "LeftInClear", "SecureAggregation", "SolvedUpdate"]
