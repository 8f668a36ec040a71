"""What a server under secure aggregation still sees: the observer of issue 49.

Secure aggregation (Bonawitz et al., CCS 2017; Flower's SecAgg+, ``SecAggPlusWorkflow`` with ``secaggplus_mod``)
masks each client's training parameters and its example count so that the server learns only their sums over the
round's clients. Everything a protocol sends outside that masked vector travels in clear: Flower's SecAgg+ masks the
parameters of a training reply and nothing else, so metrics, configs and any array a method sends as its own message
(a style or amplitude bank, statistics sent apart, a classifier head the server needs per client) stay visible per
client. The observer assumed is honest but curious: it follows the protocol and reads what it receives.

:func:`secure_aggregation_view` turns a server's wire view into that observer's. Per masked kind (:data:`MASKED`) it
replaces the uploads of the newest round by their sample-weighted mean (what the server computes from the two
sums), given once per client of that round as *the aggregate the server saw in that client's round* — so every
attack and every auditor's test runs unchanged, asking what the aggregate gives away about that client's records.
A client's sample count is removed from its clear scalars (it is masked too; only the total is learned). Auditor
pseudo-clients (``<victim>#twin``, ``<victim>#power:k``) are aggregated with the other clients of the victim's round
in the victim's place, so a counterfactual under secure aggregation is the aggregate with the victim's contribution
swapped, as it must be. A client that did not upload in the newest round of a kind has no aggregate standing for it.

Where participation varies across rounds, a server can also disaggregate (Lam et al., ICML 2021):
:func:`participation_varies` says whether this view gives it anything to solve; the attack itself is not built yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role

# What secure aggregation masks: the parameters of a training reply (Flower's SecAgg+ masks the reply's arrays and
# its example count; a model delta is the same vector less the broadcast).
MASKED = (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL, ArtifactKind.MODEL_DELTA)
# The example count a client sends beside its parameters, masked too: fedaudit's own, Flower's Message API's and
# its legacy FitRes's names for it.
COUNTS = ("num_samples", "num-examples", "num_examples")
PSEUDO = "#"  # the auditor's pseudo-clients: "<victim>#<case>" (fedaudit.audit.counterfactual)
CLIENT = "client:"

# Why each kind a method may send up is left in clear (the "what secure aggregation leaves" list).
LEFT_BECAUSE = {
    ArtifactKind.STYLE_BANK: "the server needs each client's styles to pass them on: sent as its own message, "
                             "outside the masked parameters",
    ArtifactKind.AMPLITUDE_BANK: "the server needs each client's spectra to pass them on: sent as its own "
                                 "message, outside the masked parameters",
    ArtifactKind.BN_STATS_ALL_LAYERS: "statistics sent apart from the parameters are outside the masked vector",
    ArtifactKind.CLASSIFIER_HEAD: "the server needs each client's head (a message of its own, not summed)",
    ArtifactKind.TRANSLATOR: "a message of its own, not summed",
    ArtifactKind.IMPORTANCE: "the server needs each client's importance to weight its parameters",
    ArtifactKind.RECORD: "a recorded message outside the training reply's arrays",
}


def _client(role: str) -> str | None:
    return role[len(CLIENT):] if role.startswith(CLIENT) else None


def _is_masked_upload(a: Artifact) -> bool:
    return a.receiver == SERVER and a.kind in MASKED and _client(a.sender) is not None


def _real(name: str) -> str:
    """A pseudo-client's victim, a client itself."""
    return name.split(PSEUDO, 1)[0]


def example_count(a: Artifact) -> float | None:
    """The example count an upload's scalars carry (under any of :data:`COUNTS`' names), or None."""
    if a.kind != ArtifactKind.SCALARS or a.receiver != SERVER:
        return None
    return next((float(a.tensors[k]) for k in COUNTS if k in a.tensors), None)


def _weight(view: WireView, sender: str, rnd: int) -> float:
    """The example count ``sender`` sent with its round-``rnd`` upload (1 where it sent none: equal weights)."""
    found = (example_count(a) for a in view if a.sender == sender and a.round == rnd)
    return next((c for c in found if c is not None), 1.0)


def weighted_mean(states: list[dict[str, Tensor]], weights: list[float]) -> dict[str, Tensor]:
    """The sample-weighted mean of ``states`` over the keys they all hold (integer buffers rounded), as a server
    computes it from the masked sums. One state comes back as it is."""
    if len(states) == 1:
        return dict(states[0])
    total = float(sum(weights))
    keys = [k for k in states[0] if all(k in s and s[k].shape == states[0][k].shape for s in states)]
    out = {}
    for k in keys:
        acc = sum((w / total) * s[k].double() for w, s in zip(weights, states))
        out[k] = acc.to(states[0][k].dtype) if states[0][k].is_floating_point() else torch.round(acc).to(states[0][k].dtype)
    return out


# (kind, client) → the client's single upload a server solved from two rounds' aggregates, and those rounds
Disaggregated = Mapping[tuple[ArtifactKind, str], tuple[dict[str, Tensor], int, int]]


def secure_aggregation_view(view: WireView, disaggregated: Disaggregated | None = None) -> WireView:
    """The server's view as secure aggregation leaves it (see the module's docstring); where ``disaggregated``
    holds a client's upload solved from two rounds, the server has it instead of that client's aggregate."""
    if view.role != SERVER:
        raise ValueError("secure aggregation changes what the server sees; a client's view is the same with it")
    masked = [a for a in view if _is_masked_upload(a)]
    out = [kept for a in view if not _is_masked_upload(a) and (kept := _without_count(a)) is not None]
    for kind in MASKED:
        uploads = [a for a in masked if a.kind == kind]
        solved = {c: v for (k, c), v in (disaggregated or {}).items() if k == kind}
        out += _solved(uploads, solved) + _aggregates(uploads, view, skip=set(solved))
    return WireView(view.role, sorted(out, key=lambda a: (a.round, a.kind.value, a.sender, a.receiver)))


def _aggregates(uploads: list[Artifact], view: WireView, skip: set[str] = frozenset()) -> list[Artifact]:
    """One kind's uploads as the server sees them: the newest round's aggregate once per client of that round, and
    once per auditor's pseudo-client of one of them, aggregated in its victim's place (none for the clients in
    ``skip``, whose single uploads the server solved for)."""
    real = [a for a in uploads if PSEUDO not in _client(a.sender)]
    if not real:
        return []
    rnd = max(a.round for a in real)
    round_of = {_client(a.sender): a for a in real if a.round == rnd}
    clients = sorted(round_of)
    weights = [_weight(view, client_role(c), rnd) for c in clients]
    meta = {"secure_aggregate": {"clients": clients, "round": rnd, "total_weight": sum(weights)}}
    aggregate = weighted_mean([round_of[c].tensors for c in clients], weights)
    out = [Artifact(a.kind, a.sender, SERVER, rnd, aggregate, {**a.meta, **meta}) for c, a in round_of.items()
           if c not in skip]
    for a in uploads:
        name = _client(a.sender)
        if PSEUDO not in name or _real(name) not in round_of or a.round != rnd or _real(name) in skip:
            continue
        victim = _real(name)
        swapped = [a.tensors if c == victim else round_of[c].tensors for c in clients]
        out.append(Artifact(a.kind, a.sender, SERVER, rnd, weighted_mean(swapped, weights), {**a.meta, **meta}))
    return out


def _solved(uploads: list[Artifact], solved: Mapping[str, tuple[dict[str, Tensor], int, int]]) -> list[Artifact]:
    """Each disaggregated client's solved upload, standing where its aggregate would; an auditor's pseudo-client of
    it carries the same error of the solution (its own upload plus the solved one less the client's)."""
    out = []
    own = {_client(a.sender): a for a in uploads if PSEUDO not in _client(a.sender)}
    for a in uploads:
        name = _client(a.sender)
        client = _real(name)
        if client not in solved:
            continue
        tensors, r1, r2 = solved[client]
        meta = {**a.meta, "secure_aggregate": {"clients": [client], "round": r1, "disaggregated_from": [r1, r2]}}
        if name == client:
            out.append(Artifact(a.kind, a.sender, SERVER, r1, tensors, meta))
        elif client in own and own[client].round == r1 == a.round:
            error = {k: tensors[k] - own[client].tensors[k] for k in tensors if k in own[client].tensors}
            out.append(Artifact(a.kind, a.sender, SERVER, r1,
                                {k: (t + error[k] if k in error else t) for k, t in a.tensors.items()}, meta))
    return out


def _without_count(a: Artifact) -> Artifact | None:
    """A client's clear scalars less its example count (masked with the parameters); None where nothing is left."""
    if example_count(a) is None:
        return a
    rest = {k: t for k, t in a.tensors.items() if k not in COUNTS}
    return Artifact(a.kind, a.sender, a.receiver, a.round, rest, dict(a.meta)) if rest else None


def leaves(shares: Iterable[tuple[ArtifactKind | str, str]], clear_scalars: str = "") -> list[dict[str, str]]:
    """What secure aggregation does not cover of a method's declared shares: every upload outside the masked
    parameters, with why, in declaration order. Scalars count only where they carry more than the example count
    (``clear_scalars`` says what: a method's :attr:`~fedaudit.simulation.method.Method.clear_scalars`)."""
    out = []
    for kind, direction in shares:
        kind = ArtifactKind(kind)
        if direction != "up" or kind in MASKED or (kind == ArtifactKind.SCALARS and not clear_scalars):
            continue
        why = (f"{clear_scalars}: metrics travel in clear (only the example count is masked)"
               if kind == ArtifactKind.SCALARS else LEFT_BECAUSE.get(kind, "not part of the masked parameters"))
        out.append({"kind": kind.value, "direction": "up", "why": why})
    return out


def left_in_view(view: WireView) -> list[dict[str, str]]:
    """What the server under secure aggregation still reads per client in ``view`` (one of
    :func:`secure_aggregation_view`'s): every upload kind that is not an aggregate, with why (scalars by name)."""
    found: dict[ArtifactKind, set[str]] = {}
    for a in view:
        if a.receiver == SERVER and _client(a.sender) is not None and "secure_aggregate" not in a.meta:
            found.setdefault(a.kind, set()).update(a.tensors)
    return [{"kind": kind.value, "direction": "up",
             "why": (f"{', '.join(sorted(found[kind]))}: metrics travel in clear (only the example count is masked)"
                     if kind == ArtifactKind.SCALARS else LEFT_BECAUSE.get(kind, "not part of the masked parameters"))}
            for kind in sorted(found, key=lambda k: k.value)]


@dataclass(frozen=True)
class RoundSum:
    """What a server under secure aggregation learns of one round's uploads of one kind: who took part, the sum of
    their example counts, the weighted mean of their uploads, and the model it sent them to start from."""

    round: int
    clients: frozenset[str]
    weight: float
    mean: dict[str, Tensor]
    start: dict[str, Tensor]


def disaggregation_rounds(victim: str, rounds: Mapping[int, frozenset[str]]) -> tuple[int, int] | None:
    """Two training rounds whose uploading clients differ by ``victim`` alone: the newest round it took part in,
    and the nearest round with the same clients less it (Lam et al., ICML 2021: the server knows who took part,
    and solves the aggregates for the one that differs). None where no such pair exists."""
    with_victim = sorted((r for r, s in rounds.items() if r >= 1 and victim in s), reverse=True)
    for r1 in with_victim:
        rest = rounds[r1] - {victim}
        pairs = sorted((r for r, s in rounds.items() if r >= 1 and s == rest and rest), key=lambda r: abs(r - r1))
        if pairs:
            return r1, pairs[0]
    return None


def disaggregate(victim_round: RoundSum, other: RoundSum) -> dict[str, Tensor]:
    """The victim's single upload in ``victim_round``, solved from the two rounds' aggregates: each round's weighted
    sum of updates (the aggregate less the model it started from, times the total weight) differs by the victim's
    weighted update, if the other clients' updates were the same in both rounds (the approximation Lam et al. rely
    on; exact when they were)."""
    weight = victim_round.weight - other.weight
    out = {}
    for k, start in victim_round.start.items():
        if k not in victim_round.mean or k not in other.mean or k not in other.start:
            continue
        mine = victim_round.weight * (victim_round.mean[k].double() - start.double())
        theirs = other.weight * (other.mean[k].double() - other.start[k].double())
        value = start.double() + (mine - theirs) / weight
        out[k] = value.to(start.dtype) if start.is_floating_point() else torch.round(value).to(start.dtype)
    return out


def participation_varies(rounds: dict[int, set[str]]) -> bool:
    """Whether the set of uploading clients differs between training rounds (what disaggregation needs)."""
    sets = {frozenset(s) for r, s in rounds.items() if r >= 1 and s}
    return len(sets) > 1


__all__ = ["COUNTS", "Disaggregated", "example_count", "LEFT_BECAUSE", "MASKED", "RoundSum", "disaggregate", "disaggregation_rounds", "leaves", "left_in_view", "participation_varies", "secure_aggregation_view",
           "weighted_mean"]
