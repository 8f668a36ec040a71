"""Attack families, registered by name (``fedaudit.attacks``).

Each family lives in one place: a package with its adapter in ``__init__`` and
its engine beside it (``deepinversion/engine.py``, ``gradinv/engine.py``,
``mia/reference_models.py``), or one module (``canary.py``). What several
families share sits here too: ``image_optim.py`` (the reconstruction attacks'
image prior, schedule and default budget) and ``budget.py`` (their options).
What attacks share with the auditor's counterfactuals (``fedaudit.simulation.wire_views``: what
an observer assembles from a wire view) and with methods (latent inversion, BN
statistics, training recipes) lives below both, in ``fedaudit/``.

Every attack follows one contract (:class:`fedaudit.attack.Attack`): it gets a
wire view, the public prior and the :class:`~fedaudit.attack.Access` its
``needs`` declares, and returns :class:`~fedaudit.attack.AttackOutput` rows;
the auditor (:mod:`fedaudit.audit`) scores them. A module here imports the
wire, the prior, shared mechanics and other attacks, never the federation, a
method, the data or the auditor (``tests/test_layout.py``).

``none`` is not an attack class: it means "train and measure accuracy and
communication only". Reconstruction (``deepinversion``, ``gradinv``) and
membership inference (``mia``) register here as they land. ``mia`` runs every membership
variant; ``mia-loss``, ``mia-lira``, ``mia-rmia`` and ``mia-domain`` one of them
(members of the ``mia`` family: ``all`` lists the family once). ``canary`` (the
one-run privacy audit) plants records in the training split, so it changes what is
trained: ``all`` leaves it out, and it runs only when named.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedaudit.attack import ATTACKS, Attack
from fedaudit.errors import unknown_choice
from fedaudit.registry import import_modules
from fedaudit.run.options import Option
from fedaudit.simulation.wire import ArtifactKind

from .targets import BANK_KINDS, STATS_KINDS

import_modules(__name__, __path__)  # each attack class declares its name and so joins ATTACKS

NO_ATTACK = "none"
AUTO = "auto"
# What --attack auto runs against the kinds deepinversion and mia-artifact read (their shared dispatch's), and
# against every deployed model: the loss attack (no reference models, so it fits the quick budget).
_INVERTIBLE = {kind.value for kind in (*STATS_KINDS, *BANK_KINDS, ArtifactKind.CLASSIFIER_HEAD)}
AUTO_ALWAYS = ("mia-loss",)
AUTO_FOR_STATISTICS = ("deepinversion", "mia-artifact")
# LiRA and RMIA on one set of reference models. Each reference replays a victim's whole participation (or trains
# from scratch for as long), so N of them cost N times the federation's local training: affordable on the paper
# profile's GPU, not within the quick profile's CPU budget (docs/results/membership_strength.md).
AUTO_REFERENCES = ("mia-lira", "mia-rmia")


def auto_attacks(shares: Iterable[tuple[object, str]], profile: str) -> str:
    """The attack spec ``--attack auto`` resolves to for a method that shares ``shares`` ((kind, direction)
    pairs): reconstruction and artifact membership when it ships statistics or banks, the loss attack on the
    deployed model always, and LiRA and RMIA — reference-model attacks — on the paper profile."""
    kinds = {getattr(kind, "value", kind) for kind, _ in shares}
    chosen = [*(AUTO_FOR_STATISTICS if kinds & _INVERTIBLE else ()), *AUTO_ALWAYS,
              *(AUTO_REFERENCES if profile == "paper" else ())]
    return ",".join(chosen)


def attack_names() -> list[str]:
    return [NO_ATTACK, AUTO, *ATTACKS]


def get_attacks(spec: str) -> list[type[Attack]]:
    """``none`` → [], ``all`` → every attack family once (but not the canary audit, which changes
    what is trained), ``a,b`` → those (each once)."""
    if spec == NO_ATTACK:
        return []
    if spec == AUTO:
        raise RuntimeError("--attack auto is resolved for a method first (auto_attacks)")
    if spec == "all":
        return [cls for cls in ATTACKS.values()
                if (cls.family or cls.name) == cls.name and not cls.plants_canaries]
    out = []
    for name in (s.strip() for s in spec.split(",")):
        if name not in ATTACKS:
            raise unknown_choice("attack", name, [*attack_names(), "all"])
        if ATTACKS[name] not in out:
            out.append(ATTACKS[name])
    return out


def attack_options() -> dict[str, Option]:
    """Every registered attack's options by name. A name means one declaration: attacks that share an
    option (deepinversion and gradinv share the inversion budget) share the same :class:`Option`."""
    out: dict[str, Option] = {}
    for cls in ATTACKS.values():
        for name, opt in cls.options.items():
            if out.setdefault(name, opt) is not opt:
                raise RuntimeError(f"attack option {name!r} of {cls.name} is declared twice with different meanings")
    return out


def attack_schema(spec: str) -> dict[str, dict[str, Option]]:
    """The options of the attack families ``spec`` selects, one block per family (the run records these)."""
    out: dict[str, dict[str, Option]] = {}
    for cls in get_attacks(spec):
        if cls.options:
            out.setdefault(cls.family or cls.name, {}).update(cls.options)
    return out


__all__ = ["ATTACKS", "Attack", "attack_names", "attack_options", "attack_schema", "get_attacks"]
