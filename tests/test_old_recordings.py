"""Recordings are long-lived evidence (issue 71): a recording made by each recorder at earlier commits still
verifies, names the same released model and reaches the verdict golden.json holds; a recording of a format this
fedaudit does not read is refused in one line naming both versions.

The fixtures (tests/recordings/<commit>/<recorder>) were made by tests/recordings/record_fixtures.py with the fedaudit
of that commit: b8e1a49, before the typed models (issue 59), and 747f327, the commit whose NVFlare audits failed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from fedaudit.errors import FedauditError
from fedaudit.interop.recording_reader import read_recording

HERE = Path(__file__).resolve().parent / "recordings"
spec = importlib.util.spec_from_file_location("recordings_golden", HERE / "golden.py")
assert spec is not None and spec.loader is not None
golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden)
EXPECTED = json.loads(golden.GOLDEN.read_text(encoding="utf-8"))


def test_every_recorder_has_fixtures_from_before_the_typed_models_and_from_747f327():
    assert {f"{commit}/{recorder}" for commit in ("b8e1a49", "747f327") for recorder in ("plain", "flower", "nvflare")} \
        <= set(golden.fixtures())
    assert set(golden.fixtures()) == set(EXPECTED), "a fixture without its golden entry, or the reverse"


@pytest.mark.parametrize("fixture", golden.fixtures())
def test_an_earlier_recording_verifies_names_its_released_model_and_reaches_its_verdict(fixture, tmp_path):
    """As golden.json holds it: a row that moves fails here, and golden.json changes only with a reason."""
    got = golden.observed(fixture, tmp_path / "runs")
    want = EXPECTED[fixture]
    assert got["verification"] == "verified"
    assert got["released_model"] == want["released_model"]
    assert got["framework"] == want["framework"]
    moved = {row: (want["verdict"].get(row), found) for row, found in got["verdict"].items()
             if want["verdict"].get(row) != found}
    missing = sorted(set(want["verdict"]) - set(got["verdict"]))
    assert not moved and not missing, f"{fixture}: rows moved {moved}, rows gone {missing}"


def test_every_recorder_at_every_commit_released_the_one_federation_they_all_recorded():
    """record_fixtures.py runs one federation through each recorder: whatever recorded it, the model the audit
    judges as released is the same tensors."""
    assert len({entry["released_model"]["sha256"] for entry in EXPECTED.values()}) == 1


@pytest.mark.parametrize("declared, needles", [
    ("fedaudit-recording/2", ("format version 2", "newer than the version 1", "upgrade fedaudit")),
    ("fedaudit-recording/0", ("format version 0", "no longer reads",)),
    ("another-tool/1", ("'another-tool/1'", "not a fedaudit recording",)),
])
def test_a_format_this_reader_does_not_know_is_refused_in_one_line_naming_both_versions(declared, needles, tmp_path):
    root = tmp_path / "rec"
    shutil.copytree(HERE / "747f327" / "plain", root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["format"] = declared
    manifest["field_of_a_later_version"] = {"anything": 1}  # the version is judged first: no complaint about fields
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FedauditError) as caught:
        read_recording(root)
    said = str(caught.value)
    assert "\n" not in said and all(n in said for n in needles) and "field_of_a_later_version" not in said, said
