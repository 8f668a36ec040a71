"""The inversion budget both reconstruction attacks share (``deepinversion`` and ``gradinv``), declared once.

Each option is a field declared with :func:`~fedaudit.run.options.option`: its flag, TOML key, range and
recorded value come from here; its default is the engine's own (:mod:`fedaudit.attacks.image_optim`), so it is
written down once. Both attacks' ``Options`` extend :class:`InversionBudget`, so the two share one declaration.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedaudit.attacks.image_optim import DEFAULT_ITERS, DEFAULT_LR
from fedaudit.run.options import option


@dataclass(frozen=True)
class InversionBudget:
    inversion_iters: int = option(DEFAULT_ITERS, "Optimisation steps of deepinversion and gradinv.", low=1,
                                  high=1_000_000, profiles={"paper": 2000})
    inversion_batch: int = option(40, "Images synthesised per victim, whole classes (at least one per class).",
                                  low=1, high=1_000_000, profiles={"paper": 256})
    inversion_lr: float = option(DEFAULT_LR, kind=float, help="Adam learning rate of deepinversion and gradinv.", low=1e-6,
                                 high=10.0)


__all__ = ["InversionBudget"]
