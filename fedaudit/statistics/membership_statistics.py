"""Membership statistics: how the auditor judges per-record membership scores. Pure functions, no I/O.

The scorers that produce the scores are the attack's (:mod:`fedaudit.attacks.mia.scorers`); here are
the statistics over them, the Gaussian fit that LiRA and its calibration check share, and the
calibration check itself (it needs the membership truth, so it is the auditor's).

Statistics (docs/attacks.md, "What the auditor measures"): ROC from
``sklearn.metrics.roc_curve``; AUC; TPR at FPR levels as the largest TPR
with FPR ≤ level, with Clopper–Pearson 95% intervals for the TPR (over the
member count) and the achieved FPR (over the non-member count); a level is
*resolvable* only with at least 10/level non-members; membership advantage
max(TPR − FPR); the 95% band of the AUC under no membership signal.

Nulls at the run's counts (the verdict's tests; docs/attacks.md, "Nulls, the twin
and power"). Each statistic is judged against its own distribution
when the scores carry no membership signal (members and non-members
exchangeable), computed for the actual numbers of members and non-members:

* ``advantage`` is a maximum over thresholds, so 0.1 is not "0.1 above
  chance": it is the one-sided two-sample Kolmogorov–Smirnov statistic
  max_t(F_non(t) − F_mem(t)), and its p-value is the KS test's
  (:func:`advantage_p_value`; with 225 members and 180 non-members its 95%
  null quantile is about 0.12);
* ``TPR at FPR ≤ level``: the operating point counts the members ranked above
  the (a+1)-th highest non-member, a = ⌊level·n₀⌋ false positives allowed;
  with random ranks that count is ≥ tp exactly when the top tp + a ranks hold
  at most a non-members, a hypergeometric tail (:func:`tpr_p_value`, exact);
* ``auc``: the one-sided Mann–Whitney test (:func:`auc_p_value`).

A verdict row gathers many such tests (victims × variants × targets) and
corrects them with Holm's step-down procedure (:func:`holm`), which controls
the family-wise error at the stated α without assuming independence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedaudit.errors import FedauditError
from fedaudit.statistics.intervals import clopper_pearson

VARIANCE_FLOOR = 1e-8
FPR_LEVELS = (0.001, 0.01, 0.1)
NONMEMBERS_PER_LEVEL = 10  # a level is resolvable with at least 10/level non-members (docs/attacks.md)
ROC_MAX_POINTS = 200
EXACT_KS_MAX = 10_000  # n_members × n_nonmembers up to which the KS p-value is exact (beyond: asymptotic, ~1 ms)

ArrayLike = Tensor | np.ndarray | Sequence[float]


# -- the Gaussian fit of reference signals (LiRA's, and the auditor's calibration check) ---------------


def check_reference(target: Tensor, ref: Tensor, mask: Tensor, what: str) -> tuple[Tensor, Tensor, Tensor]:
    """Target signals [n], reference signals [N, n] and their inclusion mask [N, n], checked, as CPU float64/bool."""
    target = torch.as_tensor(target).double().cpu()
    ref = torch.as_tensor(ref).double().cpu()
    mask = torch.as_tensor(mask).bool().cpu()
    if target.dim() != 1 or ref.dim() != 2 or ref.shape != mask.shape or ref.shape[1] != target.shape[0]:
        raise ValueError(f"{what}: expected target [n], reference [N, n] and mask [N, n]; got "
                         f"{tuple(target.shape)}, {tuple(ref.shape)}, {tuple(mask.shape)}")
    if ref.shape[0] < 1:
        raise FedauditError(f"{what} needs at least 1 reference model; train 8 (quick) or 64 (paper)")
    return target, ref, mask


class GaussianFit(NamedTuple):
    """Per-record Gaussian fit of the reference signals selected by a mask."""

    mean: Tensor  # NaN where a record has no signal
    var: Tensor  # unbiased per-record variance (meaningful with 2+ signals)
    count: Tensor
    resid2: float  # squared residuals around each record's own mean, summed over records
    dof: float  # their degrees of freedom


def gaussian_fit(ref: Tensor, mask: Tensor) -> GaussianFit:
    w = mask.double()
    count = w.sum(0)
    mean = (ref * w).sum(0) / count
    resid2 = ((ref - torch.nan_to_num(mean)) ** 2 * w).sum(0)
    has = count > 0
    return GaussianFit(mean, resid2 / (count - 1).clamp_min(1), count, float(resid2[has].sum()),
                       float((count[has] - 1).sum()))


def pooled_variance(*fits: GaussianFit) -> float:
    """One variance from the within-record residuals of every fit (IN and OUT alike)."""
    dof = sum(f.dof for f in fits)
    return max(sum(f.resid2 for f in fits) / dof, VARIANCE_FLOOR) if dof > 0 else VARIANCE_FLOOR


def fit_variance(fit: GaussianFit, pooled: float, per_record: bool) -> Tensor:
    """Per-record variance where asked and estimable (2+ signals), the pooled one elsewhere."""
    pooled_var = torch.full_like(fit.var, pooled)
    if not per_record:
        return pooled_var
    return torch.where(fit.count >= 2, fit.var, pooled_var).clamp_min(VARIANCE_FLOOR)


CALIBRATION_LIMIT = 1.0  # |mean standardised gap| above this: the reference models do not describe the target


def lira_calibration(target_phi: ArrayLike, ref_phi: ArrayLike, ref_in_mask: ArrayLike, is_member: ArrayLike,
                     shift: float | None = None) -> dict[str, Any]:
    """How well the reference models stand in for the target (the auditor's check; it needs the truth).

    LiRA assumes a non-member's signal under the target looks like its
    signal under the reference models that did not train on it (OUT), and a
    member's like under those that did (IN). ``out_gap`` is the mean over the
    target's non-members of (φ_target − ``shift`` − μ_out) in units of the pooled
    reference spread, ``in_gap`` the same over members against μ_in: the gaps of the
    signal LiRA scored, after the attacker's ``shift`` (its estimate, without the
    truth, of how much more confident the target is than its references on every
    record). Both near 0: calibrated. With a ``shift`` (None: the signal was scored
    as is), ``raw_out_gap`` and ``raw_in_gap`` are the gaps before it and ``shift``
    is in σ too. Reference models trained less
    than the target (fewer epochs, alone rather than in the federation) leave the
    target more confident on every record, so both raw gaps come out positive; a
    shift removes what they share, not a difference between them. ``status`` is
    "miscalibrated" when either gap LiRA scored exceeds :data:`CALIBRATION_LIMIT` in size.
    """
    target, ref, mask = check_reference(target_phi, ref_phi, ref_in_mask, "LiRA calibration")
    member = torch.as_tensor(is_member).bool().cpu()
    fit_in, fit_out = gaussian_fit(ref, mask), gaussian_fit(ref, ~mask)
    sigma = math.sqrt(pooled_variance(fit_in, fit_out))

    def gap(mu: Tensor, rows: Tensor, by: float) -> float:
        ok = rows & torch.isfinite(mu)
        return float(((target[ok] - by - mu[ok]) / sigma).mean()) if bool(ok.any()) else float("nan")

    out_gap, in_gap = gap(fit_out.mean, ~member, shift or 0.0), gap(fit_in.mean, member, shift or 0.0)
    bad = any(math.isfinite(g) and abs(g) > CALIBRATION_LIMIT for g in (out_gap, in_gap))
    shifted = {} if shift is None else {"raw_out_gap": gap(fit_out.mean, ~member, 0.0),
                                        "raw_in_gap": gap(fit_in.mean, member, 0.0), "shift": shift / sigma}
    return {"out_gap": out_gap, "in_gap": in_gap, "sigma": sigma, "limit": CALIBRATION_LIMIT, **shifted,
            "status": "miscalibrated" if bad else "calibrated"}


# -- statistics ------------------------------------------------------------------


def _scores(values: ArrayLike, what: str) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().double().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise FedauditError(f"membership metrics need at least one {what} score; the victim has no {what} records — "
                            "give it records of both kinds (evaluate: a larger train/holdout "
                            "fraction in --split; audit: more records in the recording's data)")
    bad = int((~np.isfinite(arr)).sum())
    if bad:
        raise FedauditError(f"{bad} {what} score(s) are NaN or infinite; check the target and reference logits")
    return arr


def roc(member_scores: ArrayLike, nonmember_scores: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) with members as positives and higher score = member.

    Every threshold is kept (``drop_intermediate=False``) so operating points
    can be read off exactly.
    """
    from sklearn.metrics import roc_curve

    pos, neg = _scores(member_scores, "member"), _scores(nonmember_scores, "non-member")
    y = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    fpr, tpr, thresholds = roc_curve(y, np.concatenate([pos, neg]), drop_intermediate=False)
    return fpr, tpr, thresholds


def auc(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """Area under the ROC curve (trapezoids: tied scores count one half)."""
    from sklearn.metrics import auc as sk_auc

    return float(sk_auc(fpr, tpr))


def auc_null_interval(n_members: int, n_nonmembers: int, level: float = 0.95) -> tuple[float, float]:
    """Central ``level`` band of the AUC when scores carry no membership signal.

    Normal approximation to the Mann–Whitney statistic under the null:
    Var(AUC) = (n₁ + n₀ + 1) / (12 n₁ n₀). An AUC inside the band is
    indistinguishable from guessing.
    """
    from scipy.stats import norm

    half = float(norm.ppf(0.5 + level / 2)) * math.sqrt((n_members + n_nonmembers + 1) / (12.0 * n_members * n_nonmembers))
    return (0.5 - half, 0.5 + half)


def min_nonmembers(level: float) -> int:
    """Non-members needed to resolve FPR ``level``: 10/level (docs/attacks.md)."""
    return math.ceil(NONMEMBERS_PER_LEVEL / level - 1e-9)


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, level: float, n_members: int, n_nonmembers: int) -> dict[str, Any]:
    """The operating point with the largest TPR whose FPR ≤ ``level``.

    Returns tpr and its Clopper–Pearson 95% interval over ``n_members``, the
    achieved FPR and its interval over ``n_nonmembers``, the true/false
    positive counts, and ``resolvable`` (at least 10/level non-members) with a
    ``warning`` sentence when it is not (empty string otherwise).
    """
    if not 0.0 < level < 1.0:
        raise FedauditError(f"FPR level must be in (0, 1), got {level!r}; use e.g. 0.001, 0.01 or 0.1")
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    fp = np.rint(fpr * n_nonmembers).astype(np.int64)
    tp = np.rint(tpr * n_members).astype(np.int64)
    allowed = math.floor(level * n_nonmembers + 1e-9)  # counts, not floats: 10/1000 must count as 1%
    ok = fp <= allowed
    i = int(np.flatnonzero(ok)[np.argmax(tp[ok])])  # the ROC starts at (0, 0), so ok is never empty
    need = min_nonmembers(level)
    resolvable = n_nonmembers >= need
    warning = "" if resolvable else (
        f"FPR {level:g} is not resolved: {n_nonmembers} non-members allow {allowed} false positive(s); "
        f"it needs at least {need} (10/FPR)")
    return {
        "level": float(level),
        "tpr": float(tp[i] / n_members),
        "tpr_interval": list(clopper_pearson(int(tp[i]), n_members)),
        "fpr_achieved": float(fp[i] / n_nonmembers),
        "fpr_interval": list(clopper_pearson(int(fp[i]), n_nonmembers)),
        "true_positives": int(tp[i]),
        "false_positives": int(fp[i]),
        "allowed_false_positives": int(allowed),
        "p_value": tpr_p_value(int(tp[i]), allowed, n_members, n_nonmembers),
        "resolvable": bool(resolvable),
        "warning": warning,
    }


def advantage_p_value(member_scores: ArrayLike, nonmember_scores: ArrayLike) -> float:
    """P(advantage ≥ observed) when the scores carry no membership signal, at these counts.

    The advantage max_t(TPR − FPR) is the one-sided two-sample KS statistic
    D⁺ = max(F_non − F_mem) (higher score = member); scipy's ``ks_2samp``
    gives its exact p-value up to :data:`EXACT_KS_MAX` pairs and the
    asymptotic one beyond (within a few percent of exact at 225 × 180).
    """
    from scipy.stats import ks_2samp

    pos, neg = _scores(member_scores, "member"), _scores(nonmember_scores, "non-member")
    method = "exact" if pos.size * neg.size <= EXACT_KS_MAX else "asymp"  # exact path counting grows as n₁·n₀
    return float(ks_2samp(neg, pos, alternative="greater", method=method).pvalue)


def advantage_null_quantile(n_members: int, n_nonmembers: int, alpha: float = 0.05) -> float:
    """The advantage that scores with no signal exceed with probability ``alpha`` (asymptotic one-sided KS):
    the smallest effect a test at level ``alpha`` can detect at these counts."""
    return math.sqrt(-math.log(alpha) / 2.0 * (n_members + n_nonmembers) / (n_members * n_nonmembers))


def tpr_p_value(true_positives: int, allowed_false_positives: int, n_members: int, n_nonmembers: int) -> float:
    """P(TP ≥ ``true_positives``) at an operating point allowing ``allowed_false_positives`` when
    ranks are random: the top TP + a ranks then hold at most a non-members (hypergeometric, exact)."""
    from scipy.stats import hypergeom

    if true_positives <= 0:
        return 1.0
    a = int(allowed_false_positives)
    return float(hypergeom.cdf(a, n_members + n_nonmembers, n_nonmembers, int(true_positives) + a))


def auc_p_value(member_scores: ArrayLike, nonmember_scores: ArrayLike) -> float:
    """One-sided Mann–Whitney p-value of AUC > 0.5 (members score higher)."""
    from scipy.stats import mannwhitneyu

    pos, neg = _scores(member_scores, "member"), _scores(nonmember_scores, "non-member")
    return float(mannwhitneyu(pos, neg, alternative="greater").pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (same order as given): reject where adjusted ≤ α keeps the
    family-wise error at α for any dependence between the tests."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def advantage(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """Membership advantage max(TPR − FPR) (Yeom et al.)."""
    return float(np.max(np.asarray(tpr) - np.asarray(fpr)))


def thin_roc(fpr: np.ndarray, tpr: np.ndarray, max_points: int = ROC_MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most about ``max_points`` ROC corners for a log-log plot.

    Keeps the first and last points, the best TPR at FPR 0, and for a
    log-spaced grid of FPR values the best point at or below each, so the
    low-FPR end keeps its resolution (uniform thinning would spend every
    point on FPR > 0.01).
    """
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    if fpr.size <= max_points:
        return fpr.tolist(), tpr.tolist()
    keep = {0, fpr.size - 1}
    at_zero = np.flatnonzero(fpr == 0.0)
    if at_zero.size:
        keep.add(int(at_zero[-1]))
    positive = fpr[fpr > 0]
    if positive.size:
        grid = np.geomspace(positive.min(), 1.0, max_points - len(keep))
        # fpr is non-decreasing: the last index with fpr <= g is the top of that vertical step.
        idx = np.searchsorted(fpr, grid, side="right") - 1
        keep.update(int(i) for i in idx if i >= 0)
    order = sorted(keep)
    return fpr[order].tolist(), tpr[order].tolist()


def membership_metrics(member_scores: ArrayLike, nonmember_scores: ArrayLike,
                       levels: Sequence[float] = FPR_LEVELS) -> dict[str, Any]:
    """Everything the report shows for one attack, JSON-able.

    Keys: ``n_members``, ``n_nonmembers``, ``auc``, ``auc_chance_interval``
    (95% band under no signal), ``auc_p_value``, ``advantage`` with
    ``advantage_p_value`` and ``advantage_null_95`` (its 95% quantile with no
    signal at these counts), ``tpr_at_fpr`` (one entry per
    level, keyed by ``f"{level:g}"``, see :func:`tpr_at_fpr`), ``warnings``
    (one sentence per unresolvable level) and ``roc`` (``fpr``/``tpr`` lists
    thinned to about 200 points, ``points``: the full curve's length).
    """
    pos, neg = _scores(member_scores, "member"), _scores(nonmember_scores, "non-member")
    fpr, tpr, _ = roc(pos, neg)
    n_pos, n_neg = int(pos.size), int(neg.size)
    points = {f"{lv:g}": tpr_at_fpr(fpr, tpr, lv, n_pos, n_neg) for lv in levels}
    thin_fpr, thin_tpr = thin_roc(fpr, tpr)
    return {
        "n_members": n_pos,
        "n_nonmembers": n_neg,
        "auc": auc(fpr, tpr),
        "auc_chance_interval": list(auc_null_interval(n_pos, n_neg)),
        "advantage": advantage(fpr, tpr),
        "advantage_p_value": advantage_p_value(pos, neg),
        "advantage_null_95": advantage_null_quantile(n_pos, n_neg),
        "auc_p_value": auc_p_value(pos, neg),
        "tpr_at_fpr": points,
        "warnings": [p["warning"] for p in points.values() if p["warning"]],
        "roc": {"fpr": thin_fpr, "tpr": thin_tpr, "points": int(fpr.size)},
    }
