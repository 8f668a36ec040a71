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

from fedaudit.statistics.membership_statistics import holm

from .evidence import (ANYONE, CANARY, CANARY_GRADIENT, DP_AUDIT, HIGH, INCONCLUSIVE, LOW, MEDIUM, NOT_ASSESSED,
                       Decision, Evidence, Row, decide, isnum, strongest)
from .thresholds import CORRECTION, RiskThresholds
from .wording import clause, p_text, pct, short

KEY, TITLE = "membership:canary", "DP audit: do planted canaries prove more privacy loss than claimed?"


def canary_row(metrics: dict[str, Any], t: RiskThresholds) -> Row:
    leakage = metrics.get("leakage") or {}
    audits = [("input", v, e) for v, e in (leakage.get(CANARY) or {}).items()]
    audits += [("gradient", v, e) for v, e in (leakage.get(CANARY_GRADIENT) or {}).items()]
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
    return row(d.tier, _reason(d, evidence), _short(d, evidence), d.rule)


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
                                 text=_finding(variant, victim, e),
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


# -- wording --------------------------------------------------------------------------------------


def _reason(d: Decision, evidence: list[Evidence]) -> str:
    m = len(evidence)
    top = d.facts.get("top")
    if d.rule == "refuted":
        return (f"THE DP GUARANTEE DOES NOT HOLD: {clause(top, m)}; the claimed ε {top.detail['epsilon_spent']:.2f} is "
                f"rejected at p {p_text(top.detail['p_claim_adjusted'])} after {CORRECTION} correction over {m} "
                f"audit(s). {top.text} The DP-SGD implementation, its accounting or the audit is broken (or the target "
                "carries something ε does not cover: see the coverage table).")
    if d.rule == "significant":
        within = (f" The bound is within the claimed ε {float(top.detail['epsilon_spent']):.2f} (not rejected, p "
                  f"{p_text(top.detail['p_claim_adjusted'])} after {CORRECTION}): the guarantee holds as far as this "
                  "audit can tell, and the loss it proves is loss that ε allows." if isnum(top.detail.get("epsilon_spent"))
                  else "")
        return f"{clause(top, m)}. {top.text}{within}"
    if d.rule == "uncertifiable":
        return (f"no canary audit proved any privacy loss, but with these canaries it could certify at most ε "
                f"{d.facts['ceiling']:.2f} (below {d.facts['high']:g}): plant more canaries (--canaries, "
                "--gradient-canaries) or use a dataset with a larger holdout.")
    return (f"no canary audit proved any privacy loss (all bounds 0 after {CORRECTION} correction), though it could "
            f"have certified up to ε {d.facts['ceiling']:.2f}.")


def _short(d: Decision, evidence: list[Evidence]) -> str:
    top = d.facts.get("top")
    if d.rule == "refuted":
        return f"claimed ε {top.detail['epsilon_spent']:.2f} refuted, p {p_text(top.detail['p_claim_adjusted'])}"
    if d.rule == "significant":
        return short(top)
    if d.rule == "uncertifiable":
        return f"no loss proved; ceiling ε {d.facts['ceiling']:.2f}"
    return f"no loss proved; could certify ε {d.facts['ceiling']:.2f}"


def _finding(variant: str, victim: str, e: dict[str, Any]) -> str:
    """One audit's sentence: what was planted, what it proves, and the claim beside it."""
    bound, spent, m = float(e["epsilon_lower_bound"]), e.get("epsilon_spent"), int(e["canaries"])
    counts = (f"{pct(e.get('confidence'))} confidence, δ {e.get('delta')}; {e['correct']} of {e['guesses']} guesses "
              "right")
    claim = "no DP claim" if not isnum(spent) else f"the accountant claims ε {float(spent):.2f}"
    gdp = e.get("gdp") if isinstance(e.get("gdp"), dict) else {}
    fdp = (f"; the f-DP bound: not μ-GDP for μ below {float(gdp['mu_lower_bound']):.2f}, which is ε ≥ "
           f"{float(gdp['epsilon_if_gaussian']):.2f} if its privacy curve is Gaussian"
           if isnum(gdp.get("mu_lower_bound")) and float(gdp["mu_lower_bound"]) > 0 else "")
    if variant == "gradient":
        ideal = e.get("ideal_bound")
        estimate = (e.get("estimate") or {}).get("epsilon")
        return (f"Of {m} gradient canaries planted in {victim}'s DP-SGD, the server's view of its updates proves "
                f"ε ≥ {bound:.2f} ({counts}; {claim}{fdp}"
                + (f"; a mechanism spending exactly that would give these canaries about ε ≥ {float(ideal):.2f}"
                   + (f", μ ≥ {float(e['ideal_gdp_mu']):.2f}" if isnum(e.get("ideal_gdp_mu")) else "")
                   if isnum(ideal) else "")
                + (f"; the one-shot estimate, not a bound: ε ≈ {float(estimate):.2f}" if isnum(estimate) else "")
                + f"; at most ε {float(e.get('epsilon_max_certifiable') or 0):.2f} certifiable).")
    return (f"Of {m} canaries planted in {victim}'s training split, the {e.get('target', '?')} reveals which were "
            f"trained on well enough to prove ε ≥ {bound:.2f} ({counts}; {claim}{fdp}).")
