"""The auditor's half of the canary audit: the one-run privacy audit of Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023).

An *auditor* procedure, not a wire-view attack: the auditor plants m
canaries in each victim's ``train`` split before training, each with
probability ½ (:func:`fedaudit.audit.input_canaries.plant_canaries`, called through
:func:`canary_split` before the federation is built), the federation trains
once, and afterwards the auditor scores every canary with the membership
signal and turns the guesses into an empirical ε lower bound
(:mod:`fedaudit.statistics.one_run_audit`). The split of knowledge is kept in the code:

* ``fedaudit.attacks.canary.CanaryAudit`` is the attacker's part. Through the
  attack contract it gets the deployed model to query and the canary records
  with their canary labels (:class:`~fedaudit.attack.CanaryChallenge`) —
  never whether a canary was included — and returns one score per canary:
  −cross-entropy of the target on the record with its (wrong) canary label
  (the loss signal, Yeom et al.; :func:`fedaudit.attacks.mia.scorers.loss_signal`).
  Higher = looks trained on. Its target, for a curious server, is the
  victim's last upload (its newest weights, overlaid as the server saw them);
  for a curious client, or a server that saw no weight-bearing upload from
  the victim (``target_note`` says why), the deployed global model queried as
  a black box.
* :func:`audit_canaries` is the auditor's part: it holds the inclusion truth
  (``LODOSplit.canaries``), grants the attack its access, guesses "in" for
  the k highest scores and "out" for the k lowest, and computes the bound.

Under DP-SGD the auditor also plants **gradient canaries** (the white-box variant,
:mod:`fedaudit.simulation.gradient_canaries`; :func:`plant_gradient_canaries` before training): per victim, m seeded unit
directions in the trained weights' space, each a record of its DP-SGD with probability ½. The attacker
gets their count, seed and space (never the coins) and a view of every round; it scores each canary by the
victim's summed update projected on it. Stored per victim under ``leakage.canary_gradient.<victim>``: the
one-run (ε, δ) bound over :data:`GRADIENT_K_FRACTIONS`, the f-DP bound in the Gaussian family (``gdp``;
Mahloujifar et al. 2025), the ceiling, ``ideal_bound`` / ``ideal_gdp_mu`` (what a mechanism spending exactly
the claim would show these canaries), ``claim`` with ``p_claim`` (the f-DP test of the accountant's claimed
curve: μ-GDP for full-batch DP-SGD, else (ε, δ)) and the one-shot ``estimate`` (Andrew et al. 2024; an
estimate, not a bound). Both variants' entries carry ``claim``/``p_claim`` under DP. Unless
``--no-canary-cost``, the same federation is also trained without any canaries and its accuracy stored under
``accuracy.without_canaries`` (:func:`accuracy_without_canaries`).

Stored per victim under ``leakage.canary.<victim>``: the bound
(``epsilon_lower_bound``) at ``confidence`` and ``delta`` (the run's
``--dp-delta``, also without DP), the counts behind it, the k grid and its
Bonferroni correction, the audit's power (``epsilon_max_certifiable``),
``epsilon_spent`` (the accountant's ε for that client under DP, else null),
``can_refute_claim`` (whether the power exceeds ε spent at all: if not, the
comparison cannot fail and proves nothing) and ``exceeds_claimed``: a bound
above the accountant's ε means the DP implementation, its accounting or the
audit is broken, and is logged as a warning and stored as ``warning``.

Choices, with reasons:

* ``--attack all`` does not include the canary audit: it changes what is
  trained (m/2 mislabelled records per victim), and ``all`` should audit the
  run as the method would train it. Name it: ``--attack canary`` or
  ``--attack mia,canary``.
* Label-free encoders (FedGaLA) output embeddings, so a wrong label carries
  no signal: the audit is reported as not applicable.
* The bound is on the privacy of one record of the victim's ``train`` split
  in whatever the target is — the accountant's unit. A target that carries
  something DP-SGD does not cover (BatchNorm statistics; see
  ``privacy.coverage``) may legitimately exceed ε; the warning says so.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from scipy.optimize import brentq

from fedaudit.attack import GRADIENT_CANARIES as GRADIENT
from fedaudit.attack import INPUT_CANARIES as INPUT
from fedaudit.attack import Access, Attack, AttackerPrior, AttackOutput, CanaryChallenge, GradientCanaryChallenge
from fedaudit.audit.input_canaries import KIND, plant_canaries
from fedaudit.audit.membership import black_box
from fedaudit.errors import FedauditError
from fedaudit.run.stored import CanaryChange, WithoutCanaries
from fedaudit.run.stored.leakage import CanaryEstimate, GdpBound, OneRunAudit
from fedaudit.statistics.gaussian_dp import gaussian_epsilon
from fedaudit.simulation.gradient_canaries import GRADIENT_KIND, draw_gradient_canaries, parameter_space
from fedaudit.simulation.wire import client_role
from fedaudit.statistics.one_run_audit import audit, ceiling, gaussian_fit, ideal_bounds, k_grid, p_value_of_curve

if TYPE_CHECKING:
    from fedaudit.data import LODOSplit
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Federation
    from fedaudit.simulation.method import Method

log = logging.getLogger("fedaudit")

CONFIDENCE = 0.95


class CanaryAudits(NamedTuple):
    """Per victim, the audit of its input canaries (stored as ``leakage.canary``) and of its gradient canaries
    (``leakage.canary_gradient``; only where the auditor planted them)."""

    input: dict[str, OneRunAudit]
    gradient: dict[str, OneRunAudit]



def canary_split(cfg: RunConfig, split: LODOSplit, num_classes: int,
                 victims_of: Callable[[list[str]], list[str]]) -> LODOSplit:
    """``split`` with the auditor's canaries planted in every victim's ``train`` (``victims_of(source
    domains)`` names the victims); called only when the run asks for the canary audit."""
    victims = victims_of([c.domain for c in split.sources])
    m = cfg.attack_option("canary", "canaries")
    split = plant_canaries(split, victims, m, cfg.seed, num_classes)
    log.info("canary audit: %d canaries drawn from the holdout of %s, %s of them in training", m,
             ", ".join(victims), "/".join(str(int(split.canaries[v].included.sum())) for v in victims))
    return split


# Guesses per side for gradient canaries, as fractions of m, fixed before any score: a white-box score is
# strong enough that the best guesses are the few most extreme (Steinke et al. abstain on most canaries), so the
# grid reaches down to m/64; each k is paid for (Bonferroni).
GRADIENT_K_FRACTIONS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
GRADIENT_COUNTS = (256, 512, 1024, 2048, 4096)  # the auto choice's ladder; its top bounds the scoring cost


def gradient_canary_count(cfg: RunConfig) -> int:
    """``--gradient-canaries``, or (0, the default) the smallest count of :data:`GRADIENT_COUNTS` whose (ε, δ) audit
    could certify more than the claimed ε (its ceiling), else the largest: at δ = 1e-5 that bound's δ term caps
    what any count can certify (4096 canaries: about 6.4), so ε = 8 gets 4096 — which also gives the f-DP test,
    free of that cap (its Gaussian ceiling at 4096 is ε 11.6), the power to catch a DP-SGD with a quarter of its
    noise or no clipping (tests/test_canary.py)."""
    m = int(cfg.attack_option("canary", "gradient_canaries"))
    if m:
        if m < 2:
            raise FedauditError(f"--gradient-canaries {m}: the audit needs at least 2 (or 0: chosen for the claimed ε)")
        return m
    target = float(cfg.dp_epsilon) if cfg.dp_epsilon is not None else math.inf  # no target: the largest count
    for m in GRADIENT_COUNTS:
        if ceiling(m, float(cfg.dp_delta), CONFIDENCE, GRADIENT_K_FRACTIONS) > target:
            return m
    return GRADIENT_COUNTS[-1]


def plant_gradient_canaries(cfg: RunConfig, fed: Federation, victims: Sequence[str]) -> None:
    """Before training: give every victim's DP-SGD its gradient canaries (each a record with probability ½) and
    have the wire keep every round of its messages (the statistic sums its updates). Only under DP-SGD: a
    gradient canary is a record whose clipped gradient is a direction at the clipping norm."""
    if fed.dp is None:
        if int(cfg.attack_option("canary", "gradient_canaries")):
            log.warning("--gradient-canaries has no effect in this run: gradient canaries audit DP-SGD, and this run "
                        "trains without --dp-epsilon")
        return
    m = gradient_canary_count(cfg)
    planted = draw_gradient_canaries(victims, m, cfg.seed, parameter_space(fed.model))
    index = {c.domain: c.index for c in fed.clients}
    for victim, canaries in planted.items():
        fed.dp.canaries[index[victim]] = canaries
    fed.wire.keep_history({client_role(v) for v in planted})
    log.info("canary audit: %d gradient canaries in the DP-SGD of %s (%s of them records), in a space of %d trained "
             "weights", m, ", ".join(planted), "/".join(str(int(c.included.sum())) for c in planted.values()),
             next(iter(planted.values())).dim if planted else 0)


def accuracy_without_canaries(cfg: RunConfig, method: Method, fed: Federation, clean_split: LODOSplit) -> WithoutCanaries:
    """What the canaries cost the model: the same federation (same seeds, so the same batches of real records and
    the same noise) trained on ``clean_split`` — the split before any canary was planted — with no gradient
    canaries; its accuracy beside the audited run's, and the difference (with − without). Stored under
    ``accuracy.without_canaries``; off with ``--no-canary-cost``."""
    from fedaudit.simulation.federation import Federation as Twin
    from fedaudit.simulation.wire import Wire

    log.info("canary audit: training the same federation without canaries, to measure what they cost in accuracy")
    twin = Twin(cfg, type(method)(cfg), fed.dataset, clean_split, fed.device, Wire(None))
    with torch.random.fork_rng(devices=[fed.device] if fed.device.type == "cuda" else []):  # the attacks' draws stay as they were
        twin.setup()
        twin.run()
    with_, without = fed.results(), twin.results()
    change = CanaryChange(unseen_domain=_minus(with_.unseen_domain, without.unseen_domain),
                          source_val_mean=_minus(with_.source_val.mean, without.source_val.mean))
    log.info("canary audit: accuracy with canaries %s unseen / %s source val; without %s / %s",
             with_.unseen_domain, with_.source_val.mean, without.unseen_domain, without.source_val.mean)
    return WithoutCanaries(**{k: getattr(without, k) for k in without.model_fields_set}, change_with_canaries=change,
                           note="the same run (seeds, recipe) trained without the canary audit's canaries; "
                                "change = with − without")


def _minus(a: float | None, b: float | None) -> float | None:
    """with − without; None where either run scored no model."""
    return None if a is None or b is None else a - b


Claim = tuple[float, dict[str, str | float]]  # the accountant's ε and its claimed privacy curve (curve_of's form)


def claims(fed: Federation) -> dict[str, Claim]:
    """The accountant's ε and claimed privacy curve per client domain (empty without DP)."""
    if fed.dp is None:
        return {}
    clients = fed.dp.summary({c.index: c.domain for c in fed.clients}).clients
    return {d: (float(c.epsilon_spent if c.epsilon_spent is not None else math.inf), dict(c.curve))
            for d, c in clients.items()}


def _judge_claim(found: OneRunAudit, claim: Claim | None, confidence: float) -> OneRunAudit:
    """The audit with the claim beside it: ε spent, the claimed curve, the f-DP test of that curve over the k grid
    (``p_claim``; Bonferroni) and whether this audit alone rejects it (the verdict corrects across audits)."""
    if claim is None:
        return found.with_(epsilon_spent=None, can_refute_claim=None, exceeds_claimed=False)
    eps, curve = claim
    assert found.canaries is not None and found.gdp is not None and found.epsilon_lower_bound is not None
    p_claim = p_value_of_curve(found.canaries, [row.dump() for row in found.per_k], curve)
    gaussian = found.gdp.epsilon_max_if_gaussian if curve["curve"] == "gaussian" else None
    ceiling_eps = max(found.epsilon_max_certifiable or 0.0, gaussian or 0.0)
    return found.with_(epsilon_spent=eps, claim=curve, p_claim=p_claim, can_refute_claim=ceiling_eps > eps,
                       exceeds_claimed=found.epsilon_lower_bound > eps or p_claim <= 1.0 - confidence)


def audit_canaries(attack: Attack, cfg: RunConfig, method: Method, fed: Federation, prior: AttackerPrior, *,
                   role: str, victims: Sequence[str], confidence: float = CONFIDENCE) -> CanaryAudits:
    """The one-run audit of every victim's canaries by ``attack`` (``--attack canary``): the input canaries' and
    the gradient canaries' audit per victim (see the module docstring)."""
    planted = {v: fed.split.canaries[v] for v in victims if v in fed.split.canaries}
    gradient = {} if fed.dp is None else {c.domain: fed.dp.canaries[c.index] for c in fed.clients
                                           if c.index in fed.dp.canaries and c.domain in victims}
    access = Access(query=black_box(method, fed),
                    canaries={v: CanaryChallenge(v, c.images, c.labels) for v, c in planted.items()},
                    gradient_canaries={v: GradientCanaryChallenge(v, g.count, g.seed, g.space) for v, g in gradient.items()})
    # gradient canaries are read off every round's updates; the history holds the newest round too
    view = fed.wire.history_view(role) if gradient else fed.wire.view(role)
    answers = attack.run_batch(view, prior, list(victims), fed.device, access)
    outputs = {o.victim: o for o in answers if o.info.get("variant", INPUT) == INPUT}
    claimed = claims(fed)
    out = CanaryAudits({}, {})
    for answer in answers:
        if answer.info.get("variant") == GRADIENT:
            out.gradient[answer.victim] = _gradient_entry(answer, gradient[answer.victim], cfg, claimed.get(answer.victim),
                                                       confidence, _canary_steps(fed, answer.victim))
    for victim in victims:
        answer = outputs[victim]
        if answer.scores is None:
            out.input[victim] = OneRunAudit.reported(answer.attack, answer.info)
            continue
        scores = answer.scores.numpy()
        included = planted[victim].included.cpu().numpy()
        entry = audit(scores, included, float(cfg.dp_delta), confidence)
        target = {k: v for k, v in answer.info.items() if k != "status"}
        found = _judge_claim(OneRunAudit.reported(attack.name, {
            **entry, "signal": getattr(attack, "signal", ""), **target, "canary_kind": KIND,
            "auc": _auc(scores, included)}), claimed.get(victim), confidence)
        eps = found.epsilon_spent
        if found.exceeds_claimed:
            found = found.with_(warning=(
                f"the canary audit rejects the accountant's claim for {victim} (ε {eps:.3f}; ε lower bound "
                f"{found.epsilon_lower_bound:.3f}, p of the claimed curve {found.p_claim:.2g}) at "
                f"{confidence:.0%} confidence for this audit alone: the DP-SGD implementation or its accounting is "
                "broken, or the audit is (or the target carries something ε does not cover: see privacy.coverage)"))
            log.warning("canary audit: %s", found.warning)
        out.input[victim] = found
        log.info("canary audit, %s (%s): ε ≥ %.3f at %.0f%% (δ %g; %d/%d correct at k=%d; at most %.3f certifiable)%s",
                 victim, found.target, found.epsilon_lower_bound, 100 * confidence, found.delta,
                 found.correct, found.guesses, found.k, found.epsilon_max_certifiable,
                 "" if eps is None else f"; accountant's ε {eps:.3f}")
    return out


def _canary_steps(fed: Federation, domain: str) -> int:
    """How many (canary, step) pairs went into the victim's noised sums in this process (a resumed run counts
    from the resume)."""
    if fed.dp is None:  # no DP-SGD: no gradient canaries went into any sum
        return 0
    injector = fed.dp.injectors.get(next(c.index for c in fed.clients if c.domain == domain))
    return injector.added if injector is not None else 0


def _gradient_entry(answer: AttackOutput, canaries: Any, cfg: RunConfig, claim: Claim | None,
                    confidence: float, canary_steps: int) -> OneRunAudit:
    """One victim's gradient-canary audit: the one-run bound over the fine k grid, the p-value of the claimed ε,
    the audit's ceiling, the bound a mechanism spending exactly the claimed ε would give these canaries, and the
    one-shot Gaussian estimate (an estimate, not a bound)."""
    if answer.scores is None:
        return OneRunAudit.reported(answer.attack, answer.info)
    scores, included = answer.scores.numpy(), canaries.included.cpu().numpy()
    delta = float(cfg.dp_delta)
    m = int(scores.size)
    grid = k_grid(m, GRADIENT_K_FRACTIONS)
    fit = gaussian_fit(scores, included)
    estimate = CanaryEstimate(epsilon=gaussian_epsilon(max(fit["mu"], 0.0), delta) if math.isfinite(fit["mu"]) else
                              math.inf, kind="estimate (Gaussian fit of the scores, Andrew et al. 2024), not a bound",
                              **fit)
    found = _judge_claim(OneRunAudit.reported(answer.attack, {
        **audit(scores, included, delta, confidence, grid), "variant": GRADIENT, "canary_kind": GRADIENT_KIND,
        "signal": answer.info.get("signal", ""), "target": answer.info.get("target"),
        "rounds": answer.info.get("rounds"), "auc": _auc(scores, included), "canary_steps": canary_steps,
        "directions_seed": canaries.seed, "space_dim": canaries.dim,
        "k_fractions": [round(f, 6) for f in GRADIENT_K_FRACTIONS], "estimate": estimate}), claim, confidence)
    eps = found.epsilon_spent
    if eps is not None and found.claim is not None:
        curve = found.claim
        claimed_mu = (float(curve["mu"]) if curve["curve"] == "gaussian" else
                      brentq(lambda mu: gaussian_epsilon(mu, delta) - eps, 1e-6, 100.0) if eps > 0 else 0.0)
        ideal = ideal_bounds(included, claimed_mu, delta, confidence, GRADIENT_K_FRACTIONS)
        found = found.with_(ideal_bound=ideal["epsilon_lower_bound"], ideal_gdp_mu=ideal["mu_lower_bound"],
                            ideal_mu=claimed_mu)
    gdp = found.gdp or GdpBound()
    log.info("canary audit, %s (gradient canaries, %d): ε ≥ %.3f at %.0f%% (%d/%d right at k=%d; ceiling %.3f); f-DP: "
             "μ ≥ %.3f (ε %.3f if Gaussian)%s; estimate ε ≈ %.2f", answer.victim, m, found.epsilon_lower_bound,
             100 * confidence, found.correct, found.guesses, found.k, found.epsilon_max_certifiable,
             gdp.mu_lower_bound, gdp.epsilon_if_gaussian,
             "" if eps is None else (f"; accountant's ε {eps:.3f} (μ {found.ideal_mu:.3f}), a mechanism spending it "
                                     f"exactly: ε ≥ {found.ideal_bound:.3f}, μ ≥ {found.ideal_gdp_mu:.3f}"),
             estimate.epsilon)
    if found.exceeds_claimed:
        log.warning("canary audit: gradient canaries reject the accountant's claim for %s (ε %.3f; p of the claimed "
                    "curve %.2g, ε ≥ %.3f, μ ≥ %.3f) at %.0f%% for this audit alone (the verdict corrects across "
                    "audits)", answer.victim, eps, found.p_claim, found.epsilon_lower_bound, gdp.mu_lower_bound,
                    100 * confidence)
    return found


def _auc(scores: np.ndarray, included: np.ndarray) -> float | None:
    """Descriptive only (the bound does not use it): AUC of the scores for included vs excluded canaries."""
    if included.all() or not included.any():
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(included, scores))


__all__ = ["CONFIDENCE", "accuracy_without_canaries", "audit_canaries", "canary_split", "gradient_canary_count", "plant_gradient_canaries"]
