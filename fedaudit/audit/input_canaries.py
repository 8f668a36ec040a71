"""Canaries for the one-run privacy audit: what the auditor plants in a victim's training split.

The audit (Steinke, Nasr & Jagielski, NeurIPS 2023; the statistics are
:mod:`fedaudit.statistics.one_run_audit`, the scoring ``fedaudit.attacks.canary``) needs
m records whose membership is decided by a fair coin, independently, before
training. fedaudit's canaries, for each victim:

* **Which records**: m records of the victim's own ``holdout`` split, drawn
  stratified by class (so the holdout that stays behind keeps its class mix)
  with a seed derived from the run seed and the victim's name. Same domain,
  so they are records the victim plausibly holds.
* **Mislabelled**: each gets a wrong label, uniform over the other classes.
  A correctly labelled in-distribution record is barely remembered by a
  model; a record whose label contradicts everything else of its kind is the
  strongest signal an input-space audit can plant (the paper's input-space
  canaries are mislabelled too).
* **Inclusion**: each is appended to the victim's ``train`` split with
  probability ½, independently; every one of the m leaves the holdout, so no
  canary is ever a membership non-member. ``ClientData.train_canary`` marks
  the appended ones so the auditor's notion of "members"
  (``ClientData.members``) leaves them out, and
  ``LODOSplit.canaries[victim]`` (:class:`~fedaudit.data.base.CanarySet`)
  keeps all m with the inclusion truth, in a random order.
* Canaries are only ever in ``train``: ``val`` (model selection) and the
  unseen target (accuracy) are untouched, so they never count towards
  accuracy. They do change what is trained — m/2 wrong labels per victim — so
  a run with the canary audit is not the same run without it.

Deterministic: the same (seed, victim, holdout) gives the same canaries, labels
and coins, so ``--resume`` rebuilds the same split.

Default m = 64 (``--canaries``): digits' source domains hold about 180
holdout records, and 180 − 64 = 116 ≥ 100 keeps mia's TPR at 10% FPR
resolvable (it needs 10/0.1 non-members). More canaries give the audit more
power (:func:`fedaudit.statistics.one_run_audit.epsilon_max_certifiable`), at the cost of
non-members and of label noise in training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from fedaudit.data.base import CanarySet, LODOSplit
from fedaudit.data.split import stratified_split
from fedaudit.errors import FedauditError
from fedaudit.run.seeds import derive_seed, stable_int

CANARY_STREAM = 11_001  # derive_seed stream: canary choice, wrong labels, inclusion coins
KIND = "mislabelled records of the victim's own holdout split (wrong label uniform over the other classes)"


def plant_canaries(split: LODOSplit, victims: Sequence[str], m: int, seed: int, num_classes: int) -> LODOSplit:
    """A copy of ``split`` with ``m`` canaries drawn from each victim's holdout, each in its ``train`` with
    probability ½; the auditor's record of them in ``split.canaries``. Other clients are unchanged."""
    if m < 2:  # the range a user may give is declared with the option (attacks/canary.py)
        raise ValueError(f"the canary audit needs at least 2 canaries, got {m}")
    if num_classes < 2:
        raise FedauditError("the canary audit needs at least 2 classes (a canary gets a wrong label)")
    sources, canaries = [], dict(split.canaries)
    for d in split.sources:
        if d.domain not in victims:
            sources.append(d)
            continue
        if d.domain in canaries:
            raise ValueError(f"canaries were already planted for {d.domain!r}")
        n = int(d.holdout_y.numel())
        if m >= n:
            raise FedauditError(f"--canaries {m} needs more holdout records than victim {d.domain!r} has ({n}): the canaries "
                                f"come from its holdout and some must stay non-members; use --canaries {max(2, n // 3)} or fewer")
        g = torch.Generator().manual_seed(derive_seed(seed, CANARY_STREAM, stable_int(d.domain)) % 2**63)
        hold_y = d.holdout_y.cpu()
        pick, _, keep = stratified_split(hold_y, (m / n, 0.0, 1.0 - m / n), g)
        if pick.numel() != m:  # round(n * m / n) is m; guard the float arithmetic anyway
            raise ArithmeticError(f"drew {pick.numel()} canaries instead of {m}")
        pick = pick[torch.randperm(m, generator=g)]  # a random order: position says nothing about inclusion
        true = hold_y[pick]
        wrong = (true + torch.randint(1, num_classes, (m,), generator=g)) % num_classes
        included = torch.randint(0, 2, (m,), generator=g).bool()
        dev = d.train_x.device
        pick_d, keep_d, inc_d = pick.to(dev), keep.to(dev), included.to(dev)
        images = d.holdout_x[pick_d]
        n_train = int(d.train_y.numel())
        old_mask = d.train_canary if d.train_canary is not None else torch.zeros(n_train, dtype=torch.bool, device=dev)
        sources.append(dataclasses.replace(
            d,
            train_x=torch.cat([d.train_x, images[inc_d]]),
            train_y=torch.cat([d.train_y, wrong.to(dev)[inc_d]]),
            train_idx=torch.cat([d.train_idx, d.holdout_idx[pick_d][inc_d]]),
            train_canary=torch.cat([old_mask, torch.ones(int(included.sum()), dtype=torch.bool, device=dev)]),
            holdout_x=d.holdout_x[keep_d], holdout_y=d.holdout_y[keep_d], holdout_idx=d.holdout_idx[keep_d],
        ))
        canaries[d.domain] = CanarySet(d.domain, images.cpu(), wrong, true, included, d.holdout_idx[pick_d].cpu())
    return LODOSplit(split.target, sources, split.target_x, split.target_y, canaries)


__all__ = ["KIND", "plant_canaries"]
