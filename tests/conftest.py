"""Shared fixtures: tiny, fast federations on built-in data (CPU, offline)."""

from __future__ import annotations

import os

import pytest
import torch

from fedaudit.api import evaluate

# Small enough that a run takes a few seconds on 2 cores, big enough that a
# wrong byte count or a lost round shows up.
# The auditor's judges train 60 steps, not the default 300: enough to separate a leaking artifact from its
# controls on these data (the tests that need that say so with margins), at a fifth of the cost.
TINY = dict(attack="none", dataset="digits", image_size=16, rounds=2, batch_size=32, device="cpu", judge_steps=60, quiet=None)


# Every metrics.json a test's run writes is held to the published schema (fedaudit/run/metrics.schema.json): a writer
# that adds an undeclared key or drops a required one fails the test that ran it (users only get a warning). Set at
# import, so the CLI subprocesses the tests start inherit it.
os.environ.setdefault("FEDAUDIT_STRICT_SCHEMA", "1")

# Under pytest-xdist (the default: two workers, see pyproject.toml) each worker takes one core.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(autouse=True, scope="session")
def _few_threads_from_the_start():
    # Session scope: module-scoped fixtures (a whole run a test compares a resumed run with) are set up before any
    # function-scoped fixture, and a run on 2 threads differs from one on 1 in the last digit of its loss.
    torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _few_threads(_few_threads_from_the_start):
    torch.set_num_threads(THREADS)  # again for each test: a test that changed the count may not have restored it


@pytest.fixture
def tiny_run(tmp_path):
    """Run ``evaluate`` on tiny data into tmp_path; extra options override."""

    def run(method: str = "fedavg", **overrides):
        opts = {k: v for k, v in TINY.items() if k != "quiet"}
        opts.update(overrides)
        opts.setdefault("out", str(tmp_path / "runs"))
        return evaluate(method, **opts)

    return run
