"""Did every client of a round receive the same model? A recording's check against a malicious server.

A server that sends one client another model than the rest (Pasquini et al., CCS 2022; LOKI, S&P 2024) isolates
that client's update in the aggregate — secure aggregation does not stop it — so the question is asked at the level
of the records it exposes. The evidence is exact, not sampled: verification digests the content of every model
sent down per (round, record, message type) (:class:`fedaudit.interop.recording_verify.SameModel`), on the
clients' copies where they recorded them (what each received), else on the server's (what it says it sent).

Rules, in order: ``different`` (two contents in one round, on either side's copies: HIGH), ``none_compared`` (no
round sent a model to two clients or more: NOT ASSESSED), ``server_copies`` (identical, but only the server's own
record says so — a server sending different models could record one: INCONCLUSIVE), else ``same`` (the clients'
copies are identical in every round: LOW). Runs fedaudit simulated have no such row: its engine sends one model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedaudit.run.audited_run import AuditedRun, BroadcastCheck, DifferentRound
from fedaudit.run.evidence_detail import BroadcastDetail

from .evidence import (CONSISTENCY, HIGH, INCONCLUSIVE, LOW, NOT_ASSESSED, Decision, Evidence, Rule, VerdictRow, first,
                       row)
from .thresholds import RiskThresholds
from .wording import different_models, groups_text

KEY, TITLE, ARTIFACT, OBSERVER = ("consistency:broadcasts", "did every client of a round receive the same model?",
                                  "broadcasts ↓", "the clients")


def consistency_row(run: AuditedRun, t: RiskThresholds) -> VerdictRow | None:
    """The row, for an audited recording whose verification compared its broadcasts; None otherwise."""
    if run.broadcasts is None:
        return None
    d = first(RULES, run.broadcasts)
    evidence = [Evidence("broadcast_content", f"round {x.round} {x.message_type} {x.record} ({x.recorded_by}'s copies)",
                         float(len(x.groups)), 1.0, "one model for every client", 0.0, p_adjusted=0.0, tier=HIGH,
                         effect=float(len(x.groups)), detail=BroadcastDetail(groups=x.groups, exact="content digests, no sampling"))
                for x in (run.broadcasts.different if d.rule is RULES[0] else ())]
    return row(KEY, TITLE, CONSISTENCY, ARTIFACT, OBSERVER, d, run.broadcasts, evidence, t.alpha)


@dataclass(frozen=True)
class Rounds:
    """The rounds in which clients received different models."""

    different: list[DifferentRound]


class Different(Rule[Rounds]):
    """Two contents in one round, on either side's copies."""

    name = "different"

    def decide(self, check: BroadcastCheck) -> Decision[Rounds] | None:
        return self(HIGH, Rounds(list(check.different))) if check.different else None

    def reason(self, d: Decision[Rounds], check: BroadcastCheck) -> str:
        return different_models(d.facts.different)

    def short(self, d: Decision[Rounds], check: BroadcastCheck) -> str:
        first_round = d.facts.different[0]
        return f"round {first_round.round}: {groups_text(first_round.groups)}"[:60]


class NoneCompared(Rule[None]):
    name = "none_compared"

    def decide(self, check: BroadcastCheck) -> Decision[None] | None:
        return None if check.compared else self(NOT_ASSESSED, None)

    def reason(self, d: Decision[None], check: BroadcastCheck) -> str:
        return "no round sent a model to two clients or more, so there was nothing to compare"

    def short(self, d: Decision[None], check: BroadcastCheck) -> str:
        return "nothing to compare"


class ServerCopies(Rule[None]):
    """Identical, but only the server's own record says so — a server sending different models could record one."""

    name = "server_copies"

    def decide(self, check: BroadcastCheck) -> Decision[None] | None:
        return None if check.recorded_by == "client" else self(INCONCLUSIVE, None)

    def reason(self, d: Decision[None], check: BroadcastCheck) -> str:
        return (f"every client of a round received the same model by the server's own record ({check.compared} "
                "broadcast(s) compared by content), but no client recorded what it received, and a server that sends "
                "different models could record one; record on the clients (recording_mod, or each site's shard)")

    def short(self, d: Decision[None], check: BroadcastCheck) -> str:
        return "server's own copies only"


class Same(Rule[None]):
    """The clients' own copies are identical in every round."""

    name = "same"

    def decide(self, check: BroadcastCheck) -> Decision[None]:
        return self(LOW, None)

    def reason(self, d: Decision[None], check: BroadcastCheck) -> str:
        return (f"every client of a round received the same model: the clients' own copies of {check.compared} "
                "broadcast(s) are identical by content")

    def short(self, d: Decision[None], check: BroadcastCheck) -> str:
        return f"{check.compared} broadcast(s) identical"


RULES: tuple[Rule[Any], ...] = (Different(), NoneCompared(), ServerCopies(), Same())

__all__ = ["KEY", "consistency_row"]
