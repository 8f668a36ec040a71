"""Does the DP claim hold? The one-run canary audit (Steinke, Nasr & Jagielski 2023): a proven ε lower bound per
victim and variant (input canaries scored by the model; gradient canaries read off the victim's updates under
DP-SGD).

Each audit's test is "the training is 0-DP for its records" (no privacy loss at all): the smallest p-value of its
correct guesses at ε = 0 over the audit's k grid, Bonferroni-corrected for the grid; Holm across audits. Where a DP
claim exists, a second test per audit is the f-DP test of the accountant's claimed curve (Mahloujifar et al. 2025;
μ-GDP for full-batch DP-SGD, else (ε, δ)), corrected the same way; runs stored before the curve was recorded are
tested as (ε, δ) by Steinke et al.'s bound.

Rules, in order: ``refuted`` (the claim's test rejects after Holm over every audit of the row: HIGH),
``significant`` (a significant bound: HIGH at ``canary_epsilon_high``, else MEDIUM), ``uncertifiable`` (no audit
could have certified ``canary_epsilon_high``: INCONCLUSIVE), else LOW.
"""

from __future__ import annotations

from typing import Any

from fedaudit.run.results import CANARY, CANARY_GRADIENT, Leakage
from fedaudit.statistics.membership_statistics import holm

from .evidence import (ANYONE, DP_AUDIT, HIGH, INCONCLUSIVE, LOW, MEDIUM, NOT_ASSESSED, Decision, Evidence, Row,
                       decide, isnum, strongest)
from .thresholds import RiskThresholds
from .wording import canary_finding, canary_reason, canary_short

KEY, TITLE = "membership:canary", "DP audit: do planted canaries prove more privacy loss than claimed?"


def canary_row(metrics: dict[str, Any], t: RiskThresholds) -> Row:
    sections = Leakage.of(metrics).canary_sections()
    audits = [("input", v, e) for v, e in (sections.get(CANARY) or {}).items()]
    audits += [("gradient", v, e) for v, e in (sections.get(CANARY_GRADIENT) or {}).items()]
    evidence, notes, ceilings = _evidence(audits, t)
    observer = ", ".join(sorted({_observer(ev) for ev in evidence})) or "server"

    def row(tier: str, reason: str, brief: str, rule: str | None = None) -> Row:
        return Row(KEY, TITLE, DP_AUDIT, "planted canaries", observer, tier, reason, brief, evidence, t.alpha, rule)

    if not evidence:
        return row(NOT_ASSESSED, "; ".join(notes) or "no canary result stored", "no canary result")
    decide(evidence, t)
    claims = holm([ev.detail["p_claim"] for ev in evidence])
    for ev, adj in zip(evidence, claims):
        ev.detail["p_claim_adjusted"] = adj
    d = _refuted(evidence, t) or _significant(evidence) or _uncertifiable(ceilings, t) or Decision(LOW, "low", {
        "ceiling": max(ceilings, default=0.0)})
    if d.rule == "refuted":
        d.facts["top"].tier = HIGH
    return row(d.tier, canary_reason(d, evidence), canary_short(d, evidence), d.rule)


def _observer(ev: Evidence) -> str:
    detail = ev.detail or {}
    return "server" if detail.get("variant") == "gradient" or detail.get("target") == "last_upload" else ANYONE


def _evidence(audits: list[tuple[str, str, Any]], t: RiskThresholds) -> tuple[list[Evidence], list[str], list[float]]:
    from fedaudit.statistics.one_run_audit import p_value_of_claim, p_value_of_curve

    evidence: list[Evidence] = []
    notes: list[str] = []
    ceilings: list[float] = []
    for variant, victim, e in audits:
        if not isinstance(e, dict) or not isnum(e.get("epsilon_lower_bound")):
            notes.append(f"{victim} ({variant} canaries): {(e or {}).get('status', 'not run')} — "
                         f"{(e or {}).get('reason', 'no reason stored')}")
            continue
        m, r, v = int(e["canaries"]), int(e["guesses"]), int(e["correct"])
        delta = float(e.get("delta", 1e-5))
        per_k = e.get("per_k") or [{"guesses": r, "correct": v}] * len(e.get("k_grid") or [1])
        p = p_value_of_claim(m, per_k, 0.0, delta)  # "no privacy loss at all" is the claim ε = 0
        bound, spent = float(e["epsilon_lower_bound"]), e.get("epsilon_spent")
        claim = e.get("claim")
        p_claim = (1.0 if not isnum(spent) else p_value_of_curve(m, per_k, claim) if isinstance(claim, dict)
                   else p_value_of_claim(m, per_k, float(spent), delta))
        ceilings.append(float(e.get("epsilon_max_certifiable") or 0.0))
        evidence.append(Evidence("canary_epsilon", f"{variant} canaries / {victim}", bound, 0.0, "ε = 0 (no privacy loss)",
                                 p, tier=tier_of_bound(bound, t), effect=bound,
                                 text=canary_finding(variant, victim, e),
                                 detail={"attack": f"{variant} canaries", "victim": victim, "target": e.get("target"),
                                         "epsilon_spent": spent, "epsilon_max_certifiable": e.get("epsilon_max_certifiable"),
                                         "p_claim": p_claim, "variant": variant, "ideal_bound": e.get("ideal_bound"),
                                         "estimate": (e.get("estimate") or {}).get("epsilon")}))
    return evidence, notes, ceilings


# -- rules ----------------------------------------------------------------------------------------


def _refuted(evidence: list[Evidence], t: RiskThresholds) -> Decision | None:
    refuted = [ev for ev in evidence if ev.detail["p_claim_adjusted"] <= t.alpha]
    return Decision(HIGH, "refuted", {"top": max(refuted, key=lambda ev: ev.value)}) if refuted else None


def _significant(evidence: list[Evidence]) -> Decision | None:
    top = strongest(evidence)
    return Decision(top.tier, "significant", {"top": top}) if top.tier in (HIGH, MEDIUM) else None


def _uncertifiable(ceilings: list[float], t: RiskThresholds) -> Decision | None:
    ceiling = max(ceilings, default=0.0)
    return (Decision(INCONCLUSIVE, "uncertifiable", {"ceiling": ceiling, "high": t.canary_epsilon_high})
            if ceiling < t.canary_epsilon_high else None)


def tier_of_bound(bound: float, t: RiskThresholds) -> str:
    return HIGH if bound >= t.canary_epsilon_high else MEDIUM if bound > 0 else LOW
