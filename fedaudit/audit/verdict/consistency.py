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

from typing import Any

from .evidence import CONSISTENCY, HIGH, INCONCLUSIVE, LOW, NOT_ASSESSED, Decision, Evidence, Row
from .thresholds import RiskThresholds
from .wording import consistency_reason, consistency_short

KEY, TITLE, ARTIFACT, OBSERVER = ("consistency:broadcasts", "did every client of a round receive the same model?",
                                  "broadcasts ↓", "the clients")


def consistency_row(metrics: dict[str, Any], t: RiskThresholds) -> Row | None:
    """The row, for an audited recording whose verification compared its broadcasts; None otherwise."""
    recording = (metrics.get("provenance") or {}).get("recording")
    same = ((recording.get("verification") or {}).get("broadcasts")) if isinstance(recording, dict) else None
    if not isinstance(same, dict):
        return None
    d = _different(same) or _none_compared(same) or _server_copies(same) or Decision(LOW, "same", {
        "compared": same.get("compared")})
    evidence = [Evidence("broadcast_content", f"round {x['round']} {x['message_type']} {x['record']} "
                         f"({x.get('recorded_by', 'server')}'s copies)", float(len(x["groups"])), 1.0,
                         "one model for every client", 0.0, p_adjusted=0.0, tier=HIGH, effect=float(len(x["groups"])),
                         detail={"groups": x["groups"], "exact": "content digests, no sampling"})
                for x in d.facts.get("different", [])]
    return Row(KEY, TITLE, CONSISTENCY, ARTIFACT, OBSERVER, d.tier, consistency_reason(d), consistency_short(d),
               evidence, t.alpha, d.rule)


def _different(same: dict[str, Any]) -> Decision | None:
    found = [x for x in same.get("different") or [] if isinstance(x, dict) and x.get("groups")]
    return Decision(HIGH, "different", {"different": found}) if found else None


def _none_compared(same: dict[str, Any]) -> Decision | None:
    return None if same.get("compared") else Decision(NOT_ASSESSED, "none_compared")


def _server_copies(same: dict[str, Any]) -> Decision | None:
    if same.get("recorded_by") == "client":
        return None
    return Decision(INCONCLUSIVE, "server_copies", {"compared": same.get("compared")})


__all__ = ["KEY", "consistency_row"]
