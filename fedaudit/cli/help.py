"""``--help`` as plain text in sections, every flag whole at any width.

Rich's option tables (typer's default) share the terminal's width between a flag's name, its negative form, its
metavar and its help, and cut the name with an ellipsis when they do not fit: at 80 columns ``evaluate --help``
printed ``--secure-aggregati…``, a flag no user could copy. The plain formatter writes a name whole and moves its
help to the next line when the name is long. The sections keep the panels the flags declare, the common flags
first.

Typer builds its commands on click, and since typer 0.26 on a copy of click of its own (``typer._click``), not on
the click that pip installs beside it. So this module calls only methods of the objects it is handed — the
command's own ``format_usage``/``format_help_text``/``format_epilog``, the formatter's ``section``/``write``, each
parameter's ``get_help_record`` — and never names click: whichever copy built the command formats it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from typer.core import TyperCommand

ARGUMENTS, COMMON = "Arguments", "Common options"
# The flags a user reaches for first, in this order, whatever panel declares them.
COMMON_FLAGS = ("method", "dataset", "records", "attack", "target_domain", "model", "profile", "attacker",
                "device", "out", "config", "resume", "unverified", "fail_on", "fail_on_inconclusive", "json_summary",
                "quiet")
OTHER = "Other options"


class Formatter(Protocol):
    """What this module uses of a help formatter (click's ``HelpFormatter``, in whichever copy of click)."""

    width: int
    current_indent: int

    def write(self, string: str) -> None: ...

    def section(self, name: str) -> AbstractContextManager[None]: ...


class Parameter(Protocol):
    """What this module uses of a command's parameter (click's ``Parameter``, in whichever copy of click)."""

    @property
    def name(self) -> str | None: ...

    @property
    def param_type_name(self) -> str: ...

    def get_help_record(self, ctx: Any) -> tuple[str, str] | None: ...


class SectionedCommand(TyperCommand):
    """A command whose help lists its parameters by section: its arguments, the common flags, then each declared panel
    in the order its first flag was declared, then the rest."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # The plain layout every click writes (usage, text, options, epilog), from this command's own methods:
        # typer's format_help would hand the page to rich where rich is installed and the typer is old.
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        for title, records in help_sections(self.get_params(ctx), ctx):
            with formatter.section(title):
                write_rows(formatter, records)


NAME_COLUMN = 30  # as click's: a longer name goes on its own line, its help under it


def write_rows(formatter: Formatter, records: list[tuple[str, str]]) -> None:
    """A definition list, as click's, but its help wrapped only at spaces: a flag named in the help
    (``--fail-on-inconclusive``) stays whole too."""
    first = min(max(len(name) for name, _ in records), NAME_COLUMN) + 2
    indent = " " * formatter.current_indent
    for name, text in records:
        lines = textwrap.wrap(text, max(formatter.width - first - 2, 10), break_on_hyphens=False,
                              break_long_words=False) or [""]
        if len(name) <= first - 2:
            formatter.write(f"{indent}{name:<{first}}{lines.pop(0)}\n")
        else:
            formatter.write(f"{indent}{name}\n")
        formatter.write("".join(f"{indent}{' ' * first}{line}\n" for line in lines))


def help_sections(params: Sequence[Parameter], ctx: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """(section title, [(flag, help)]) in the order shown."""
    sections: dict[str, list[tuple[str, str]]] = {ARGUMENTS: [], COMMON: []}
    common: dict[str, tuple[str, str]] = {}
    for param in params:
        record = param.get_help_record(ctx)
        if record is None:  # a hidden parameter has no line
            continue
        record = (record[0], record[1].replace("\\[", "["))  # typer escapes brackets for rich, which is off here
        if param.param_type_name == "argument":
            sections[ARGUMENTS].append(record)
        elif param.name in COMMON_FLAGS:
            common[param.name] = record
        else:
            sections.setdefault(getattr(param, "rich_help_panel", None) or OTHER, []).append(record)
    sections[COMMON] = [common[name] for name in COMMON_FLAGS if name in common]
    other = sections.pop(OTHER, [])
    return [(title, records) for title, records in (*sections.items(), (OTHER, other)) if records]


__all__ = ["SectionedCommand", "help_sections"]
