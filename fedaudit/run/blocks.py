"""The fields fedaudit reads of an attack's own account of its reference models, and the rows of history.csv and
wire.jsonl — read once, here, for the verdict, the report and the terminal (every block of metrics.json has its typed
model: :mod:`fedaudit.run.stored`, gathered by :class:`fedaudit.run.results.RunMetrics`).

A :class:`Block` is a frozen dataclass whose fields name the stored keys. ``Block.of(mapping)`` reads each field from
the key of its name, anything absent as the field's default.
Values keep their stored form: the report prints what the run stored, and says so where it is missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar


B = TypeVar("B", bound="Block")


class Block:
    """A stored row or block read into named fields (see the module's doc)."""

    _stored: frozenset[str] = frozenset()

    @classmethod
    def of(cls: type[B], data: Any) -> B:
        data = data if isinstance(data, Mapping) else {}
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}  # type: ignore[arg-type]
        block = cls(**values)
        object.__setattr__(block, "_stored", frozenset(values))
        return block

    def has(self, name: str) -> bool:
        """Whether the file stored this field (a null included): what a table shows as a dash, not leaves out."""
        return name in self._stored


# -- what an attack says of its reference models -------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceTraining(Block):
    epochs: Any = None
    target_exposure_epochs: Any = None
    kind: Any = None  # replay or scratch (absent: stored before replay references, from scratch)
    round: Any = None  # a replay's round
    released_as: Any = None  # a replay of the released model: the mean it was found to be
    no_replay: Any = None  # a from-scratch set: why no replay ran
    shift: Any = None  # φ units: the target's uniform lift over these references, which LiRA and RMIA took off


# -- history.csv and wire.jsonl rows --------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryRow(Block):
    round: Any = None
    val_mean: Any = None
    target: Any = None
    bytes_up: Any = None
    bytes_down: Any = None


@dataclass(frozen=True)
class WireRow(Block):
    kind: Any = "?"
    direction: Any = "?"
    round: Any = -1
    bytes: Any = 0
    sender: Any = None
    receiver: Any = None
