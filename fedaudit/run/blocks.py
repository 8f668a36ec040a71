"""The attack results' score blocks as the report shows them, and the rows of history.csv and wire.jsonl — read once,
here, for the report and the terminal (every other block of metrics.json has its typed model: :mod:`fedaudit.run.stored`,
gathered by :class:`fedaudit.run.results.RunMetrics`).

A :class:`Block` is a frozen dataclass whose fields name the stored keys. ``Block.of(mapping)`` reads each field from
the key of its name, a nested block, a list of blocks or a mapping of blocks the same way, and anything absent (or of
the wrong shape for a block) as the field's default.
Values keep their stored form: the report prints what the run stored, and says so where it is missing. The attack
results have their own typed entries (:mod:`fedaudit.run.entries`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
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


# -- scores, as the report shows them ---------------------------------------------------------------------


@dataclass(frozen=True)
class Score(Block):
    """An attack's rate beside its nulls (a reconstruction's domain attribution, PSNR, …), as stored."""

    attack: Any = None
    chance: Any = None
    control: Any = None
    prior_only: Any = None
    twin: Any = None
    status: Any = "unavailable"
    p_value: Any = None


@dataclass(frozen=True)
class MatchedScores(Block):
    psnr_mean: Any = None
    ssim_mean: Any = None
    psnr_best: Any = None


@dataclass(frozen=True)
class Matched(Block):
    """Batch inversions (gradinv): each reconstruction paired with a distinct member, and the control's."""

    attack: MatchedScores = field(default_factory=MatchedScores)
    control: MatchedScores = field(default_factory=MatchedScores)


@dataclass(frozen=True)
class Identified(Block):
    """The record-level test as stored (the verdict judges its finite numbers: fedaudit.run.entries)."""

    attack: Any = None
    attack_ci95: Any = None
    attack_p_value: Any = None
    chance: Any = None
    control: Any = None
    prior_only: Any = None
    twin: Any = None
    n: Any = None
    attack_k: Any = None
    balanced: Any = None
    null_q95: Any = None


@dataclass(frozen=True)
class VictimScores(Block):
    """A victim's reconstruction scores (``entry.metrics``)."""

    status: Any = None
    reason: Any = None
    identifiability: Identified | None = None
    domain_attribution: Score | None = None
    class_fidelity: Score | None = None
    psnr_mean: Score | None = None
    ssim_mean: Score | None = None
    lpips_mean: Score | None = None
    matched: Matched | None = None


@dataclass(frozen=True)
class PowerSize(Block):
    """The positive control at one size (images per class)."""

    p_reveals: Any = None
    domain_attribution: Score | None = None
    class_fidelity: Score | None = None
    identifiability: Any = None
    p_value: Any = None
    images: Any = None


POWER_SINGLE = "single"  # a positive control's size key: the artifact of one member image alone (else per class)


@dataclass(frozen=True)
class PowerShown(Block):
    status: Any = "?"
    reason: Any = ""
    reached: Any = None
    record_level: Any = None
    p_value: Any = None
    sizes: dict[str, PowerSize] = field(default_factory=dict)


@dataclass(frozen=True)
class Status(Block):
    status: Any = "?"
    reason: Any = ""


@dataclass(frozen=True)
class Judge(Block):
    """One of the auditor's judges (a classifier, LPIPS) and its status."""

    status: Any = "?"
    looked_for: Any = "?"
    fix: Any = ""
    accuracy_on_members: Any = None
    trained_on: Any = "?"


@dataclass(frozen=True)
class Judges(Block):
    lpips: Judge | None = None
    domain_classifier: Judge | None = None
    class_classifier: dict[str, Judge] = field(default_factory=dict)


@dataclass(frozen=True)
class Roc(Block):
    fpr: Any = None
    tpr: Any = None


@dataclass(frozen=True)
class Calibration(Block):
    status: Any = None
    out_gap: Any = None  # σ, of the signal the attack scored (after the attacker's shift)
    in_gap: Any = None
    raw_out_gap: Any = None  # σ, before the shift (absent: stored before the attacks shifted)
    raw_in_gap: Any = None
    shift: Any = None  # σ


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
