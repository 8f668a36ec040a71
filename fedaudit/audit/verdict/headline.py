"""The verdict's headline: what a reviewer reads before any row (issue 56).

The highest tier alone reads lower than what is unknown: a run whose only decided row is LOW and whose other rows are
INCONCLUSIVE (the attack could not have seen a leak) or NOT ASSESSED (no attack looked) is not "low risk". So the
headline is the highest *decided* tier with, beside it, how many rows stayed undecided — and it reads LOW alone only
where every row was decided. The terminal, the report (and its PDF), ``--json`` and the sweep's table all print these
words; ``--fail-on-inconclusive`` makes a gate fail on what the audit could not see.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .evidence import HIGH, INCONCLUSIVE, LOW, MEDIUM, NOT_ASSESSED

DECIDED = (HIGH, MEDIUM, LOW)  # highest first


@dataclass(frozen=True)
class Headline:
    """The highest decided tier (None: no row decided) and the rows left undecided, by tier."""

    decided: str | None
    inconclusive: int = 0
    not_assessed: int = 0

    @classmethod
    def of(cls, tiers: Iterable[str]) -> Headline:
        """From the tiers of a run's verdict rows."""
        tiers = list(tiers)
        decided = next((t for t in DECIDED if t in tiers), None)
        return cls(decided, tiers.count(INCONCLUSIVE), tiers.count(NOT_ASSESSED))

    @property
    def undecided(self) -> str:
        """``3 questions inconclusive, 6 not assessed`` (empty when every row was decided)."""
        parts = [f"{self.inconclusive} question{'s' * (self.inconclusive != 1)} inconclusive"] if self.inconclusive else []
        parts += [f"{self.not_assessed} not assessed"] if self.not_assessed else []
        return ", ".join(parts)

    @property
    def words(self) -> str:
        """``HIGH``, ``MEDIUM; also 3 questions inconclusive``, ``LOW where decided; 3 questions inconclusive``,
        ``LOW`` (only when nothing stayed undecided), ``none decided: 3 questions inconclusive``."""
        return self.lead + self.rest

    @property
    def lead(self) -> str:
        """The words the tier's colour goes on: the decided tier, or that none was decided."""
        return self.decided.upper() if self.decided else "none decided" if self.undecided else "no verdict rows"

    @property
    def rest(self) -> str:
        """What follows the lead: the undecided rows, never left out."""
        rest = self.undecided
        if not rest:
            return ""
        if self.decided is None:
            return f": {rest}"
        return f" where decided; {rest}" if self.decided == LOW else f"; also {rest}"

    @property
    def tier(self) -> str:
        """The tier the headline is shown in: the decided one, except that a LOW beside undecided rows and a run with
        nothing decided show as INCONCLUSIVE (never the colour of "low risk")."""
        if self.decided in (HIGH, MEDIUM):
            return self.decided
        if self.decided == LOW and not self.inconclusive and not self.not_assessed:
            return LOW
        return INCONCLUSIVE if self.inconclusive or self.decided == LOW else NOT_ASSESSED


__all__ = ["Headline"]
