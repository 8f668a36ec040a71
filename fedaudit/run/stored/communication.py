"""Traffic: the ledger's bytes each way, per artifact kind and per round, and what the method declares it sends."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from fedaudit.run.stored.core import Stored


class KindBytes(Stored):
    """The bytes one artifact kind sent, each way."""

    up: int = 0
    down: int = 0


class Communication(Stored):
    """Traffic from the ledger, and what the method declares it sends."""

    # Required where a run writes them, absent in a file only when it is damaged: read as None then.
    model_config = ConfigDict(json_schema_extra={"required": ["bytes_up", "bytes_down"]})

    bytes_up: int | None = None
    bytes_down: int | None = None
    messages: int | None = Field(None, description="older runs only: the ledger's message count")
    by_kind: dict[str, KindBytes] = Field(default_factory=dict)
    rounds: int | None = None
    clients: int | None = None
    mb_up_per_round: float | None = None
    mb_down_per_round: float | None = None
    declared: list[str] = Field(default_factory=list, description="what the method (or recording) says it sends: "
                                "kind and arrow, e.g. full_model↑")
    per_target: dict[str, Communication] | None = Field(None, description="a --target-domain all run: each target's")


__all__ = ["Communication", "KindBytes"]
