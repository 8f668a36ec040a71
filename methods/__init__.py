"""FedDG methods, one module each, registered by name (``fedaudit.methods``)."""

from __future__ import annotations

from fedaudit.errors import unknown_choice
from fedaudit.simulation.method import Method

from .ccst import CCST
from .elcfs import ELCFS
from .fedavg import FedAvg
from .feddg_ga import FedDGGA
from .fedfd import FedFD, FedFDA
from .fedgala import FedGaLA
from .fedlsi import FedLSI
from .fedprox import FedProx
from .fedsb import FedSB
from .gperxan import GPerXAN

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (FedAvg, FedProx, GPerXAN, FedSB, FedGaLA, FedFD, FedFDA, FedLSI, FedDGGA, ELCFS, CCST)}


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``; a clear error otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise unknown_choice("method", name, METHODS) from None


__all__ = ["METHODS", "Method", "get_method"]
