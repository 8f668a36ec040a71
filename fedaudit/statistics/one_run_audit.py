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

The f-DP test (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential
Privacy in One Run", ICML 2025, arXiv:2410.22235): the same game and guesses,
judged against a whole trade-off curve instead of one (ε, δ) pair. The
(ε, δ) analysis above pays δ on every canary (the 2·m·δ term), so what m
canaries can certify stops growing with m: at δ = 1e-5 and 95%, with every
guess right, a single test of all m guesses certifies at most about 8.2 (near
m = 3·10⁴; 7.83 at m = 10⁴), and this module's Bonferroni grid at most about
7.1 (near m = 10⁴; tests/test_canary.py holds these numbers). A claim stated
as a curve has no such free mass. Full-batch DP-SGD claims exactly one (its accountant's curve is μ-GDP,
μ = √(Σ steps / σ²)), so the test of that claim is as sharp as the mechanism.
The paper bounds P[≥ v of r guesses right] for an f-DP mechanism by a
backward recursion over i = v − 1 … 0 from r_v = τ·v/m, h_v = τ·(r − v)/m::

    h_i = max(h_{i+1}, f⁻(r_{i+1}))
    r_i = r_{i+1} + i / (r − i) · (h_i − h_{i+1})

where f⁻(x) is the smallest type-I error at which a test of one canary's
inclusion reaches power x under the curve (:func:`gaussian_curve`,
:func:`dp_curve`). If that probability were τ, then r_0 + h_0 ≤ r/m; so the
largest τ meeting it bounds the probability, and is the p-value of "the
mechanism is f-DP" (:func:`curve_p_value`; r_0 + h_0 grows with τ, bisection).
:func:`gdp_lower_bound` is the largest μ that the guesses reject ("not μ-GDP"),
the paper's empirical privacy; ε(μ, δ) of it is an ε lower bound only for
mechanisms whose curve is Gaussian, which the report says. Written from the
paper's procedure and checked against (numbers, not code) Meta's
implementation of it (facebookresearch/PrivacyGuard,
``privacy_guard/analysis/mia/fdp_analysis_node.py``); tests/test_canary.py holds
it to known truth: simulated μ-GDP canaries are never rejected at their own μ
more often than the level allows, and a μ four times larger is.

Power: with r guesses the audit can never certify more than
:func:`epsilon_max_certifiable` (all r correct). At δ = 0 that is
log(q/(1 − q)) with q = β^(1/r) — about 3 for r = 64 at 95%: certifying
ε = 8 needs thousands of canaries. A bound of 0 from a weak audit says nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedaudit.statistics.gaussian_dp import gaussian_epsilon

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


# -- the f-DP test ----------------------------------------------------------------------------------------

InversePower = Callable[[np.ndarray], np.ndarray]  # x ↦ the smallest type-I error at which a test reaches power x
GRID_POINTS = 256  # candidates per pass of the vectorised searches (numpy's per-call cost dominates below ~1,000)


def gaussian_curve(mu: float | np.ndarray) -> InversePower:
    """μ-GDP's inverse power: a test of power x needs type-I error Φ(Φ⁻¹(x) − μ) at least (``mu`` may be an array
    of candidate curves, evaluated side by side)."""
    from scipy.special import ndtr, ndtri

    mu = np.asarray(mu, dtype=np.float64)
    if not np.all(mu >= 0):
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    return lambda x: ndtr(ndtri(np.clip(x, 0.0, 1.0)) - mu)


def dp_curve(epsilon: float, delta: float) -> InversePower:
    """(ε, δ)-DP's inverse power: power x needs type-I error max((x − δ)·e^−ε, 1 − δ − e^ε·(1 − x)) at least."""
    if epsilon < 0 or not 0.0 <= delta <= 1.0:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon!r}, {delta!r}")
    grow = math.exp(min(epsilon, 700.0))

    def inverse(x: np.ndarray) -> np.ndarray:
        x = np.clip(x, 0.0, 1.0)
        return np.clip(np.maximum((x - delta) / grow, 1.0 - delta - grow * (1.0 - x)), 0.0, 1.0)
    return inverse


def curve_of(claim: dict[str, Any]) -> InversePower:
    """The inverse power of a stored claim: ``{"curve": "gaussian", "mu": μ}`` or ``{"curve": "epsilon_delta",
    "epsilon": ε, "delta": δ}`` (:func:`fedaudit.simulation.dp_accounting.claimed_curve` writes them)."""
    if claim.get("curve") == "gaussian":
        return gaussian_curve(float(claim["mu"]))
    if claim.get("curve") == "epsilon_delta":
        return dp_curve(float(claim["epsilon"]), float(claim["delta"]))
    raise ValueError(f"unknown privacy curve {claim!r}")


def _consistent(inverse: InversePower, m: int, r: int, v: int, tau: float | np.ndarray) -> np.ndarray:
    """Whether P[≥ v of r right] = ``tau`` is possible for a mechanism with this curve: the recursion's r_0 + h_0
    stays within r/m. Vectorised over ``tau`` and over the candidate curves ``inverse`` holds; both sums only
    grow as i falls, so the loop stops once every candidate has exceeded."""
    limit = r / m
    tau = np.asarray(tau, dtype=np.float64)
    right, wrong = tau * v / m, tau * (r - v) / m
    for i in range(v - 1, -1, -1):
        grown = np.maximum(wrong, inverse(right))
        right = right + i / (r - i) * (grown - wrong)
        wrong = grown
        if np.all(right + wrong > limit):
            break
    return np.asarray(right + wrong <= limit)


def _last_rejected(rejects: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, passes: int = 2) -> float:
    """The bisection :func:`gdp_lower_bound` and :func:`curve_p_value` share, vectorised: ``rejects`` holds at
    ``lo`` and not at ``hi`` and is monotone between; each pass narrows the bracket :data:`GRID_POINTS`-fold and
    keeps ``lo`` a point where it holds (so the answer is never past the crossing)."""
    for _ in range(passes):
        grid = np.linspace(lo, hi, GRID_POINTS + 2)[1:-1]
        held = rejects(grid)
        n = int(np.argmin(held)) if not held.all() else held.size  # first candidate that does not reject
        lo, hi = (grid[n - 1] if n else lo), (grid[n] if n < held.size else hi)
    return float(lo)


def curve_p_value(m: int, r: int, v: int, inverse: InversePower) -> float:
    """P-value of "the mechanism is f-DP for this curve" after ``v`` right of ``r`` guesses on ``m`` canaries: the
    largest probability of that outcome the curve allows (found on log τ, to about 1e-5 relative; the
    returned value is on the safe side, never below it)."""
    _check_counts(m, r, v)
    if v == 0 or _consistent(inverse, m, r, v, 1.0):
        return 1.0
    if not _consistent(inverse, m, r, v, 1e-300):
        return 1e-300
    # "rejects" here is "τ is still possible": the largest possible τ is the p-value
    log_tau = _last_rejected(lambda logs: _consistent(inverse, m, r, v, np.exp(logs)), math.log(1e-300), 0.0, passes=3)
    width = (0.0 - math.log(1e-300)) / GRID_POINTS ** 3  # the bracket left: report its upper end
    return min(1.0, math.exp(log_tau + width))


@functools.lru_cache(maxsize=256)
def gdp_lower_bound(m: int, r: int, v: int, confidence: float = 0.95) -> float:
    """The largest μ whose μ-GDP the guesses reject at level 1 − ``confidence`` (0 if none): the f-DP one-run
    bound in the Gaussian family. A larger μ rejects less (its inverse power is smaller everywhere)."""
    _check_counts(m, r, v)
    _check_levels(0.0, confidence)
    beta = 1.0 - confidence
    if v == 0 or _consistent(gaussian_curve(0.0), m, r, v, beta):
        return 0.0
    hi = 1.0 if v == r else 2.0 * gdp_lower_bound(m, r, r, confidence) + 1e-3  # fewer right rejects less
    while not _consistent(gaussian_curve(hi), m, r, v, beta):
        hi *= 2.0
        if hi > 1e3:
            raise ArithmeticError(f"no μ up to 1000 is consistent with m={m}, r={r}, v={v}; this cannot happen")
    return _last_rejected(lambda mus: ~_consistent(gaussian_curve(mus), m, r, v, beta), 0.0, hi)


def p_value_of_curve(m: int, per_k: Sequence[dict[str, Any]], claim: dict[str, Any]) -> float:
    """The f-DP test of a stored claim (:func:`curve_of`) from an audit's per-k counts: the smallest p over the
    grid, Bonferroni-corrected as :func:`p_value_of_claim`."""
    inverse = curve_of(claim)
    return min(1.0, len(per_k) * min(curve_p_value(m, int(row["guesses"]), int(row["correct"]), inverse)
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


def ideal_bounds(included: Sequence[bool] | np.ndarray, mu: float, delta: float, confidence: float = 0.95,
                 fractions: Sequence[float] = K_FRACTIONS, repeats: int = 9, seed: int = 0) -> dict[str, float]:
    """What this audit certifies, as medians over ``repeats`` draws, when every canary's score is Gaussian and an
    included one sits ``mu`` standard deviations higher — the scores of a mechanism exactly μ-GDP, i.e. one that
    spends exactly the claimed ε: the (ε, δ) bound and the f-DP μ bound. The yardstick for a real audit of the
    same m canaries."""
    truth = np.asarray(included, dtype=bool)
    rng = np.random.default_rng(seed)
    grid = k_grid(int(truth.size), fractions)
    runs = [audit(rng.normal(size=truth.size) + mu * truth, truth, delta, confidence, grid) for _ in range(repeats)]
    return {"epsilon_lower_bound": float(np.median([a["epsilon_lower_bound"] for a in runs])),
            "mu_lower_bound": float(np.median([a["gdp"]["mu_lower_bound"] for a in runs]))}


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
                     "epsilon_max_certifiable": epsilon_max_certifiable(m, r, delta, per_test),
                     "mu_lower_bound": gdp_lower_bound(m, r, v, per_test),
                     "mu_max_certifiable": gdp_lower_bound(m, r, r, per_test)})
    best = max(rows, key=lambda row: (row["epsilon_lower_bound"], row["k"]))
    gdp = max(rows, key=lambda row: (row["mu_lower_bound"], row["k"]))
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
        "gdp": _gdp_summary(gdp, rows, delta),
        "per_k": rows,
    }


def _gdp_summary(best: dict[str, Any], rows: list[dict[str, Any]], delta: float) -> dict[str, Any]:
    """The f-DP bound's best k, its μ and what that μ means as ε at the run's δ (for a Gaussian curve only)."""
    mu, ceiling_mu = best["mu_lower_bound"], max(row["mu_max_certifiable"] for row in rows)
    return {"mu_lower_bound": mu, "epsilon_if_gaussian": gaussian_epsilon(mu, delta) if mu > 0 else 0.0,
            "mu_max_certifiable": ceiling_mu, "epsilon_max_if_gaussian": gaussian_epsilon(ceiling_mu, delta),
            "k": best["k"], "guesses": best["guesses"], "correct": best["correct"],
            "kind": "f-DP one-run bound (Mahloujifar et al. 2025): not μ-GDP for any smaller μ; its ε holds for "
                    "mechanisms whose privacy curve is Gaussian"}


__all__ = ["audit", "ceiling", "curve_of", "curve_p_value", "dp_curve", "epsilon_lower_bound", "epsilon_max_certifiable",
           "gaussian_curve", "gaussian_fit", "gdp_lower_bound", "guesses", "ideal_bounds", "k_grid", "p_value",
           "p_value_of_claim", "p_value_of_curve"]
