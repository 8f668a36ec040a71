"""Confidence intervals shared by the leakage and membership statistics."""

from __future__ import annotations


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for ``k`` successes in ``n`` trials.

    scipy ships with scikit-learn (a dependency), so its beta quantiles are
    always there.
    """
    from scipy.stats import beta

    if n <= 0:
        return (0.0, 1.0)
    alpha = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return (lo, hi)
