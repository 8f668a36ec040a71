"""Replay references: reference models that train as the target trained, from what the observer saw (issue 57).

LiRA and RMIA calibrate a record's signal against reference models trained with and without it. Trained from
scratch on half of the victim's pool, they do not train as the target did — the target is one round of local
training from a broadcast that already carries rounds of the federation — and their signals sit σs away from the
target's (the auditor's calibration check measured +0.7 to +2.4 σ on fedavg digits). A curious server needs none of
that guesswork: it holds the weights each client's last round started from (its own broadcast, over the client's
previous upload where the method keeps a part local) and the recipe the method's public code runs
(``AttackerPrior.round_recipes``). A replay reference starts from exactly those weights and runs that one round on a
random half of the pool, IN or OUT for each record, so it differs from the target only in which records it saw.

* The victim's upload (``last_upload``): the reference's trained model is the counterfactual upload.
* The released model (``global_model``): where it is a weighted mean of the final round's uploads — checked on the
  wire, not assumed: the mean of the recorded uploads, by sample count or equally, must answer the pool as the
  released model does — the reference's model takes the victim's place in that mean, the other clients' uploads
  held fixed (what IN or OUT changes is the victim's data alone).

Where a replay is not possible (another observer, no recipe declared, a released model that is no such mean) the
attack falls back to from-scratch references and says why; the auditor's calibration check then shows what that
costs.
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
from fedaudit.simulation.wire_views import latest_weights, overlay_state
from fedaudit.tensor_ops.aggregation import load_state_

# The released model must answer the probe records as the reconstructed mean does, to this much of its largest logit
# (float32 sums in another order; a GPU's TF32 more).
RELEASE_TOLERANCE = 1e-3
PROBE_RECORDS = 64


@dataclass(frozen=True)
class Release:
    """How a reference's local model enters the released model: ``others`` (Σ of the other clients' weighted
    uploads, float tensors; the mean's value for the rest) plus ``weight`` × the reference's weights."""

    others: dict[str, Tensor]
    weight: float
    weighting: str  # "sample counts" or "equal": the mean the released model was found to be
    gap: float  # the largest logit gap between the mean and the released model on the probe records

    def model_of(self, local: nn.Module, into: nn.Module) -> nn.Module:
        """``into`` loaded with the released model as it would be with ``local`` in the victim's place."""
        mine = local.state_dict()
        state = {k: (v + self.weight * mine[k].to(v.dtype)) if v.is_floating_point() else v
                 for k, v in self.others.items()}
        load_state_(into, state)
        return into.eval()


@dataclass(frozen=True)
class Replay:
    """One round of the victim's local training as the observer can replay it: the weights it started from, the
    round, the recipe, and for the released model how a trained reference enters it."""

    round: int
    start: dict[str, Tensor]
    recipe: TrainOne
    release: Release | None = None
    # The victim's training-set size (its uploaded sample count): each reference trains on that many records, so it
    # takes the target's number of steps; None where the view holds no count (then half the pool).
    train_size: int | None = None

    @property
    def digest(self) -> str:
        """What the reference models depend on besides the pool and the recipe: the start (and the others' part)."""
        h = hashlib.sha256(str((self.round, self.train_size)).encode())
        for state in (self.start, *((self.release.others,) if self.release else ())):
            for k in sorted(state):
                h.update(k.encode())
                h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
        if self.release is not None:
            h.update(repr((self.release.weight, self.release.weighting)).encode())
        return h.hexdigest()[:16]

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": "replay", "round": self.round, "recipe": repr(self.recipe),
                                  "train_size": self.train_size}
        if self.release is not None:
            out.update(released_as=f"the {self.release.weighting}-weighted mean of round {self.round}'s uploads",
                       victim_weight=round(self.release.weight, 6), release_gap=self.release.gap)
        return out


def upload_replay(view: WireView, prior: AttackerPrior, victim: str, device: torch.device) -> Replay | str:
    """The replay of the victim's newest weight-bearing upload, or why there is none in this view."""
    if view.role != SERVER:
        return f"only the server holds the broadcast a client's upload started from; this attacker is {view.role}"
    recipe = prior.round_recipes.get(victim)
    if recipe is None:
        return prior.replay_note or "the method declares no recipe for one round of this client's local training"
    me = client_role(victim)
    uploads = latest_weights([a for a in view if a.sender == me], sender=me)
    if not uploads:
        return f"the server's view holds no weight-bearing upload from {victim}"
    rnd = max(a.round for a in uploads)
    before = latest_weights([a for a in view if a.sender == me and a.round < rnd], sender=me)
    sent = latest_weights([a for a in view if a.sender == SERVER and a.receiver == me and a.round <= rnd], receiver=me)
    if not any(a.round == rnd for a in sent):
        return f"the server's view holds no broadcast to {victim} in round {rnd}, the round its upload trained in"
    base = {k: v.detach().to(device) for k, v in prior.build_model().state_dict().items()}
    start, source = overlay_state(base, [*before, *sent], device)
    fresh = [k for k, s in source.items() if s == "fresh" and base[k].is_floating_point()]
    if fresh:
        return (f"the weights {victim} started round {rnd} from are not all on the wire ({len(fresh)} tensors, e.g. "
                f"{fresh[0]}, neither broadcast nor uploaded before)")
    count = _count(view, me, rnd)
    return Replay(rnd, start, recipe, train_size=None if count is None else int(count))


def release_replay(view: WireView, prior: AttackerPrior, victim: str, query: Query, probe: Tensor,
                   preprocess: Preprocess, upload: Replay | str, device: torch.device) -> Replay | str:
    """The replay of the released model: the victim's last round swapped into the mean that the released model is,
    where it is one (checked against ``query`` on the ``probe`` records), or why not."""
    if isinstance(upload, str):
        return upload
    if view.role != SERVER:
        return "only the server sees the other clients' uploads that the released model averages"
    full = [a for a in view if a.kind == ArtifactKind.FULL_MODEL and a.receiver == SERVER and a.sender != SERVER]
    final = max((a.round for a in full), default=None)
    if final is None or upload.round != final:
        return (f"the released model is not the mean of {victim}'s last round ({upload.round}): the last round of "
                f"whole-model uploads is {final}")
    by_sender = {a.sender: a for a in full if a.round == final}
    senders = sorted(by_sender)
    counts = {s: _count(view, s, final) for s in senders}
    weightings = ([("sample counts", [counts[s] for s in senders])] if all(c is not None for c in counts.values())
                  else []) + [("equal", [1.0] * len(senders))]
    model = prior.build_model().to(device)
    released = _answers(query, probe, preprocess)
    best: tuple[float, str] | None = None
    for name, weights in weightings:
        total = float(sum(weights))
        mean = _mean([by_sender[s].tensors for s in senders], [w / total for w in weights], device)
        load_state_(model, mean)
        gap = float((_answers(lambda x: prior.predict(model.eval(), x), probe, preprocess) - released).abs().max())
        scale = float(released.abs().max()) or 1.0
        if gap <= RELEASE_TOLERANCE * max(scale, 1.0):
            w = weights[senders.index(client_role(victim))] / total
            mine = {k: v.detach().to(device) for k, v in by_sender[client_role(victim)].tensors.items()}
            others = {k: (v - w * mine[k].to(v.dtype)) if v.is_floating_point() else v for k, v in mean.items()}
            return Replay(upload.round, upload.start, upload.recipe, Release(others, w, name, gap), upload.train_size)
        best = min(best or (gap, name), (gap, name))
    assert best is not None
    return (f"the released model is not a weighted mean of round {final}'s uploads (the closest, {best[1]} weights, "
            f"answers the pool with logits up to {best[0]:.3g} apart): its references cannot replay it")


def _count(view: WireView, sender: str, rnd: int) -> float | None:
    found = (example_count(a) for a in view if a.sender == sender and a.round == rnd)
    return next((c for c in found if c is not None), None)


def _mean(states: list[dict[str, Tensor]], weights: list[float], device: torch.device) -> dict[str, Tensor]:
    out = {}
    for k, first in states[0].items():
        if first.is_floating_point():
            out[k] = sum(w * s[k].detach().to(device, torch.float64) for w, s in zip(weights, states)).to(first.dtype)
        else:
            out[k] = first.detach().to(device)  # integer buffers (batch counts) do not change an eval-mode answer
    return out


@torch.no_grad()
def _answers(forward: Callable[[Tensor], Tensor], images: Tensor, preprocess: Preprocess) -> Tensor:
    return torch.cat([out.float().cpu() for _, out in forward_chunks(forward, images, preprocess, "fp32")])


__all__ = ["PROBE_RECORDS", "RELEASE_TOLERANCE", "Release", "Replay", "release_replay", "upload_replay"]
