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
from typing import Any

from fedaudit.run.results import Leakage, MIA, MembershipResult
from fedaudit.statistics.membership_statistics import advantage_null_quantile

from .evidence import (ANYONE, ARTIFACT, DOMAIN, GLOBAL, HIGH, INCONCLUSIVE, LAST_UPLOAD, LOW, MEDIUM, MEMBERSHIP,
                       NOT_ASSESSED, Decision, Evidence, Row, Unscored, decide, interval, isnum, mia_level, strongest)
from .thresholds import RiskThresholds
from .wording import (membership_finding, membership_reason, membership_short, membership_title, not_assessed,
                      observer_of)

Attack = MembershipResult  # (variant, target, victim, entry)
WEIGHTS_FROM = re.compile(r"^(\w+)@r\d+ from client:")


# -- which row each attack belongs to -----------------------------------------------------------------


def membership_groups(metrics: dict[str, Any], config: dict[str, Any]) -> dict[str, list[Attack]]:
    """Every stored membership attack under the subject its input is: a share key (``full_model↑``), ``global_model``
    (the released model), or ``last_upload`` where a run stored no way to tell which share the upload was."""
    groups: dict[str, list[Attack]] = {}
    declared = list((metrics.get("communication") or {}).get("declared") or [])
    sees = "↑" if str(config.get("attacker") or "server") == "server" else "↓"
    for variant, target, victim, entry in Leakage.of(metrics).membership(ordered=True):
        if variant == DOMAIN:  # participation, not records: its own row
            continue
        if target == GLOBAL:
            keys = [GLOBAL]
        elif target == LAST_UPLOAD:
            keys = upload_shares(entry, declared)
        elif variant == ARTIFACT:
            keys = [f"{target.split(':')[0]}{sees}"]
        else:
            keys = [target]
        for key in keys:
            groups.setdefault(key, []).append(MembershipResult(variant, target, victim, entry))
    return groups


def upload_shares(entry: dict[str, Any], declared: list[str]) -> list[str]:
    """The shares a last-upload attack's model was built from: the client-sent kinds its ``weights_from`` names, else
    the declared weight-bearing upload, else ``last_upload`` (a run that stored neither)."""
    sources = entry.get("weights_from")
    kinds = [m.group(1) for s in (sources if isinstance(sources, dict) else {}) if (m := WEIGHTS_FROM.match(str(s)))]
    if kinds:
        return [f"{k}↑" for k in dict.fromkeys(kinds)]
    weight = [k for k in declared if k.endswith("↑") and k[:-1] in ("full_model", "partial_model")]
    return weight[:1] or [LAST_UPLOAD]


# -- one row ------------------------------------------------------------------------------------------------


def membership_row(subject: str, attacks: list[Attack], metrics: dict[str, Any], config: dict[str, Any],
                   t: RiskThresholds) -> Row:
    """The membership row of one subject (a share key, ``global_model`` or ``last_upload``)."""
    attacker = str(config.get("attacker") or "server")
    observer = (ANYONE if subject == GLOBAL else "server" if subject == LAST_UPLOAD else observer_of(subject, attacker))
    artifact = "released model" if subject == GLOBAL else subject

    def row(tier: str, reason: str, brief: str, evidence: list[Evidence] = (), rule: str | None = None) -> Row:
        return Row(f"membership:{subject}", membership_title(subject), MEMBERSHIP, artifact, observer, tier, reason,
                   brief, list(evidence), t.alpha, rule)

    unseen = _unseen(subject, observer, attacker, attacks, metrics)
    if unseen:
        return row(NOT_ASSESSED, *not_assessed(MEMBERSHIP, unseen))
    evidence, skipped = _evidence(attacks, t)
    if not evidence:
        return row(NOT_ASSESSED, *not_assessed(MEMBERSHIP, Decision(NOT_ASSESSED, "no_score", {"subject": subject,
                                                                                            "skipped": skipped})))
    decide(evidence, t)
    artifact_tests = [(victim, e) for variant, _, victim, e in attacks if variant == ARTIFACT and "advantage" in e]
    discounted = _discount_twins(evidence, artifact_tests, t)
    decision = (_exact_match(artifact_tests) or _significant(evidence) or _twin_only(discounted)
                or _no_control(artifact_tests, t) or _undetectable(evidence, t) or _low(evidence, t))
    reason = membership_reason(decision, subject, evidence, artifact_tests, metrics, t)
    return row(decision.tier, reason, membership_short(decision, evidence), evidence, decision.rule)


def _unseen(subject: str, observer: str, attacker: str, attacks: list[Attack],
            metrics: dict[str, Any]) -> Decision | None:
    """Why a row has nothing to judge, or None."""
    if subject[-1:] in "↑↓" and subject.endswith("↑") != (attacker == "server"):
        return Decision(NOT_ASSESSED, "other_view", {"observer": observer, "attacker": attacker})
    if attacks:
        return None
    data = metrics.get("auditor_data") or {}
    if data.get("status") == "none":
        return Decision(NOT_ASSESSED, "no_records", {"why": data.get("why")})
    if not Leakage.of(metrics).sections.get(MIA):
        return Decision(NOT_ASSESSED, "no_attack")
    return Decision(NOT_ASSESSED, "no_target", {"subject": subject})


def _evidence(attacks: list[Attack], t: RiskThresholds) -> tuple[list[Evidence], list[Unscored]]:
    """Each attack's tests (TPR at 1% FPR, and the advantage), and why the others have none."""
    evidence: list[Evidence] = []
    skipped: list[Unscored] = []
    for variant, target, victim, e in attacks:
        if "advantage" not in e:
            skipped.append(Unscored.of(f"{variant}/{victim}", e))
            continue
        detail = {"attack": _attack_name(variant, e), "variant": variant, "target": target, "victim": victim,
                  "members": int(e.get("n_members", e.get("members", 0)) or 0),
                  "nonmembers": int(e.get("n_nonmembers", e.get("nonmembers", 0)) or 0),
                  "auc": e.get("auc") if isnum(e.get("auc")) else None}
        level = mia_level(e, 0.01)
        if level is not None and isnum(level.get("p_value")):
            ci = level.get("tpr_interval", level.get("tpr_ci95"))
            resolvable = bool(level.get("resolvable", True))
            clears = resolvable and interval(ci) and ci[0] > t.mia_tpr_ci_low
            evidence.append(Evidence("mia_tpr", f"{variant} on {target} / {victim}", float(level.get("tpr", 0.0)),
                                     float(level.get("fpr_achieved", 0.01)), "achieved FPR (the chance line TPR = FPR)",
                                     float(level["p_value"]), interval=ci if interval(ci) else None,
                                     tier=HIGH if clears else MEDIUM if resolvable else LOW,
                                     effect=(ci[0] if interval(ci) else None),
                                     detail={**detail, "resolvable": resolvable, "warning": level.get("warning") or None}))
        adv, p = e.get("advantage"), e.get("advantage_p_value")
        if isnum(adv) and isnum(p):
            tier = HIGH if adv >= t.mia_advantage_high else MEDIUM if adv >= t.mia_advantage_medium else LOW
            evidence.append(Evidence("mia_advantage", f"{variant} on {target} / {victim}", float(adv),
                                     e.get("advantage_null_95"), "95% quantile with no signal at these counts", float(p),
                                     tier=tier, effect=float(adv), detail=detail))
    for e in evidence:
        e.text = membership_finding(e)
    return evidence, skipped


def _attack_name(variant: str, entry: dict[str, Any]) -> str:
    if variant == ARTIFACT:
        signal = str(entry.get("signal") or "")
        return ("tracing test" if "tracing" in signal else "nearest-entry test" if "nearest" in signal
                else "artifact test")
    return f"{variant} attack"


# -- rules --------------------------------------------------------------------------------------------


def _discount_twins(evidence: list[Evidence], artifact_tests: list[tuple[str, dict]], t: RiskThresholds) -> list[Evidence]:
    """The holdout twin is the artifact test's null: where it separates members as well (the signal survives swapping
    the members out, e.g. it comes from the weights), that test's finding cannot be credited to the artifact."""
    twin_off = _twin_separates(artifact_tests, t)
    discounted = [e for e in evidence if e.tier in (HIGH, MEDIUM) and (e.detail or {}).get("variant") == ARTIFACT
                  and (e.detail or {}).get("victim") in twin_off]
    for e in discounted:
        e.tier = LOW
    return discounted


def _exact_match(artifact_tests: list[tuple[str, dict]]) -> Decision | None:
    shipped = [(victim, e) for victim, e in artifact_tests if isinstance(e.get("exact_matches"), dict)
               and e["exact_matches"].get("members") and not e["exact_matches"].get("nonmembers")]
    return Decision(HIGH, "exact_match", {"found": shipped}) if shipped else None


def _significant(evidence: list[Evidence]) -> Decision | None:
    top = strongest(evidence)
    return Decision(top.tier, "significant", {"top": top}) if top.tier in (HIGH, MEDIUM) else None


def _twin_only(discounted: list[Evidence]) -> Decision | None:
    victims = sorted({(e.detail or {}).get("victim") for e in discounted})
    return Decision(INCONCLUSIVE, "twin_only", {"victims": victims}) if discounted else None


def _no_control(artifact_tests: list[tuple[str, dict]], t: RiskThresholds) -> Decision | None:
    """Power before LOW: the artifact test must have found the members of its positive control."""
    weak = [(victim, e) for victim, e in artifact_tests
            if not (isnum((e.get("power") or {}).get("advantage_p_value")) and e["power"]["advantage_p_value"] <= t.alpha)]
    return Decision(INCONCLUSIVE, "no_control", {"weak": weak}) if weak else None


def _detectable(evidence: list[Evidence], t: RiskThresholds) -> tuple[float, int]:
    """The smallest advantage the row's tests could have detected after Holm's first step, and their number."""
    advantage = [e for e in evidence if e.test == "mia_advantage"]
    m = len(advantage) or 1
    sizes = {(e.detail["members"], e.detail["nonmembers"]) for e in advantage}
    return (min(advantage_null_quantile(n1, n0, t.alpha / m) for n1, n0 in sizes) if sizes else float("inf")), m


def _undetectable(evidence: list[Evidence], t: RiskThresholds) -> Decision | None:
    detectable, m = _detectable(evidence, t)
    if detectable <= t.mia_advantage_medium:
        return None
    return Decision(INCONCLUSIVE, "undetectable", {"detectable": detectable, "tests": m})


def _low(evidence: list[Evidence], t: RiskThresholds) -> Decision:
    detectable, m = _detectable(evidence, t)
    return Decision(LOW, "low", {"detectable": detectable, "tests": m})


def _twin_separates(artifact_tests: list[tuple[str, dict[str, Any]]], t: RiskThresholds) -> set[str]:
    """Victims whose holdout twin (the artifact with the members swapped out) separates members significantly."""
    return {victim for victim, e in artifact_tests if isinstance(e.get("twin"), dict)
            and isnum(e["twin"].get("advantage_p_value")) and e["twin"]["advantage_p_value"] <= t.alpha}
