"""What an attacker can aim at in a wire view, per victim: the one dispatch every artifact attack shares.

Reconstruction (``deepinversion``) and artifact-level membership inference
(``mia-artifact``) attack the same things, so they find them here once:

* **server** (sees every upload). Per victim, its newest upload of each kind:
  a statistics-bearing artifact (``FULL_MODEL``, ``BN_STATS_ALL_LAYERS``, a
  ``PARTIAL_MODEL`` with BN buffers) becomes a :class:`StatsTarget`, a full
  model state: fresh initialisation < the weights the server broadcast to the
  victim < the victim's own uploaded weights < the artifact's statistics; a
  ``CLASSIFIER_HEAD`` a :class:`HeadTarget`; a ``STYLE_BANK`` or
  ``AMPLITUDE_BANK`` a :class:`BankTarget`.
* **curious client** (sees what was broadcast to it). The broadcast global
  statistics as they are (``variant`` "global", every victim at once), and by
  **differencing** (:func:`difference_stats`): the mean statistics of the
  other clients, from the global ones and the attacker's own upload. A
  broadcast bank names every client, so each victim's entries are a
  :class:`BankTarget` of their own.

What cannot be attacked comes back as :class:`Unavailable` with a status
("not yet supported", "not applicable") and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fedaudit.attack import AttackerPrior
from fedaudit.models.classifier import head_layer
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role
from fedaudit.simulation.wire_views import count_sources, latest_weights, overlay_state
from fedaudit.tensor_ops.bn_statistics import MEAN, VAR, bn_stat_keys

DIFFERENCING = "differencing"
NO_BN_STATISTICS = "the model carries no batch-normalisation statistics"

STATS_KINDS = (ArtifactKind.FULL_MODEL, ArtifactKind.BN_STATS_ALL_LAYERS, ArtifactKind.PARTIAL_MODEL,
               ArtifactKind.GLOBAL_STATS)
BANK_KINDS = (ArtifactKind.STYLE_BANK, ArtifactKind.AMPLITUDE_BANK)
NOT_YET = {
    ArtifactKind.MODEL_DELTA: "attacking a model delta is not yet supported",
    # a recorded framework record fedaudit could not name: the recording's record_kinds can name it
    ArtifactKind.RECORD: "a recorded record of no known kind; map its name in the recording's record_kinds",
}
NOT_APPLICABLE = {
    ArtifactKind.SCALARS: "carries no statistics to invert",
    ArtifactKind.TRANSLATOR: "carries no statistics to invert",
    ArtifactKind.IMPORTANCE: "carries no statistics to invert",
}


def difference_stats(global_stats: dict[str, Tensor], own_stats: dict[str, Tensor], num_clients: int,
                     own_weight: float | None = None, pooled: bool = False) -> dict[str, Tensor]:
    """The mean statistics of the *other* clients, from the global ones and the attacker's own.

    With global statistics G = w·s_own + (1 − w)·m_others (``w`` the
    attacker's aggregation weight, 1/K by default), m_others =
    (G − w·s_own) / (1 − w). With ``pooled`` aggregation the relation holds for
    the mean and the second moment σ² + μ², so the variance is recovered from
    the second moment. Variances are clamped at 0 (an assumed weight that is
    off can push them below).
    """
    if num_clients < 2:
        raise ValueError("differencing needs at least two clients")
    w = 1.0 / num_clients if own_weight is None else float(own_weight)
    if not 0.0 < w < 1.0:
        raise ValueError(f"own_weight must lie in (0, 1), got {w}")
    out: dict[str, Tensor] = {}
    for key, g in global_stats.items():
        if key.endswith(MEAN):
            out[key] = (g.float() - w * own_stats[key].float()) / (1 - w)
    for key, g in global_stats.items():
        if not key.endswith(VAR):
            continue
        if pooled:
            mkey = key[: -len(VAR)] + MEAN
            g2 = g.float() + global_stats[mkey].float().square()
            own2 = own_stats[key].float() + own_stats[mkey].float().square()
            out[key] = ((g2 - w * own2) / (1 - w) - out[mkey].square()).clamp_min(0.0)
        else:
            out[key] = ((g.float() - w * own_stats[key].float()) / (1 - w)).clamp_min(0.0)
    return out


@dataclass
class StatsTarget:
    """A model state whose BN buffers hold the statistics to attack, and the victims they summarise."""

    artifact: str
    victims: list[str]
    state: dict[str, Tensor]
    use_ce: bool  # the head's weights came over the wire, so the target classes are meaningful
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class HeadTarget:
    """One victim's uploaded classifier head (BatchNorm1d statistics of its latents + linear layer)."""

    victim: str
    artifact: Artifact


@dataclass
class BankTarget:
    """One victim's entries of a style or amplitude bank."""

    victim: str
    artifact: Artifact
    entries: dict[str, Tensor]  # "mean"/"std" (styles) or "amplitude"


@dataclass
class Unavailable:
    """An artifact of a victim that cannot be attacked here, and why."""

    victim: str
    artifact: str
    status: str
    reason: str


@dataclass
class Targets:
    """Everything :func:`find_targets` found, by kind, with the prior's fresh model state it assembled on."""

    stats: list[StatsTarget]
    heads: list[HeadTarget]
    banks: list[BankTarget]
    unavailable: list[Unavailable]
    fresh: nn.Module  # the prior's freshly initialised model
    base: dict[str, Tensor]
    keys: list[str]  # the architecture's BN buffer names (running mean/var)


def find_targets(view: WireView, prior: AttackerPrior, victims: list[str], device: torch.device,
                 own_weight: float | None = None) -> Targets:
    """Every target ``view`` offers against ``victims`` (see the module docstring)."""
    fresh = prior.build_model()
    keys = bn_stat_keys(fresh)
    base = {k: v.detach().to(device) for k, v in fresh.state_dict().items()}
    head = head_layer(fresh, prior.num_classes)  # fedaudit's `head`, or a model's last nn.Linear to the logits
    ctx = _Context(view, prior, base, keys, [k for k in base if head and k.startswith(f"{head}.")], device)
    out = Targets([], [], [], [], fresh, base, keys)
    if view.role == SERVER:
        _server_targets(ctx, victims, out)
    else:
        _client_targets(ctx, victims, out, own_weight)
    return out


def _server_targets(ctx: _Context, victims: list[str], out: Targets) -> None:
    broadcasts = [a for a in ctx.view if a.sender == SERVER]
    for victim in victims:
        sent = [a for a in ctx.view if a.sender == client_role(victim)]
        for kind in sorted({a.kind for a in sent}, key=lambda k: k.value):
            art = max((a for a in sent if a.kind == kind), key=lambda a: a.round)
            if kind == ArtifactKind.CLASSIFIER_HEAD:
                out.heads.append(HeadTarget(victim, art))
                continue
            if kind in BANK_KINDS:
                out.banks.append(BankTarget(victim, art, dict(art.tensors)))
                continue
            reason = ctx.skip_reason(art)
            if reason is not None:
                out.unavailable.append(Unavailable(victim, kind.value, *reason))
                continue
            # Weights: fresh < what the server broadcast to the victim < what the victim uploaded itself.
            layers = [*latest_weights(broadcasts, receiver=client_role(victim)),
                      *latest_weights(sent, sender=client_role(victim))]
            state, info = ctx.assemble(layers, art)
            if "unsupported" in info:
                out.unavailable.append(Unavailable(victim, kind.value, "not yet supported", info["unsupported"]))
                continue
            out.stats.append(StatsTarget(kind.value, [victim], state, info.pop("use_ce"), info))


def _client_targets(ctx: _Context, victims: list[str], out: Targets, own_weight: float | None) -> None:
    me = ctx.view.role
    received = [a for a in ctx.view if a.receiver == me]
    own = [a for a in ctx.view if a.sender == me]
    for kind in sorted({a.kind for a in received}, key=lambda k: k.value):
        art = max((a for a in received if a.kind == kind), key=lambda a: a.round)
        if kind in BANK_KINDS:  # the broadcast bank names every client's entries: no differencing needed
            _broadcast_bank(art, victims, out)
            continue
        reason = ctx.skip_reason(art)
        if reason is not None:
            out.unavailable += [Unavailable(v, kind.value, *reason) for v in victims]
            continue
        # Weights: fresh < own uploads < the broadcast weights (the model the global stats belong to).
        layers = [*latest_weights(own, sender=me), *latest_weights(received, receiver=me)]
        state, info = ctx.assemble(layers, art)
        if "unsupported" in info:
            out.unavailable += [Unavailable(v, kind.value, "not yet supported", info["unsupported"]) for v in victims]
            continue
        use_ce = info.pop("use_ce")
        out.stats.append(StatsTarget(kind.value, list(victims), state, use_ce, dict(info, variant="global")))
        _differenced(ctx, art, own, state, use_ce, info, victims, out, own_weight)


def _broadcast_bank(art: Artifact, victims: list[str], out: Targets) -> None:
    """Each victim's entries of a broadcast bank (keys ``<victim>/<entry>``), or why it holds none."""
    for v in victims:
        entries = {k[len(v) + 1:]: t for k, t in art.tensors.items() if k.startswith(f"{v}/")}
        if entries:
            out.banks.append(BankTarget(v, art, entries))
        else:
            out.unavailable.append(Unavailable(v, art.kind.value, "not applicable",
                                               f"the broadcast bank holds no entry of {v}"))


def _differenced(ctx: _Context, art: Artifact, own: list[Artifact], state: dict[str, Tensor], use_ce: bool,
                 info: dict[str, Any], victims: list[str], out: Targets, own_weight: float | None) -> None:
    """The other clients' statistics: the broadcast aggregate with the attacker's own upload taken out."""
    kind = art.kind
    mine = ctx.own_stats(own, art.round)
    if mine is None:
        out.unavailable += [Unavailable(v, f"{kind.value}:{DIFFERENCING}", "not applicable",
                                        "the attacker never uploaded its own BN statistics") for v in victims]
        return
    own_art, own_stats = mine
    k = ctx.prior.num_clients
    pooled = kind == ArtifactKind.GLOBAL_STATS  # FedFD pools second moments; FedAvg averages buffers
    others = difference_stats({key: state[key] for key in ctx.keys}, own_stats, k, own_weight, pooled)
    diff_state = {**state, **{key: t.to(state[key].dtype) for key, t in others.items()}}
    out.stats.append(StatsTarget(f"{kind.value}:{DIFFERENCING}", list(victims), diff_state, use_ce, dict(
        info, variant=DIFFERENCING, clients=k, own_weight=own_weight or 1.0 / k, pooled=pooled,
        own_round=own_art.round, exact_round=own_art.round == art.round - 1)))


@dataclass
class _Context:
    view: WireView
    prior: AttackerPrior
    base: dict[str, Tensor]
    keys: list[str]
    head_keys: list[str]
    device: torch.device

    def skip_reason(self, art: Artifact) -> tuple[str, str] | None:
        """Why ``art`` cannot be attacked as statistics here, or None when it can."""
        if art.kind in NOT_YET:
            return "not yet supported", NOT_YET[art.kind]
        if art.kind in NOT_APPLICABLE:
            return "not applicable", NOT_APPLICABLE[art.kind]
        if art.kind not in STATS_KINDS:
            return "not yet supported", f"no matcher for artifact kind {art.kind.value}"
        if not self.keys:
            return "not applicable", NO_BN_STATISTICS
        if not any(k in art.tensors for k in self.keys):
            if art.kind == ArtifactKind.PARTIAL_MODEL:
                return "not applicable", "this partial model carries no BatchNorm running statistics"
            some = ", ".join(list(art.tensors)[:2])
            return "not yet supported", f"its tensors ({some}, ...) name no BatchNorm buffer of the model"
        return None

    def assemble(self, layers: Iterable[Artifact], stats: Artifact) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """A full model state: fresh init, overlaid by ``layers`` in order, then the statistics of ``stats``."""
        state, source = overlay_state(self.base, [*layers, stats], self.device)
        weights_from = count_sources(source, skip=self.keys)
        use_ce = bool(self.head_keys) and all(source[k] != "fresh" for k in self.head_keys)
        unknown = [k for k in self.keys if source[k] == "fresh"]
        info = {"round": stats.round, "sender": stats.sender, "weights_from": weights_from, "use_ce": use_ce}
        if unknown:
            # Matching a fresh layer's 0/1 statistics would pull the images toward noise, not toward the victim.
            info["unsupported"] = (f"the wire carries the statistics of {(len(self.keys) - len(unknown)) // 2} of "
                                   f"{len(self.keys) // 2} BN layers (missing e.g. {unknown[0]}); partial-layer "
                                   "matching is not implemented")
        return state, info

    def own_stats(self, own: list[Artifact], broadcast_round: int) -> tuple[Artifact, dict[str, Tensor]] | None:
        """The attacker's own uploaded statistics that went into the broadcast of ``broadcast_round``.

        The broadcast of round r aggregates the uploads of round r − 1; the
        wire keeps only the newest message per kind in memory, so when that
        upload is gone the newest one stands in (``exact_round`` says which).
        """
        candidates = [a for a in own if all(k in a.tensors for k in self.keys)]
        if not candidates:
            return None
        before = [a for a in candidates if a.round < broadcast_round]
        art = max(before or candidates, key=lambda a: a.round)
        return art, {k: art.tensors[k].to(self.device) for k in self.keys}


__all__ = ["BANK_KINDS", "DIFFERENCING", "STATS_KINDS", "BankTarget", "HeadTarget", "StatsTarget", "Targets",
           "Unavailable", "difference_stats", "find_targets"]
