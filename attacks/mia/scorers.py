"""Membership-inference scorers: per-record signals and attack scores (the attacker's side).

Pure functions, no I/O. An attack module feeds them the target model's logits
on the victim's members and holdouts (and their flips), the logits of N
reference models trained on random halves of that pool (see
:mod:`fedaudit.attacks.mia.reference_models`), the inclusion masks, and the logits on a
population (other domains' holdouts); the auditor then scores members against
non-members with
:func:`fedaudit.statistics.membership_statistics.membership_metrics`::

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
* LiRA's attack (not these functions, which are the paper's statistic) first moves the target's φ by
  :func:`reference_offset`: the mean over the unlabelled challenge of φ_target − (the record's mean over all
  reference models). A target that is uniformly more confident than its references (a replay that cannot
  reproduce the other clients' training exactly, references capped in epochs) reads every record as a member
  to LiRA online's likelihood ratio; the shift removes that uniform part without the truth, under the
  assumption that the challenge holds members in the proportion the references hold IN records. The auditor
  stores the offset before and after it (``calibration``).
* RMIA population records are OUT for every reference model, so offline
  Pr(z) applies the same (1+a) correction to their mean over all reference
  models (the paper's offline approximation, applied to x and z alike).
  The score is a monotone function of Pr(x|θ)/Pr(x), so this choice moves
  only the score's scale, never the ROC.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from fedaudit.errors import FedauditError
from fedaudit.statistics.membership_statistics import (
    ArrayLike,
    check_reference,
    fit_variance,
    gaussian_fit,
    pooled_variance,
)

GLOBAL_VARIANCE_BELOW = 64  # fewer reference models than this: one pooled variance (Carlini et al. 2022)
RMIA_TEMPERATURE, RMIA_GAMMA, RMIA_OFFLINE_A = 2.0, 2.0, 0.3


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
              flipped_logits: Tensor | None = None, shift: float = 0.0) -> Tensor:
    """RMIA's Pr(x|θ): softmax probability of the true label at ``temperature``, [..., n] (float64).

    With ``flipped_logits`` the mean of both views' probabilities. ``shift`` is taken off the true label's logit
    first, which lowers LiRA's φ by exactly ``shift`` (:func:`reference_offset`): RMIA then scores the target
    LiRA scores.
    """
    if not temperature > 0:
        raise FedauditError(f"RMIA temperature must be > 0, got {temperature!r}; the paper uses 2")
    idx = _true_label_index(logits, labels)
    z = logits.double()
    if shift:
        z = z.scatter(-1, idx, z.gather(-1, idx) - shift)
    p = torch.log_softmax(z / temperature, dim=-1).gather(-1, idx).squeeze(-1).exp()
    if flipped_logits is not None:
        p = 0.5 * (p + rmia_prob(flipped_logits, labels, temperature, shift=shift))
    return p


# -- LiRA ------------------------------------------------------------------------


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
    target, ref, mask = check_reference(target_phi, ref_phi, ref_in_mask, "online LiRA")
    per_record = not _use_global_variance(global_variance, ref.shape[0])
    fit_in, fit_out = gaussian_fit(ref, mask), gaussian_fit(ref, ~mask)
    pooled = pooled_variance(fit_in, fit_out)
    mu_in, n_in, mu_out, n_out = fit_in.mean, fit_in.count, fit_out.mean, fit_out.count
    var_in, var_out = fit_variance(fit_in, pooled, per_record), fit_variance(fit_out, pooled, per_record)
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


def reference_offset(target_phi: ArrayLike, ref_phi: ArrayLike) -> float:
    """How much more confident the target is than its reference models on the challenge as a whole: the mean
    over records of φ_target − (the record's mean φ over every reference model, IN and OUT alike).

    No truth is used: a record's all-model mean mixes IN and OUT in the proportion its references hold it, which
    is the challenge's member fraction when the pool is the victim's training set and its non-members (as
    :func:`fedaudit.attacks.mia.reference_models.inclusion_masks` sizes a replay). Then the offset is zero for
    references that stand in for the target, and the target's uniform lift over them otherwise.
    """
    target = torch.as_tensor(target_phi).double().cpu()
    ref = torch.as_tensor(ref_phi).double().cpu()
    if ref.dim() != 2 or ref.shape[1] != target.shape[0] or ref.shape[0] < 1:
        raise ValueError(f"reference offset: expected target [n] and reference [N >= 1, n]; got "
                         f"{tuple(target.shape)}, {tuple(ref.shape)}")
    gap = target - ref.mean(0)
    ok = torch.isfinite(gap)
    return float(gap[ok].mean()) if bool(ok.any()) else 0.0


def lira_offline(target_phi: ArrayLike, ref_phi: ArrayLike, ref_in_mask: ArrayLike,
                 global_variance: bool | None = None) -> Tensor:
    """Offline LiRA score per record from OUT reference models only: −log Pr[Z > φ], Z ~ N(μ_out, σ²_out).

    A monotone transform of the paper's OUT-CDF (same ROC), exact in the far
    tail. Records OUT for no reference model use the pooled OUT mean.
    Higher = member.
    """
    target, ref, mask = check_reference(target_phi, ref_phi, ref_in_mask, "offline LiRA")
    out = ~mask
    if not bool(out.any()):
        raise FedauditError("offline LiRA needs OUT reference signals and every record is IN for every reference "
                            "model; build the masks with inclusion_masks(n_records, n_models >= 2, generator)")
    fit_out = gaussian_fit(ref, out)
    mu_out, n_out = fit_out.mean, fit_out.count
    var_out = fit_variance(fit_out, pooled_variance(fit_out), not _use_global_variance(global_variance, ref.shape[0]))
    if bool((n_out == 0).any()):
        fallback = float(ref[out].mean())
        mu_out = torch.where(n_out > 0, mu_out, torch.full_like(mu_out, fallback))
        warnings.warn(f"offline LiRA: {int((n_out == 0).sum())} record(s) are OUT for no reference model; "
                      f"they are tested against the pooled OUT mean {fallback:.3g}", stacklevel=2)
    return -torch.special.log_ndtr((mu_out - target) / var_out.sqrt())


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
    px, ref_x, mask = check_reference(target_p_x, ref_p_x, ref_in_mask_x, "RMIA")
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


def consistency(embeddings: Tensor, pairs: int) -> Tensor:
    """Mean cosine of view pairs: [..., 2·pairs·n, D] laid out as pair k's A views then its B views → [..., n] (float64)."""
    e = embeddings.double()
    n = e.shape[-2] // (2 * pairs)
    e = e.reshape(*e.shape[:-2], pairs, 2, n, e.shape[-1])
    return F.cosine_similarity(e[..., 0, :, :], e[..., 1, :, :], dim=-1).mean(-2)


def fisher_z(c: Tensor) -> Tensor:
    """atanh of a cosine, clamped off ±1 so a perfectly consistent record stays finite."""
    return torch.atanh(c.double().clamp(-1 + 1e-6, 1 - 1e-6))


