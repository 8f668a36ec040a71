"""The one-run ε lower bound of Steinke, Nasr & Jagielski (NeurIPS 2023): pure statistics, no I/O.

"Privacy Auditing with One (1) Training Run" (arXiv:2305.08846). The auditor
holds m canaries, each included in the training set independently with
probability ½, trains once, and makes r guesses ("in" / "out", abstaining on
the other m − r); v of them are correct. If the training algorithm is
(ε, δ)-DP (add/remove one record), the paper's main theorem for approximate DP
bounds the chance of that many correct guesses::

    q      = e^ε / (1 + e^ε)                         (accuracy of ε-DP randomised response)
    f(u)   = P[Binomial(r, q) ≥ u]
    P[W ≥ v] ≤ f(v) + 2·m·δ · max_{i = 1..v} (f(v − i) − f(v)) / i

The right-hand side is the p-value of the null hypothesis "the algorithm is
(ε, δ)-DP" (:func:`p_value`); f(v − i) − f(v) = P[v − i ≤ Binomial(r, q) ≤ v − 1].
With δ = 0 it is exactly the Binomial tail. The ε lower bound at confidence
1 − β is the largest ε whose p-value is still below β: every smaller ε is then
rejected too, because (ε', δ)-DP implies (ε, δ)-DP for ε' ≤ ε
(:func:`epsilon_lower_bound`, bisection that keeps p(lower end) < β, so the
returned value is never above the crossing; tolerance ``TOL``).

Checked against (numbers, not code; nothing was copied): the paper's
published Python (``p_value_DP_audit`` / ``get_eps_audit``, as quoted with a
citation of the paper in ``one_run_audit/equations.py`` of
git.mami2.moe/626_privacy/mia_on_model_distillation) and Google DeepMind's
independent implementation (google-deepmind/jax_privacy,
``jax_privacy/auditing.py``: ``_one_run_p_value``). On a grid of (m, r, v, δ, ε)
the three p-values agreed to 4e-16 and the bounds to 1e-9 (the paper's code
bisects 30 times). The quoted file's own example, m = 1000, r = v = 600,
δ = 1e-5 at 95%, gives ε ≥ 5.270399; tests/test_canary.py holds this module to
that number and to the closed form at δ = 0.

Choosing the number of guesses (a choice, and its price): guesses are the k
highest scores ("in") and the k lowest ("out"), r = 2k. k is not fixed in
advance: the audit tries every k of a grid fixed *before* looking at the
scores (:func:`k_grid`: m/8, m/4 and m/2, rounded, at least 1) and reports the
best. Picking the best after looking is a multiple test, so each k is tested
at β / |grid| (Bonferroni): the probability that *any* of the grid's bounds
exceeds the true ε is at most β, so the reported maximum holds with
confidence 1 − β. The paper's experiments also sweep the number of guesses;
this module pays for the sweep instead of reporting an uncorrected maximum.

Power: with r guesses the audit can never certify more than
:func:`epsilon_max_certifiable` (all r correct). At δ = 0 that is
log(q/(1 − q)) with q = β^(1/r) — about 3 for r = 64 at 95%: certifying
ε = 8 needs thousands of canaries. A bound of 0 from a weak audit says nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

TOL = 1e-9  # bisection stops when the bracket is this narrow (ε units)
MAX_EPSILON = 1e4  # no finite r can certify more; a search that gets here has a bug
K_FRACTIONS = (1 / 8, 1 / 4, 1 / 2)  # k as fractions of m, fixed before any score is seen
CORRECTION = "bonferroni"


def _check_counts(m: int, r: int, v: int) -> None:
    for name, x in (("m", m), ("r", r), ("v", v)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {x!r}")
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")


def _check_levels(delta: float, confidence: float) -> None:
    if not (0.0 <= delta <= 1.0):
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if not (0.5 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence!r}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of "(ε, δ)-DP" after ``v`` correct of ``r`` guesses on ``m`` canaries (the paper's bound)."""
    from scipy.stats import binom

    _check_counts(m, r, v)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if v == 0:
        return 1.0
    q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0
    tail = float(binom.sf(v - 1, r, q))  # f(v) = P[B >= v]
    if delta == 0.0:
        return min(tail, 1.0)
    # band[i-1] = P[v - i <= B <= v - 1] = f(v - i) - f(v), summed from the pmf (no cancellation)
    band = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.max(band / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε whose (ε, δ)-DP hypothesis the guesses reject at level 1 − ``confidence`` (0 if none).

    ``v <= r/2`` always gives 0 (the p-value at ε = 0 is at least ½); all ``r``
    correct gives the finite :func:`epsilon_max_certifiable`.
    """
    _check_counts(m, r, v)
    _check_levels(delta, confidence)
    beta = 1.0 - confidence
    if r == 0 or p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0  # invariant: p(lo) < beta <= p(hi)
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2.0 * hi
        if hi > MAX_EPSILON:
            raise ArithmeticError(f"no ε up to {MAX_EPSILON:g} is consistent with m={m}, r={r}, v={v}; this cannot happen")
    while hi - lo > TOL:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


def epsilon_max_certifiable(m: int, r: int, delta: float, confidence: float = 0.95) -> float:
    """The audit's power: the bound if all ``r`` guesses were correct."""
    return epsilon_lower_bound(m, r, r, delta, confidence)


def k_grid(m: int, fractions: Sequence[float] = K_FRACTIONS) -> list[int]:
    """Guesses per side tried by :func:`audit`: m/8, m/4, m/2 by default (rounded, at least 1, distinct)."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 2:
        raise ValueError(f"need at least 2 canaries, got {m!r}")
    return sorted({max(1, min(m // 2, round(m * f))) for f in fractions})


def ceiling(m: int, delta: float, confidence: float = 0.95, fractions: Sequence[float] = K_FRACTIONS) -> float:
    """The most an audit of ``m`` canaries over ``k_grid(m, fractions)`` can certify (every guess right)."""
    grid = k_grid(m, fractions)
    per_test = 1.0 - (1.0 - confidence) / len(grid)
    return max(epsilon_max_certifiable(m, 2 * k, delta, per_test) for k in grid)


def p_value_of_claim(m: int, per_k: Sequence[dict[str, Any]], epsilon: float, delta: float) -> float:
    """The p-value of "the training is (``epsilon``, δ)-DP" from an audit's per-k counts: the smallest over the
    grid, Bonferroni-corrected for having looked at every k (the same price :func:`audit` pays for its bound)."""
    return min(1.0, len(per_k) * min(p_value(m, int(row["guesses"]), int(row["correct"]), float(epsilon), delta)
                                     for row in per_k))


def gaussian_fit(scores: Sequence[float] | np.ndarray, included: Sequence[bool] | np.ndarray) -> dict[str, float]:
    """The one-shot estimate's statistic (Andrew et al., ICLR 2024): the included canaries' mean score above the
    excluded ones', in units of the pooled standard deviation (μ of the Gaussian pair that fits them). An
    estimate of the privacy loss of the mechanism as run, not a bound."""
    s, truth = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    a, b = s[truth], s[~truth]
    if a.size < 2 or b.size < 2:
        raise ValueError("the Gaussian fit needs at least 2 included and 2 excluded canaries")
    pooled = math.sqrt(((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2))
    return {"mu": float((a.mean() - b.mean()) / pooled) if pooled > 0 else math.inf,
            "mean_included": float(a.mean()), "mean_excluded": float(b.mean()), "pooled_std": pooled}


def ideal_bound(included: Sequence[bool] | np.ndarray, mu: float, delta: float, confidence: float = 0.95,
                fractions: Sequence[float] = K_FRACTIONS, repeats: int = 9, seed: int = 0) -> float:
    """What this audit certifies, as a median over ``repeats`` draws, when every canary's score is Gaussian and
    an included one sits ``mu`` standard deviations higher — the scores of a mechanism exactly μ-GDP, i.e. one
    that spends exactly the claimed ε. The yardstick for a real audit of the same m canaries."""
    truth = np.asarray(included, dtype=bool)
    rng = np.random.default_rng(seed)
    grid = k_grid(int(truth.size), fractions)
    bounds = [audit(rng.normal(size=truth.size) + mu * truth, truth, delta, confidence, grid)["epsilon_lower_bound"]
              for _ in range(repeats)]
    return float(np.median(bounds))


def guesses(scores: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """+1 ("in") for the ``k`` highest scores, −1 ("out") for the ``k`` lowest, 0 (abstain) for the rest.

    Ties are broken by position (a stable sort), so the caller's order must not
    depend on the truth.
    """
    s = np.asarray(scores, dtype=np.float64)
    if not 1 <= k <= s.size // 2:
        raise ValueError(f"k must be between 1 and half the {s.size} canaries, got {k}")
    order = np.argsort(s, kind="stable")
    out = np.zeros(s.size, dtype=np.int8)
    out[order[-k:]] = 1
    out[order[:k]] = -1
    return out


def audit(scores: Sequence[float] | np.ndarray, included: Sequence[bool] | np.ndarray, delta: float,
          confidence: float = 0.95, grid: Sequence[int] | None = None) -> dict[str, Any]:
    """The one-run audit of one victim's canaries: scores (higher = looks included) and the inclusion truth.

    Returns the best Bonferroni-corrected bound over ``grid`` (default
    :func:`k_grid`) with the counts behind it, the audit's power and every k's
    row. JSON-able.
    """
    s = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(included, dtype=bool)
    if s.shape != truth.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and inclusion {truth.shape} must be matching vectors")
    if not np.all(np.isfinite(s)):
        raise ValueError("canary scores must be finite")
    _check_levels(delta, confidence)
    m = int(s.size)
    ks = list(grid) if grid is not None else k_grid(m)
    if not ks:
        raise ValueError("the k grid is empty")
    per_test = 1.0 - (1.0 - confidence) / len(ks)
    rows = []
    for k in ks:
        g = guesses(s, k)
        r = int(np.count_nonzero(g))
        v = int(np.count_nonzero((g == 1) & truth) + np.count_nonzero((g == -1) & ~truth))
        rows.append({"k": int(k), "guesses": r, "correct": v,
                     "epsilon_lower_bound": epsilon_lower_bound(m, r, v, delta, per_test),
                     "epsilon_max_certifiable": epsilon_max_certifiable(m, r, delta, per_test)})
    best = max(rows, key=lambda row: (row["epsilon_lower_bound"], row["k"]))
    return {
        "epsilon_lower_bound": best["epsilon_lower_bound"],
        "confidence": confidence,
        "delta": delta,
        "canaries": m,
        "included": int(truth.sum()),
        "guesses": best["guesses"],
        "correct": best["correct"],
        "k": best["k"],
        "k_grid": [int(k) for k in ks],
        "correction": CORRECTION,
        "confidence_per_k": per_test,
        "epsilon_max_certifiable": max(row["epsilon_max_certifiable"] for row in rows),
        "per_k": rows,
    }


__all__ = ["audit", "ceiling", "epsilon_lower_bound", "epsilon_max_certifiable", "gaussian_fit", "guesses",
           "ideal_bound", "k_grid", "p_value", "p_value_of_claim"]
