"""What today's fedaudit finds in each long-lived recording fixture (tests/recordings/<commit>/<recorder>, made by
record_fixtures.py at that commit): its verification, the released model it names (a digest of its tensors) and the
verdict `fedaudit audit --attack auto` reaches on it, row by row (question, level, tier and the rule that decided).

tests/test_old_recordings.py holds every fixture to golden.json. A change that moves a row on purpose rewrites the
file in the same commit, with the reason in the message::

    python tests/recordings/golden.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.json"
MODEL = "tests.user_models:PlainCNN"  # the fixtures' factory (record_fixtures.FACTORY), named as a reviewer would


def fixtures() -> list[str]:
    """``<commit>/<recorder>`` of every fixture kept."""
    return sorted(f"{d.parent.name}/{d.name}" for d in HERE.glob("*/*") if (d / "manifest.json").is_file())


def observed(fixture: str, out: Path) -> dict[str, Any]:
    """Verify and audit one fixture (the run written under ``out``); what golden.json holds of it."""
    import torch
    from typer.testing import CliRunner

    from fedaudit.cli import app
    from fedaudit.interop.recording_reader import read_recording
    from fedaudit.interop.recording_verify import verify_recording

    rec = read_recording(HERE / fixture)
    verification = verify_recording(rec)
    artifact, judged = rec.deployed()
    digest = hashlib.sha256()
    for key in sorted(artifact.tensors):
        digest.update(key.encode() + artifact.tensors[key].to(torch.float64).numpy().tobytes())
    result = CliRunner().invoke(app, ["audit", str(HERE / fixture), "--model", MODEL, "--attack", "auto",
                                      "--device", "cpu", "--out", str(out), "--quiet"])
    if result.exit_code != 0:
        raise AssertionError(f"fedaudit audit {fixture}: exit {result.exit_code}\n{result.output}")
    (run_dir,) = out.iterdir()
    assert (run_dir / "COMPLETE").is_file(), f"{fixture}: the audit's run is not complete"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"verification": verification["status"],
            "released_model": {"round": judged["round"], "released": judged["released"],
                               "sha256": digest.hexdigest()},
            "framework": metrics["provenance"]["recording"].get("framework"),
            "verdict": {row["row"]: [row["question"], row["level"], row["tier"], row["rule"]]
                        for row in metrics["verdict"]}}


def write() -> None:
    import tempfile

    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fixture in fixtures():
            found[fixture] = observed(fixture, Path(tmp) / fixture.replace("/", "-"))
            print(f"{fixture}: {found[fixture]['verification']}, {len(found[fixture]['verdict'])} rows")
    GOLDEN.write_text(json.dumps(found, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/recordings/golden.py --write")
    sys.path.insert(0, str(HERE.parent.parent))  # the repository's root: tests.user_models is the fixtures' model
    write()
