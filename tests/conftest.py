"""Shared fixtures: tiny, fast federations on built-in data (CPU, offline)."""

from __future__ import annotations

import pytest
import torch

from fedaudit.api import evaluate

# Small enough that a run takes a few seconds on 2 cores, big enough that a
# wrong byte count or a lost round shows up.
TINY = dict(dataset="digits", image_size=16, rounds=2, batch_size=32, device="cpu", quiet=None)


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(2)


@pytest.fixture
def tiny_run(tmp_path):
    """Run ``evaluate`` on tiny data into tmp_path; extra options override."""

    def run(method: str = "fedavg", **overrides):
        opts = {k: v for k, v in TINY.items() if k != "quiet"}
        opts.update(overrides)
        opts.setdefault("out", str(tmp_path / "runs"))
        return evaluate(method, **opts)

    return run
