"""The reference models' logits on a victim's pool, cached in the run directory
(``mia/<victim>-reference-logits.safetensors`` beside a JSON key of what produced them): a second audit whose key
matches trains nothing. The JSON is written last, so a matching key marks a complete cache."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedaudit.attack import AttackerPrior, MembershipChallenge
from fedaudit.attacks.mia.reference_models import ReferenceLogits, TrainOne
from fedaudit.run import run_directory

log = logging.getLogger("fedaudit")

CACHE_FORMAT = 1
def tensors_of(ref: ReferenceLogits) -> dict[str, Tensor]:
    named = {"logits": ref.logits, "flipped": ref.flipped, "population_logits": ref.population_logits,
             "population_flipped": ref.population_flipped, "masks": ref.masks.to(torch.uint8)}
    return {k: v for k, v in named.items() if v is not None}


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:16]


def digest_tensors(*tensors: Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def cache_paths(cache_dir: Path | None, victim: str, what: str = "reference-logits") -> tuple[Path, Path] | None:
    """Where a victim's reference tensors are cached: ``what`` tells from-scratch references (``reference-logits``)
    from replayed ones (``replay-logits``)."""
    if cache_dir is None:
        return None
    stem = run_directory.safe_name(victim) + "-" + what
    return cache_dir / f"{stem}.safetensors", cache_dir / f"{stem}.json"


def load_cache(paths: tuple[Path, Path] | None, victim: str,
                key: dict[str, Any] | None) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """(tensors, how they were made) when the cache holds this key, else None."""
    if paths is None or not all(p.is_file() for p in paths):
        return None
    from safetensors.torch import load_file

    try:
        meta = run_directory.read_json(paths[1])
        if meta.get("key") != key:
            log.info("mia: reference-logit cache for %s was made by other settings; retraining", victim)
            return None
        return load_file(str(paths[0])), dict(meta.get("made", {}))
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        log.warning("mia: unreadable reference-logit cache for %s (%s); retraining", victim, exc)
        return None


def save_cache(paths: tuple[Path, Path] | None, key: dict[str, Any] | None, tensors: dict[str, Tensor],
                made: dict[str, Any]) -> None:
    if paths is None:
        return
    from safetensors.torch import save_file

    paths[0].parent.mkdir(parents=True, exist_ok=True)
    with run_directory.atomic_path(paths[0]) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    # Written last: a matching key marks a complete cache.
    run_directory.write_json(paths[1], {"key": key, "made": made, "tensors": sorted(tensors)})


def cache_key(challenge: MembershipChallenge, prior: AttackerPrior, reference_models: int, seed: int, recipe: TrainOne,
              path: str, device: torch.device, precision: str, signal: str) -> dict[str, Any]:
    """Everything the cached tensors depend on: a cache made under any other value is retrained."""
    shapes = sorted((k, list(v.shape)) for k, v in prior.build_model().state_dict().items())
    return {
        "format": CACHE_FORMAT,
        "victim": challenge.victim,
        "reference_models": reference_models,
        "recipe": repr(recipe),
        "seed": seed,
        "path": path,
        "device": device.type,
        "precision": precision,
        "signal": signal,
        "flip": bool(prior.hflip),
        "architecture": digest(json.dumps(shapes).encode()),
        "pool": digest_tensors(challenge.images, challenge.labels),
        "population": digest_tensors(challenge.population_images, challenge.population_labels),
    }
