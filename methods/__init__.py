"""FedDG methods, one module each. A method class declares its ``name`` and so joins the registry
(:data:`fedaudit.simulation.method.METHODS`); importing this package imports every module in it, so adding a
method is adding its module (and its test)."""

from __future__ import annotations

from fedaudit.registry import import_modules
from fedaudit.simulation.method import METHODS, Method

import_modules(__name__, __path__)


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``; a clear error otherwise."""
    return METHODS.named(name)


__all__ = ["METHODS", "Method", "get_method"]
