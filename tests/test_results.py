"""metrics.json against its published schema (fedaudit/run/metrics.schema.json): the golden runs, a fresh run,
and a writer that adds an undeclared key or drops a required one. Every run the suite makes is also validated as it
is written (conftest.py sets FEDAUDIT_STRICT_SCHEMA), so each attack and method that a test runs holds the schema."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from fedaudit.errors import FedauditError
from fedaudit.run import results
from fedaudit.run.results import SCHEMA_VERSION, Leakage, RunMetrics, problems

# the golden runs (machine.json beside them says which machine wrote them)
GOLDEN = sorted(p for p in (Path(__file__).parent / "golden").glob("*.json") if p.name != "machine.json")
KEPT = {"accuracy": "accuracy", "communication": "communication", "leakage": "leakage", "verdict": "verdict"}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A fresh run with a membership attack: its metrics.json as written."""
    from tests.conftest import TINY
    import fedaudit

    opts = {k: v for k, v in TINY.items() if k != "quiet"}
    result = fedaudit.evaluate("fedavg", **{**opts, "attack": "mia-loss", "rounds": 1,
                                            "out": str(tmp_path_factory.mktemp("schema"))})
    return result.run_dir


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_every_golden_run_holds_the_schema(path):
    golden = json.loads(path.read_text())
    assert set(golden) == set(KEPT)
    for key, definition in KEPT.items():
        assert problems(golden[key], definition) == [], f"{path.name}: {key}"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_a_stored_runs_typed_blocks_read_back_as_stored(path):
    """Runs written by older fedaudit versions keep loading: each block with its typed model reads the golden run's
    block whole and writes it back unchanged, and so does each verdict row with its tests' typed blocks."""
    from fedaudit.run.results import VerdictRow
    from fedaudit.run.stored import Accuracy, Communication

    golden = json.loads(path.read_text())
    for key, model in (("accuracy", Accuracy), ("communication", Communication)):
        assert model.read(golden[key]).dump() == golden[key], f"{path.name}: {key}"
    assert [VerdictRow.from_json(r).to_json() for r in golden["verdict"]] == golden["verdict"]


def test_a_fresh_run_holds_the_schema_and_reads_back_typed(fresh, capsys):
    data = _metrics(fresh)
    assert data["schema_version"] == SCHEMA_VERSION and problems(data) == []
    assert results.main([str(fresh / "metrics.json")]) == 0 and "valid" in capsys.readouterr().out
    run = RunMetrics.from_json(data)
    assert run.to_json() == data
    # the verdict judged in the run's process from its typed metrics is the one judged again from the file
    from fedaudit.audit.verdict import judge

    assert judge(data, json.loads((fresh / "config.json").read_text())["config"]) == data["verdict"]
    rows = run.rows()
    assert rows and {r.row for r in rows} >= {"membership:global_model"} and all(r.short for r in rows)
    found = Leakage.read(data["leakage"]).membership()
    assert {(r.variant, r.target) for r in found} >= {("loss", "global_model"), ("loss", "last_upload")}
    assert [r[:3] for r in Leakage.read(data["leakage"]).membership(ordered=True)] == sorted(r[:3] for r in found)


@pytest.mark.parametrize("breach", ["new top-level key", "new key in a verdict row", "new key in a membership entry",
                                    "verdict dropped", "short form dropped", "advantage p dropped", "tier misspelt"])
def test_a_writer_that_breaks_the_schema_is_caught(fresh, breach):
    data = copy.deepcopy(_metrics(fresh))
    entry = data["leakage"]["mia"]["loss"]["global_model"]
    entry = entry[next(iter(entry))]
    if breach == "new top-level key":
        data["leakage_v2"] = {}
    elif breach == "new key in a verdict row":
        data["verdict"][0]["confidence"] = 0.9
    elif breach == "new key in a membership entry":
        entry["auc_v2"] = 0.5
    elif breach == "verdict dropped":
        del data["verdict"]
    elif breach == "short form dropped":
        del data["verdict"][0]["short"]
    elif breach == "advantage p dropped":
        del entry["advantage_p_value"]
    else:
        data["verdict"][0]["tier"] = "severe"
    assert problems(data), breach


def test_the_writer_refuses_a_breach_under_strict_and_only_warns_a_user(fresh, tmp_path, monkeypatch, caplog):
    data = _metrics(fresh)
    data["leakage_v2"] = {}
    monkeypatch.setenv(results.STRICT_ENV, "1")
    with pytest.raises(AssertionError, match="leakage_v2"):
        results.validate(data, "metrics.json")
    monkeypatch.delenv(results.STRICT_ENV)
    results.validate(data, "metrics.json")  # a user's finished run is kept: the breach is fedaudit's bug
    assert "does not match metrics.schema.json" in caplog.text and "leakage_v2" in caplog.text
    (tmp_path / "bad.json").write_text(json.dumps(data))
    assert results.main([str(tmp_path / "bad.json")]) == 1


def _copy_with(run_dir: Path, tmp_path: Path, **changes) -> Path:
    copy_dir = tmp_path / "copy"
    shutil.copytree(run_dir, copy_dir)
    data = _metrics(copy_dir)
    data.update(changes)
    if changes.get("schema_version") is None:
        data.pop("schema_version")
    (copy_dir / "metrics.json").write_text(json.dumps(data))
    return copy_dir


def test_an_old_run_still_renders_rejudged_and_a_newer_one_says_the_version(fresh, tmp_path):
    from fedaudit.reports import write_report
    from fedaudit.reports.load import load_run

    old = _copy_with(fresh, tmp_path, schema_version=None,
                     verdict=[{"artifact": "the victim's last upload", "tier": "medium", "reason": "old wording"}])
    page = write_report(old).read_text()
    assert f"made before metrics schema {SCHEMA_VERSION}" in page and "old wording" not in page
    newer = _copy_with(fresh, tmp_path / "n", schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(FedauditError, match=f"metrics schema {SCHEMA_VERSION + 1}; this fedaudit reads schema "
                                            f"{SCHEMA_VERSION} and earlier: upgrade fedaudit"):
        load_run(newer)


def test_the_schema_ships_with_the_package_and_names_its_version():
    schema = results.schema()
    assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert results.SCHEMA_FILE.parent == Path(results.__file__).parent
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert "metrics.schema.json" in pyproject["tool"]["setuptools"]["package-data"]["fedaudit.run"]


def test_the_schemas_generated_definitions_are_the_models():
    """metrics.schema.json's definitions of the typed blocks (fedaudit.run.stored) are generated from them: a field
    added to a model without rewriting the file (python scripts/metrics_schema.py) fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("metrics_schema", Path(__file__).parent.parent / "scripts" / "metrics_schema.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # compared as JSON, not as text: a pydantic release that orders a definition's keys otherwise is no change
    assert json.loads(results.SCHEMA_FILE.read_text(encoding="utf-8")) == json.loads(script.generated_text()), (
        "metrics.schema.json is behind fedaudit/run/stored/: run python scripts/metrics_schema.py")
    from fedaudit.run.stored import Communication

    defs = json.loads(results.SCHEMA_FILE.read_text(encoding="utf-8"))["$defs"]
    assert set(defs["communication"]["properties"]) == set(Communication.model_fields)


def test_a_typed_block_is_written_strictly_and_read_leniently():
    """Building a block with a key it does not declare fails where it is built; reading a stored one keeps what is
    valid, reads the rest as absent, and says which fields the file stored."""
    from pydantic import ValidationError

    from fedaudit.run.stored import Communication

    with pytest.raises(ValidationError):
        Communication(bytes_up=1, bytes_down=1, bytes_sideways=1)
    with pytest.raises(ValidationError):
        Communication(bytes_up="12", bytes_down=1)  # no conversion where a block is built
    read = Communication.read({"bytes_up": 7, "bytes_down": "12", "rounds": True, "clients": None, "unknown": 1,
                               "declared": ["full_model↑"], "by_kind": {"a": {"up": 1, "odd": 2}, "b": {"up": 3}},
                               "per_target": {"t": {"bytes_up": 1, "bytes_down": 2, "odd": 3}}})
    assert (read.bytes_up, read.bytes_down, read.rounds, read.clients) == (7, None, None, None)
    assert read.model_fields_set == {"bytes_up", "declared", "by_kind", "per_target"}
    # a nested block is read leniently too: one odd key does not lose its siblings
    assert read.dump() == {"bytes_up": 7, "by_kind": {"a": {"up": 1}, "b": {"up": 3}}, "declared": ["full_model↑"],
                           "per_target": {"t": {"bytes_up": 1, "bytes_down": 2}}}
    assert Communication.read("not a block").model_fields_set == set()
