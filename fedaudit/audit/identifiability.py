"""Identifiability: do reconstructions sit closer to training records than to fresh ones?

For each reconstruction ``r`` (optimised for class ``c``) the auditor asks
whether its nearest *member* of class ``c`` is nearer than its nearest
*non-member* of class ``c`` (pixel L2 on [0, 1] images, or L2 between
latents). Two things make the naive fraction wrong, and this module fixes
both:

* **Unequal reference sets.** With 50% of a victim's records as members and
  40% as holdouts, a random image lands nearer to a member about 5/9 of the
  time, not 1/2 (and 7/9 at a 70/20 split). So every comparison uses *equal*
  numbers of members and non-members per class, ``s`` = the smaller count:
  the statistic is the probability, over a random ``s``-subset of the class's
  members and a random ``s``-subset of its non-members, that the nearer of the
  two nearest records is a member — computed exactly from the sorted
  distances (no sampling), then averaged over reconstructions. Its chance
  level is then 1/2 by symmetry — and it is still measured, not assumed
  (below).
* **Dependent reconstructions.** A batch of reconstructions optimised together
  is not a set of independent coin flips: forty near-identical blobs that
  happen to sit near one member all score "member". A binomial interval over
  them is too narrow. The test is therefore a **permutation test** on the
  membership labels, conditional on the reconstructions: relabel a class's
  pooled members and non-members at random (same counts), compute the same
  statistic, and repeat :data:`PERMUTATIONS` times. ``chance`` is the mean of
  that null distribution, ``null_q95`` its 95% quantile and ``p_value`` the
  share of it at or above the observed value (with the usual +1 so p is
  never 0).

The exact expectation: sort the pool's distances to ``r``; a member at rank
``k`` among the members, with ``j`` non-members nearer, is the nearest of a
random member subset with probability C(m−k, s−1)/C(m, s), and no non-member
subset element is nearer with probability C(n−j, s)/C(n, s); the statistic is
the sum of their products over the members.

The Clopper–Pearson interval of the value (over the number of
reconstructions) is kept for display; the verdict uses the p-value.
Reconstructions whose class has no member or no non-member cannot be judged
and are counted in ``excluded``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fedaudit.statistics.intervals import clopper_pearson

PERMUTATIONS = 500  # null replicates; the smallest p-value is 1/(1 + PERMUTATIONS)
NULL_QUANTILE = 0.95


def _log_comb(n: Tensor, k: int) -> Tensor:
    return torch.lgamma(n + 1) - math.lgamma(k + 1) - torch.lgamma(n - k + 1)


def _tables(m: int, n: int, s: int) -> tuple[Tensor, Tensor]:
    """first[k] = P(the member ranked k (1-based) among m is the nearest of a random s-subset);
    clear[j] = P(a random s-subset of n non-members avoids the j nearest)."""
    k = torch.arange(0, m + 1, dtype=torch.float64)
    first = torch.where((k >= 1) & (m - k >= s - 1), torch.exp(_log_comb((m - k).clamp_min(s - 1), s - 1)
                                                                - _log_comb(torch.tensor(float(m)), s)), 0.0)
    j = torch.arange(0, n + 1, dtype=torch.float64)
    clear = torch.where(n - j >= s, torch.exp(_log_comb((n - j).clamp_min(s), s) - _log_comb(torch.tensor(float(n)), s)), 0.0)
    return first, clear


def _balanced_closer(labels: Tensor, first: Tensor, clear: Tensor) -> Tensor:
    """P(nearest of a balanced pair of subsets is a member), from member labels along sorted distances [..., pool]."""
    member = labels.double()
    rank = member.cumsum(-1).long()  # a member's rank among members (1-based) at its position
    before = (1 - member).cumsum(-1).long()  # non-members nearer than (or at) this position; 0 extra at members
    return (member * first[rank] * clear[before]).sum(-1)


@dataclass(frozen=True)
class IdentifiabilityTest:
    """The balanced identifiability of a set of reconstructions, with its permutation null."""

    value: float  # P(the nearest of a balanced member/non-member pair is a member), mean over judged reconstructions
    k: float  # the expected count behind it (value × n)
    n: int  # reconstructions judged
    ci95: list[float]
    chance: float  # the permutation null's mean
    null_q95: float
    p_value: float
    excluded: int  # reconstructions of a class with no member or no non-member to compare with
    per_class: dict[str, int]  # balanced size per class
    permutations: int
    members: int
    nonmembers: int


def identifiability_test(recon: Tensor, targets: Tensor | None, members: Tensor, member_y: Tensor | None,
                         nonmembers: Tensor, nonmember_y: Tensor | None, *, seed: int = 0,
                         permutations: int = PERMUTATIONS) -> IdentifiabilityTest:
    """Balanced identifiability of ``recon`` against ``members`` vs ``nonmembers``, with its permutation null.

    ``targets=None`` (or no labels) compares with the nearest record of any
    class. All tensors are on one device; images are compared flattened.
    Returns the test with the reference set sizes (:class:`IdentifiabilityTest`).
    """
    g = torch.Generator().manual_seed(seed)
    r = recon.flatten(1).float().cpu()
    mem, non = members.flatten(1).float().cpu(), nonmembers.flatten(1).float().cpu()
    if targets is None or member_y is None or nonmember_y is None:
        t = torch.zeros(r.shape[0], dtype=torch.long)
        my, ny = torch.zeros(mem.shape[0], dtype=torch.long), torch.zeros(non.shape[0], dtype=torch.long)
    else:
        t, my, ny = targets.cpu().long(), member_y.cpu().long(), nonmember_y.cpu().long()
    observed = torch.zeros(r.shape[0], dtype=torch.float64)
    null = torch.zeros(permutations, r.shape[0], dtype=torch.float64)
    judged = torch.zeros(r.shape[0], dtype=torch.bool)
    per_class: dict[str, int] = {}
    for c in torch.unique(t).tolist():
        rows = (t == c).nonzero().flatten()
        pool = torch.cat([mem[my == c], non[ny == c]])
        m, n = int((my == c).sum()), int((ny == c).sum())
        s = min(m, n)
        if s == 0:
            continue
        per_class[str(c)] = s
        judged[rows] = True
        first, clear = _tables(m, n, s)
        order = torch.cdist(r[rows], pool).argsort(dim=1)  # [rows, pool], nearest first
        is_member = torch.cat([torch.ones(m, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])
        observed[rows] = _balanced_closer(is_member[order], first, clear)
        # Null: relabel the class's pool at random, keeping the counts.
        relabel = is_member[torch.rand(permutations, m + n, generator=g).argsort(dim=1)]  # [P, pool]
        null[:, rows] = _balanced_closer(relabel[:, order], first, clear)  # [P, rows]
    n = int(judged.sum())
    excluded = int((~judged).sum())
    sizes = {"members": int(mem.shape[0]), "nonmembers": int(non.shape[0])}
    if n == 0:
        nan = float("nan")
        return IdentifiabilityTest(value=nan, k=0, n=0, ci95=[0.0, 1.0], chance=nan, null_q95=nan, p_value=1.0,
                                   excluded=excluded, per_class=per_class, permutations=permutations, **sizes)
    value = float(observed[judged].mean())
    null_values = null[:, judged].mean(1)
    k = value * n
    lo, hi = clopper_pearson(int(round(k)), n)
    p = (1 + int((null_values >= value - 1e-12).sum())) / (1 + permutations)
    return IdentifiabilityTest(value=value, k=k, n=n, ci95=[lo, hi], chance=float(null_values.mean()),
                               null_q95=float(torch.quantile(null_values, NULL_QUANTILE)), p_value=p,
                               excluded=excluded, per_class=per_class, permutations=permutations, **sizes)


def min_p_value(permutations: int = PERMUTATIONS) -> float:
    """The smallest p-value the permutation test can return: what a multiplicity correction must allow for."""
    return 1.0 / (1 + permutations)


__all__ = ["PERMUTATIONS", "IdentifiabilityTest", "identifiability_test", "min_p_value"]

