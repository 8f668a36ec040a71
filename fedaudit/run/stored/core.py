"""The :class:`Stored` base every typed block of metrics.json derives from: strict where a block is built, lenient
where a stored one is read (see :mod:`fedaudit.run.stored`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, Self

from pydantic import (AliasChoices, BaseModel, ConfigDict, SerializerFunctionWrapHandler, TypeAdapter, ValidationError,
                      model_serializer)
from pydantic.fields import FieldInfo

from fedaudit.errors import FedauditError


class Stored(BaseModel):
    """A block of metrics.json (see the module's doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)
    # A field typed ``X | None`` reads None where the file has no value; a run writes null only for the fields named
    # here, and only those allow null in the schema (a stored null elsewhere reads as absent).
    stored_nulls: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def read(cls, data: object) -> Self:
        """The block as stored: each field validated alone (a nested block through its own ``read``), an absent or
        invalid one its default; not a mapping: every field its default."""
        found = data if isinstance(data, Mapping) else {}
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            key = next((k for k in _stored_keys(name, info) if k in found), None)
            if key is None or (found[key] is None and name not in cls.stored_nulls):
                continue
            value = None if found[key] is None else _read_value(info.annotation, found[key])
            if value is not _INVALID:
                values[name] = value
        block: Self = cls.model_construct(_fields_set=set(values), **values)  # type: ignore[assignment]
        return block

    @classmethod
    def reported(cls, attack: str, values: Mapping[str, Any]) -> Self:
        """The block built from what an attack reported (``AttackOutput.info``) with what the auditor adds: a key the
        model does not declare is a one-line error naming the attack and the model to declare it in (a plug-in's
        own key would otherwise vanish from metrics.json, or break its schema)."""
        undeclared = sorted(set(values) - set(cls.model_fields))
        if undeclared:
            raise FedauditError(f"attack {attack} reported {', '.join(undeclared)}, which a stored {cls.__name__} does "
                                f"not hold: declare the field in {cls.__module__}.{cls.__name__}, or leave it out of "
                                "AttackOutput.info")
        return cls(**values)

    def with_(self, **changes: Any) -> Self:
        """A copy with ``changes`` set, validated as strictly as a block being built (pydantic's ``model_copy``
        would set them unchecked)."""
        return type(self)(**{**{name: getattr(self, name) for name in self.model_fields_set}, **changes})

    def has(self, name: str) -> bool:
        """Whether the file stored this field (a null included): what a table shows as a dash, not leaves out."""
        return name in self.model_fields_set

    def dump(self) -> dict[str, Any]:
        """The block as metrics.json stores it: the fields its writer set, in declaration order."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)


class Keyed(Stored):
    """A block that stores the entries of one mapping field (``keyed``) under their own keys, beside its named fields:
    metrics.json's leakage holds each reconstruction attack's section under the attack's name, a section each
    artifact's table under the artifact's name."""

    model_config = ConfigDict(json_schema_extra=lambda schema, cls: _keyed_schema(schema, cls))
    keyed: ClassVar[str]

    @classmethod
    def read(cls, data: object) -> Self:
        found = data if isinstance(data, Mapping) else {}
        named = {k: v for k, v in found.items() if k in cls.model_fields and k != cls.keyed}
        rest = {str(k): v for k, v in found.items() if k not in named and isinstance(v, Mapping)}
        return super().read({**named, **({cls.keyed: rest} if rest else {})})

    @model_serializer(mode="wrap")
    def _by_key(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]  # no return type: the schema stays the model's
        out = handler(self)
        return {**{k: v for k, v in out.items() if k != self.keyed}, **out.get(self.keyed, {})}


def _keyed_schema(schema: dict[str, Any], cls: type[Any]) -> None:
    """The file holds the keyed field's entries under their own keys, not under the field's name."""
    schema["additionalProperties"] = schema["properties"].pop(cls.keyed)["additionalProperties"]


_INVALID = object()  # a stored value of the wrong type: the field reads as absent


def _stored_keys(name: str, info: FieldInfo) -> list[str]:
    """Where a field may be stored: its legacy names (``validation_alias``), then its own."""
    alias = info.validation_alias
    if isinstance(alias, str):
        return [alias, name]
    if isinstance(alias, AliasChoices):
        return [*(k for k in alias.choices if isinstance(k, str)), name]
    return [name]


def _read_value(annotation: Any, value: Any) -> Any:
    """One stored value as its field's type: nested blocks (alone, or a list or mapping of them) leniently, through
    their own ``read``; anything else strictly (no "12" for 12, no true for 1), else :data:`_INVALID`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    inner = args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1 else annotation
    if _is_block(inner):
        return inner.read(value) if isinstance(value, Mapping) else _INVALID
    origin, inner_args = typing.get_origin(inner), typing.get_args(inner)
    if origin is dict and _holds_blocks(inner_args[1]):  # a mapping of blocks, or of mappings of blocks
        if not isinstance(value, Mapping):
            return _INVALID
        read = {str(k): _read_value(inner_args[1], v) for k, v in value.items() if isinstance(v, Mapping)}
        return {k: v for k, v in read.items() if v is not _INVALID}
    if origin is list and _is_block(inner_args[0]):
        return [inner_args[0].read(v) for v in value if isinstance(v, Mapping)] if isinstance(value, list) else _INVALID
    try:
        return _strict(annotation).validate_python(value)
    except ValidationError:
        return _INVALID


def _is_block(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Stored)


def _holds_blocks(hint: Any) -> bool:
    """A block, or a mapping whose values hold blocks (at any depth)."""
    return _is_block(hint) or (typing.get_origin(hint) is dict and _holds_blocks(typing.get_args(hint)[1]))


@cache
def _strict(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation, config=ConfigDict(strict=True))


def first_problem(exc: ValidationError) -> str:
    """A validation error in one line: its first problem, with the field's path and the value given, and how many
    more there are (pydantic's own message spans lines)."""
    errors = exc.errors()
    if not errors:
        return str(exc).splitlines()[0]
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "the block"
    given = f" (given {first['input']!r:.80})" if "input" in first and not isinstance(first["input"], Mapping) else ""
    more = f"; {len(errors) - 1} more problem(s)" if len(errors) > 1 else ""
    return f"{exc.title} field {where!r}: {first.get('msg', 'invalid')}{given}{more}"


__all__ = ["Keyed", "Stored", "first_problem"]
