"""The Gaussian mechanism's privacy in (ε, δ): one exact conversion from μ-GDP, shared by the DP-SGD accountant
(full-batch steps compose into one Gaussian mechanism) and the one-run audit's f-DP bounds."""

from __future__ import annotations

import math


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε at ``delta`` of the Gaussian mechanism with sensitivity / noise = ``mu`` (μ-GDP), exactly (Balle & Wang
    2018, Thm 8; Dong, Roth & Su 2019): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), solved for ε."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def delta_at(eps: float) -> float:  # e^ε Φ(·) as exp(ε + logΦ(·)): no overflow at large ε
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)))

    if delta_at(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_at(hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: delta_at(e) - delta, 0.0, hi, xtol=1e-10))
