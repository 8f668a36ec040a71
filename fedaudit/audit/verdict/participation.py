"""Does the released model reveal which domains took part? One row, from the domain-level attack (issue 47).

The domain-level attack scores a source domain's holdout records (never trained on themselves) against the unseen
domain's records on the released model: its AUC. A domain that is merely easier than the unseen one shows a gap
without having taken part, so the test's null is that domain's **twins**: the same federation trained without it,
each with its own seed, scored by the same attack on the same records (:mod:`fedaudit.audit.domain_twin`). Under the
null the released model is one more federation of that kind, so its AUC is compared with the twins' mean against
their spread — a one-sided t test with the prediction interval's standard error s·√(1 + 1/R) for R twins, s pooled
over the row's domains (the training noise of a federation is much the same whichever domain it leaves out).

Rules, in order (each a small function returning a :class:`Decision` or None):

* ``significant`` — a domain's AUC beat its twins after Holm: MEDIUM at a lift of ``participation_auc_lift_medium``
  over their mean, HIGH at ``participation_auc_lift_high``;
* ``no_twin`` — a domain has no twin (a recording, whose loop fedaudit cannot re-run), or no domain has two (no
  spread to measure the training noise by): its gap cannot be told from the domain's own difficulty, INCONCLUSIVE;
* ``undetectable`` — at this spread a lift of ``participation_auc_lift_medium`` could not have been detected after
  the correction: INCONCLUSIVE;
* otherwise LOW.

The pooled row (``all``) the attack also stores has no single twin and is not a test here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from fedaudit.run.results import Leakage, MIA

from .evidence import (ANYONE, DOMAIN, GLOBAL, HIGH, INCONCLUSIVE, LOW, MEDIUM, NOT_ASSESSED, PARTICIPATION, Decision,
                       Evidence, Row, Unscored, decide, isnum, strongest)
from .thresholds import RiskThresholds
from .wording import level_title, not_assessed, participation_finding, participation_reason, participation_short

KEY = f"{PARTICIPATION}:{GLOBAL}"
POOLED = "all"


def participation_row(metrics: dict[str, Any], t: RiskThresholds) -> Row:
    """The released model's participation row."""

    def row(tier: str, reason: str, brief: str, evidence: list[Evidence] = (), rule: str | None = None) -> Row:
        return Row(KEY, level_title(GLOBAL, PARTICIPATION), PARTICIPATION, "released model", ANYONE, tier, reason, brief,
                   list(evidence), t.alpha, rule)

    results = list(Leakage.of(metrics).membership())
    entries = {victim: e for variant, _, victim, e in results if variant == DOMAIN and victim != POOLED}
    if not entries:
        data = metrics.get("auditor_data") or {}
        rule = ("no_records" if data.get("status") == "none" else
                "no_target" if Leakage.of(metrics).sections.get(MIA) and any(v == DOMAIN for v, *_ in results)
                else "no_attack")
        return row(NOT_ASSESSED, *not_assessed(PARTICIPATION, Decision(NOT_ASSESSED, rule, {"why": data.get("why"),
                                                                                        "subject": GLOBAL})))
    spread, df = twin_spread(entries.values())
    evidence = [e for victim, entry in entries.items()
                if (e := participation_evidence(victim, entry, spread, df, t)) is not None]
    if not evidence:
        skipped = [Unscored.of(f"domain/{v}", e) for v, e in entries.items()]
        return row(NOT_ASSESSED, *not_assessed(PARTICIPATION, Decision(NOT_ASSESSED, "no_score",
                                                                       {"subject": GLOBAL, "skipped": skipped})))
    decide(evidence, t)
    decision = (_significant(evidence) or _no_twin(evidence, df) or _undetectable(evidence, df, t)
                or Decision(LOW, "low", {"detectable": _detectable(evidence, df, t)}))
    return row(decision.tier, participation_reason(decision, evidence, t), participation_short(decision, evidence),
               evidence, decision.rule)


def _twin_aucs(entry: dict[str, Any]) -> list[float]:
    twin = entry.get("domain_twin") if isinstance(entry.get("domain_twin"), dict) else {}
    aucs = twin.get("aucs") if twin.get("status") == "measured" else None
    return [float(a) for a in aucs if isnum(a)] if isinstance(aucs, list) else []


def twin_spread(entries: Iterable[dict[str, Any]]) -> tuple[float | None, int]:
    """The twins' standard deviation around their domain's mean, pooled over the domains, and its degrees of
    freedom (None and 0 where no domain has two twins)."""
    squares, df = 0.0, 0
    for entry in entries:
        aucs = _twin_aucs(entry)
        if len(aucs) >= 2:
            mean = sum(aucs) / len(aucs)
            squares += sum((a - mean) ** 2 for a in aucs)
            df += len(aucs) - 1
    return (math.sqrt(squares / df) if df else None), df


def participation_evidence(victim: str, entry: dict[str, Any], spread: float | None, df: int,
                           t: RiskThresholds) -> Evidence | None:
    """One source domain's test: the released model's AUC against its twins' mean, by their pooled spread."""
    from scipy.stats import t as student

    value = entry.get("auc")
    if not isnum(value):
        return None
    aucs = _twin_aucs(entry)
    twin = entry.get("domain_twin") if isinstance(entry.get("domain_twin"), dict) else {}
    detail = {"victim": victim, "attack": "domain-level attack", "twin_aucs": aucs, "df": df,
              "twin_reason": None if aucs else str(twin.get("reason") or "no domain twin was trained"),
              "members": int(entry.get("n_members", 0) or 0), "nonmembers": int(entry.get("n_nonmembers", 0) or 0),
              "nonmember_domain": entry.get("nonmember_domain")}
    if not aucs or spread is None:  # nothing to compare with: the row says so (rule no_twin)
        e = Evidence("participation_auc", f"domain-level attack on {GLOBAL} / {victim}", float(value), None,
                     "domain twins", 1.0, tier=LOW, detail={**detail, "twin": False})
        e.text = participation_finding(e)
        return e
    base = sum(aucs) / len(aucs)
    se = spread * math.sqrt(1.0 + 1.0 / len(aucs))
    lift = float(value) - base
    p = float(student.sf(lift / se, df)) if se > 0 else (0.0 if lift > 0 else 1.0)
    tier = (HIGH if lift >= t.participation_auc_lift_high - 1e-9 else
            MEDIUM if lift >= t.participation_auc_lift_medium - 1e-9 else LOW)
    e = Evidence("participation_auc", f"domain-level attack on {GLOBAL} / {victim}", float(value), base,
                 "domain twins", p, nulls={"domain_twins": base}, tier=tier, effect=lift,
                 detail={**detail, "twin": True, "spread": spread, "se": se})
    e.text = participation_finding(e)
    return e


# -- rules --------------------------------------------------------------------------------------------


def _significant(evidence: list[Evidence]) -> Decision | None:
    top = strongest(evidence)
    return Decision(top.tier, "significant", {"top": top}) if top.tier in (HIGH, MEDIUM) else None


def _no_twin(evidence: list[Evidence], df: int) -> Decision | None:
    missing = [e for e in evidence if not (e.detail or {}).get("twin")]
    return Decision(INCONCLUSIVE, "no_twin", {"missing": missing, "df": df}) if missing else None


def _detectable(evidence: list[Evidence], df: int, t: RiskThresholds) -> float:
    """The smallest AUC lift over the twins the row's tests could have detected after Holm's first step (the
    one-sided t quantile times the largest standard error)."""
    from scipy.stats import t as student

    ses = [float(e.detail["se"]) for e in evidence if isnum((e.detail or {}).get("se"))]
    if not ses or df < 1:
        return float("inf")
    return float(student.isf(t.alpha / len(evidence), df)) * max(ses)


def _undetectable(evidence: list[Evidence], df: int, t: RiskThresholds) -> Decision | None:
    detectable = _detectable(evidence, df, t)
    if detectable <= t.participation_auc_lift_medium:
        return None
    return Decision(INCONCLUSIVE, "undetectable", {"detectable": detectable, "tests": len(evidence)})
