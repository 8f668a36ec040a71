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

Layout: :mod:`.evidence` (the row and its tests), :mod:`.inversion`,
:mod:`.membership`, :mod:`.participation` and :mod:`.canary` (each row's rules, small functions that
return the tier and the facts that decided it), :mod:`.wording` (every
sentence and short form), :mod:`.thresholds`.

**Enough evidence before LOW.** A reconstruction row that would read LOW
reads INCONCLUSIVE when no test in it could have reached MEDIUM at its counts:
a perfect result (every image right) not significant at ``alpha`` / the number
of the row's tests (Holm's first step), or, for a lift test, a strongest null
so high that even 100% is a lift below the medium threshold. The reason names
the counts and any saturated null (one already at 100%). This holds for the
image and the latent-feature versions alike (same tests, same counts).

**Power before LOW.** A reconstruction row that would read LOW reads
INCONCLUSIVE unless one of its attacks reached power — revealed the domain or
class of a handful of member images from their artifact better than its
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

from typing import Any

from fedaudit.run.results import BOOKKEEPING, CANARY, CANARY_GRADIENT, Leakage, MIA, NOT_RECONSTRUCTIONS

from .canary import canary_row
from .evidence import CONSISTENCY
from .consistency import consistency_row
from .evidence import (ARTIFACT, CLIENT_DATA, DOMAIN, GLOBAL, HIGH, INCONCLUSIVE, LEVEL_OF, LEVELS, LOW, MEDIUM,
                       NOT_ASSESSED, NULL_NAMES, PARTICIPATION, POWER_ALPHA, RECORDS, TIER_ORDER, Evidence, Row,
                       mia_level)
from .inversion import inversion_rows
from .membership import membership_groups, membership_row
from .participation import participation_row
from .thresholds import CORRECTION, RiskThresholds, load_thresholds
from .wording import ADVICE, advice, made_by, pct, secure_aggregation_lead, share_title

SECURE_AGGREGATION_ROW = "@secure_aggregation"  # the suffix of a row judged from that observer's view


def judge(metrics: dict[str, Any], config: dict[str, Any], thresholds: RiskThresholds | None = None) -> list[dict[str, Any]]:
    """The verdict rows of one target's metrics: for every declared share its records (reconstruction, membership)
    and client-data rows, the membership of any other artifact an attack read, the released model's membership and
    participation, and the canary audit if one ran."""
    t = thresholds or RiskThresholds()
    groups = membership_groups(metrics, config)
    declared = list((metrics.get("communication") or {}).get("declared") or [])
    rows: list[Row] = []
    for key in declared:
        records, client_data = inversion_rows(key, metrics, config, t)
        rows += [records, membership_row(key, groups.get(key, []), metrics, config, t), client_data]
    rows += [membership_row(key, attacks, metrics, config, t) for key, attacks in groups.items()
             if key not in declared and key != GLOBAL]
    rows += [membership_row(GLOBAL, groups.get(GLOBAL, []), metrics, config, t), participation_row(metrics, t)]
    if Leakage.of(metrics).canary_sections():
        rows.append(canary_row(metrics, t))
    rows += secure_aggregation_rows(metrics, config, declared, t)
    consistency = consistency_row(metrics, t)
    if consistency is not None:
        rows.append(consistency)
    data = metrics.get("auditor_data") or {}
    if data.get("status") == "none":  # nothing was scored: every row says so first, whatever else it says
        why = str(data.get("why") or "the auditor holds none of the clients' records")
        for row in rows:
            if why not in row.reason and row.question != CONSISTENCY:  # digests need no record
                row.reason = f"{why}; {row.reason}"
    return [row.to_json() for row in rows]


def secure_aggregation_rows(metrics: dict[str, Any], config: dict[str, Any], declared: list[str],
                            t: RiskThresholds) -> list[Row]:
    """Each upload's rows once more, judged from what a server under secure aggregation sees (``--secure-aggregation``;
    :mod:`fedaudit.simulation.secure_aggregation`): the same rules over that observer's evidence — the aggregate's
    for what the mask covers, the upload's own for what it leaves. Row keys end in :data:`SECURE_AGGREGATION_ROW`."""
    section = metrics.get("secure_aggregation")
    if not isinstance(section, dict) or not isinstance(section.get("leakage"), dict):
        return []
    seen = {**metrics, "leakage": section["leakage"]}
    groups = membership_groups(seen, config)
    left = {item["kind"]: item["why"] for item in section.get("leaves") or []}
    rows: list[Row] = []
    for key in (k for k in declared if k.endswith("↑")):
        kind = key[:-1]
        records, client_data = inversion_rows(key, seen, config, t)
        for row in (records, membership_row(key, groups.get(key, []), seen, config, t), client_data):
            row.row += SECURE_AGGREGATION_ROW
            row.observer = str(section.get("observer") or "server (secure aggregation)")
            solved = (section.get("disaggregation") or {}).get("clients")
            row.reason = f"{secure_aggregation_lead(kind, left.get(kind), section.get('aggregate'), solved)} {row.reason}"
            rows.append(row)
    return rows


def membership_row_of(metrics: dict[str, Any], config: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(variant, target) of every stored membership attack → the key of the verdict row that judges it (tables built
    beside the verdict use it rather than guessing from the target's name)."""
    return {(variant, target): f"membership:{key}" for key, attacks in membership_groups(metrics, config).items()
            for variant, target, _, _ in attacks}


__all__ = ["ADVICE", "ARTIFACT", "BOOKKEEPING", "CANARY", "CANARY_GRADIENT", "CLIENT_DATA", "CORRECTION", "DOMAIN",
           "Evidence", "HIGH", "INCONCLUSIVE", "LEVELS", "LEVEL_OF", "PARTICIPATION", "RECORDS", "LOW", "MEDIUM", "MIA", "NOT_ASSESSED", "NOT_RECONSTRUCTIONS", "NULL_NAMES", "POWER_ALPHA",
           "RiskThresholds", "Row", "TIER_ORDER", "SECURE_AGGREGATION_ROW", "advice", "judge", "load_thresholds", "made_by", "membership_row_of", "mia_level", "pct",
           "share_title"]
