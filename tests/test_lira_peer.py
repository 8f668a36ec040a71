"""Issue 57 item 5: fedaudit's LiRA agrees with an independent implementation of the published statistic.

The peer below is written here from Carlini et al., "Membership Inference Attacks From First Principles" (S&P 2022),
Algorithm 1 and §VI, with numpy and scipy, record by record, sharing no code with fedaudit: per record, the
logit-scaled confidence φ = log p_y − log(1 − p_y) of each reference model, the mean and variance of the IN and OUT
models' φ, the online score log N(φ_target; μ_in, σ²_in) − log N(φ_target; μ_out, σ²_out) and the offline one-sided
test Pr[Z > φ_target], Z ~ N(μ_out, σ²_out), scored as −log of it. The estimator choices fedaudit documents
(fedaudit.attacks.mia.scorers) are taken as stated there: unbiased per-record variances from 64 reference models up,
below that one variance for all records pooled from each record's residuals around its own IN and OUT means (the
paper's "global variance"; offline: OUT residuals only). The test fails when fedaudit's statistic is perturbed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import special, stats

from fedaudit.attacks.mia import scorers
from fedaudit.attacks.mia.scorers import lira_offline, lira_online, lira_signal


def peer_phi(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """φ from softmax probabilities, as the paper defines it: log(p_y / (1 − p_y)), [..., n, C] → [..., n]."""
    p = special.softmax(logits.astype(np.float64), axis=-1)
    p_y = np.take_along_axis(p, np.broadcast_to(labels[..., None], p.shape[:-1] + (1,)), -1)[..., 0]
    return np.log(p_y) - np.log1p(-p_y)


def peer_lira(target: np.ndarray, ref: np.ndarray, keep: np.ndarray, global_variance: bool) -> tuple[np.ndarray, ...]:
    """(online, offline) scores per record, record by record."""
    n = target.shape[0]
    mu_in, mu_out, var_in, var_out = (np.empty(n) for _ in range(4))
    resid_in = resid_out = dof_in = dof_out = 0.0
    for j in range(n):
        ins, outs = ref[keep[:, j], j], ref[~keep[:, j], j]
        mu_in[j], mu_out[j] = ins.mean(), outs.mean()
        var_in[j], var_out[j] = ins.var(ddof=1), outs.var(ddof=1)
        resid_in += ((ins - mu_in[j]) ** 2).sum()
        resid_out += ((outs - mu_out[j]) ** 2).sum()
        dof_in += ins.size - 1
        dof_out += outs.size - 1
    if global_variance:
        var_in = var_out = np.full(n, (resid_in + resid_out) / (dof_in + dof_out))
        var_offline = np.full(n, resid_out / dof_out)
    else:
        var_offline = var_out
    online = (stats.norm.logpdf(target, mu_in, np.sqrt(var_in))
              - stats.norm.logpdf(target, mu_out, np.sqrt(var_out)))
    offline = -stats.norm.logsf(target, mu_out, np.sqrt(var_offline))
    return online, offline


def _fixture(models: int, n: int = 60, classes: int = 5, seed: int = 0):
    """Per-model logits [N, n, C] of reference models and the target's [n, C]: members sit higher on their label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    keep = np.zeros((models, n), dtype=bool)
    for j in range(n):  # every record IN for half the models
        keep[rng.permutation(models)[: models // 2], j] = True
    base = rng.normal(0.0, 1.0, (n, classes))
    ref = base + rng.normal(0.0, 0.6, (models, n, classes))
    ref[..., np.arange(n), labels] += 1.5 * keep  # training on a record raises its own logit
    member = rng.random(n) < 0.5
    target = base + rng.normal(0.0, 0.6, (n, classes))
    target[np.arange(n), labels] += 1.5 * member
    return target, ref, keep, labels


@pytest.mark.parametrize("models", [8, 64])
def test_fedaudits_lira_agrees_with_the_published_statistic(models):
    target, ref, keep, labels = _fixture(models)
    y = torch.as_tensor(labels)
    phi_t = lira_signal(torch.as_tensor(target), y)
    phi_r = lira_signal(torch.as_tensor(ref), y)
    np.testing.assert_allclose(phi_t.numpy(), peer_phi(target, labels), rtol=0, atol=1e-9)
    np.testing.assert_allclose(phi_r.numpy(), peer_phi(ref, labels), rtol=0, atol=1e-9)
    online, offline = peer_lira(peer_phi(target, labels), peer_phi(ref, labels), keep, global_variance=models < 64)
    mask = torch.as_tensor(keep)
    np.testing.assert_allclose(lira_online(phi_t, phi_r, mask).numpy(), online, rtol=0, atol=1e-6)
    np.testing.assert_allclose(lira_offline(phi_t, phi_r, mask).numpy(), offline, rtol=0, atol=1e-6)


@pytest.mark.parametrize("perturb", ["variance", "mean", "likelihood"])
def test_the_agreement_fails_when_fedaudits_statistic_is_perturbed(perturb, monkeypatch):
    """The comparison can fail: a variance 0.1% off, a mean moved by 1e-4, a likelihood with a stray constant."""
    target, ref, keep, labels = _fixture(8)
    if perturb == "variance":
        real = scorers.pooled_variance
        monkeypatch.setattr(scorers, "pooled_variance", lambda *fits: real(*fits) * 1.001)
    elif perturb == "mean":
        real_fit = scorers.gaussian_fit
        monkeypatch.setattr(scorers, "gaussian_fit", lambda r, m: real_fit(r, m)._replace(mean=real_fit(r, m).mean + 1e-4))
    else:
        real_pdf = scorers._normal_logpdf
        monkeypatch.setattr(scorers, "_normal_logpdf", lambda x, mu, var: real_pdf(x, mu, var) * (1 + 1e-5))
    y = torch.as_tensor(labels)
    phi_t, phi_r = lira_signal(torch.as_tensor(target), y), lira_signal(torch.as_tensor(ref), y)
    online, offline = peer_lira(peer_phi(target, labels), peer_phi(ref, labels), keep, global_variance=True)
    mask = torch.as_tensor(keep)
    ours = (lira_online(phi_t, phi_r, mask).numpy(), lira_offline(phi_t, phi_r, mask).numpy())
    assert max(np.abs(ours[0] - online).max(), np.abs(ours[1] - offline).max()) > 1e-6
