"""``metrics.json → anonymity_evidence``: the verdict's rows laid out as the evidence an anonymity assessment and a
DPIA ask for — for the released model and for the protocol apart, one line per attack family the EDPB's Opinion
28/2024 names, each with its tier, deciding fact and budget and the verdict rows behind it, or "not tested" and what
would test it; the measures the run itself used, each with the rows it bears on; and the standing caveat. Built by
:mod:`fedaudit.audit.attack_families` from the rows, so a governance tool reads what the report shows."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from fedaudit.run.stored.core import Stored

# What fedaudit did with an attack family for one assessed object.
# The attack families, in the section's order, each under its field's name, as a reviewer reads them.
FAMILIES = {"membership_inference": "membership inference",
            "attribute_inference": "attribute and property inference",
            "reconstruction": "reconstruction and model inversion",
            "regurgitation": "regurgitation and exfiltration of training data"}

Status = Literal["tested", "not run", "not tested"]
TESTED: Status = "tested"
NOT_RUN: Status = "not run"
NOT_TESTED: Status = "not tested"


class LinkedRow(Stored):
    """A verdict row a line rests on (``row``: its key in metrics.json → verdict, and the report's anchor)."""

    model_config = ConfigDict(json_schema_extra={"required": ["row", "level", "tier", "observer"]})

    row: str = ""
    level: str = ""
    tier: str = ""
    observer: str = ""


class FamilyEvidence(Stored):
    """One attack family against one assessed object: ``tested`` (a verdict row of this family was decided: the
    highest tier over its rows, the row that set it, that row's deciding fact and the attack's budget), ``not run``
    (fedaudit has the attack; this run did not run it — ``untested`` says how to) or ``not tested`` (fedaudit has no
    such attack here — ``untested`` says what would test it). ``untested`` also names what a tested line left out."""

    model_config = ConfigDict(json_schema_extra={"required": ["status", "rows"]})

    status: Status = NOT_TESTED
    tier: str | None = None
    deciding_row: str | None = None
    fact: str | None = None
    budget: str | None = None
    ran: list[str] = Field(default_factory=list, description="the attacks and tests whose evidence the rows hold")
    rows: list[LinkedRow] = Field(default_factory=list)
    untested: str | None = None


class AssessedObject(Stored):
    """The released model (held by whoever receives it) or the protocol (what each party receives during training),
    one line per attack family."""

    model_config = ConfigDict(json_schema_extra={"required": ["holder", "membership_inference", "attribute_inference",
                                                              "reconstruction", "regurgitation"]})

    holder: str = ""
    membership_inference: FamilyEvidence = Field(default_factory=FamilyEvidence)
    attribute_inference: FamilyEvidence = Field(default_factory=FamilyEvidence)
    reconstruction: FamilyEvidence = Field(default_factory=FamilyEvidence)
    regurgitation: FamilyEvidence = Field(default_factory=FamilyEvidence)

    def lines(self) -> list[tuple[str, FamilyEvidence]]:
        """(family, its line) for the four families, in the order the section shows them."""
        return [(family, getattr(self, family)) for family in FAMILIES]


class Measure(Stored):
    """A methodological measure the run used or did not (record-level DP, client-level DP, secure aggregation, what is
    shared), in words, with its ε where it has one and the verdict rows it bears on."""

    model_config = ConfigDict(json_schema_extra={"required": ["measure", "in_place", "text", "rows"]})

    measure: Literal["dp_sgd", "client_dp", "secure_aggregation", "shared"] = "shared"
    in_place: bool = False
    epsilon: float | None = None
    delta: float | None = None
    text: str = ""
    rows: list[str] = Field(default_factory=list)


class AnonymityEvidence(Stored):
    """The evidence file of one target (see the module's doc)."""

    model_config = ConfigDict(json_schema_extra={"required": ["caveat", "sources", "released_model", "protocol",
                                                              "measures"]})

    caveat: str = ""
    sources: list[str] = Field(default_factory=list)
    released_model: AssessedObject = Field(default_factory=AssessedObject)
    protocol: AssessedObject = Field(default_factory=AssessedObject)
    measures: list[Measure] = Field(default_factory=list)

    def dump(self) -> dict[str, Any]:
        """As metrics.json stores it: a value the builder left None is left out (it reads back as None)."""
        return self.model_dump(mode="json", exclude_unset=True, exclude_none=True, by_alias=True)

    def objects(self) -> list[tuple[str, AssessedObject]]:
        """(key, object): the released model first, then the protocol."""
        return [("released_model", self.released_model), ("protocol", self.protocol)]


__all__ = ["FAMILIES", "NOT_RUN", "NOT_TESTED", "TESTED", "AnonymityEvidence", "AssessedObject", "FamilyEvidence", "LinkedRow",
           "Measure", "Status"]
