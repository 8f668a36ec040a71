"""The fields fedaudit reads of an attack's own account of its reference models, and the rows of history.csv and
wire.jsonl — read once, here, for the verdict, the report and the terminal (every block of metrics.json has its typed
model: :mod:`fedaudit.run.stored`, gathered by :class:`fedaudit.run.results.RunMetrics`).

A :class:`Block` is a frozen dataclass whose fields name the stored keys. ``Block.of(mapping)`` reads each field from
the key of its name, a nested block, a list of blocks or a mapping of blocks the same way, and anything absent (or of
the wrong shape for a block) as the field's default.
Values keep their stored form: the report prints what the run stored, and says so where it is missing.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar


B = TypeVar("B", bound="Block")


class Block:
    """A stored block read into named fields (see the module's doc)."""

    _stored: frozenset[str] = frozenset()

    @classmethod
    def of(cls: type[B], data: Any) -> B:
        data = data if isinstance(data, Mapping) else {}
        values = {}
        for f, read in _readers(cls):  # type: ignore[arg-type]  # a class is hashable; typeshed's type[B] is not
            if f.name in data:
                values[f.name] = read(data[f.name])
        block = cls(**values)
        object.__setattr__(block, "_stored", frozenset(values))
        return block

    def has(self, name: str) -> bool:
        """Whether the file stored this field (a null included): what a table shows as a dash, not leaves out."""
        return name in self._stored

    @classmethod
    def maybe(cls: type[B], data: Any) -> B | None:
        """The block, or None where the file stores none (an empty mapping, or not a mapping)."""
        return cls.of(data) if isinstance(data, Mapping) and data else None


@cache
def _readers(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f, _reader(hints[f.name])) for f in dataclasses.fields(cls))


def _reader(hint: Any) -> Any:
    """How a stored value becomes the field's value: blocks (also inside lists and mappings) read, the rest kept."""
    union = _is_union(hint)
    options = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    for o in options:
        if _is_block(o):
            return o.maybe if union and type(None) in typing.get_args(hint) else o.of
        if typing.get_origin(o) in (list, dict):
            args = typing.get_args(o)
            return _container(typing.get_origin(o), args[-1] if args and _is_block(args[-1]) else None)
    return _kept


def _kept(value: Any) -> Any:
    return value


def _is_block(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Block)


def _container(origin: type, inner: type[Block] | None) -> Any:
    """A list or mapping field: its blocks read (where it holds blocks); anything but a list or mapping reads as empty."""
    def read_list(value: Any) -> list[Any]:
        if not isinstance(value, list):
            return []
        return [inner.of(x) for x in value if isinstance(x, Mapping)] if inner else value

    def read_dict(value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            return {}
        return {k: inner.of(x) for k, x in value.items() if isinstance(x, Mapping)} if inner else dict(value)

    return read_list if origin is list else read_dict


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


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
