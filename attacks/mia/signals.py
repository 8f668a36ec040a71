"""What a membership attack computes from what it may query: the victim's last upload assembled from the server's
view into a queryable model (besides the deployed model the auditor hands it), the federation's preprocessing
rebuilt from public knowledge, each record's signals (loss, LiRA's φ, RMIA's probabilities, or a label-free
encoder's augmentation consistency); and why a target or variant was skipped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch import Tensor

from fedaudit.attack import AttackerPrior, MembershipChallenge, Query
from fedaudit.attacks.mia.reference_models import eval_views
from fedaudit.attacks.mia.scorers import consistency, fisher_z, lira_signal, loss_signal, rmia_prob
from fedaudit.run.seeds import derive_seed, stable_int
from fedaudit.tensor_ops.augment import SimCLRAugment
from fedaudit.tensor_ops.aggregation import load_state_
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role
from fedaudit.simulation.wire_views import count_sources, latest_weights, overlay_state

NOT_APPLICABLE = "not applicable"
MIA_STREAM = 9_001  # derive_seed stream: challenge shuffles, reference models, consistency views


@dataclass(frozen=True)
class Skipped:
    """A variant or target that could not run, and why (stored as is in metrics)."""

    reason: str
    status: str = NOT_APPLICABLE

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


def last_upload(view: WireView, prior: AttackerPrior, victim: str,
                device: torch.device) -> tuple[Query | Skipped, dict[str, Any]]:
    """The victim's newest uploaded weights as a queryable model (through the method's public ``predict``),
    or why there are none in this view; with where its weights came from."""
    if view.role != SERVER:
        return Skipped(f"only a curious server sees a client's uploads; this attacker is {view.role}"), {}
    me = client_role(victim)
    sent = [a for a in view if a.sender == me]
    uploads = latest_weights(sent, sender=me)
    if not uploads:
        kinds = ", ".join(sorted({a.kind.value for a in sent})) or "nothing"
        return Skipped(f"the server's view holds no weight-bearing upload (full_model or partial_model) from "
                       f"{victim}; it sent {kinds}"), {}
    broadcast = latest_weights([a for a in view if a.sender == SERVER], receiver=me)
    stats = [a for a in sent if a.kind == ArtifactKind.BN_STATS_ALL_LAYERS]
    layers: list[Artifact] = [*broadcast, *uploads, *([max(stats, key=lambda a: a.round)] if stats else [])]
    model = prior.build_model()
    base = {k: v.detach().to(device) for k, v in model.state_dict().items()}
    state, source = overlay_state(base, layers, device)
    load_state_(model, state)
    model = model.to(device).eval()
    info = {"round": max(a.round for a in uploads), "weights_from": count_sources(source)}
    return (lambda x: prior.predict(model, x)), info


def attacker_preprocess(prior: AttackerPrior, device: torch.device) -> Preprocess:
    """The federation's normalisation and augmentation, rebuilt from public knowledge."""
    return Preprocess(prior.mean, prior.std, device, hflip=prior.hflip, channels_last=device.type == "cuda")


def target_signals(forward: Query, challenge: MembershipChallenge, pre: Preprocess, prior: AttackerPrior,
                   want_rmia: bool, precision: str, seed: int, pairs: int) -> dict[str, Tensor]:
    """Per-record signals of one target: ``loss`` and LiRA's ``phi`` (and, for RMIA, the challenge's ``logits``
    and ``flipped`` logits, from which Pr(x|θ) is taken once the references' shift is known, and ``p_z``)."""
    y = challenge.labels.cpu()
    if prior.label_free:
        views = consistency_views(challenge, prior, seed, pairs)
        (emb,) = eval_views(forward, [views], pre, False, precision)
        c = consistency(emb, pairs)
        return {"loss": c, "phi": fisher_z(c)}
    sets = [challenge.images, challenge.population_images] if want_rmia else [challenge.images]
    outs = list(eval_views(forward, sets, pre, prior.hflip, precision))
    logits, flipped = outs.pop(0), outs.pop(0) if prior.hflip else None
    sig = {"loss": loss_signal(logits, y), "phi": lira_signal(logits, y, flipped)}
    if want_rmia:
        pop, pop_flipped = outs.pop(0), outs.pop(0) if prior.hflip else None
        sig["logits"] = logits
        if flipped is not None:
            sig["flipped"] = flipped
        sig["p_z"] = rmia_prob(pop, challenge.population_labels.cpu(), flipped_logits=pop_flipped)
    return sig


def consistency_views(challenge: MembershipChallenge, prior: AttackerPrior, seed: int, pairs: int) -> Tensor:
    """uint8 [2·pairs·n, C, H, W]: for each pair k, view A of every record, then view B (fixed seed)."""
    images = challenge.images
    g = torch.Generator(device=images.device)
    g.manual_seed(derive_seed(seed, MIA_STREAM, 2, stable_int(challenge.victim)))
    augment = SimCLRAugment(hflip=prior.hflip)
    unit = images.float() / 255.0
    views = [augment(unit, g) for _ in range(2 * pairs)]
    return torch.cat(views).mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)
