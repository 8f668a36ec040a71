"""The verdict: one row per question a reviewer asks, each asked at one level and decided only by evidence of that
level (issue 47) —

* **records**: for each artifact and direction on the wire, *can its training records be reconstructed?* and *does it
  reveal which records were trained on?*; the same membership question for the released model; where canaries
  were planted, *does the (record-level) DP claim hold?*; and, for a recording, *did every client of a round
  receive the same model?* (:mod:`.consistency`);
* **the client's data as a whole**: for each artifact, *does it reveal what a client's data is like* (its domain,
  its classes)?;
* **participation**: *does the released model reveal which domains took part?* —

each judged from one observer's view (the server, a client, or anyone holding the released model) and decided by a
rule over stored evidence. A row's mitigation is of its level: record-level DP bounds what one record does, not what
a whole client's data is like or whether it took part (the report's summary says which measure addresses which).

A reviewer signs this, so every tier is a rule over numbers the run stored,
and each row keeps the evidence that decided it: the test, its value, the
baseline it had to beat and that baseline's name, its interval, its p-value
before and after correction, and the attack's power.

**Baselines are the strongest null that fits the test.**

* Record level (``identifiability``: are reconstructions nearer to training
  records than to fresh ones?): the permutation null at the run's counts
  (chance), the untrained control, the prior-only control and the holdout
  twin. It must beat every one of them — the permutation test against
  chance, a one-sided Fisher test against each measured null — so its p-value
  is the largest of those (an intersection-union test), which must survive
  the row's correction: MEDIUM; HIGH when, in addition, its 95% interval's low
  end clears the strongest null by ``identifiability_margin_high``.
* Distribution level (``domain_attribution``, ``class_fidelity``; the client-data rows): chance (the
  best guess that ignores the victim, or the image), the untrained control and
  the prior-only control — not the twin, which carries the domain as the
  members do (twin above the controls is itself the distribution-level
  finding). The lift over the strongest null is judged against the
  thresholds, and the lift must be significant: a one-sided binomial test
  against chance, Fisher's exact test against a measured control.
* Membership (``mia_tpr``, ``mia_advantage``): TPR at 1% FPR with its exact
  hypergeometric p-value (MEDIUM significant at a resolvable level, HIGH with
  its interval above ``mia_tpr_ci_low``); the advantage max(TPR − FPR) with
  its one-sided KS p-value at the run's counts (MEDIUM at
  ``mia_advantage_medium`` or more).
* Participation (``participation_auc``): the domain-level attack's AUC on the
  released model against chance and against the **domain twin**, the same
  federation trained without that domain (:mod:`.participation`).

**Many tests, one row.** Every test behind a row (victims × attacks, or
victims × variants × targets) enters Holm's step-down correction at the
family-wise level ``alpha`` (default 0.05): with no leakage at all, a row reads
MEDIUM or HIGH at most 5% of the time whatever the number of tests.

**One answer per artifact.** A membership row holds every membership attack
whose input is its artifact (the loss, LiRA and RMIA attacks on the victim's
last upload are attacks on that upload's share; the tracing and nearest-entry
tests on the statistics or bank they read; the record- and domain-level
attacks on the released model), so no two rows about one tensor and one
observer can disagree (:mod:`.membership`).

Layout: the stored metrics are read once into typed entries (:class:`fedaudit.run.audited_run.AuditedRun`) by
:func:`judge`; :mod:`.evidence` holds the tiers, a :class:`~.evidence.Rule` and its :class:`~.evidence.Decision`;
:mod:`.unassessed` the rules of rows with nothing to judge; :mod:`.inversion`, :mod:`.membership`,
:mod:`.participation`, :mod:`.canary` and :mod:`.consistency` each question's rules — one small class each, that
decides from the row's typed case and writes its own reason and short form from the facts it decided — chained in
the module's ``RULES``; :mod:`.wording` the vocabulary they write with; :mod:`.thresholds`. Every row is a
:class:`~fedaudit.run.results.VerdictRow`, the type metrics.json stores and the report reads.

**Enough evidence before LOW.** A reconstruction row that would read LOW
reads INCONCLUSIVE when no test in it could have reached MEDIUM at its counts:
a perfect result (every image right) not significant at ``alpha`` / the number
of the row's tests (Holm's first step), or, for a lift test, a strongest null
so high that even 100% is a lift below the medium threshold. The reason names
the counts and any saturated null (one already at 100%). This holds for the
image and the latent-feature versions alike (same tests, same counts).

**Power before LOW.** A reconstruction row that would read LOW reads
INCONCLUSIVE unless one of its attacks reached power — revealed the domain or
class of a handful of member images from their artifact (or, for records, singled
out a member image from its own statistics alone) better than its
prior-only control, at the same budget (the positive control,
:mod:`fedaudit.audit.reconstruction`). Where the attack could not also single
those records out (``record_level``), the LOW says record-level leakage was
not testable. A membership row that would
read LOW reads INCONCLUSIVE when its counts could not detect an advantage of
``mia_advantage_medium`` at the corrected level; a row of the artifact test
(``artifact``: membership from a shared bank or statistics) reads
INCONCLUSIVE, too, unless the same test found the members of its positive
control (the artifact recomputed from a few members alone) at ``alpha`` for
every victim. Its holdout twin (the members swapped out) is its null: a
victim whose twin also separates members significantly cannot raise the row
(INCONCLUSIVE when that was all). A per-record bank that holds a member's own
entry exactly (and no non-member's) reads HIGH whatever the counts: an exact
match has no false positives to estimate. A membership advantage that is
significant and reaches ``mia_advantage_high`` (0.5) reads HIGH whatever the
low-FPR figures.

Tiers: ``high``, ``medium``, ``low``, ``inconclusive``, ``not_assessed``.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from fedaudit.run.audited_run import AuditedRun, SecureAggregationView
from fedaudit.run.entries import mia_level
from fedaudit.run.results import CANARY, CANARY_GRADIENT, MIA, Evidence, RunMetrics, VerdictRow

from . import canary, consistency, inversion, membership, participation, unassessed
from .evidence import (ARTIFACT, CLIENT_DATA, CONSISTENCY, DOMAIN, DP_AUDIT, GLOBAL, HIGH, INCONCLUSIVE, INVERSION,
                       LEVEL_OF, LEVELS, LOW, MEDIUM, MEMBERSHIP, NOT_ASSESSED, NULL_NAMES, PARTICIPATION, POWER_ALPHA,
                       RECORDS, SECURE_AGGREGATION_ROW, TIER_ORDER, Rule)
from .headline import Headline
from .thresholds import CORRECTION, RiskThresholds, load_thresholds
from .wording import ADVICE, advice_of, pct, secure_aggregation_lead, share_title

# Every question's rules, as each module chains them (the not-assessed ones first): where a stored rule name is
# looked up again (what would make an inconclusive row conclusive).
RULES: dict[str, tuple[Rule[Any], ...]] = {
    INVERSION: inversion.RULES, CLIENT_DATA: inversion.RULES, MEMBERSHIP: membership.RULES,
    PARTICIPATION: participation.RULES, DP_AUDIT: canary.RULES, CONSISTENCY: consistency.RULES}
NOT_ASSESSED_RULES = (unassessed.OTHER_VIEW, unassessed.NO_RECORDS, unassessed.NO_ATTACK, unassessed.NO_TARGET,
                      unassessed.NO_SCORE)


def judge(metrics: dict[str, Any], config: dict[str, Any], thresholds: RiskThresholds | None = None) -> list[dict[str, Any]]:
    """The verdict rows of one target's stored metrics, as metrics.json stores them (:func:`judge_rows`): for what
    reads a metrics.json file (the report's re-judging, the scripts)."""
    return [row.to_json() for row in judge_rows(AuditedRun.of(metrics, config), thresholds)]


def judge_run(run: RunMetrics, attacker: str, thresholds: RiskThresholds | None = None) -> list[VerdictRow]:
    """The verdict rows of the run just made, from its typed metrics (:func:`judge_rows`)."""
    return judge_rows(AuditedRun.of_run(run, attacker), thresholds)


def store_verdict(run: RunMetrics, attacker: str) -> None:
    """Judge the run just made (default thresholds) and store, beside its evidence, the rows, the thresholds they were
    judged with and the rows laid out as the evidence an anonymity assessment asks for — what evaluate and audit
    write to metrics.json."""
    from fedaudit.audit.attack_families import anonymity_evidence  # it lays out this package's rows

    thresholds = RiskThresholds()
    run.verdict = judge_run(run, attacker, thresholds)
    run.verdict_thresholds = asdict(thresholds)
    run.anonymity_evidence = anonymity_evidence(run, run.verdict)


def judge_rows(run: AuditedRun, thresholds: RiskThresholds | None = None) -> list[VerdictRow]:
    """For every declared share its records (reconstruction, membership) and client-data rows, the membership of any
    other artifact an attack read, the released model's membership and participation, the canary audit if one ran,
    each upload's rows again under secure aggregation, and a recording's broadcast check."""
    t = thresholds or RiskThresholds()
    groups = membership.membership_groups(run)
    rows: list[VerdictRow] = []
    for key in run.declared:
        records, client_data = inversion.inversion_rows(key, run, t)
        rows += [records, membership.membership_row(key, groups[key], run, t), client_data]
    rows += [membership.membership_row(key, attacks, run, t) for key, attacks in groups.items()
             if key not in run.declared and key != GLOBAL]
    rows += [membership.membership_row(GLOBAL, groups[GLOBAL], run, t), participation.participation_row(run, t)]
    if run.canary_ran:
        rows.append(canary.canary_row(run, t))
    if run.secure_aggregation is not None:
        rows += secure_aggregation_rows(run.secure_aggregation, run.declared, t)
    if run.broadcasts is not None and (checked := consistency.consistency_row(run, t)) is not None:
        rows.append(checked)
    if run.no_records is not None:  # nothing was scored: every row says so first, whatever else it says
        rows = [r if run.no_records in r.reason or r.question == CONSISTENCY  # digests need no record
                else replace(r, reason=f"{run.no_records}; {r.reason}") for r in rows]
    return rows


def secure_aggregation_rows(seen: SecureAggregationView, declared: tuple[str, ...], t: RiskThresholds) -> list[VerdictRow]:
    """Each upload's rows once more, judged from what a server under secure aggregation sees (``--secure-aggregation``;
    :mod:`fedaudit.simulation.secure_aggregation`): the same rules over that observer's evidence — the aggregate's
    for what the mask covers, the upload's own for what it leaves. Row keys end in :data:`SECURE_AGGREGATION_ROW`."""
    groups = membership.membership_groups(seen.run)
    rows: list[VerdictRow] = []
    for key in (k for k in declared if k.endswith("↑")):
        kind = key[:-1]
        lead = secure_aggregation_lead(kind, seen.left(kind), seen.aggregate_round, seen.aggregate_clients,
                                       seen.solved)
        records, client_data = inversion.inversion_rows(key, seen.run, t)
        for r in (records, membership.membership_row(key, groups[key], seen.run, t), client_data):
            rows.append(replace(r, row=r.row + SECURE_AGGREGATION_ROW, observer=seen.observer,
                                reason=f"{lead} {r.reason}"))
    return rows


def to_conclude(question: str, rule: str | None, made_by: str) -> str:
    """What would turn an INCONCLUSIVE row (decided by ``rule``) into a conclusive one, in the words of the command
    that made the run (``made_by``: evaluate, audit) — the report's summary lists it beside each such row."""
    for found in RULES.get(question, ()) + NOT_ASSESSED_RULES:
        if found.name == rule:
            return found.to_conclude(made_by)
    return Rule().to_conclude(made_by)


def membership_row_of(metrics: dict[str, Any], config: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(variant, target) of every stored membership attack → the key of the verdict row that judges it (tables built
    beside the verdict use it rather than guessing from the target's name); the domain-level attack answers the
    released model's participation row (issue 47), not a records row."""
    return {**{(test.variant, test.target): f"membership:{key}"
               for key, attacks in membership.membership_groups(AuditedRun.of(metrics, config)).items()
               for test in attacks},
            (DOMAIN, GLOBAL): participation.KEY}


__all__ = ["ADVICE", "ARTIFACT", "advice_of", "CANARY", "CANARY_GRADIENT", "CLIENT_DATA", "CORRECTION", "DOMAIN",
           "Evidence", "HIGH", "Headline", "INCONCLUSIVE", "LEVELS", "LEVEL_OF", "PARTICIPATION", "RECORDS", "LOW", "MEDIUM", "MIA",
           "NOT_ASSESSED", "NULL_NAMES", "POWER_ALPHA", "RULES", "RiskThresholds",
           "SECURE_AGGREGATION_ROW", "TIER_ORDER", "VerdictRow", "judge", "judge_rows", "judge_run", "load_thresholds", "store_verdict",
           "membership_row_of", "mia_level", "pct", "share_title", "to_conclude"]
