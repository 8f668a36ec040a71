"""Does an artifact reveal which records were trained on? One row per artifact and observer, over **every**
record-level membership attack whose input is that artifact: the model attacks (loss, LiRA, RMIA) on the victim's
last upload belong to the row of the share that upload is (``full_model↑``, or each kind its weights came from), the
tracing and nearest-entry tests to the row of the artifact they read, and the record-level attacks on the released
model to the released model's row. Holm runs over the row's whole family, so a row can never read LOW while an
attack on the same tensor, seen by the same observer, is significant. The domain-level attack asks another question
(did a domain take part?) and has its own row (:mod:`.participation`).

Rules, in order (each a small function returning a :class:`Decision` or None):

* ``exact_match`` — a per-record bank holds members' own entries exactly and no non-member's: HIGH whatever the
  counts (an exact match has no false positives to estimate).
* ``significant`` — the strongest test after Holm (and after the twin rule below) sets the tier: TPR at 1% FPR
  significant at a resolvable level is MEDIUM, HIGH with its interval's low end above ``mia_tpr_ci_low``; an
  advantage of ``mia_advantage_high`` is HIGH, of ``mia_advantage_medium`` MEDIUM.
* ``twin_only`` — the artifact test separated members, but so did its holdout twin (the artifact with the members
  swapped out) for those victims: the signal is not this artifact's, INCONCLUSIVE.
* ``no_control`` — the artifact test did not find the members of its positive control: INCONCLUSIVE.
* ``undetectable`` — at these counts an advantage of ``mia_advantage_medium`` could not have been detected
  across the row's tests: INCONCLUSIVE.
* otherwise LOW: every attack on the artifact had its power and none was significant.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedaudit.run.audited_run import AuditedRun
from fedaudit.run.entries import ExactMatches, MembershipEntry, MembershipTest
from fedaudit.run.evidence_detail import MembershipDetail, MembershipTprDetail, expect
from fedaudit.statistics.membership_statistics import advantage_null_quantile

from .evidence import (VerdictRow, Detectable, Strongest, ANYONE, ARTIFACT, DOMAIN, GLOBAL, HIGH, INCONCLUSIVE, LAST_UPLOAD, LOW, MEDIUM, MEMBERSHIP,
                       Decision, Evidence, Rule, Significant, Unscored, closest, decide, deciding, first, row)
from .thresholds import CORRECTION, RiskThresholds
from .unassessed import NO_ATTACK, NO_RECORDS, NO_SCORE, NO_TARGET, OTHER_VIEW, Unseen
from .wording import (advice_of, attack_of, clause, fmt, membership_finding, membership_title, observer_of, p_text,
                      quiet_short, short, subject_name)

Attack = MembershipTest  # (variant, target, victim, entry)
WEIGHTS_FROM = re.compile(r"^(\w+)@r\d+ from client:")


# -- which row each attack belongs to -----------------------------------------------------------------


def membership_groups(run: AuditedRun) -> dict[str, list[Attack]]:
    """Every stored membership attack under the subject its input is: a share key (``full_model↑``), ``global_model``
    (the released model), or ``last_upload`` where a run stored no way to tell which share the upload was."""
    groups: dict[str, list[Attack]] = defaultdict(list)  # a subject no attack read has none
    sees = "↑" if run.attacker == "server" else "↓"
    for test in sorted(run.membership, key=lambda r: (r.variant, r.target, r.victim)):  # judged again, the same
        if test.variant == DOMAIN:  # participation, not records: its own row
            continue
        if test.target == GLOBAL:
            keys = [GLOBAL]
        elif test.target == LAST_UPLOAD:
            keys = upload_shares(test.entry, list(run.declared))
        elif test.variant == ARTIFACT:
            keys = [f"{test.target.split(':')[0]}{sees}"]
        else:
            keys = [test.target]
        for key in keys:
            groups[key].append(test)
    return groups


def upload_shares(entry: MembershipEntry, declared: list[str]) -> list[str]:
    """The shares a last-upload attack's model was built from: the client-sent kinds its ``weights_from`` names, else
    the declared weight-bearing upload, else ``last_upload`` (a run that stored neither)."""
    kinds = [m.group(1) for s in entry.weights_from if (m := WEIGHTS_FROM.match(s))]
    if kinds:
        return [f"{k}↑" for k in dict.fromkeys(kinds)]
    weight = [k for k in declared if k.endswith("↑") and k[:-1] in ("full_model", "partial_model")]
    return weight[:1] or [LAST_UPLOAD]


# -- one row ------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """What the rules of one membership row look at."""

    subject: str
    evidence: list[Evidence]
    artifact_tests: list[tuple[str, MembershipEntry]]  # (victim, entry) of the artifact test, where it ran
    discounted: list[Evidence]  # the artifact test's findings its holdout twin shares
    run: AuditedRun
    t: RiskThresholds


def membership_row(subject: str, attacks: list[Attack], run: AuditedRun, t: RiskThresholds) -> VerdictRow:
    """The membership row of one subject (a share key, ``global_model`` or ``last_upload``)."""
    observer = (ANYONE if subject == GLOBAL else "server" if subject == LAST_UPLOAD else observer_of(subject, run.attacker))
    artifact = "released model" if subject == GLOBAL else subject

    def made(d: Decision[Any], case: object, evidence: Sequence[Evidence] = ()) -> VerdictRow:
        return row(f"membership:{subject}", membership_title(subject), MEMBERSHIP, artifact, observer, d, case,
                   evidence, t.alpha)

    sees = not (subject[-1:] in "↑↓" and subject.endswith("↑") != (run.attacker == "server"))
    unseen = Unseen(MEMBERSHIP, subject, observer, run.attacker, sees, run.no_records, run.membership_ran,
                    bool(attacks))
    if (d := deciding((OTHER_VIEW, NO_RECORDS, NO_ATTACK, NO_TARGET), unseen)) is not None:
        return made(d, unseen)
    evidence, unseen.skipped[:] = _evidence(attacks, t)
    if not evidence:
        return made(NO_SCORE.decide(unseen), unseen)
    decide(evidence, t)
    artifact_tests = [(a.victim, a.entry) for a in attacks if a.variant == ARTIFACT and a.entry.scored]
    case = Case(subject, evidence, artifact_tests, _discount_twins(evidence, artifact_tests, t), run, t)
    return made(first(RULES, case), case, evidence)


def _evidence(attacks: list[Attack], t: RiskThresholds) -> tuple[list[Evidence], list[Unscored]]:
    """Each attack's tests (TPR at 1% FPR, and the advantage), and why the others have none."""
    evidence: list[Evidence] = []
    skipped: list[Unscored] = []
    for a in attacks:
        variant, target, victim, e = a.variant, a.target, a.victim, a.entry
        if not e.scored:
            skipped.append(Unscored(f"{variant}/{victim}", e.status, e.reason))
            continue
        detail = MembershipDetail(attack=_attack_name(variant, e), variant=variant, target=target, victim=victim,
                                  members=e.members or 0, nonmembers=e.nonmembers or 0, auc=e.auc)
        level = e.at_1pct_fpr
        if level is not None and level.p_value is not None:
            ci = list(level.interval) if level.interval else None
            clears = level.resolvable and ci is not None and ci[0] > t.mia_tpr_ci_low
            evidence.append(Evidence("mia_tpr", f"{variant} on {target} / {victim}", level.tpr or 0.0, level.fpr_achieved,
                                     "achieved FPR (the chance line TPR = FPR)", level.p_value, interval=ci,
                                     tier=HIGH if clears else MEDIUM if level.resolvable else LOW,
                                     effect=(ci[0] if ci else None),
                                     detail=MembershipTprDetail(**vars(detail), resolvable=level.resolvable,
                                                                warning=level.warning)))
        if e.advantage is not None and e.advantage_p_value is not None:
            adv = e.advantage
            tier = HIGH if adv >= t.mia_advantage_high else MEDIUM if adv >= t.mia_advantage_medium else LOW
            evidence.append(Evidence("mia_advantage", f"{variant} on {target} / {victim}", adv,
                                     e.advantage_null_95, "95% quantile with no signal at these counts",
                                     e.advantage_p_value, tier=tier, effect=adv, detail=detail))
    for found in evidence:
        found.text = membership_finding(found)
    return evidence, skipped


def _attack_name(variant: str, entry: MembershipEntry) -> str:
    if variant == ARTIFACT:
        return ("tracing test" if "tracing" in entry.signal else "nearest-entry test" if "nearest" in entry.signal
                else "artifact test")
    return f"{variant} attack"


def _discount_twins(evidence: list[Evidence], artifact_tests: list[tuple[str, MembershipEntry]],
                    t: RiskThresholds) -> list[Evidence]:
    """The holdout twin is the artifact test's null: where it separates members as well (the signal survives swapping
    the members out, e.g. it comes from the weights), that test's finding cannot be credited to the artifact."""
    twin_off = {victim for victim, e in artifact_tests if e.twin is not None and e.twin.significant(t.alpha)}
    discounted = [e for e in evidence if e.tier in (HIGH, MEDIUM) and expect(e.detail, MembershipDetail).variant == ARTIFACT
                  and e.victim in twin_off]
    for e in discounted:
        e.tier = LOW
    return discounted


# -- rules --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verbatim:
    """Per victim, the bank's exact matches of its members (and of no non-member)."""

    found: list[tuple[str, ExactMatches]]


class ExactMatch(Rule[Verbatim]):
    """A per-record bank holds members' own entries exactly and no non-member's: an exact match has no false
    positives to estimate."""

    name = "exact_match"

    def decide(self, case: Case) -> Decision[Verbatim] | None:
        shipped = [(victim, e.exact) for victim, e in case.artifact_tests
                   if e.exact is not None and e.exact.members and not e.exact.nonmembers]
        return self(HIGH, Verbatim(shipped)) if shipped else None

    def reason(self, d: Decision[Verbatim], case: Case) -> str:
        return (f"{_matched(d.facts.found)}: {subject_name(case.subject)} carries members' records verbatim (HIGH "
                f"by the exact-match rule, whatever the counts).{_also(case, None)}")

    def short(self, d: Decision[Verbatim], case: Case) -> str:
        return f"{sum(exact.members for _, exact in d.facts.found)} members' entries found verbatim"


class RowSignificant(Significant):
    def reason(self, d: Decision[Strongest], case: Case) -> str:
        top, t = d.facts.top, case.t
        rule = (f" HIGH by the advantage rule: significant after {CORRECTION} correction and at least "
                f"{t.mia_advantage_high:g}, whatever the low-FPR figures." if top.tier == HIGH and top.test == "mia_advantage"
                else "")
        return f"{clause(top, len(case.evidence))}. {top.text}{rule}{_also(case, top)}{_verbatim(case)}"

    def short(self, d: Decision[Strongest], case: Case) -> str:
        return short(d.facts.top)


@dataclass(frozen=True)
class Victims:
    """The victims whose finding the holdout twin shares."""

    victims: list[str]


class TwinOnly(Rule[Victims]):
    """The artifact test separated members, but so did its holdout twin for those victims."""

    name = "twin_only"

    def decide(self, case: Case) -> Decision[Victims] | None:
        victims = sorted({str(e.victim) for e in case.discounted})
        return self(INCONCLUSIVE, Victims(victims)) if case.discounted else None

    def reason(self, d: Decision[Victims], case: Case) -> str:
        readings = "; ".join(f"{victim}: twin AUC {fmt(twin.auc)}, KS p {p_text(twin.advantage_p_value)}"
                             for victim, e in case.artifact_tests
                             if victim in d.facts.victims and (twin := e.twin) is not None)
        return (f"{clause(closest(case.evidence), len(case.evidence))}, but the test separates members for "
                f"{', '.join(d.facts.victims)} and so does its holdout twin (the artifact with those members swapped "
                f"out): the signal is not this artifact's, and what the artifact adds cannot be told apart — "
                f"{readings}.{_also(case, None)}")

    def short(self, d: Decision[Victims], case: Case) -> str:
        return f"{short(closest(case.evidence))}; its twin too"

    def to_conclude(self, made_by: str) -> str:
        return ("a signal the holdout twin does not share: the artifact carries no more than a model without those "
                "members would; more records per victim tell the two apart")


@dataclass(frozen=True)
class Weak:
    """Per victim, the artifact test whose positive control it did not find."""

    weak: list[tuple[str, MembershipEntry]]


class NoControl(Rule[Weak]):
    """Power before LOW: the artifact test must have found the members of its positive control."""

    name = "no_control"

    def decide(self, case: Case) -> Decision[Weak] | None:
        weak = [(victim, e) for victim, e in case.artifact_tests
                if not (e.control is not None and e.control.significant(case.t.alpha))]
        return self(INCONCLUSIVE, Weak(weak)) if weak else None

    def reason(self, d: Decision[Weak], case: Case) -> str:
        shown = "; ".join(f"{victim}: {_control_reading(e)}" for victim, e in d.facts.weak)
        return (f"{_lead(case)}, but the artifact test did not find the members of its positive control (the artifact "
                f"recomputed from a few members alone, significant at {case.t.alpha:g} needed) — {shown}: a silence "
                f"from a test without power says nothing.{_also(case, None)}{_verbatim(case)}")

    def short(self, d: Decision[Weak], case: Case) -> str:
        return f"{short(closest(case.evidence))}; control missed"

    def to_conclude(self, made_by: str) -> str:
        return ("an artifact test that finds the members of its positive control: more records per victim ("
                f"{advice_of(made_by, 'more_records')})")


class Undetectable(Rule[Detectable]):
    """At these counts an advantage of ``mia_advantage_medium`` could not have been detected across the row."""

    name = "undetectable"

    def decide(self, case: Case) -> Decision[Detectable] | None:
        detectable, m = _detectable(case.evidence, case.t)
        return None if detectable <= case.t.mia_advantage_medium else self(INCONCLUSIVE, Detectable(detectable, m))

    def reason(self, d: Decision[Detectable], case: Case) -> str:
        return (f"{_lead(case)}, but at these counts an advantage below {d.facts.detectable:.2f} could not have "
                f"been detected across {d.facts.tests} tests (the medium threshold is "
                f"{case.t.mia_advantage_medium:g}): {advice_of(case.run.made_by, 'more_records')}.{_also(case, None)}"
                f"{_miscalibrated(case)}{_verbatim(case)}")

    def short(self, d: Decision[Detectable], case: Case) -> str:
        return quiet_short(case.evidence, d.facts.detectable, seen=False)

    def to_conclude(self, made_by: str) -> str:
        return f"enough records to detect an advantage of 0.1 after the correction: {advice_of(made_by, 'more_records')}"


class Low(Rule[Detectable]):
    """Every attack on the artifact had its power and none was significant."""

    name = "low"

    def decide(self, case: Case) -> Decision[Detectable]:
        detectable, m = _detectable(case.evidence, case.t)
        return self(LOW, Detectable(detectable, m))

    def reason(self, d: Decision[Detectable], case: Case) -> str:
        return (f"{_lead(case)}; every attack had its power: an advantage of {d.facts.detectable:.2f} or more would "
                f"have been detected.{_also(case, None)}{_miscalibrated(case)}{_verbatim(case)}")

    def short(self, d: Decision[Detectable], case: Case) -> str:
        return quiet_short(case.evidence, d.facts.detectable, seen=True)


RULES: tuple[Rule[Any], ...] = (ExactMatch(), RowSignificant(), TwinOnly(), NoControl(), Undetectable(), Low())


# -- what the rules share ---------------------------------------------------------------------------------------


def _detectable(evidence: list[Evidence], t: RiskThresholds) -> tuple[float, int]:
    """The smallest advantage the row's tests could have detected after Holm's first step, and their number."""
    advantage = [e for e in evidence if e.test == "mia_advantage"]
    m = len(advantage) or 1
    sizes = {(d.members, d.nonmembers) for d in (expect(e.detail, MembershipDetail) for e in advantage)}
    return (min(advantage_null_quantile(n1, n0, t.alpha / m) for n1, n0 in sizes) if sizes else float("inf")), m



def _lead(case: Case) -> str:
    m = len(case.evidence)
    return (f"no attack on {subject_name(case.subject)} was significant after {CORRECTION} correction over {m} tests "
            f"(closest {clause(closest(case.evidence), m)})")


def _also(case: Case, top: Evidence | None) -> str:
    """Every other attack on the artifact with its best advantage and corrected p: the reviewer sees them all."""
    best: dict[str, Evidence] = {}
    for e in case.evidence:
        name = attack_of(e)
        if e.test == "mia_advantage" and (top is None or name != attack_of(top)):
            if name not in best or e.p_adjusted < best[name].p_adjusted:
                best[name] = e
    others = "; ".join(f"{name} {e.value:.2f} on {e.victim} (p {p_text(e.p_adjusted)})" for name, e in best.items())
    return f" Other attacks on {subject_name(case.subject)}: {others}." if others else ""


def _control_reading(e: MembershipEntry) -> str:
    control = e.control
    if control is not None and control.stored:
        return f"AUC {fmt(control.auc)}, KS p {p_text(control.advantage_p_value)} on {control.records} records"
    return str((control.reason if control else None) or e.controls or "not run")


def _miscalibrated(case: Case) -> str:
    bad = sorted({f"{r.variant}/{r.victim}" for r in case.run.membership if r.entry.miscalibrated})
    return (f" The reference models did not stand in for the target ({', '.join(bad)}: see the membership section), "
            "so those variants' silence says little." if bad else "")


def _verbatim(case: Case) -> str:
    """A note naming the records a per-record bank carries verbatim (their own entry, found exactly, within the
    float error of recomputing it)."""
    found = [(victim, e.exact) for victim, e in case.artifact_tests if e.exact is not None and e.exact.members]
    return f" The bank carries records verbatim: {_matched(found)}." if found else ""


def _matched(found: list[tuple[str, ExactMatches]]) -> str:
    return "; ".join(
        f"{exact.members} of {victim}'s members have their own entry in it exactly (non-members: {exact.nonmembers}"
        + (f"; tolerance {exact.tolerance:.2g}" if exact.tolerance is not None else "") + ")"
        for victim, exact in found)
