"""What can be reconstructed from a shared artifact? Two rows per declared share (kind and direction), one per
level (issue 47), from the reconstruction attacks' stored scores, their nulls and their power:

* **records** (row key ``full_model↑``): can individual training records be reconstructed from it? Decided only by
  the record-level test (``identifiability``: reconstructions nearer the victim's training records than to fresh
  records of its domain, beyond every null, the holdout twin included);
* **the client's data as a whole** (``client_data:full_model↑``): does it reveal what the client's data is like —
  its domain, its classes? Decided only by the distribution-level tests (``domain_attribution``,
  ``class_fidelity``), whose null is what smooth images and an untrained model give.

Rules, in order, for each row over its own tests (each a small function returning a :class:`Decision` or None):
``significant`` (a test beat its strongest null after Holm: its own tier), ``uninformative`` (no test at these
counts could have reached MEDIUM: INCONCLUSIVE), ``powered`` (the positive control showed the attack finds this
level's leakage where it is known to exist: LOW), else INCONCLUSIVE for want of power (``unpowered``). A records
row's power is the control's record-level finding (it singled out the member images it was built from); the client
data row's is its distribution-level finding (it revealed their domain or class)."""

from __future__ import annotations

from typing import Any

from fedaudit.run.results import BOOKKEEPING, Leakage
from fedaudit.statistics.membership_statistics import holm

from .evidence import (CLIENT_DATA, HIGH, INCONCLUSIVE, INVERSION, LOW, MEDIUM, NOT_ASSESSED, NULL_NAMES, POWER_ALPHA,
                       Decision, Evidence, Row, decide, interval, isnum, pair, strongest)
from .thresholds import RiskThresholds
from .wording import (identifiability_finding, inversion_lead, inversion_reason, inversion_short, level_title,
                      lift_finding, lift_lead, not_assessed, observer_of, pct)

RECORD_TESTS = ("identifiability",)


def inversion_rows(key: str, metrics: dict[str, Any], config: dict[str, Any], t: RiskThresholds) -> list[Row]:
    """The records row and the client-data row of one declared share (``"full_model↑"``)."""
    kind, arrow = key[:-1], key[-1]
    attacker = str(config.get("attacker") or "server")
    observer = observer_of(key, attacker)

    def row(question: str, tier: str, reason: str, brief: str, evidence: list[Evidence] = (),
            rule: str | None = None) -> Row:
        name = key if question == INVERSION else f"{CLIENT_DATA}:{key}"
        return Row(name, level_title(key, question), question, key, observer, tier, reason, brief, list(evidence),
                   t.alpha, rule)

    found = _attacks_on(kind, metrics)
    unseen = _unseen(arrow, observer, attacker, kind, metrics, found)
    if unseen:
        return [row(q, NOT_ASSESSED, *not_assessed(q, unseen)) for q in (INVERSION, CLIENT_DATA)]
    evidence, skipped, powers = _gather(found, attacker, t)
    rows = []
    for question in (INVERSION, CLIENT_DATA):
        mine = [e for e in evidence if (e.test in RECORD_TESTS) == (question == INVERSION)]
        if not mine:
            why = skipped or ([f"no record-level test was stored for {kind} (distribution-level tests only)"]
                              if evidence and question == INVERSION else [])
            rows.append(row(question, NOT_ASSESSED, *not_assessed(question, Decision(
                NOT_ASSESSED, "no_score", {"subject": kind, "skipped": why}))))
            continue
        decide(mine, t)
        records = question == INVERSION
        decision = (_significant(mine) or _uninformative(mine, t) or _powered(powers, records)
                    or _unpowered(powers, records))
        rows.append(row(question, decision.tier, inversion_reason(decision, mine, metrics),
                        inversion_short(decision, mine), mine, decision.rule))
    return rows


def _attacks_on(kind: str, metrics: dict[str, Any]) -> list[tuple[str, str, dict]]:
    """(attack, key, section) of every reconstruction result whose target is this kind."""
    return [(name, k, sec) for name, sec in Leakage.of(metrics).reconstruction_sections().items()
            for k in sec if k not in BOOKKEEPING and k.split(":")[0] == kind]


def _unseen(arrow: str, observer: str, attacker: str, kind: str, metrics: dict[str, Any],
            found: list[tuple[str, str, dict]]) -> Decision | None:
    """Why a row has nothing to judge, or None."""
    ran = bool(Leakage.of(metrics).reconstruction_sections())
    if arrow != ("↑" if attacker == "server" else "↓"):  # first: the hint must name the view as well as the attack
        return Decision(NOT_ASSESSED, "other_view", {"observer": observer, "attacker": attacker, "attack_ran": ran})
    if not ran:
        return Decision(NOT_ASSESSED, "no_attack")
    if not found:
        return Decision(NOT_ASSESSED, "no_target", {"subject": kind})
    return None


def _gather(found: list[tuple[str, str, dict]], attacker: str, t: RiskThresholds
            ) -> tuple[list[Evidence], list[str], list[tuple[str, dict[str, Any]]]]:
    """The tests of every attack on the share, why others were not scored, and each victim's positive control."""
    evidence: list[Evidence] = []
    skipped: list[str] = []
    powers: list[tuple[str, dict[str, Any]]] = []
    for name, key, sec in found:
        entries = {v: e for v, e in sec[key].items() if isinstance(e, dict)}
        summary = (sec.get("summary") or {}).get(key)
        if summary is None:
            for e in entries.values():
                status = e.get("status", "unknown")
                reason = e.get("reason") or (e.get("metrics") or {}).get("reason") or "no reason stored"
                status = "attacked but not scored" if status == "attacked" else status
                if f"{status}: {reason}" not in skipped:
                    skipped.append(f"{status}: {reason}")
            continue
        evidence += reconstruction_evidence(name, key, attacker, entries, summary, t)
        powers += [(f"{name} {key} / {v}", e.get("power") or {}) for v, e in entries.items()
                   if isinstance(e.get("metrics"), dict) and "identifiability" in e["metrics"]]
    return evidence, skipped, powers


# -- rules --------------------------------------------------------------------------------------


def _significant(evidence: list[Evidence]) -> Decision | None:
    top = strongest(evidence)
    return Decision(top.tier, "significant", {"top": top}) if top.tier in (HIGH, MEDIUM) else None


def _uninformative(evidence: list[Evidence], t: RiskThresholds) -> Decision | None:
    """A LOW that no result at these counts could have turned into MEDIUM is not a finding."""
    if any(_could_reach_medium(e, len(evidence), t) for e in evidence):
        return None
    counts = sorted({f"{e.test} on {(e.detail or {}).get('n')}" for e in evidence
                     if isinstance((e.detail or {}).get("n"), int)})
    saturated = sorted({f"{e.test} ({e.baseline_name} already at {pct(e.baseline)})" for e in evidence if _saturated(e)})
    return Decision(INCONCLUSIVE, "uninformative", {"counts": counts, "saturated": saturated})


def _powered(powers: list[tuple[str, dict[str, Any]]], records: bool) -> Decision | None:
    """Power, corrected across the row's victims (Holm): a positive control that fires by chance in one of many
    victims must not turn an uninformative reading into an informative LOW. A records row needs the control to have
    singled out its member images; a client-data row, to have revealed their domain or class."""
    measured = [(src, p) for src, p in powers if p.get("status") == "measured" and isnum(p.get("p_value"))]
    # p_reveals: stored since issue 47; before, p_value was the smaller of it and the record-level p
    level = [p.get("p_record_level", 1.0) if records else p.get("p_reveals", p["p_value"]) for _, p in measured]
    reached = [src for (src, _), a in zip(measured, holm(level)) if a <= POWER_ALPHA]
    return Decision(LOW, "powered", {"control": reached[0], "records": records}) if reached else None


def _unpowered(powers: list[tuple[str, dict[str, Any]]], records: bool) -> Decision:
    why = sorted({p.get("reason") for _, p in powers if p.get("status") == "not available" and p.get("reason")})
    ran = any(p.get("status") == "measured" for _, p in powers)
    return Decision(INCONCLUSIVE, "unpowered", {"why": [] if ran else why, "records": records})


# -- evidence -----------------------------------------------------------------------------------


def _could_reach_medium(e: Evidence, m: int, t: RiskThresholds) -> bool:
    """Whether a perfect result at the test's counts (every image right) would read MEDIUM: significant at
    alpha / m (Holm's first step, the most a row's strongest test may need) and, for a lift test, a lift of at
    least the medium threshold. A test whose counts were not stored is given the benefit of the doubt."""
    detail = e.detail or {}
    n = detail.get("n")
    if not isinstance(n, int):
        return True
    if n <= 0:
        return False
    level = t.alpha / max(m, 1)
    if e.test == "identifiability":  # the permutation test against chance and one against each measured null
        chance = detail.get("chance")
        best = [lift_p_value([n, n], None, float(chance))] if isnum(chance) else []
        best += [lift_p_value([n, n], [v * n, n], None) for v in (detail.get("measured") or {}).values()]
        return max(best, default=0.0) <= level
    return (1.0 - float(e.baseline or 0.0) >= float(detail.get("medium", 0.0)) - 1e-9
            and lift_p_value([n, n], detail.get("null_counts"), detail.get("chance")) <= level)


def _saturated(e: Evidence) -> bool:
    """The strongest null is already at a bound the test cannot beat (100%)."""
    return isnum(e.baseline) and float(e.baseline) >= 1.0 - 1e-9


def _strongest_null(nulls: dict[str, float]) -> tuple[str, float]:
    """(name, value) of the largest finite null."""
    finite = {k: v for k, v in nulls.items() if isnum(v)}
    name = max(finite, key=lambda k: finite[k])
    return name, float(finite[name])


def reconstruction_evidence(attack: str, key: str, attacker: str, entries: dict[str, dict], summary: dict[str, Any],
                            t: RiskThresholds) -> list[Evidence]:
    """The distribution-level tests (macro over victims) and each victim's record-level test."""
    attacked = {v: e for v, e in entries.items() if e.get("status") == "attacked" and isinstance(e.get("metrics"), dict)
                and "identifiability" in e["metrics"]}
    what = "images" if any("image_grid" in e for e in attacked.values()) else "latent features"
    victims = list((summary.get("domain_attribution") or {}).get("victims") or attacked)
    out = _distribution_evidence(attack, key, summary, victims, inversion_lead(key, attacker, victims, what), t)
    for victim, e in attacked.items():
        found = _record_evidence(attack, key, victim, e, what, t)
        if found is not None:
            out.append(found)
    return out


def _distribution_evidence(attack: str, key: str, summary: dict[str, Any], victims: list[str], lead: str,
                           t: RiskThresholds) -> list[Evidence]:
    attribution = summary.get("domain_attribution") or {}
    tests = (("domain_attribution", attribution.get("macro") or {}, attribution.get("counts"),
              (t.domain_attribution_lift_high, t.domain_attribution_lift_medium)),
             ("class_fidelity", summary.get("class_fidelity") or {}, (summary.get("class_fidelity") or {}).get("counts"),
              (t.class_fidelity_lift_high, t.class_fidelity_lift_medium)))
    source = {"domain_attribution": f"{attack} {key} (macro over {len(victims)} victim(s))",
              "class_fidelity": f"{attack} {key} (mean over {len(victims)} victim(s))"}
    found = [_lift_evidence(test, source[test], metric, counts or {}, levels, lift_lead(test, lead, victims),
                            len(victims)) for test, metric, counts, levels in tests]
    return [e for e in found if e is not None]


def _lift_evidence(test: str, source: str, metric: dict[str, Any], counts: dict[str, Any], levels: tuple[float, float],
                   lead: str, victims: int) -> Evidence | None:
    """A distribution-level test: the attack's rate over the strongest of chance and the measured controls."""
    nulls = {k: metric[k] for k in ("chance", "control", "prior_only") if isnum(metric.get(k))}
    if not isnum(metric.get("attack")) or not nulls:
        return None
    high, medium = levels
    name, base = _strongest_null(nulls)
    p = lift_p_value(counts.get("attack"), counts.get(name), base if name == "chance" else None)
    lift = metric["attack"] - base
    tier = HIGH if lift >= high - 1e-9 else MEDIUM if lift >= medium - 1e-9 else LOW
    text = lift_finding(lead, metric, victims, lift, NULL_NAMES[name], base)
    return Evidence(test, source, float(metric["attack"]), base, NULL_NAMES[name], p,
                    nulls={**nulls, **({"twin": metric["twin"]} if isnum(metric.get("twin")) else {})},
                    tier=tier, text=text, effect=lift,
                    detail={"n": round(counts["attack"][1]) if pair(counts.get("attack")) else None,
                            "null_counts": counts.get(name), "chance": base if name == "chance" else None,
                            "medium": medium})


def _record_evidence(attack: str, key: str, victim: str, e: dict[str, Any], what: str,
                     t: RiskThresholds) -> Evidence | None:
    """Record-level leakage beyond *every* null: the permutation test against chance and a one-sided test against
    each measured null must all reject (an intersection-union test: its p-value is the largest). Significant, it is
    MEDIUM; HIGH when its 95% interval's low end also clears the strongest null by ``identifiability_margin_high``
    (significance alone already puts the low end above each measured null at these counts, so the margin is what
    separates a large leak from a detectable one)."""
    ident = e["metrics"]["identifiability"]
    if not isnum(ident.get("attack")) or not isnum(ident.get("attack_p_value")):
        return None
    nulls = {k: ident[k] for k in ("chance", "control", "prior_only", "twin") if isnum(ident.get(k))}
    measured = {k: v for k, v in nulls.items() if k != "chance"}
    name, base = _strongest_null(nulls)
    ci = ident.get("attack_ci95")
    n = int(ident.get("n") or 0)
    p_each = {"chance": float(ident["attack_p_value"]),
              **{k: lift_p_value([ident["attack"] * n, n], [v * n, n], None) for k, v in measured.items()}}
    p = max(p_each.values())
    margin = (ci[0] - base) if interval(ci) else None
    tier = HIGH if margin is not None and margin >= t.identifiability_margin_high - 1e-9 else MEDIUM
    text = identifiability_finding(ident, n, what, victim, ci if interval(ci) else None, p_each["chance"], p,
                                   NULL_NAMES[name], base, margin, t.identifiability_margin_high)
    return Evidence("identifiability", f"{attack} {key} / {victim}", float(ident["attack"]), base, NULL_NAMES[name],
                    p, interval=ci if interval(ci) else None, nulls=nulls,
                    power=_power_summary(e.get("power")), tier=tier, text=text, effect=margin,
                    detail={"p_against": p_each, "balanced": ident.get("balanced"),
                            "null_q95": ident.get("null_q95"), "n": n, "chance": ident.get("chance"),
                            "measured": measured, "victim": victim})


def _power_summary(power: Any) -> dict[str, Any] | None:
    if not isinstance(power, dict):
        return None
    if power.get("status") != "measured":
        return {"reached": False, "status": power.get("status"), "reason": power.get("reason")}
    sizes = {k: {**{m: v[m] for m in ("domain_attribution", "class_fidelity") if m in v},
                 "identifiability": v.get("identifiability"), "identifiability_p_value": v.get("p_value")}
             for k, v in (power.get("sizes") or {}).items() if isinstance(v, dict) and "p_reveals" in v}
    return {"reached": bool(power.get("reached")), "record_level": bool(power.get("record_level")),
            "p_value": power.get("p_value"), "sizes": sizes}


def lift_p_value(attack: Any, null: Any, chance: float | None) -> float:
    """One-sided p-value of the attack's count beating the null: binomial against a chance level,
    Fisher's exact test against a measured control's count."""
    from scipy.stats import binomtest, fisher_exact

    if not pair(attack):
        return 1.0
    k, n = round(attack[0]), round(attack[1])
    if n <= 0:
        return 1.0
    if chance is not None:
        return float(binomtest(k, n, min(max(chance, 0.0), 1.0), alternative="greater").pvalue)
    if not pair(null) or round(null[1]) <= 0:
        return 1.0
    kb, nb = round(null[0]), round(null[1])
    return float(fisher_exact([[k, n - k], [kb, nb - kb]], alternative="greater")[1])
