"""Membership inference: per-record signals, attack scores and ROC statistics.

Pure functions, no I/O. An attack module feeds them the target model's logits
on the victim's members and holdouts (and their flips), the logits of N
reference models trained on random halves of that pool (see
:mod:`fedaudit.attacks.mia.reference_models`), the inclusion masks, and the logits on a
population (other domains' holdouts); the auditor then scores members against
non-members with :func:`membership_metrics`::

    phi_t = lira_signal(target_logits, y, target_flip_logits)          # [n]
    phi_r = lira_signal(ref.logits, y, ref.flipped)                    # [N, n]
    score = lira_online(phi_t, phi_r, masks)                           # [n]
    report = membership_metrics(score[is_member], score[~is_member])

Attacks (docs/attacks.md, "The attacks"):

* ``loss`` — Yeom et al., CSF 2018: score = −CE(f(x), y).
* ``lira`` — Carlini et al., "Membership Inference Attacks From First
  Principles", S&P 2022. Signal φ = log p_y − log Σ_{y'≠y} p_{y'} (the
  logit-scaled confidence, computed as z_y − logsumexp_{y'≠y} z_{y'} so a
  confident model never rounds p_y to 1). Online: log N(φ; μ_in, σ²_in) −
  log N(φ; μ_out, σ²_out) with per-record means from the IN and OUT reference
  models. Offline: a one-sided test against the OUT Gaussian only; fedaudit
  scores −log Pr[Z > φ], Z ~ N(μ_out, σ²_out), a monotone transform of the
  paper's OUT-CDF Pr[Z ≤ φ] (same ROC) that does not saturate at 1.0 in
  floating point, so strong members stay ranked at low FPR. Higher = member.
* ``rmia`` — Zarifzadeh et al., "Low-Cost High-Power Membership Inference
  Attacks", ICML 2024. Pr(x|θ) = softmax probability of the true label at
  temperature T; Pr(x) = mean over reference models (offline:
  ½[(1+a)·Pr_OUT(x) + (1−a)]); LR(x, z) = [Pr(x|θ)/Pr(x)] / [Pr(z|θ)/Pr(z)];
  score = fraction of population records z with LR(x, z) ≥ γ.

Hyper-parameters (the same in the ``quick`` and ``paper`` profiles; only the
number of reference models differs, 8 vs 64, and is the caller's choice):
RMIA T = 2, γ = 2, a = 0.3; LiRA switches to one global variance below
``GLOBAL_VARIANCE_BELOW`` = 64 reference models.

Deviations and choices, with reasons:

* The global variance is one *pooled within-record* variance: squared
  residuals of each record's IN and OUT signals around that record's own IN
  or OUT mean, pooled over records and over IN and OUT (offline: OUT only).
  Carlini et al. use "a global variance for all examples"; pooling residuals
  keeps the spread of the per-record means (which the per-record μ already
  models) out of σ², and one σ² shared by IN and OUT keeps the online score
  linear in φ.
* Per-record variances use the unbiased estimator; a record with fewer than 2
  IN (or OUT) signals uses the pooled variance instead. Every variance is
  floored at ``VARIANCE_FLOOR`` so identical reference signals cannot divide
  by zero.
* Records that are IN for no reference model (online LiRA) get
  μ_in = μ_out + the mean IN−OUT shift over records that have both (and OUT
  for none: μ_out = μ_in − shift), so their score stays on the same scale as
  everyone else's. Offline LiRA and offline RMIA give a record that is OUT for
  no reference model the pooled OUT mean over all records (a globally
  calibrated test for that record). Balanced masks from
  :func:`fedaudit.attacks.mia.reference_models.inclusion_masks` never need these with
  N ≥ 2; a warning says how many records used them.
* RMIA population records are OUT for every reference model, so offline
  Pr(z) applies the same (1+a) correction to their mean over all reference
  models (the paper's offline approximation, applied to x and z alike).
  The score is a monotone function of Pr(x|θ)/Pr(x), so this choice moves
  only the score's scale, never the ROC.

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
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedaudit.errors import FedauditError
from fedaudit.intervals import clopper_pearson

GLOBAL_VARIANCE_BELOW = 64  # fewer reference models than this: one pooled variance (Carlini et al. 2022)
VARIANCE_FLOOR = 1e-8
RMIA_TEMPERATURE, RMIA_GAMMA, RMIA_OFFLINE_A = 2.0, 2.0, 0.3
FPR_LEVELS = (0.001, 0.01, 0.1)
NONMEMBERS_PER_LEVEL = 10  # a level is resolvable with at least 10/level non-members (docs/attacks.md)
ROC_MAX_POINTS = 200
EXACT_KS_MAX = 10_000  # n_members × n_nonmembers up to which the KS p-value is exact (beyond: asymptotic, ~1 ms)

ArrayLike = Tensor | np.ndarray | Sequence[float]


# -- signals ----------------------------------------------------------------------


def _true_label_index(logits: Tensor, labels: Tensor) -> Tensor:
    """``labels`` [n] broadcast to ``logits`` [..., n, C] as a gather index [..., n, 1]."""
    labels = labels.to(logits.device, torch.long)
    if logits.shape[-2] != labels.shape[-1]:
        raise ValueError(f"logits have {logits.shape[-2]} records but labels {labels.shape[-1]}")
    return labels.expand(logits.shape[:-1]).unsqueeze(-1)


def loss_signal(logits: Tensor, labels: Tensor) -> Tensor:
    """−CE per record (Yeom et al.): logits [..., n, C], labels [n] → [..., n] (float64)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp.gather(-1, _true_label_index(logits, labels)).squeeze(-1)


def lira_signal(logits: Tensor, labels: Tensor, flipped_logits: Tensor | None = None) -> Tensor:
    """LiRA's φ = log p_y − log Σ_{y'≠y} p_{y'} per record, [..., n, C] → [..., n] (float64).

    Computed as z_y − logsumexp_{y'≠y} z_{y'} (the softmax normaliser cancels),
    exact even where p_y rounds to 1. With ``flipped_logits`` (the same
    records, horizontally flipped) the result is the mean of both views'
    signals, as LiRA does (Carlini et al. 2022).
    """
    z = logits.double()
    idx = _true_label_index(z, labels)
    true = z.gather(-1, idx).squeeze(-1)
    others = z.scatter(-1, idx, -math.inf).logsumexp(-1)
    phi = true - others
    if flipped_logits is not None:
        if flipped_logits.shape != logits.shape:
            raise ValueError(f"flipped logits {tuple(flipped_logits.shape)} do not match logits {tuple(logits.shape)}")
        phi = 0.5 * (phi + lira_signal(flipped_logits, labels))
    return phi


def rmia_prob(logits: Tensor, labels: Tensor, temperature: float = RMIA_TEMPERATURE,
              flipped_logits: Tensor | None = None) -> Tensor:
    """RMIA's Pr(x|θ): softmax probability of the true label at ``temperature``, [..., n] (float64).

    With ``flipped_logits`` the mean of both views' probabilities.
    """
    if not temperature > 0:
        raise FedauditError(f"RMIA temperature must be > 0, got {temperature!r}; the paper uses 2")
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    p = logp.gather(-1, _true_label_index(logits, labels)).squeeze(-1).exp()
    if flipped_logits is not None:
        p = 0.5 * (p + rmia_prob(flipped_logits, labels, temperature))
    return p


# -- LiRA ------------------------------------------------------------------------


def _check_reference(target: Tensor, ref: Tensor, mask: Tensor, what: str) -> tuple[Tensor, Tensor, Tensor]:
    target = torch.as_tensor(target).double().cpu()
    ref = torch.as_tensor(ref).double().cpu()
    mask = torch.as_tensor(mask).bool().cpu()
    if target.dim() != 1 or ref.dim() != 2 or ref.shape != mask.shape or ref.shape[1] != target.shape[0]:
        raise ValueError(f"{what}: expected target [n], reference [N, n] and mask [N, n]; got "
                         f"{tuple(target.shape)}, {tuple(ref.shape)}, {tuple(mask.shape)}")
    if ref.shape[0] < 1:
        raise FedauditError(f"{what} needs at least 1 reference model; train 8 (quick) or 64 (paper)")
    return target, ref, mask


class _Fit(NamedTuple):
    """Per-record Gaussian fit of the reference signals selected by a mask."""

    mean: Tensor  # NaN where a record has no signal
    var: Tensor  # unbiased per-record variance (meaningful with 2+ signals)
    count: Tensor
    resid2: float  # squared residuals around each record's own mean, summed over records
    dof: float  # their degrees of freedom


def _gaussian_fit(ref: Tensor, mask: Tensor) -> _Fit:
    w = mask.double()
    count = w.sum(0)
    mean = (ref * w).sum(0) / count
    resid2 = ((ref - torch.nan_to_num(mean)) ** 2 * w).sum(0)
    has = count > 0
    return _Fit(mean, resid2 / (count - 1).clamp_min(1), count, float(resid2[has].sum()), float((count[has] - 1).sum()))


def _pooled(*fits: _Fit) -> float:
    """One variance from the within-record residuals of every fit (IN and OUT alike)."""
    dof = sum(f.dof for f in fits)
    return max(sum(f.resid2 for f in fits) / dof, VARIANCE_FLOOR) if dof > 0 else VARIANCE_FLOOR


def _variance(fit: _Fit, pooled: float, per_record: bool) -> Tensor:
    """Per-record variance where asked and estimable (2+ signals), the pooled one elsewhere."""
    pooled_var = torch.full_like(fit.var, pooled)
    if not per_record:
        return pooled_var
    return torch.where(fit.count >= 2, fit.var, pooled_var).clamp_min(VARIANCE_FLOOR)


def _use_global_variance(global_variance: bool | None, n_models: int) -> bool:
    return n_models < GLOBAL_VARIANCE_BELOW if global_variance is None else bool(global_variance)


def _normal_logpdf(x: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    return -0.5 * (math.log(2 * math.pi) + var.log() + (x - mean) ** 2 / var)


def lira_online(target_phi: ArrayLike, ref_phi: ArrayLike, ref_in_mask: ArrayLike,
                global_variance: bool | None = None) -> Tensor:
    """Online LiRA score per record: log N(φ; μ_in, σ²_in) − log N(φ; μ_out, σ²_out).

    ``target_phi`` [n], ``ref_phi`` [N, n], ``ref_in_mask`` [N, n] (True: the
    record was in that reference model's training half). ``global_variance``
    None = automatic (pooled below 64 reference models). Higher = member.
    """
    target, ref, mask = _check_reference(target_phi, ref_phi, ref_in_mask, "online LiRA")
    per_record = not _use_global_variance(global_variance, ref.shape[0])
    fit_in, fit_out = _gaussian_fit(ref, mask), _gaussian_fit(ref, ~mask)
    pooled = _pooled(fit_in, fit_out)
    mu_in, n_in, mu_out, n_out = fit_in.mean, fit_in.count, fit_out.mean, fit_out.count
    var_in, var_out = _variance(fit_in, pooled, per_record), _variance(fit_out, pooled, per_record)
    both = (n_in > 0) & (n_out > 0)
    if not bool(both.any()):
        raise FedauditError("online LiRA needs records that are IN for some reference models and OUT for others; "
                            "build the masks with inclusion_masks(n_records, n_models >= 2, generator)")
    missing = ~both
    if bool(missing.any()):
        shift = float((mu_in[both] - mu_out[both]).mean())
        mu_in = torch.where(n_in > 0, mu_in, mu_out + shift)
        mu_out = torch.where(n_out > 0, mu_out, mu_in - shift)
        warnings.warn(f"online LiRA: {int(missing.sum())} record(s) are IN (or OUT) for no reference model; "
                      f"their missing mean is the other mean shifted by the average IN-OUT gap {shift:.3g}",
                      stacklevel=2)
    return _normal_logpdf(target, mu_in, var_in) - _normal_logpdf(target, mu_out, var_out)


def lira_offline(target_phi: ArrayLike, ref_phi: ArrayLike, ref_in_mask: ArrayLike,
                 global_variance: bool | None = None) -> Tensor:
    """Offline LiRA score per record from OUT reference models only: −log Pr[Z > φ], Z ~ N(μ_out, σ²_out).

    A monotone transform of the paper's OUT-CDF (same ROC), exact in the far
    tail. Records OUT for no reference model use the pooled OUT mean.
    Higher = member.
    """
    target, ref, mask = _check_reference(target_phi, ref_phi, ref_in_mask, "offline LiRA")
    out = ~mask
    if not bool(out.any()):
        raise FedauditError("offline LiRA needs OUT reference signals and every record is IN for every reference "
                            "model; build the masks with inclusion_masks(n_records, n_models >= 2, generator)")
    fit_out = _gaussian_fit(ref, out)
    mu_out, n_out = fit_out.mean, fit_out.count
    var_out = _variance(fit_out, _pooled(fit_out), not _use_global_variance(global_variance, ref.shape[0]))
    if bool((n_out == 0).any()):
        fallback = float(ref[out].mean())
        mu_out = torch.where(n_out > 0, mu_out, torch.full_like(mu_out, fallback))
        warnings.warn(f"offline LiRA: {int((n_out == 0).sum())} record(s) are OUT for no reference model; "
                      f"they are tested against the pooled OUT mean {fallback:.3g}", stacklevel=2)
    return -torch.special.log_ndtr((mu_out - target) / var_out.sqrt())


CALIBRATION_LIMIT = 1.0  # |mean standardised gap| above this: the reference models do not describe the target


def lira_calibration(target_phi: ArrayLike, ref_phi: ArrayLike, ref_in_mask: ArrayLike, is_member: ArrayLike) -> dict[str, Any]:
    """How well the reference models stand in for the target (the auditor's check; it needs the truth).

    LiRA assumes a non-member's signal under the target looks like its
    signal under the reference models that did not train on it (OUT), and a
    member's like under those that did (IN). ``out_gap`` is the mean over the
    target's non-members of (φ_target − μ_out) in units of the pooled
    reference spread, ``in_gap`` the same over members against μ_in. Both near
    0: calibrated. Reference models trained less than the target (fewer epochs,
    alone rather than in the federation) leave the target more confident on
    every record, so both gaps come out positive and LiRA mistakes that for
    membership or misses it. ``status`` is "miscalibrated" when either gap
    exceeds :data:`CALIBRATION_LIMIT` in size.
    """
    target, ref, mask = _check_reference(target_phi, ref_phi, ref_in_mask, "LiRA calibration")
    member = torch.as_tensor(is_member).bool().cpu()
    fit_in, fit_out = _gaussian_fit(ref, mask), _gaussian_fit(ref, ~mask)
    sigma = math.sqrt(_pooled(fit_in, fit_out))

    def gap(mu: Tensor, rows: Tensor) -> float:
        ok = rows & torch.isfinite(mu)
        return float(((target[ok] - mu[ok]) / sigma).mean()) if bool(ok.any()) else float("nan")

    out_gap, in_gap = gap(fit_out.mean, ~member), gap(fit_in.mean, member)
    bad = any(math.isfinite(g) and abs(g) > CALIBRATION_LIMIT for g in (out_gap, in_gap))
    return {"out_gap": out_gap, "in_gap": in_gap, "sigma": sigma, "limit": CALIBRATION_LIMIT,
            "status": "miscalibrated" if bad else "calibrated"}


# -- RMIA ------------------------------------------------------------------------


def rmia_score(target_p_x: ArrayLike, ref_p_x: ArrayLike, ref_in_mask_x: ArrayLike, target_p_z: ArrayLike,
               ref_p_z: ArrayLike, gamma: float = RMIA_GAMMA, a: float = RMIA_OFFLINE_A, offline: bool = False) -> Tensor:
    """RMIA score per record x: the fraction of population records z with LR(x, z) ≥ γ.

    ``target_p_x`` [n] and ``ref_p_x`` [N, n] are Pr(x|θ) from :func:`rmia_prob`
    under the target and the reference models; ``ref_in_mask_x`` [N, n] as in
    LiRA; ``target_p_z`` [k] and ``ref_p_z`` [N, k] the same for the population
    (OUT for every reference model). Online, Pr(x) is the mean over all
    reference models; offline, ½[(1+a)·Pr_OUT(x) + (1−a)]. Higher = member;
    the score takes k + 1 values (k population records resolve it).
    """
    if not gamma > 0:
        raise FedauditError(f"RMIA gamma must be > 0, got {gamma!r}; the paper uses 2")
    if not 0.0 <= a <= 1.0:
        raise FedauditError(f"RMIA offline a must be in [0, 1], got {a!r}; the paper uses 0.3 (tune on reference models)")
    px, ref_x, mask = _check_reference(target_p_x, ref_p_x, ref_in_mask_x, "RMIA")
    pz = torch.as_tensor(target_p_z).double().cpu()
    ref_z = torch.as_tensor(ref_p_z).double().cpu()
    if pz.dim() != 1 or pz.numel() == 0 or ref_z.shape != (ref_x.shape[0], pz.shape[0]):
        raise ValueError(f"RMIA population: expected target [k >= 1] and reference [N, k]; got "
                         f"{tuple(pz.shape)}, {tuple(ref_z.shape)}")
    if offline:
        out = ~mask
        if not bool(out.any()):
            raise FedauditError("offline RMIA needs OUT reference signals and every record is IN for every reference "
                                "model; build the masks with inclusion_masks(n_records, n_models >= 2, generator)")
        n_out = out.double().sum(0)
        mean_out = (ref_x * out).sum(0) / n_out
        if bool((n_out == 0).any()):
            fallback = float(ref_x[out].mean())
            mean_out = torch.where(n_out > 0, mean_out, torch.full_like(mean_out, fallback))
            warnings.warn(f"offline RMIA: {int((n_out == 0).sum())} record(s) are OUT for no reference model; "
                          f"their Pr_OUT is the pooled OUT mean {fallback:.3g}", stacklevel=2)
        prior_x = 0.5 * ((1 + a) * mean_out + (1 - a))
        prior_z = 0.5 * ((1 + a) * ref_z.mean(0) + (1 - a))
    else:
        prior_x, prior_z = ref_x.mean(0), ref_z.mean(0)
    tiny = torch.finfo(torch.float64).tiny
    ratio_x = px / prior_x.clamp_min(tiny)
    ratio_z, _ = (pz / prior_z.clamp_min(tiny)).sort()
    # LR(x, z) >= gamma  <=>  ratio_z <= ratio_x / gamma: count by binary search, not an [n, k] matrix.
    count = torch.searchsorted(ratio_z, ratio_x / gamma, right=True)
    return count.double() / ratio_z.numel()


# -- artifact statistics (the ``artifact`` variant: membership from what a client shared) ----------


def nearest_entry_scores(candidates: Tensor, bank: Tensor, chunk: int = 1024) -> Tensor:
    """Per-record bank test: −(Euclidean distance from each candidate's own artifact [n, D] to its nearest
    bank entry [m, D]). A member whose artifact is in the bank scores 0, the maximum."""
    if candidates.dim() != 2 or bank.dim() != 2 or candidates.shape[1] != bank.shape[1]:
        raise ValueError(f"candidates {tuple(candidates.shape)} and bank {tuple(bank.shape)} must be [n, D] and [m, D]")
    bank = bank.double()
    out = [torch.cdist(candidates[i:i + chunk].double(), bank).amin(dim=1) for i in range(0, candidates.shape[0], chunk)]
    return -torch.cat(out)


def tracing_scores(features: Tensor, shared: Tensor) -> Tensor:
    """Aggregate-statistics test: is the candidate's feature vector y ∈ R^d pulled into the shared mean a?

    The tracing attack of Dwork, Smith, Steinke, Ullman and Vadhan (FOCS 2015), a linearised form of the
    likelihood-ratio test of Homer et al. (2008) and Sankararaman et al. (2009), whitened:

        score(y) = (y − p)ᵀ Σ⁻¹ (a − p)

    with p and Σ the population's mean and covariance. The candidates [n, d] (members and non-members
    alike, as the attacker receives them) are their own population: other domains' records would differ
    by their domain, not by membership. Each statistic is standardised, then Σ is the correlation matrix
    shrunk toward the identity with the Ledoit–Wolf weight (:func:`ledoit_wolf_shrinkage`): a network's
    per-channel statistics are strongly correlated, and whitening them lifted the test's AUC on the
    statistics of 14 records from 0.65 (standardised only) to 1.00 (``scripts/tracing_whitening.py``). Its signal grows like
    d/n for a mean over n records while its noise grows like √d: the power rises with the number of
    statistics shared and falls with the records behind them. Solved in whichever of the d- or
    n-dimensional spaces is smaller (Woodbury). The score is a symmetric function of the candidates, so
    with no membership signal members and non-members stay exchangeable. Higher = member."""
    y = features.double()
    a = shared.double().reshape(1, -1)
    if y.dim() != 2 or y.shape[1] != a.shape[1]:
        raise ValueError(f"features {tuple(features.shape)} and shared statistics {tuple(shared.shape)} do not match")
    n, d = y.shape
    if n < 3:
        raise ValueError("the tracing test needs at least 3 candidates to estimate the population from them")
    p = y.mean(0, keepdim=True)
    sd = y.std(0, keepdim=True)
    sd = torch.where(sd > 0, sd, torch.ones_like(sd))  # a constant statistic carries nothing: left unscaled
    z, t = (y - p) / sd, ((a - p) / sd).T  # [n, d], [d, 1]
    lam = max(ledoit_wolf_shrinkage(z), 1e-6)
    c = (1.0 - lam) / n  # Σ = λ·I + c·zᵀz
    if c == 0.0:  # full shrinkage: Σ = I
        w = t
    elif d <= n:
        w = torch.linalg.solve(lam * torch.eye(d, dtype=z.dtype, device=z.device) + c * (z.T @ z), t)
    else:
        inner = torch.linalg.solve(lam / c * torch.eye(n, dtype=z.dtype, device=z.device) + z @ z.T, z @ t)
        w = (t - z.T @ inner) / lam
    return (z @ w).squeeze(1)


def ledoit_wolf_shrinkage(z: Tensor) -> float:
    """The Ledoit–Wolf (2004) weight λ ∈ [0, 1] of the identity in λ·I + (1 − λ)·R, R = zᵀz/n the sample
    correlation of standardised rows z [n, d]; from the n×n Gram matrix, so d may be large."""
    n, d = z.shape
    gram = z @ z.T
    r2 = gram.square().sum() / n**2  # ‖R‖²_F
    spread = (z.square().sum(1).square() - 2.0 * gram.square().sum(1) / n + r2).sum() / n**2
    distance = r2 - 2.0 * z.square().sum() / n + d  # ‖R − I‖²_F
    if float(distance) <= 0.0:
        return 1.0
    return float((spread / distance).clamp(0.0, 1.0))


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
