"""Seed derivation, defined once: every random stream of a run comes from its seed through here.

``derive_seed(seed, stream, …)`` mixes integers into a 63-bit seed, so that
streams (a client's batches in a round, the attacker's fresh model, the
auditor's challenge shuffle) are independent of each other and stable across
processes; ``stable_int`` turns a name (a domain) into such an integer, since
Python's own ``hash`` of a string is salted per process.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (seed, round, client …)."""
    digest = hashlib.sha256(",".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def stable_int(text: str) -> int:
    """A seed component from a name, the same in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


__all__ = ["derive_seed", "stable_int"]
