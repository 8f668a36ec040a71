"""User-facing errors.

A :class:`FedauditError` is a mistake the user can fix (unknown name, missing
folder, value out of range). Its message is one line that names the problem
and the fix; the CLI prints it and exits with status 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class FedauditError(Exception):
    """A user error: one line naming the problem and how to fix it."""


class PointCrashed(RuntimeError):
    """A sweep point's run raised something other than a FedauditError: a bug, not the user's input (its
    traceback is in the point's error.txt). The CLI says so in one line and exits 1, as a crash does, not 2."""


def unknown_choice(what: str, value: object, choices: Iterable[str]) -> FedauditError:
    """Uniform error for a name that is not one of the valid choices."""
    valid = ", ".join(sorted(choices))
    return FedauditError(f"unknown {what} {value!r}; valid choices: {valid}")
