"""Federations fedaudit did not run: the recording format and its writer, the Flower recorder, and
auditing a recording (its wire, its declared model, its own DP)."""
