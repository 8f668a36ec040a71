"""What an observer assembles from a wire view, for attacks and the auditor alike.

An attack turns the messages it saw into a model or statistics to attack (the
newest weights sent to or by a party, overlaid on a fresh model of the public
architecture); the auditor's counterfactuals (holdout twin, positive control)
rebuild artifacts the same way, so both read the wire through this one module.
It reads artifacts only: no client, dataset or federation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from fedaudit.tensor_ops.aggregation import load_state_
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView
from fedaudit.tensor_ops.bn_statistics import MEAN, VAR
from fedaudit.tensor_ops.style import style_encoder

WEIGHT_KINDS = (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL)


def style_encoder_in_view(fresh: nn.Module, view: WireView, device: torch.device) -> tuple[nn.Module, str]:
    """The feature map styles were measured with: the first block of the newest global model the
    observer saw (CCST freezes that block at its round-0 weights, so every round carries them)."""
    model = copy.deepcopy(fresh).to(device)
    sent = [a for a in view if a.kind == ArtifactKind.FULL_MODEL and a.sender == SERVER
            and (view.role == SERVER or a.receiver == view.role)]
    source = "fresh initialisation (no global model on the wire)"
    if sent:
        latest = max(sent, key=lambda a: a.round)
        load_state_(model, {k: t.to(device) for k, t in latest.tensors.items()})
        source = f"full_model@r{latest.round} from server"
    return style_encoder(model.eval()), source


def overlay_state(base: dict[str, Tensor], artifacts: Iterable[Artifact],
                  device: torch.device) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``base`` overlaid by each artifact's matching tensors in order, and where each tensor came from
    ("fresh" or ``<kind>@r<round> from <sender>``)."""
    state = dict(base)
    source = dict.fromkeys(state, "fresh")
    for art in artifacts:
        for k, t in art.tensors.items():
            if k in state and t.shape == state[k].shape:
                state[k] = t.detach().to(device, state[k].dtype)
                source[k] = f"{art.kind.value}@r{art.round} from {art.sender}"
    return state, source


def count_sources(source: dict[str, str], skip: Iterable[str] = ()) -> dict[str, int]:
    """How many tensors came from each source (``weights_from`` in the results), leaving out ``skip``."""
    skip = set(skip)
    counts: dict[str, int] = {}
    for k, s in source.items():
        if k not in skip:
            counts[s] = counts.get(s, 0) + 1
    return counts


def latest_weights(arts: list[Artifact], sender: str | None = None, receiver: str | None = None) -> list[Artifact]:
    """The newest weight-bearing artifact of each kind from ``sender`` / to ``receiver``, oldest first."""
    picked = []
    for kind in WEIGHT_KINDS:
        found = [a for a in arts if a.kind == kind and (sender is None or a.sender == sender)
                 and (receiver is None or a.receiver == receiver)]
        if found:
            picked.append(max(found, key=lambda a: a.round))
    return sorted(picked, key=lambda a: a.round)


__all__ = ["MEAN", "VAR", "WEIGHT_KINDS", "count_sources", "latest_weights", "overlay_state",
           "style_encoder_in_view"]
