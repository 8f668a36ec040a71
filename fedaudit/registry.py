"""Plug-ins by name: a method or an attack joins its registry by declaring itself.

A class that sets ``name`` in its own body registers under that name when it is made (the base class's
``__init_subclass__`` calls :meth:`Registry.join`); a subclass that does not set one (it tunes its parent) does not.
So adding a method or an attack is one module in ``methods/`` or ``attacks/`` (each package imports its modules)
or, for a user's own experiment, one class defined before calling :func:`fedaudit.evaluate`. Two classes declaring
one name is an error naming both; defining the same class again (a reloaded module, a re-run notebook cell)
replaces it. Entries are kept in name order, so listings and ``--attack all`` do not depend on import order.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, TypeVar

from fedaudit.errors import unknown_choice

T = TypeVar("T", bound=type)


class Registry(dict[str, T]):
    """Registered classes by name, in name order (whatever order their modules happened to be imported in)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind  # "method", "attack": what the errors call an entry

    def join(self, cls: T, register: bool = True) -> None:
        """Register ``cls`` under the ``name`` its own body declares (nothing when it declares none)."""
        name = cls.__dict__.get("name")
        if not register or not isinstance(name, str):
            return
        known = self.get(name)
        if known is not None and _where(known) != _where(cls):
            raise TypeError(f"{self.kind} {name!r} is declared twice, by {_where(known)} and {_where(cls)}; give one "
                            "of them another name")
        self._put(name, cls)

    def named(self, name: str) -> T:
        """The class registered as ``name``; a one-line error naming the choices otherwise."""
        try:
            return self[name]
        except KeyError:
            raise unknown_choice(self.kind, name, self) from None

    def _put(self, name: str, cls: T) -> None:
        self[name] = cls
        ordered = sorted(self.items())
        self.clear()
        self.update(ordered)


def import_modules(package: str, path: Any) -> None:
    """Import every module of a plug-in package (``methods``, ``attacks``): its classes register as they are made."""
    for module in pkgutil.iter_modules(path):
        if module.name.isidentifier() and not module.name.startswith("_"):  # not a scratch copy, not private
            importlib.import_module(f"{package}.{module.name}")


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
