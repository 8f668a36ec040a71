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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedaudit.run.stored.reconstruction import POWER_SINGLE
from fedaudit.run.audited_run import AuditedRun
from fedaudit.run.evidence_detail import IdentifiabilityDetail, LiftDetail
from fedaudit.run.entries import finite_pair, LiftTest, ReconstructionEntry, ReconstructionPower, ReconstructionTable
from fedaudit.statistics.membership_statistics import holm

from .evidence import (VerdictRow, Strongest, CLIENT_DATA, HIGH, INCONCLUSIVE, INVERSION, LOW, MEDIUM, NULL_NAMES, POWER_ALPHA,
                       Decision, Evidence, Rule, Significant, closest, decide, deciding, first, isnum, row)
from .thresholds import CORRECTION, RiskThresholds
from .unassessed import NO_ATTACK, NO_SCORE, NO_TARGET, OTHER_VIEW, Unseen
from .wording import (advice_of, clause, identifiability_finding, inversion_lead, inversion_notes, level_title,
                      lift_finding, lift_lead, observer_of, pct, short)

RECORD_TESTS = ("identifiability",)


@dataclass
class Case:
    """What the rules of one reconstruction row look at: its own tests, each victim's positive control, the level."""

    key: str
    evidence: list[Evidence]
    powers: list[tuple[str, ReconstructionPower | None]]  # (whose control, its result) for each victim scored
    records: bool  # the records row (else the client-data row)
    made_by: str
    t: RiskThresholds


def inversion_rows(key: str, run: AuditedRun, t: RiskThresholds) -> list[VerdictRow]:
    """The records row and the client-data row of one declared share (``"full_model↑"``)."""
    kind, arrow = key[:-1], key[-1]
    observer = observer_of(key, run.attacker)
    found = [table for table in run.reconstructions if table.artifact.split(":")[0] == kind]

    def made(question: str, d: Decision[Any], case: object, evidence: Sequence[Evidence] = ()) -> VerdictRow:
        name = key if question == INVERSION else f"{CLIENT_DATA}:{key}"
        return row(name, level_title(key, question), question, key, observer, d, case, evidence, t.alpha)

    unseen = [Unseen(q, kind, observer, run.attacker, arrow == ("↑" if run.attacker == "server" else "↓"),
                     run.no_records, run.reconstruction_ran, bool(found)) for q in (INVERSION, CLIENT_DATA)]
    if (d := deciding((OTHER_VIEW, NO_ATTACK, NO_TARGET), unseen[0])) is not None:  # the same case for both rows
        return [made(u.question, d, u) for u in unseen]
    evidence, skipped, powers = _gather(found, run.attacker, t)
    rows = []
    for question, u in zip((INVERSION, CLIENT_DATA), unseen):
        records = question == INVERSION
        mine = [e for e in evidence if (e.test in RECORD_TESTS) == records]
        if not mine:
            u.not_scored[:] = skipped or ([f"no record-level test was stored for {kind} (distribution-level tests only)"]
                                       if evidence and records else [])
            rows.append(made(question, NO_SCORE.decide(u), u))
            continue
        decide(mine, t)
        case = Case(key, mine, powers, records, run.made_by, t)
        rows.append(made(question, first(RULES, case), case, mine))
    return rows


def _gather(found: list[ReconstructionTable], attacker: str, t: RiskThresholds
            ) -> tuple[list[Evidence], list[str], list[tuple[str, ReconstructionPower | None]]]:
    """The tests of every attack on the share, why others were not scored, and each victim's positive control."""
    evidence: list[Evidence] = []
    skipped: list[str] = []
    powers: list[tuple[str, ReconstructionPower | None]] = []
    for table in found:
        if not table.scored:
            for e in table.entries.values():
                status = "attacked but not scored" if e.status == "attacked" else e.status
                if f"{status}: {e.reason}" not in skipped:
                    skipped.append(f"{status}: {e.reason}")
            continue
        evidence += reconstruction_evidence(table, attacker, t)
        powers += [(f"{table.attack} {table.artifact} / {v}", e.power) for v, e in table.entries.items()
                   if e.record_test]
    return evidence, skipped, powers


# -- rules --------------------------------------------------------------------------------------


class RowSignificant(Significant):
    def reason(self, d: Decision[Strongest], case: Case) -> str:
        return f"{clause(d.facts.top, len(case.evidence))}. {d.facts.top.text}"

    def short(self, d: Decision[Strongest], case: Case) -> str:
        return short(d.facts.top)


@dataclass(frozen=True)
class Counts:
    """Why no test could reach medium: the tests' record counts, and the nulls already at their bound."""

    counts: list[str]
    saturated: list[str]


class Uninformative(Rule[Counts]):
    """A LOW that no result at these counts could have turned into MEDIUM is not a finding."""

    name = "uninformative"

    def decide(self, case: Case) -> Decision[Counts] | None:
        evidence = case.evidence
        if any(_could_reach_medium(e, len(evidence), case.t) for e in evidence):
            return None
        counts = sorted({f"{e.test} on {n}" for e in evidence if isinstance(n := getattr(e.detail, "n", None), int)})
        saturated = sorted({f"{e.test} ({e.baseline_name} already at {pct(e.baseline)})" for e in evidence
                            if _saturated(e)})
        return self(INCONCLUSIVE, Counts(counts, saturated))

    def reason(self, d: Decision[Counts], case: Case) -> str:
        m = len(case.evidence)
        stronger = advice_of(case.made_by, "stronger_inversion")
        return (f"no test beat its strongest null ({inversion_notes(case.evidence)}), and at these counts none could "
                f"have: even a perfect result would not reach medium after {CORRECTION} correction over {m} test(s) "
                f"({', '.join(d.facts.counts) or 'counts not stored'})"
                + (f"; saturated: {', '.join(d.facts.saturated)}" if d.facts.saturated else "")
                + f". Give each client more records, and {stronger[0].lower()}{stronger[1:]}")

    def short(self, d: Decision[Counts], case: Case) -> str:
        return "too few records for any test to decide"

    def to_conclude(self, made_by: str) -> str:
        return ("more records per client, so that a test could reach medium at all: "
                f"{advice_of(made_by, 'more_records')}")


@dataclass(frozen=True)
class Control:
    """The positive control that decided, and (records rows) the size of the artifacts it singled members out from."""

    control: str
    size: str | None


class Powered(Rule[Control]):
    """Power, corrected across the row's victims (Holm): a positive control that fires by chance in one of many
    victims must not turn an uninformative reading into an informative LOW. A records row needs the control to have
    singled out its member images; a client-data row, to have revealed their domain or class."""

    name = "powered"

    def decide(self, case: Case) -> Decision[Control] | None:
        measured = [(src, p) for src, p in case.powers if p is not None and p.measured]
        level = [p.p_record_level if case.records else 1.0 if p.p_reveals is None else p.p_reveals for _, p in measured]
        reached = [(src, p) for (src, p), hit in zip(measured, reaching(level)) if hit]
        if not reached:
            return None
        src, power = reached[0]
        return self(LOW, Control(src, power.record_size if case.records else None))

    def reason(self, d: Decision[Control], case: Case) -> str:
        found = (f"singled out member images from {_size_words(d.facts.size)} (reconstructions nearer them than "
                 "to fresh records of their domain), so it would have found record-level leakage of that kind here"
                 if case.records else
                 "revealed the domain or class of a few member images from their statistics, so it would have found "
                 "what this artifact tells about the client's data as a whole")
        return (f"no test beat its strongest null after {CORRECTION} correction ({inversion_notes(case.evidence)}). "
                f"On the positive control ({d.facts.control}) the attack {found}.")

    def short(self, d: Decision[Control], case: Case) -> str:
        return f"{short(closest(case.evidence))}; had power"


@dataclass(frozen=True)
class Unmeasured:
    """Why no positive control ran (empty: one ran, and did not reach)."""

    why: list[str]


class Unpowered(Rule[Unmeasured]):
    name = "unpowered"

    def decide(self, case: Case) -> Decision[Unmeasured]:
        ran = any(p is not None and p.status == "measured" for _, p in case.powers)
        why = sorted({p.reason for _, p in case.powers if p is not None and p.status == "not available" and p.reason})
        return self(INCONCLUSIVE, Unmeasured([] if ran else why))

    def reason(self, d: Decision[Unmeasured], case: Case) -> str:
        if d.facts.why:
            budget = f"no positive control ran ({'; '.join(d.facts.why)})"
        elif case.records:
            budget = ("the attack could not single out even the member images its positive control was built from, "
                      "each from its own statistics alone or a handful pooled, so record-level leakage was not "
                      "testable at this budget")
        else:
            budget = "the attack could not recover even the artifact of a handful of member images at this budget"
        return (f"no test beat its strongest null ({inversion_notes(case.evidence)}), but {budget}: a low reading "
                f"cannot be told from a weak attack. {advice_of(case.made_by, 'stronger_inversion')}")

    def short(self, d: Decision[Unmeasured], case: Case) -> str:
        return f"{short(closest(case.evidence))}; no power"

    def to_conclude(self, made_by: str) -> str:
        return "an attack strong enough to pass its positive control: " + advice_of(made_by, "stronger_inversion")



def reaching(p_values: Sequence[float]) -> list[bool]:
    """Which positive controls reached power: their p-values Holm-corrected over the row's victims, at
    :data:`POWER_ALPHA` (a control that fires by chance in one of many victims does not count)."""
    return [adjusted <= POWER_ALPHA for adjusted in holm(list(p_values))]


def _size_words(size: str | None) -> str:
    if size == POWER_SINGLE:
        return "the statistics of each image alone"
    return f"the statistics of {size} image(s) per class" if size else "their statistics"


RULES: tuple[Rule[Any], ...] = (RowSignificant(), Uninformative(), Powered(), Unpowered())


# -- evidence -----------------------------------------------------------------------------------


def _could_reach_medium(e: Evidence, m: int, t: RiskThresholds) -> bool:
    """Whether a perfect result at the test's counts (every image right) would read MEDIUM: significant at
    alpha / m (Holm's first step, the most a row's strongest test may need) and, for a lift test, a lift of at
    least the medium threshold. A test whose counts were not stored is given the benefit of the doubt."""
    detail = e.detail
    if not isinstance(detail, (IdentifiabilityDetail, LiftDetail)) or not isinstance(detail.n, int):
        return True
    n = detail.n
    if n <= 0:
        return False
    level = t.alpha / max(m, 1)
    if isinstance(detail, IdentifiabilityDetail):  # the permutation test against chance and one per measured null
        chance = detail.chance
        best = [lift_p_value([n, n], None, float(chance))] if chance is not None and isnum(chance) else []
        best += [lift_p_value([n, n], [v * n, n], None) for v in detail.measured.values()]
        return max(best, default=0.0) <= level
    return (1.0 - float(e.baseline or 0.0) >= float(detail.medium) - 1e-9
            and lift_p_value([n, n], detail.null_counts, detail.chance) <= level)


def _saturated(e: Evidence) -> bool:
    """The strongest null is already at a bound the test cannot beat (100%)."""
    return e.baseline is not None and isnum(e.baseline) and e.baseline >= 1.0 - 1e-9


def _strongest_null(nulls: dict[str, float]) -> tuple[str, float]:
    """(name, value) of the largest null."""
    name = max(nulls, key=lambda k: nulls[k])
    return name, float(nulls[name])


def reconstruction_evidence(table: ReconstructionTable, attacker: str, t: RiskThresholds) -> list[Evidence]:
    """The distribution-level tests (macro over victims) and each victim's record-level test."""
    attacked = {v: e for v, e in table.entries.items() if e.identifiability is not None}
    what = "images" if any(e.images for e in attacked.values()) else "latent features"
    victims = list(table.victims or attacked)
    lead = inversion_lead(table.artifact, attacker, victims, what)
    source = f"{table.attack} {table.artifact}"
    tests = (("domain_attribution", f"{source} (macro over {len(victims)} victim(s))", table.domain_attribution,
              (t.domain_attribution_lift_high, t.domain_attribution_lift_medium)),
             ("class_fidelity", f"{source} (mean over {len(victims)} victim(s))", table.class_fidelity,
              (t.class_fidelity_lift_high, t.class_fidelity_lift_medium)))
    out = [e for test, where, found, levels in tests if found is not None
           and (e := _lift_evidence(test, where, found, levels, lift_lead(test, lead, victims), len(victims)))]
    out += [e for victim, entry in attacked.items()
            if (e := _record_evidence(f"{source} / {victim}", victim, entry, what, t)) is not None]
    return out


def _lift_evidence(test: str, source: str, found: LiftTest, levels: tuple[float, float], lead: str,
                   victims: int) -> Evidence | None:
    """A distribution-level test: the attack's rate over the strongest of chance and the measured controls."""
    if found.attack is None or not found.nulls:
        return None
    high, medium = levels
    name, base = _strongest_null(found.nulls)
    attack = found.count("attack")
    null_counts = found.count(name)
    p = lift_p_value(attack, null_counts, base if name == "chance" else None)
    lift = found.attack - base
    tier = HIGH if lift >= high - 1e-9 else MEDIUM if lift >= medium - 1e-9 else LOW
    text = lift_finding(lead, found, victims, lift, NULL_NAMES[name], base)
    return Evidence(test, source, found.attack, base, NULL_NAMES[name], p,
                    nulls={**found.nulls, **({"twin": found.twin} if found.twin is not None else {})},
                    tier=tier, text=text, effect=lift,
                    detail=LiftDetail(n=round(attack[1]) if attack else None,
                                      null_counts=list(null_counts) if null_counts else None,
                                      chance=base if name == "chance" else None, medium=medium))


def _record_evidence(source: str, victim: str, entry: ReconstructionEntry, what: str,
                     t: RiskThresholds) -> Evidence | None:
    """Record-level leakage beyond *every* null: the permutation test against chance and a one-sided test against
    each measured null must all reject (an intersection-union test: its p-value is the largest). Significant, it is
    MEDIUM; HIGH when its 95% interval's low end also clears the strongest null by ``identifiability_margin_high``
    (significance alone already puts the low end above each measured null at these counts, so the margin is what
    separates a large leak from a detectable one)."""
    ident = entry.identifiability
    if ident is None or ident.attack is None or ident.attack_p_value is None:
        return None
    measured = {k: v for k, v in ident.nulls.items() if k != "chance"}
    name, base = _strongest_null(ident.nulls)
    ci = list(ident.ci95) if ident.ci95 else None
    n = ident.n
    p_each = {"chance": ident.attack_p_value,
              **{k: lift_p_value([ident.attack * n, n], [v * n, n], None) for k, v in measured.items()}}
    p = max(p_each.values())
    margin = (ci[0] - base) if ci else None
    tier = HIGH if margin is not None and margin >= t.identifiability_margin_high - 1e-9 else MEDIUM
    text = identifiability_finding(ident, what, victim, ident.attack_p_value, p, NULL_NAMES[name], base, margin,
                                   t.identifiability_margin_high)
    return Evidence("identifiability", source, ident.attack, base, NULL_NAMES[name], p, interval=ci,
                    nulls=dict(ident.nulls), power=entry.power.summary() if entry.power else None, tier=tier,
                    text=text, effect=margin,
                    detail=IdentifiabilityDetail(p_against=p_each, null_q95=ident.null_q95, n=n,
                                                 balanced=None if ident.balanced is None else ident.balanced.dump(),
                                                 chance=ident.chance, measured=measured, victim=victim))


def lift_p_value(attack: Any, null: Any, chance: float | None) -> float:
    """One-sided p-value of the attack's count beating the null: binomial against a chance level,
    Fisher's exact test against a measured control's count."""
    from scipy.stats import binomtest, fisher_exact

    if finite_pair(attack) is None:
        return 1.0
    k, n = round(attack[0]), round(attack[1])
    if n <= 0:
        return 1.0
    if chance is not None:
        return float(binomtest(k, n, min(max(chance, 0.0), 1.0), alternative="greater").pvalue)
    if finite_pair(null) is None or round(null[1]) <= 0:
        return 1.0
    kb, nb = round(null[0]), round(null[1])
    return float(fisher_exact([[k, n - k], [kb, nb - kb]], alternative="greater")[1])
