"""Leave-one-domain-out (LODO) protocol.

The target domain is the unseen client, tested whole. Every source domain is
split, stratified by class and with a fixed seed, into ``train`` (members),
``val`` (model selection) and ``holdout`` (non-members for membership
inference, never trained on). Stratification keeps the member and non-member
class mixes alike, so a membership attack cannot score by guessing the class.
"""

from __future__ import annotations

import math
import operator

import torch

from ..errors import FedauditError
from .base import ClientData, LODOSplit, MultiDomainDataset
from .stream import take

SPLIT_NAMES = ("train", "val", "holdout")


def _check_fractions(fractions: tuple[float, float, float]) -> tuple[float, float, float]:
    try:
        fr = tuple(float(f) for f in fractions)
    except (TypeError, ValueError):
        raise FedauditError(
            f"split fractions {fractions!r} are not numbers; give three positive numbers "
            "(train, val, holdout) that sum to 1, e.g. 0.5,0.1,0.4"
        ) from None
    if len(fr) != 3 or not all(math.isfinite(f) and f > 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
        raise FedauditError(
            f"split fractions {fractions!r} are invalid; give three positive numbers "
            "(train, val, holdout) that sum to 1, e.g. 0.5,0.1,0.4"
        )
    return fr  # type: ignore[return-value]


def check_seed(seed: object) -> int:
    """The seed as a Python int (numpy integers welcome); FedauditError for anything else."""
    if not isinstance(seed, bool):
        try:
            return operator.index(seed)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise FedauditError(f"seed {seed!r} is not an integer; give a whole number such as 0")


def _generator(seed: int, domain_index: int) -> torch.Generator:
    # one stream per (seed, domain): a domain's split does not depend on which
    # domain is the target, so the same client keeps the same members across runs
    mixed = (int(seed) * 1_000_003 + domain_index * 7919 + 0x5EED) % (1 << 63)
    return torch.Generator().manual_seed(mixed)


def stratified_split(
    labels: torch.Tensor, fractions: tuple[float, float, float], gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Disjoint, covering index sets: sizes round(N*f), per-class counts within a record or two of N_c*f.

    Each class is shuffled and its records get evenly spaced keys (r + 0.5) / N_c in
    (0, 1); sorting all records by key interleaves the classes in proportion, so
    cutting the sorted list at the global sizes stratifies every split at once.
    """
    n = labels.numel()
    keys = torch.empty(n, dtype=torch.float64)
    for c in torch.unique(labels):
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        keys[idx] = (torch.arange(idx.numel(), dtype=torch.float64) + 0.5) / idx.numel()
    # random order first, then a stable sort: records with equal keys are ordered at random
    perm = torch.randperm(n, generator=gen)
    order = perm[torch.sort(keys[perm], stable=True).indices]
    n_train = round(n * fractions[0])
    n_val = round(n * fractions[1])
    n_val = min(n_val, n - n_train)
    train, val, hold = order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]
    return train.sort().values, val.sort().values, hold.sort().values


def lodo_split(
    ds: MultiDomainDataset,
    target: str,
    fractions: tuple[float, float, float] = (0.5, 0.1, 0.4),
    seed: int = 0,
) -> LODOSplit:
    """Hold out ``target`` whole; split every other domain into train/val/holdout."""
    if target not in ds.domains:
        valid = ", ".join(repr(d) for d in ds.domains)
        raise FedauditError(f"unknown target domain {target!r} for dataset {ds.name}; choose one of: {valid}")
    fr = _check_fractions(fractions)
    seed = check_seed(seed)
    sources: list[ClientData] = []
    for i, dom in enumerate(ds.domains):
        if dom == target:
            continue
        x, y = ds.images[dom], ds.labels[dom]
        parts = stratified_split(y, fr, _generator(seed, i))
        for name, idx in zip(SPLIT_NAMES, parts):
            if idx.numel() == 0:
                raise FedauditError(
                    f"domain {dom!r} has {y.numel()} images, which leaves its {name} split empty "
                    f"with fractions {tuple(fr)}; add images or raise the {name} fraction"
                )
        tr, va, ho = parts
        sources.append(
            ClientData(
                domain=dom,
                train_x=take(x, tr), train_y=y[tr],
                val_x=take(x, va), val_y=y[va],
                holdout_x=take(x, ho), holdout_y=y[ho],
                train_idx=tr, val_idx=va, holdout_idx=ho,
            )
        )  # fmt: skip
    return LODOSplit(target=target, sources=sources, target_x=ds.images[target], target_y=ds.labels[target])


MIN_VAL_RECORDS = 10  # fewer per client: model selection rests on a handful of records
MIN_HOLDOUT_PER_CLASS = 10  # fewer of a class: nothing about that class's records can read LOW


def thin_splits(split: LODOSplit, classes: list[str]) -> list[str]:
    """What the split leaves too thin to rely on, one sentence each (empty when nothing is)."""
    out = []
    for c in split.sources:
        if int(c.val_y.numel()) < MIN_VAL_RECORDS:
            out.append(f"client {c.domain} has {int(c.val_y.numel())} validation record(s) (fewer than "
                       f"{MIN_VAL_RECORDS}): model selection rests on them")
        counts = torch.bincount(c.holdout_y, minlength=len(classes)).tolist()
        thin = [f"{classes[k]} ({n})" for k, n in enumerate(counts) if n < MIN_HOLDOUT_PER_CLASS]
        if thin:
            out.append(f"client {c.domain} holds fewer than {MIN_HOLDOUT_PER_CLASS} holdout records of "
                       f"{len(thin)} class(es): {', '.join(thin[:5])}{', …' if len(thin) > 5 else ''}")
    return out
