"""One declaration per option: its default, per-profile defaults, type, range or choices, and help.

An :class:`Option` is everything fedaudit knows about a setting. From it come
the command-line flag (``--name-with-dashes``), the TOML key (the name, dashes
or underscores), the one-line range or choice error, the value recorded in
``config.json``, and the line in ``--help``. Run options are declared on
:class:`fedaudit.run.config.RunConfig`'s fields (:func:`option`), attack options
on the attack classes' ``Options`` dataclasses (``Attack.options`` is read from them), so adding an option touches one
place.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedaudit.errors import FedauditError, unknown_choice

# A nullable option given as the word `none` on the command line stays that word until
# fedaudit.run.config.resolve: unlike an absent flag (None: the config file, the DP recipe or the method's defaults
# decide), it sets the option to None over all of them, and it survives a grid's or a sweep's JSON.
NONE_WORDS = ("none", "null")


@dataclass(frozen=True)
class Option:
    """A setting. ``kind`` is its value type (int, float, str or bool); ``nullable`` lets it be None
    (meaning "no cap", "not set"); ``low``/``high`` bound numbers; ``choices`` lists the allowed
    strings; ``profiles`` maps a profile name to its own default."""

    default: Any
    help: str
    kind: type = str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    profiles: Mapping[str, Any] = field(default_factory=dict)

    def default_for(self, profile: str) -> Any:
        return self.profiles.get(profile, self.default)

    def is_none_word(self, value: Any) -> bool:
        """``none`` given for a nullable option: None, set explicitly (see NONE_WORDS)."""
        return self.nullable and isinstance(value, str) and value.lower() in NONE_WORDS

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it is valid for this option, else a one-line error naming ``--flag``, the range and the value."""
        flag = flag_of(name)
        if value is None or self.is_none_word(value):
            if self.nullable:
                return None
            raise FedauditError(f"{flag} needs a value")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise FedauditError(f"{flag} must be true or false, got {value!r}")
            return value
        if self.kind in (int, float):
            integer = self.kind is int
            if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or (
                    not integer and not math.isfinite(value)):
                raise FedauditError(f"{flag} must be {'an integer' if integer else 'a number'}, got {value!r}")
            lo = -math.inf if self.low is None else self.low
            hi = math.inf if self.high is None else self.high
            if not lo <= value <= hi:
                raise FedauditError(f"{flag} must be between {lo:g} and {hi:g}, got {value!r}")
            return value if integer else float(value)
        if not isinstance(value, str):
            raise FedauditError(f"{flag} must be a string, got {value!r}")
        if self.choices and value not in self.choices:
            raise unknown_choice(flag[2:], value, self.choices)
        return value

    def parse(self, name: str, text: str) -> Any:
        """A command-line word as this option's type (errors name the flag)."""
        if self.is_none_word(text):
            return text.lower()  # explicit: resolve turns it into None over every default
        if self.kind is str:
            return text
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        return self.check(name, value)


def option(default: Any, help: str, **spec: Any) -> Any:
    """A :class:`RunConfig` field declared as an :class:`Option` (its default is the field's default)."""
    kind = spec.pop("kind", None) or (type(default) if default is not None else str)
    declared = Option(default, help, kind=kind, **spec)
    return field(default=default, metadata={"option": declared})


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def declared(cls: type) -> dict[str, Option]:
    """The options declared on a dataclass's fields, in declaration order."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(cls) if "option" in f.metadata}


__all__ = ["Option", "declared", "flag_of", "option"]
