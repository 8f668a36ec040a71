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

from dataclasses import dataclass, replace
from typing import Any

from fedaudit.run.audited_run import AuditedRun
from fedaudit.run.entries import CanaryAudit
from fedaudit.run.evidence_detail import CanaryDetail, expect
from fedaudit.statistics.membership_statistics import holm

from .evidence import (VerdictRow, Strongest, ANYONE, DP_AUDIT, HIGH, INCONCLUSIVE, LOW, MEDIUM, NOT_ASSESSED, Decision, Evidence, Rule,
                       Significant, decide, first, row)
from .thresholds import CORRECTION, RiskThresholds
from .wording import canary_finding, clause, p_text, short

KEY, TITLE = "membership:canary", "DP audit: do planted canaries prove more privacy loss than claimed?"


@dataclass
class Case:
    """What the rules of the DP audit row look at."""

    evidence: list[Evidence]
    notes: list[str]  # audits that stored no bound, and why
    ceilings: list[float]  # the largest ε each audit's canaries could certify
    t: RiskThresholds


def canary_row(run: AuditedRun, t: RiskThresholds) -> VerdictRow:
    evidence, notes, ceilings = _evidence(run.canaries, t)
    observer = ", ".join(sorted({_observer(ev) for ev in evidence})) or "server"
    case = Case(evidence, notes, ceilings, t)
    if evidence:
        decide(evidence, t)
        claims = holm([claim_of(ev).p_claim for ev in evidence])
        for ev, adj in zip(evidence, claims):
            ev.detail = replace(claim_of(ev), p_claim_adjusted=adj)
    d = first(RULES, case)
    return row(KEY, TITLE, DP_AUDIT, "planted canaries", observer, d, case, evidence, t.alpha)


def claim_of(ev: Evidence) -> CanaryDetail:
    """A canary audit's block (every test of this row is one)."""
    return expect(ev.detail, CanaryDetail)


def _observer(ev: Evidence) -> str:
    return "server" if claim_of(ev).variant == "gradient" or claim_of(ev).target == "last_upload" else ANYONE


def _evidence(audits: tuple[CanaryAudit, ...], t: RiskThresholds) -> tuple[list[Evidence], list[str], list[float]]:
    from fedaudit.statistics.one_run_audit import p_value_of_claim, p_value_of_curve

    evidence: list[Evidence] = []
    notes: list[str] = []
    ceilings: list[float] = []
    for a in audits:
        if a.bound is None or a.canaries is None:
            notes.append(f"{a.victim} ({a.variant} canaries): {a.status or 'not run'} — {a.reason or 'no reason stored'}")
            continue
        p = p_value_of_claim(a.canaries, a.per_k, 0.0, a.delta)  # "no privacy loss at all" is the claim ε = 0
        p_claim = (1.0 if a.epsilon_spent is None else p_value_of_curve(a.canaries, a.per_k, dict(a.claim))
                   if a.claim is not None else p_value_of_claim(a.canaries, a.per_k, a.epsilon_spent, a.delta))
        ceilings.append(a.ceiling or 0.0)
        evidence.append(Evidence("canary_epsilon", f"{a.variant} canaries / {a.victim}", a.bound, 0.0,
                                 "ε = 0 (no privacy loss)", p, tier=tier_of_bound(a.bound, t), effect=a.bound,
                                 text=canary_finding(a),
                                 detail=CanaryDetail(attack=f"{a.variant} canaries", victim=a.victim, target=a.target,
                                                     epsilon_spent=a.epsilon_spent, epsilon_max_certifiable=a.ceiling,
                                                     p_claim=p_claim, variant=a.variant, ideal_bound=a.ideal_bound,
                                                     estimate=a.estimate)))
    return evidence, notes, ceilings


# -- rules ----------------------------------------------------------------------------------------


class NoBound(Rule[None]):
    """No audit stored a bound: why, per audit."""

    name = "no_bound"
    judges = False

    def decide(self, case: Case) -> Decision[None] | None:
        return None if case.evidence else self(NOT_ASSESSED, None)

    def reason(self, d: Decision[None], case: Case) -> str:
        return "; ".join(case.notes) or "no canary result stored"

    def short(self, d: Decision[None], case: Case) -> str:
        return "no canary result"


class Refuted(Rule[Strongest]):
    """The claim's test rejects after Holm over every audit of the row: the DP guarantee does not hold."""

    name = "refuted"

    def decide(self, case: Case) -> Decision[Strongest] | None:
        # `is not None`, never `or 1.0`: a p of exactly 0.0 (binom.sf underflows at δ = 0) is the strongest evidence
        refuted = [ev for ev in case.evidence
                   if (p := claim_of(ev).p_claim_adjusted) is not None and p <= case.t.alpha]
        if not refuted:
            return None
        top = max(refuted, key=lambda ev: ev.value)
        top.tier = HIGH
        return self(HIGH, Strongest(top))

    def reason(self, d: Decision[Strongest], case: Case) -> str:
        top, m = d.facts.top, len(case.evidence)
        return (f"THE DP GUARANTEE DOES NOT HOLD: {clause(top, m)}; the claimed ε {claim_of(top).epsilon_spent:.2f} is "
                f"rejected at p {p_text(claim_of(top).p_claim_adjusted)} after {CORRECTION} correction over {m} "
                f"audit(s). {top.text} The DP-SGD implementation, its accounting or the audit is broken (or the target "
                "carries something ε does not cover: see the coverage table).")

    def short(self, d: Decision[Strongest], case: Case) -> str:
        top = d.facts.top
        return f"claimed ε {claim_of(top).epsilon_spent:.2f} refuted, p {p_text(claim_of(top).p_claim_adjusted)}"


class RowSignificant(Significant):
    def reason(self, d: Decision[Strongest], case: Case) -> str:
        top = d.facts.top
        spent = claim_of(top).epsilon_spent
        within = (f" The bound is within the claimed ε {spent:.2f} (not rejected, p "
                  f"{p_text(claim_of(top).p_claim_adjusted)} after {CORRECTION}): the guarantee holds as far as this "
                  "audit can tell, and the loss it proves is loss that ε allows." if spent is not None else "")
        return f"{clause(top, len(case.evidence))}. {top.text}{within}"

    def short(self, d: Decision[Strongest], case: Case) -> str:
        return short(d.facts.top)


@dataclass(frozen=True)
class Ceiling:
    """The largest ε the row's canaries could have certified."""

    ceiling: float


class Uncertifiable(Rule[Ceiling]):
    """No audit could have certified ``canary_epsilon_high``."""

    name = "uncertifiable"

    def decide(self, case: Case) -> Decision[Ceiling] | None:
        ceiling = max(case.ceilings, default=0.0)
        return self(INCONCLUSIVE, Ceiling(ceiling)) if ceiling < case.t.canary_epsilon_high else None

    def reason(self, d: Decision[Ceiling], case: Case) -> str:
        return (f"no canary audit proved any privacy loss, but with these canaries it could certify at most ε "
                f"{d.facts.ceiling:.2f} (below {case.t.canary_epsilon_high:g}): plant more canaries (--canaries, "
                "--gradient-canaries) or use a dataset with a larger holdout.")

    def short(self, d: Decision[Ceiling], case: Case) -> str:
        return f"no loss proved; ceiling ε {d.facts.ceiling:.2f}"

    def to_conclude(self, made_by: str) -> str:
        return "more canaries (--canaries, --gradient-canaries) or a dataset with a larger holdout"


class Low(Rule[Ceiling]):
    name = "low"

    def decide(self, case: Case) -> Decision[Ceiling]:
        return self(LOW, Ceiling(max(case.ceilings, default=0.0)))

    def reason(self, d: Decision[Ceiling], case: Case) -> str:
        return (f"no canary audit proved any privacy loss (all bounds 0 after {CORRECTION} correction), though it "
                f"could have certified up to ε {d.facts.ceiling:.2f}.")

    def short(self, d: Decision[Ceiling], case: Case) -> str:
        return f"no loss proved; could certify ε {d.facts.ceiling:.2f}"


RULES: tuple[Rule[Any], ...] = (NoBound(), Refuted(), RowSignificant(), Uncertifiable(), Low())


def tier_of_bound(bound: float, t: RiskThresholds) -> str:
    return HIGH if bound >= t.canary_epsilon_high else MEDIUM if bound > 0 else LOW
