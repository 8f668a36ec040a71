"""Every hint leads somewhere (issue 48): a row that says "not assessed" and names the flags that would assess it,
followed to the letter, gets a result — or says why none can exist, without sending the reader round again."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedaudit.cli import app

runner = CliRunner()
HINT = re.compile(r"(?:run|assess it) with ((?:--[a-z-]+ [^\s;,()]+\s?)+)")
QUICK = ["--device", "cpu", "--inversion-iters", "4", "--inversion-batch", "10", "--judge-steps", "5",
         "--reference-models", "2", "--reference-epochs", "1", "--quiet"]


def _audit(rec: Path, out: Path, flags: list[str], extra: list[str]) -> dict[str, dict]:
    if out.exists():
        shutil.rmtree(out)
    result = runner.invoke(app, ["audit", str(rec), "--out", str(out), *extra, *QUICK, *flags])
    assert result.exit_code == 0, result.output
    metrics = json.loads(next(out.rglob("metrics.json")).read_text())
    return {r["row"]: r for r in metrics["verdict"]}


def follow_every_hint(rec: Path, tmp_path: Path, extra: list[str], client: str) -> int:
    """Audit once, then follow each not-assessed row's hint; returns how many hints were followed."""
    first = _audit(rec, tmp_path / "first", ["--attack", "mia-loss"], extra)
    followed: dict[tuple[str, ...], dict[str, dict]] = {}
    count = 0
    for key, row in first.items():
        if row["tier"] != "not_assessed":
            continue
        hint = HINT.search(row["reason"])
        if hint is None:
            continue  # the row says why it cannot be assessed, and names nothing to run
        flags = tuple(hint.group(1).replace("client:<domain>", f"client:{client}").split())
        if "--attack" not in flags:
            flags += ("--attack", "auto")
        if flags not in followed:
            followed[flags] = _audit(rec, tmp_path / f"hint{len(followed)}", list(flags), extra)
        after = followed[flags][key]
        count += 1
        assert after["tier"] != "not_assessed" or HINT.search(after["reason"]) is None, (
            f"{key}: following {' '.join(flags)} still reads not assessed and sends the reader on: {after['reason']}")
        assert after["reason"] != row["reason"], f"{key}: following {' '.join(flags)} changed nothing"
    return count


@pytest.mark.slow
def test_every_hint_of_the_flower_examples_report_leads_somewhere(tmp_path):
    from tests.test_flower import example_recording_at

    rec = example_recording_at(tmp_path / "rec")
    assert follow_every_hint(rec, tmp_path, [], "clean") >= 3


@pytest.mark.slow
def test_every_hint_of_a_plain_pytorch_loops_report_leads_somewhere(tmp_path):
    from tests.test_own_model import record_loop

    rec = record_loop(tmp_path / "rec", "examples.pytorch_fedavg.net:Net", image_size=32)
    assert follow_every_hint(rec, tmp_path, ["--model", "examples.pytorch_fedavg.net:Net"], "clean") >= 3


@pytest.mark.slow
def test_a_model_without_batch_norm_explains_instead_of_hinting_in_circles(tmp_path):
    from tests.test_own_model import PLAIN, record_loop

    rec = record_loop(tmp_path / "rec", PLAIN)
    assert follow_every_hint(rec, tmp_path, ["--model", PLAIN], "clean") >= 3
