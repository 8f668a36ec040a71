"""The inversion budget both reconstruction attacks share (``deepinversion`` and ``gradinv``), declared once.

Each option is an :class:`~fedaudit.run.options.Option`: its flag, TOML key,
range and recorded value come from here; its default is the engine's own
(:mod:`fedaudit.attacks.image_optim`), so it is written down once.
"""

from __future__ import annotations

from fedaudit.attacks.image_optim import DEFAULT_ITERS, DEFAULT_LR
from fedaudit.run.options import Option

INVERSION_ITERS = Option(DEFAULT_ITERS, "Optimisation steps of deepinversion and gradinv.", kind=int,
                         low=1, high=1_000_000, profiles={"paper": 2000})
INVERSION_BATCH = Option(40, "Images synthesised per victim, whole classes (at least one per class).", kind=int,
                         low=1, high=1_000_000, profiles={"paper": 256})
INVERSION_LR = Option(DEFAULT_LR, "Adam learning rate of deepinversion and gradinv.", kind=float,
                      low=1e-6, high=10.0)

INVERSION_BUDGET = {"inversion_iters": INVERSION_ITERS, "inversion_batch": INVERSION_BATCH,
                    "inversion_lr": INVERSION_LR}

__all__ = ["INVERSION_BUDGET"]
