"""Plug-ins register themselves: a method or an attack is one class that declares its name (fedaudit.registry)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from fedaudit.attack import NO_ACCESS, Access, Attack, AttackOutput, AttackSetup
from fedaudit.attacks import ATTACKS  # the package: importing it registers the built-in attacks
from fedaudit.methods import METHODS
from fedaudit.methods.fedavg import FedAvg
from fedaudit.run.options import Option, option
from fedaudit.simulation.wire import ArtifactKind, WireView


@pytest.fixture
def registries():
    """METHODS and ATTACKS as they were before the test, whatever it registered (even if it failed half-way)."""
    before = dict(METHODS), dict(ATTACKS)
    yield
    for registry, kept in zip((METHODS, ATTACKS), before):
        registry.clear()
        registry.update(kept)


def test_a_method_and_an_attack_each_declared_in_one_class_run_through_evaluate(tiny_run, registries):
    """Nothing else is touched: no tuple of names, no branch on a name. The method trains, its option reaches it
    from evaluate's keywords, the attack is found by --attack, gets its own option, and its reconstructions are
    scored by the auditor (their access is the default: the wire view and the prior only)."""

    class UnweightedFedAvg(FedAvg):
        name = "test-unweighted"
        summary = "FedAvg with every client weighted alike"
        options: ClassVar[dict[str, Option]] = {"damping": Option(1.0, "share of the new mean kept", kind=float,
                                                                  low=0.0, high=1.0)}
        aggregated: ClassVar[list[float]] = []

        def aggregate(self, server, uploads, rnd):
            UnweightedFedAvg.aggregated.append(self.opts["damping"])
            return super().aggregate(server, uploads, rnd)

    @dataclass(frozen=True)
    class GreyOptions:
        grey_images: int = option(2, "images per victim", low=1, high=8)

    class GreyImages(Attack):
        name = "test-grey"
        summary = "every reconstruction a flat grey image: an attack that knows nothing"
        Options: ClassVar[type] = GreyOptions

        def __init__(self, images: int = 2) -> None:
            self.images = images

        @classmethod
        def from_config(cls, setup: AttackSetup, prior):
            return cls(setup.options.grey_images)

        def run(self, view: WireView, prior, victim: str, device: torch.device,
                access: Access = NO_ACCESS) -> list[AttackOutput]:
            shape = (self.images, prior.channels, prior.image_size, prior.image_size)
            return [AttackOutput(self.name, view.role, victim, ArtifactKind.FULL_MODEL.value,
                                 images=torch.zeros(shape), targets=torch.arange(self.images) % prior.num_classes,
                                 control_images=torch.zeros(shape), info={"status": "attacked"})]

    try:
        assert METHODS["test-unweighted"] is UnweightedFedAvg and ATTACKS["test-grey"] is GreyImages
        run_dir, metrics = tiny_run("test-unweighted", attack="test-grey", rounds=1, method_option=["damping=0.5"],
                           grey_images=3)
    finally:
        METHODS.pop("test-unweighted")
        ATTACKS.pop("test-grey")
    assert UnweightedFedAvg.aggregated == [0.5]
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["method"] == "test-unweighted" and config["attack_options"]["test-grey"] == {"grey_images": 3}
    scored = metrics["leakage"]["test-grey"]["full_model"]
    assert {entry["metrics"]["identifiability"]["n"] for entry in scored.values()} == {3}
    # The verdict judges a plug-in's evidence by the same rules: grey images beat no null, and with no positive
    # control a low reading cannot be told from a weak attack.
    row = next(r for r in metrics["verdict"] if r["row"] == "client_data:full_model↑")
    assert row["tier"] == "inconclusive" and {e["source"].split()[0] for e in row["evidence"]} == {"test-grey"}


def test_the_same_class_made_again_replaces_itself_and_the_registry_keeps_name_order(registries):
    """A re-run notebook cell or a reloaded module makes the class again: it replaces its earlier self. Entries are in
    name order, so what --attack all runs, and in which order, does not hang on import order."""
    def make():
        class Again(FedAvg):
            name = "aaa-again"
        return Again

    first, second = make(), make()
    assert first is not second and METHODS["aaa-again"] is second and list(METHODS) == sorted(METHODS)
    from fedaudit.attacks import get_attacks

    assert [cls.name for cls in get_attacks("all")] == ["deepinversion", "gradinv", "mia"]


def test_two_classes_declaring_one_name_is_an_error_naming_both():
    with pytest.raises(TypeError, match="declared twice, by .*FedAvg and .*Impostor"):
        class Impostor(FedAvg):
            name = "fedavg"
    assert METHODS["fedavg"] is FedAvg


def test_a_subclass_that_declares_no_name_tunes_its_parent_and_does_not_register():
    before = dict(ATTACKS)

    class Quieter(ATTACKS["deepinversion"]):
        pass

    assert dict(ATTACKS) == before and Quieter.name == "deepinversion"


def test_an_attack_that_sets_options_by_hand_is_told_to_declare_them_as_fields():
    """Options are read from the Options dataclass; a dict set on the class would be silently replaced."""
    with pytest.raises(TypeError, match="declare them as the fields of a frozen dataclass"):
        class ByHand(Attack, register=False):
            name = "by-hand"
            options: ClassVar[dict[str, Option]] = {"level": Option(1, "a level", kind=int)}


def test_an_unknown_name_is_a_one_line_error_naming_the_registered_choices():
    from fedaudit.errors import FedauditError

    with pytest.raises(FedauditError, match=r"unknown method 'fedavgg'; valid choices: .*fedavg, "):
        METHODS.named("fedavgg")
