"""Replay references: reference models that train as the target trained, from what the observer saw (issue 57).

LiRA and RMIA calibrate a record's signal against reference models trained with and without it. Trained from
scratch on half of the victim's pool, they do not train as the target did, and their signals sit σs away from the
target's (the auditor's calibration check measured +0.8 to +2.5 σ on fedavg digits). A curious server needs none of
that guesswork: it holds every broadcast it sent the victim, every upload it got back with the victim's sample
count, and the recipe of a round (the method's public code, ``AttackerPrior.round_recipes``). A replay reference
re-lives the victim's participation from its first round on a random subset of the pool as large as the victim's
training set, IN or OUT for each record: each round it trains from the broadcast the victim got, moved by how the
reference's own earlier rounds would have moved the federation's weighted mean, the other clients' recorded
*updates* held fixed — so it differs from the target only in which records it saw. With D the difference between
the reference's federation and the recorded one, a round in which the victim's weight is w moves it to
D ← (1 − w)·D + w·(the reference's model − the victim's upload): the others' updates, added to the reference's
broadcast instead of the recorded one, carry D on (holding their *uploads* fixed instead would let the members'
influence on them, one round removed, into every OUT reference: on fedavg digits the released model's OUT
references then sat 0.35 higher on members than on non-members, σ 0.43).

Why the whole trajectory and not only the last round: the weights a victim's last round starts from already carry
every earlier round of its members. A reference replaying only that round has, for a true member, an OUT
distribution that has seen the record (measured on fedavg digits: the OUT references' mean φ on members 0.6–0.9
above their mean on non-members, and LiRA below the loss attack), and its training set mixes non-members where the
target's holds members it has fitted already (the target ended +0.6 σ more confident than those references).

* The victim's upload (``last_upload``): a reference's model after its last replayed round.
* The released model (``global_model``): where it is the final round's weighted mean of the uploads — checked on the
  wire, not assumed: the mean of the recorded uploads, by sample count or equally, must answer the pool as the
  released model does — a reference takes the victim's place in that mean.

What it holds the others to: their recorded updates, as if a client's local training moved any start by the same
amount (first order) — the auditor's calibration check measures what that costs. Where a replay is not possible (another observer, no recipe declared,
rounds the view did not keep, a released model that is no such mean) the attack trains from scratch and says why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedaudit.attack import AttackerPrior, Query
from fedaudit.simulation.recipes import TrainOne
from fedaudit.simulation.secure_aggregation import example_count
from fedaudit.simulation.training import Preprocess, forward_chunks
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role
from fedaudit.tensor_ops.aggregation import load_state_

# The released model must answer the probe records as the reconstructed mean does, to this much of its largest logit
# (float32 sums in another order; a GPU's TF32 more).
RELEASE_TOLERANCE = 1e-3
PROBE_RECORDS = 64
State = dict[str, Tensor]


def swapped(base: State, weight: float, mine: State, theirs: State) -> State:
    """``base`` with ``weight``·(mine − theirs) added to its float tensors: a mean with one member's part replaced."""
    return {k: (v + weight * (mine[k].to(v.dtype) - theirs[k].to(v.dtype))) if v.is_floating_point() else v
            for k, v in base.items()}


def moved(base: State, drift: State | None) -> State:
    """``base`` plus ``drift`` on its float tensors (the recorded federation moved to the reference's)."""
    if drift is None:
        return dict(base)
    return {k: (v + drift[k].to(v.dtype)) if v.is_floating_point() else v for k, v in base.items()}


def drifted(drift: State | None, weight: float, mine: State, theirs: State) -> State:
    """D ← (1 − w)·D + w·(mine − theirs): the reference's federation after a round in which the victim weighs ``w``
    (float tensors, float64)."""
    out = {}
    for k, t in theirs.items():
        if t.is_floating_point():
            step = weight * (mine[k].to(torch.float64) - t.to(torch.float64))
            out[k] = step if drift is None else (1 - weight) * drift[k] + step
    return out


@dataclass(frozen=True)
class Round:
    """One round the victim took part in: what it uploaded, its weight in that round's mean, and the broadcast its
    next round started from (None after its last; rounds it skipped in between leave the drift as it was)."""

    round: int
    upload: State
    weight: float
    next_start: State | None


@dataclass(frozen=True)
class Release:
    """How a reference's last round enters the released model: the recorded mean, ``weight`` and the victim's
    upload it replaces (the drift of the reference's earlier rounds comes with the model)."""

    mean: State
    upload: State
    weight: float
    weighting: str  # "sample counts" or "equal": the mean the released model was found to be
    gap: float  # the largest logit gap between the mean and the released model on the probe records

    def model_of(self, local: nn.Module, into: nn.Module, drift: State | None = None) -> nn.Module:
        """``into`` loaded with the released model as it would be with ``local`` in the victim's place, the
        federation before the final round moved by ``drift``."""
        load_state_(into, moved(self.mean, drifted(drift, self.weight, local.state_dict(), self.upload)))
        return into.eval()


@dataclass(frozen=True)
class Replay:
    """The victim's participation as the server can replay it: the weights its first round started from, each
    round, the recipe of a round, the victim's training-set size, and for the released model how a reference
    enters it."""

    start: State
    rounds: tuple[Round, ...]
    recipe: TrainOne
    train_size: int | None = None  # its uploaded sample count: each reference trains on that many records
    release: Release | None = None

    @property
    def round(self) -> int:
        return self.rounds[-1].round

    def trajectory(self, drifts: dict[int, State] | None = None) -> TrainOne:
        """A reference's whole participation as one recipe call (it starts from :attr:`start`); ``drifts`` gets each
        reference's drift before its final round, by ``id`` of its model (what :meth:`Release.model_of` needs)."""
        def train(model: nn.Module, images: Tensor, labels: Tensor, preprocess: Preprocess,
                  generator: torch.Generator) -> None:
            drift: State | None = None
            for step in self.rounds:
                self.recipe(model, images, labels, preprocess, generator)
                if step.next_start is None:
                    break
                drift = drifted(drift, step.weight, model.state_dict(), step.upload)
                load_state_(model, moved(step.next_start, drift))
            if drifts is not None and drift is not None:
                drifts[id(model)] = drift
        return train

    @property
    def digest(self) -> str:
        """What the reference models depend on besides the pool and the recipe."""
        h = hashlib.sha256(repr((self.train_size, [(r.round, r.weight) for r in self.rounds],
                                 self.release and (self.release.weight, self.release.weighting))).encode())
        states = [self.start, *(s for r in self.rounds for s in (r.upload, r.next_start) if s is not None)]
        for state in [*states, *((self.release.mean,) if self.release else ())]:
            for k in sorted(state):
                h.update(k.encode())
                h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": "replay", "round": self.round, "rounds": len(self.rounds),
                                  "recipe": repr(self.recipe), "train_size": self.train_size}
        if self.release is not None:
            out.update(released_as=f"the {self.release.weighting}-weighted mean of round {self.round}'s uploads",
                       victim_weight=round(self.release.weight, 6), release_gap=self.release.gap)
        return out


def upload_replay(view: WireView, history: WireView | None, prior: AttackerPrior, victim: str,
                  device: torch.device) -> Replay | str:
    """The replay of the victim's participation up to its newest upload, or why there is none."""
    if view.role != SERVER:
        return f"only the server holds what a client's rounds started from; this attacker is {view.role}"
    recipe = prior.round_recipes.get(victim)
    if recipe is None:
        return prior.replay_note or "the method declares no recipe for one round of this client's local training"
    me = client_role(victim)
    seen = [*(history or ()), *view]
    uploads = _by_round(seen, ArtifactKind.FULL_MODEL, sender=me)
    starts = _by_round(seen, ArtifactKind.FULL_MODEL, sender=SERVER, receiver=me)
    if not uploads:
        return f"the server's view holds no whole-model upload from {victim}"
    if history is None and min(uploads) > 1:
        return ("the server's view holds only the newest round; a replay needs every round the victim took part in "
                "(kept where the run asks for replayed references)")
    missing = [r for r in uploads if r not in starts]
    if missing:
        return f"the server's view holds no whole-model broadcast to {victim} in round {missing[0]}, which it trained in"
    order = sorted(uploads)
    counts = _counts(seen)
    rounds = []
    for i, rnd in enumerate(order):
        weight = _weight(seen, counts, me, rnd)
        nxt = order[i + 1] if i + 1 < len(order) else None
        rounds.append(Round(rnd, _state(uploads[rnd], device), weight, None if nxt is None else _state(starts[nxt], device)))
    size = counts.get(me)
    return Replay(_state(starts[order[0]], device), tuple(rounds), recipe, None if size is None else int(size))


def release_replay(view: WireView, prior: AttackerPrior, victim: str, query: Query, probe: Tensor,
                   preprocess: Preprocess, upload: Replay | str, device: torch.device) -> Replay | str:
    """The replay of the released model: the victim's last round swapped into the mean that the released model is,
    where it is one (checked against ``query`` on the ``probe`` records), or why not."""
    if isinstance(upload, str):
        return upload
    full = [a for a in view if a.kind == ArtifactKind.FULL_MODEL and a.receiver == SERVER and a.sender != SERVER]
    final = max((a.round for a in full), default=None)
    if final is None or upload.round != final:
        return (f"the released model is not the mean of {victim}'s last round ({upload.round}): the last round of "
                f"whole-model uploads is {final}")
    by_sender = {a.sender: a for a in full if a.round == final}
    senders = sorted(by_sender)
    counts = _counts(view)
    weightings = ([("sample counts", [counts[s] for s in senders])] if all(s in counts for s in senders)
                  else []) + [("equal", [1.0] * len(senders))]
    model = prior.build_model().to(device)
    released = _answers(query, probe, preprocess)
    best: tuple[float, str] | None = None
    for name, weights in weightings:
        total = float(sum(weights))
        mean = _mean([_state(by_sender[s], device) for s in senders], [w / total for w in weights])
        load_state_(model, mean)
        gap = float((_answers(lambda x: prior.predict(model.eval(), x), probe, preprocess) - released).abs().max())
        if gap <= RELEASE_TOLERANCE * max(float(released.abs().max()), 1.0):
            w = weights[senders.index(client_role(victim))] / total
            return Replay(upload.start, upload.rounds, upload.recipe, upload.train_size,
                          Release(mean, _state(by_sender[client_role(victim)], device), w, name, gap))
        best = min(best or (gap, name), (gap, name))
    assert best is not None
    return (f"the released model is not a weighted mean of round {final}'s uploads (the closest, {best[1]} weights, "
            f"answers the pool with logits up to {best[0]:.3g} apart): its references cannot replay it")


def _by_round(arts: list[Artifact], kind: ArtifactKind, sender: str, receiver: str | None = None) -> dict[int, Artifact]:
    return {a.round: a for a in arts if a.kind == kind and a.sender == sender
            and (receiver is None or a.receiver == receiver)}


def _state(a: Artifact, device: torch.device) -> State:
    return {k: v.detach().to(device) for k, v in a.tensors.items()}


def _counts(arts: WireView | list[Artifact]) -> dict[str, float]:
    """Each client's newest uploaded sample count."""
    out: dict[str, tuple[int, float]] = {}
    for a in arts:
        c = example_count(a)
        if c is not None and (a.sender not in out or a.round >= out[a.sender][0]):
            out[a.sender] = (a.round, c)
    return {s: c for s, (_, c) in out.items()}


def _weight(seen: list[Artifact], counts: dict[str, float], me: str, rnd: int) -> float:
    """The victim's weight in round ``rnd``'s mean: its count over that round's uploaders' (the view's newest counts;
    equal weights where it holds none). A round whose other uploads the view did not keep is taken to have had the
    final round's uploaders."""
    uploaders = {a.sender for a in seen if a.kind == ArtifactKind.FULL_MODEL and a.receiver == SERVER
                 and a.sender != SERVER and a.round == rnd}
    if len(uploaders) < 2:
        final = max((a.round for a in seen if a.kind == ArtifactKind.FULL_MODEL and a.receiver == SERVER), default=rnd)
        uploaders |= {a.sender for a in seen if a.kind == ArtifactKind.FULL_MODEL and a.receiver == SERVER
                      and a.sender != SERVER and a.round == final}
    if all(s in counts for s in uploaders):
        return counts[me] / sum(counts[s] for s in uploaders)
    return 1.0 / max(len(uploaders), 1)


def _mean(states: list[State], weights: list[float]) -> State:
    out = {}
    for k, first in states[0].items():
        if first.is_floating_point():
            out[k] = sum(w * s[k].to(torch.float64) for w, s in zip(weights, states)).to(first.dtype)
        else:
            out[k] = first  # integer buffers (batch counts) do not change an eval-mode answer
    return out


@torch.no_grad()
def _answers(forward: Callable[[Tensor], Tensor], images: Tensor, preprocess: Preprocess) -> Tensor:
    return torch.cat([out.float().cpu() for _, out in forward_chunks(forward, images, preprocess, "fp32")])


__all__ = ["PROBE_RECORDS", "RELEASE_TOLERANCE", "Release", "Replay", "Round", "drifted", "moved", "release_replay",
           "swapped", "upload_replay"]
