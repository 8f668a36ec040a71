"""The reference signals of one victim's targets: replayed where the observer can replay the target's round, trained
from scratch elsewhere (:mod:`fedaudit.attacks.mia.replay`), cached in the run directory either way.

Each target gets a dict of LiRA's φ [N, n] with the inclusion masks (and RMIA's probabilities on the pool and the
population), plus ``info``: how its reference models were made (``kind`` replay or scratch, and for a from-scratch
set why no replay ran). Replays of one round share their training: each reference is trained once and asked about
every target it replays (its own weights as the upload; the released model with it in the victim's place).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedaudit.attack import AttackerPrior, MembershipChallenge, Query
from fedaudit.attacks.mia.logit_cache import cache_key, cache_paths, load_cache, save_cache, tensors_of
from fedaudit.attacks.mia.reference_models import (ITSELF, Queried, choose_path, inclusion_masks, train_references)
from fedaudit.attacks.mia.replay import PROBE_RECORDS, Replay, release_replay, upload_replay
from fedaudit.attacks.mia.scorers import consistency, fisher_z, lira_signal, rmia_prob
from fedaudit.attacks.mia.signals import MIA_STREAM, Skipped, consistency_views
from fedaudit.run.seeds import derive_seed, stable_int
from fedaudit.simulation.recipes import TrainOne
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import WireView

if TYPE_CHECKING:
    from fedaudit.attacks.mia import MembershipInference

GLOBAL, LAST_UPLOAD = "global_model", "last_upload"
REPLAY, SCRATCH = "replay", "scratch"
TRAINING = {REPLAY: "replay each target's last round from the weights it started from (the server's view), from "
                    "scratch where that is not possible",
            SCRATCH: "train every reference from its own initialisation for the target's exposure (capped by "
                     "--reference-epochs)"}


def reference_signals(attack: MembershipInference, view: WireView, history: WireView | None, prior: AttackerPrior,
                      challenge: MembershipChallenge, query: Query, targets: list[str], pre: Preprocess,
                      device: torch.device, cache_dir: Any) -> dict[str, dict[str, Any] | Skipped]:
    """Per target: its reference signals (see the module), or why there are none."""
    seed = derive_seed(attack.seed, MIA_STREAM, 1, stable_int(challenge.victim))
    n = challenge.labels.shape[0]
    if n < 4:
        return dict.fromkeys(targets, Skipped(f"the victim's pool has {n} records; reference models need at least 4"))
    replays = _replays(view, history, prior, challenge, query, pre, device) if attack.training == REPLAY else {}
    out: dict[str, dict[str, Any] | Skipped] = {}
    replayed = {t: r for t, r in replays.items() if t in targets and isinstance(r, Replay)}
    if replayed:
        size = next(iter(replayed.values())).train_size
        size = size if size is not None and 2 <= size < n else None  # as many records as the target trained on
        masks = inclusion_masks(n, attack.reference_models, torch.Generator().manual_seed(seed % 2**63), size)
        out.update(_replayed(attack, prior, challenge, replayed, masks, seed, pre, device, cache_dir))
    rest = [t for t in targets if t not in replayed]
    if rest:
        masks = inclusion_masks(n, attack.reference_models, torch.Generator().manual_seed(seed % 2**63))
        scratch = _scratch(attack, prior, challenge, masks, seed, pre, device, cache_dir)
        for t in rest:
            why = replays.get(t, "--reference-training scratch")
            out[t] = scratch if isinstance(scratch, Skipped) else {
                **scratch, "info": {**scratch["info"], "kind": SCRATCH, "no_replay": why}}
    return out


def _replays(view: WireView, history: WireView | None, prior: AttackerPrior, challenge: MembershipChallenge,
             query: Query, pre: Preprocess, device: torch.device) -> dict[str, Replay | str]:
    if prior.label_free:
        return dict.fromkeys((LAST_UPLOAD, GLOBAL), "a label-free encoder's references are trained from scratch")
    upload = upload_replay(view, history, prior, challenge.victim, device)
    probe = challenge.images[:PROBE_RECORDS]
    return {LAST_UPLOAD: upload, GLOBAL: release_replay(view, prior, challenge.victim, query, probe, pre, upload, device)}


def _replayed(attack: MembershipInference, prior: AttackerPrior, challenge: MembershipChallenge,
              replayed: dict[str, Replay], masks: Tensor, seed: int, pre: Preprocess, device: torch.device,
              cache_dir: Any) -> dict[str, dict[str, Any]]:
    """The replayed targets' signals: one training of N references along the victim's rounds, asked about each."""
    first = next(iter(replayed.values()))
    into = prior.build_model().to(device)
    drifts: dict[int, Any] = {}  # each reference's drift before its final round, by its model's id

    def query_of(replay: Replay) -> Queried:
        def asked(model: torch.nn.Module) -> Query:
            target = (model if replay.release is None
                      else replay.release.model_of(model, into, drifts.pop(id(model), None)))
            return lambda x: prior.predict(target, x)
        return asked

    assert all(r.start is first.start for r in replayed.values())  # one victim's replays share their training

    queries = {t: query_of(r) for t, r in replayed.items()}
    population = challenge.population_images if challenge.population_labels.numel() else None
    paths = cache_paths(cache_dir, challenge.victim, "replay-logits")
    key = None
    if paths is not None:
        key = {**cache_key(challenge, prior, attack.reference_models, seed, first.recipe, "sequential", device,
                           attack.precision, "logits"),
               "replay": {t: r.digest for t, r in replayed.items()}}
    loaded = load_cache(paths, challenge.victim, key)
    if loaded is None:
        t0 = time.perf_counter()
        trained = train_references(prior.new_model, challenge.images, challenge.labels, masks, first.trajectory(drifts),
                                   preprocess=pre, population=population, seed=seed, path="sequential",
                                   flip=prior.hflip, precision=attack.precision, start=first.start, queries=queries)
        tensors = {f"{t}.{k}": v for t, ref in trained.items() for k, v in tensors_of(ref).items()}
        made = {"seconds": round(time.perf_counter() - t0, 3)}
        save_cache(paths, key, tensors, made)
        attack.trained += 1
        source = "trained"
    else:
        (tensors, made), source = loaded, "cache"
    out = {}
    for target, replay in replayed.items():
        mine = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"{target}.")}
        info = {"reference_models": int(masks.shape[0]), "source": source, **made, **replay.describe(),
                "epochs": getattr(replay.recipe, "epochs", 0) * len(replay.rounds) or None}
        out[target] = {**signals_of(mine, challenge, prior), "info": info}
    return out


def _scratch(attack: MembershipInference, prior: AttackerPrior, challenge: MembershipChallenge, masks: Tensor,
             seed: int, pre: Preprocess, device: torch.device, cache_dir: Any) -> dict[str, Any] | Skipped:
    """Reference signals of models trained from their own initialisation (today's LiRA), from the cache or trained."""
    recipe = attack.recipe(prior, challenge.victim)
    if recipe is None:
        return Skipped("no local recipe of this victim to train reference models with (Method.reference_recipe: "
                       "the method gives none, or the client never trained under DP-SGD)")
    if prior.new_model is None:
        return Skipped("the prior has no architecture constructor to build reference models with")
    # The path that will run, not the one asked for: "auto" is vmap on CUDA and sequential on a CPU, and
    # the two agree to float error only, so a cache made by one is not the other's.
    path, reason = choose_path(attack.path, prior.build_model(), recipe, masks.sum(1).tolist(), device)
    paths = cache_paths(cache_dir, challenge.victim)
    signal = f"consistency/{attack.consistency_pairs}" if prior.label_free else "logits"
    key = (cache_key(challenge, prior, attack.reference_models, seed, recipe, path, device, attack.precision, signal)
           if paths is not None else None)
    loaded = load_cache(paths, challenge.victim, key)
    if loaded is None:
        t0 = time.perf_counter()
        tensors, made = _train_scratch(attack, challenge, prior, pre, seed, recipe, masks, path)
        made["path_reason"] = reason  # why this path (training it again reports only "asked for")
        made["seconds"] = round(time.perf_counter() - t0, 3)
        save_cache(paths, key, tensors, made)
        attack.trained += 1
        source = "trained"
    else:
        (tensors, made), source = loaded, "cache"
    info = {"reference_models": int(masks.shape[0]), "recipe": repr(recipe), "epochs": recipe.epochs,
            "source": source, **made}
    return {**signals_of(tensors, challenge, prior), "info": info}


def _train_scratch(attack: MembershipInference, challenge: MembershipChallenge, prior: AttackerPrior, pre: Preprocess,
                   seed: int, recipe: TrainOne, masks: Tensor, path: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors to cache, and how they were made (training path and why)."""
    if prior.label_free:
        views = consistency_views(challenge, prior, attack.seed, attack.consistency_pairs)
        ref = train_references(prior.new_model, challenge.images, challenge.labels, masks, recipe, preprocess=pre,
                               population=views, seed=seed, path=path, flip=False, precision=attack.precision)[ITSELF]
        # Only the consistency per (model, record) is kept: the view embeddings are large and nothing else reads them.
        tensors = {"consistency": consistency(ref.population_logits, attack.consistency_pairs).float(),
                   "masks": ref.masks.to(torch.uint8)}
    else:
        population = challenge.population_images if challenge.population_labels.numel() else None
        ref = train_references(prior.new_model, challenge.images, challenge.labels, masks, recipe, preprocess=pre,
                               population=population, seed=seed, path=path, flip=prior.hflip,
                               precision=attack.precision)[ITSELF]
        tensors = tensors_of(ref)
    return tensors, {"path": ref.path, "path_reason": ref.reason}


def signals_of(t: dict[str, Tensor], challenge: MembershipChallenge, prior: AttackerPrior) -> dict[str, Any]:
    """LiRA's φ [N, n] and the masks (and RMIA's probabilities) from a set of cached reference tensors."""
    masks = t["masks"].bool()
    if prior.label_free:
        return {"phi": fisher_z(t["consistency"]), "masks": masks}
    y = challenge.labels.cpu()
    out = {"phi": lira_signal(t["logits"], y, t.get("flipped")), "masks": masks}
    if "population_logits" in t:
        out["p_x"] = rmia_prob(t["logits"], y, flipped_logits=t.get("flipped"))
        out["p_z"] = rmia_prob(t["population_logits"], challenge.population_labels.cpu(),
                               flipped_logits=t.get("population_flipped"))
    return out


__all__ = ["REPLAY", "SCRATCH", "TRAINING", "reference_signals", "signals_of"]
