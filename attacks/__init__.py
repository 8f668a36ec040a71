"""Attack families, one module each, registered by name (``fedaudit.attacks``).

``none`` is not an attack class: it means "train and measure accuracy and
communication only". Reconstruction (``deepinversion``) and membership
inference (``mia``) register here as they land.
"""

from __future__ import annotations

from fedaudit.attack import Attack
from fedaudit.errors import unknown_choice

from .deepinversion import DeepInversion

ATTACKS: dict[str, type[Attack]] = {cls.name: cls for cls in (DeepInversion,)}

NO_ATTACK = "none"


def attack_names() -> list[str]:
    return [NO_ATTACK, *ATTACKS]


def get_attacks(spec: str) -> list[type[Attack]]:
    """``none`` → [], ``all`` → every registered attack, ``a,b`` → those."""
    if spec == NO_ATTACK:
        return []
    if spec == "all":
        return list(ATTACKS.values())
    out = []
    for name in (s.strip() for s in spec.split(",")):
        if name not in ATTACKS:
            raise unknown_choice("attack", name, [*attack_names(), "all"])
        out.append(ATTACKS[name])
    return out


__all__ = ["ATTACKS", "Attack", "attack_names", "get_attacks"]
