"""Golden runs: a refactoring keeps every number of fedavg, gperxan, fedlsi and ccst on digits.

The files under tests/golden/ were written by ``python scripts/golden.py --write`` from main before
the audit wing was rebuilt (issue 15). A rule changed on purpose rewrites its golden file in the
same commit, with the reason. Four short runs with attacks: about four minutes on 2 cores, so slow.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "golden.py"
spec = importlib.util.spec_from_file_location("golden", SCRIPT)
golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden)


@pytest.mark.slow
@pytest.mark.parametrize("method", golden.METHODS)
def test_golden_run_is_unchanged(method, tmp_path):
    torch.set_num_threads(2)  # as scripts/golden.py wrote them: CPU kernels may sum in another order on one thread
    expected = json.loads((golden.GOLDEN_DIR / f"{method}.json").read_text(encoding="utf-8"))
    got = json.loads(json.dumps(golden.golden_metrics(method, tmp_path)))
    diff = golden.differences(expected, got)
    assert not diff, "\n".join([golden.other_machine(), *diff[:40]])


def test_differences_finds_a_moved_number_and_a_missing_key():
    expected = {"a": {"b": [1.0, 2.0]}, "c": 1}
    assert golden.differences(expected, {"a": {"b": [1.0, 2.0]}, "c": 1}) == []
    assert golden.differences(expected, {"a": {"b": [1.0, 2.5]}}) == [".c: missing", ".a.b[1]: 2.0 -> 2.5"]
    assert golden.strip_timings({"seconds": 1, "x": {"seconds_shared": 2, "y": 3}}) == {"x": {"y": 3}}
