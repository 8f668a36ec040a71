"""One target's metrics.json as the verdict reads it (:class:`AuditedRun`): the declared shares, who attacked, the
attack results as the typed entries of :mod:`fedaudit.run.entries`, a recording's broadcast check and the view of a
server under secure aggregation — read once, here, from the stored blocks' models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fedaudit.run.entries import (CanaryAudit, MembershipEntry, MembershipTest, ReconstructionTable, canary_audits)
from fedaudit.run.results import RunMetrics
from fedaudit.run.stored import Broadcasts
from fedaudit.run.stored.reconstruction import Judges


@dataclass(frozen=True)
class DifferentRound:
    """A round in which the server sent clients different content under one record and message type."""

    round: Any
    message_type: Any
    record: Any
    groups: list[list[str]]  # clients that received the same content, one list per content
    recorded_by: str  # whose copies were compared: server, or client


@dataclass(frozen=True)
class BroadcastCheck:
    """A recording's verification of the broadcasts: did every client of a round receive the same model?"""

    compared: Any  # how many broadcasts were compared
    recorded_by: str | None
    different: tuple[DifferentRound, ...]

    @classmethod
    def of(cls, same: Broadcasts) -> BroadcastCheck:
        return cls(same.compared, same.recorded_by,
                   tuple(DifferentRound(x.round, x.message_type, x.record, list(x.groups), x.recorded_by)
                         for x in same.different if x.groups))


@dataclass(frozen=True)
class SecureAggregationView:
    """What ``--secure-aggregation`` stored: that server's view of the same run, and what the mask leaves."""

    run: AuditedRun
    observer: str
    leaves: dict[str, str]  # kind → why the mask leaves it (secure aggregation does not cover it)
    aggregate_round: Any
    aggregate_clients: tuple[str, ...] | None  # None: the aggregate was not described
    solved: dict[str, tuple[str, list[Any]]]  # client → (kind, the two rounds) disaggregation solved


    def left(self, kind: str) -> str | None:
        """Why the mask leaves ``kind`` in clear, or None where it covers it."""
        return self.leaves[kind] if kind in self.leaves else None


@dataclass(frozen=True)
class AuditedRun:
    """One target's metrics.json as the verdict reads it."""

    declared: tuple[str, ...]  # the shares, kind and arrow: "full_model↑"
    attacker: str  # server, or client:<domain>
    made_by: str  # evaluate, or audit (a recording's)
    no_records: str | None  # why, where the auditor held none of the clients' records (nothing was scored)
    membership_ran: bool
    membership: tuple[MembershipTest, ...]  # in the order the attacks wrote them
    reconstructions: tuple[ReconstructionTable, ...]  # in the order the attacks ran
    judges: dict[str, Judges]  # attack → the auditor's judges of its reconstructions
    canary_ran: bool  # a canary section was stored (its audits may all lack a bound)
    canaries: tuple[CanaryAudit, ...]
    broadcasts: BroadcastCheck | None
    secure_aggregation: SecureAggregationView | None

    @classmethod
    def of(cls, metrics: Mapping[str, Any], config: Mapping[str, Any]) -> AuditedRun:
        """A stored metrics.json (and its run's config) as the verdict reads it."""
        return cls.of_run(RunMetrics.from_json(metrics), str(config.get("attacker") or "server"))

    @classmethod
    def of_run(cls, run: RunMetrics, attacker: str) -> AuditedRun:
        """One target's typed metrics, as the run that made them holds them (no round trip through a dict), attacked
        from ``attacker``'s view."""
        leakage = run.results
        data = run.auditor_data
        recording = run.provenance.recording
        verification = recording.verification if recording is not None else None
        same = verification.broadcasts if verification is not None else None
        return cls(
            declared=tuple(run.communication.declared),
            attacker=attacker,
            made_by="audit" if recording is not None else "evaluate",
            no_records=((data.why or "the auditor holds none of the clients' records")
                        if data is not None and data.status == "none" else None),
            membership_ran=bool(leakage.mia),
            membership=tuple(MembershipTest(r.variant, r.target, r.victim, MembershipEntry.of(r.entry))
                             for r in leakage.membership()),
            reconstructions=tuple(ReconstructionTable.of(name, key, by_victim, section.summary.get(key))
                                  for name, section in leakage.reconstructions.items()
                                  for key, by_victim in section.tables()),
            judges={name: section.auditor or Judges() for name, section in leakage.reconstructions.items()},
            canary_ran=leakage.has("canary") or leakage.has("canary_gradient"),
            canaries=tuple(canary_audits(leakage)),
            broadcasts=BroadcastCheck.of(same) if same is not None else None,
            secure_aggregation=_secure_aggregation(run, attacker))

    @property
    def reconstruction_ran(self) -> bool:
        return bool(self.reconstructions)


def _secure_aggregation(run: RunMetrics, attacker: str) -> SecureAggregationView | None:
    section = run.secure_aggregation
    if section is None or not section.has("leakage"):
        return None
    aggregate = section.aggregate if section.aggregate and section.aggregate.model_fields_set else None
    return SecureAggregationView(
        AuditedRun.of_run(replace(run, leakage=section.leakage, secure_aggregation=None), attacker),
        section.observer or "server (secure aggregation)",
        {str(item.kind): str(item.why) for item in section.leaves},
        None if aggregate is None else aggregate.round, None if aggregate is None else tuple(aggregate.clients),
        {c: (str(v.kind), list(v.rounds)) for c, v in section.disaggregation.clients.items()})
