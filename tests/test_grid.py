"""fedaudit sweep: a grid of ordinary runs, resumable, failures kept apart, the same results on every backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedaudit.errors import FedauditError
from fedaudit.sweeps.grid import grid_from, load_grid, point_resources, run_grid

TINY_FIXED = {"dataset": "digits", "image_size": 16, "rounds": 1, "batch_size": 32, "attack": "none", "device": "cpu"}


def metrics_of(root: Path, row: dict) -> dict:
    return json.loads((root / row["run_dir"] / "metrics.json").read_text())


def test_a_grid_runs_every_point_keeps_a_failure_apart_and_resumes_without_training(tmp_path, monkeypatch):
    """Two points, one that cannot run (0 rounds): the sweep finishes the other, records the failure's one-line
    error, writes the index and the compare page; run again, it trains nothing it has already finished."""
    fixed = {k: v for k, v in TINY_FIXED.items() if k != "rounds"}
    grid = grid_from({"fixed": fixed, "grid": {"rounds": [1, 0]}})
    outcome = run_grid(grid, tmp_path / "sweep", threads=1)
    rows = {r["name"]: r for r in outcome.index["points"]}
    assert set(rows) == {"rounds=1", "rounds=0"}
    ok, bad = rows["rounds=1"], rows["rounds=0"]
    assert ok["status"] == "complete" and (outcome.root / ok["run_dir"] / "COMPLETE").is_file()
    assert Path(ok["run_dir"]).parent == Path("points") / "rounds=1"  # relative: the folder can move
    assert metrics_of(outcome.root, ok)["communication"]["rounds"] == 1
    assert json.loads((outcome.root / ok["run_dir"] / "config.json").read_text())["config"]["image_size"] == 16
    assert bad["status"] == "failed" and "rounds" in bad["error"] and "\n" not in bad["error"]
    assert [r["name"] for r in outcome.failed] == ["rounds=0"]
    assert (tmp_path / "sweep" / "compare.html").is_file()
    assert not (tmp_path / "sweep" / "COMPLETE").exists()  # not every point finished
    index = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert index["points"] == outcome.index["points"] and index["threads"] == 1

    import fedaudit.api

    trained = []
    real = fedaudit.api.evaluate
    monkeypatch.setattr(fedaudit.api, "evaluate", lambda *a, **k: trained.append(k.get("rounds")) or real(*a, **k))
    again = run_grid(grid, tmp_path / "sweep", threads=1)
    assert trained == [0]  # the finished point is not run again; the failed one is retried
    kept = {r["name"]: r for r in again.index["points"]}["rounds=1"]
    assert kept["run_dir"] == ok["run_dir"] and kept["seconds"] == ok["seconds"]  # its record is kept too
    resumed = run_grid(None, tmp_path / "sweep", resume=True, threads=1)  # the grid the folder holds
    assert [r["status"] for r in resumed.index["points"]] == ["complete", "failed"]


def test_grid_mistakes_are_one_line_errors(tmp_path):
    with pytest.raises(FedauditError, match="unknown option in the grid 'roundz'"):
        grid_from({"fixed": {"roundz": 2}})
    with pytest.raises(FedauditError, match="sets 'out', which the sweep owns"):
        grid_from({"grid": {"out": ["a", "b"]}})
    with pytest.raises(FedauditError, match=r"\[grid\] seed must be a non-empty list"):
        grid_from({"grid": {"seed": 0}})
    with pytest.raises(FedauditError, match="'seed' is both fixed and in the grid"):
        grid_from({"fixed": {"seed": 0}, "grid": {"seed": [1, 2]}})
    with pytest.raises(FedauditError, match="top-level key 'method'"):
        grid_from({"method": "fedavg"})
    with pytest.raises(FedauditError, match="grid file .* does not exist"):
        load_grid(tmp_path / "missing.toml")
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps({"grid": {"fixed": {}, "grid": {"seed": [0]}}}))
    with pytest.raises(FedauditError, match="holds another grid's sweep"):
        run_grid(grid_from({"grid": {"seed": [1]}}), tmp_path / "sweep")
    with pytest.raises(FedauditError, match="--address names a Ray cluster"):
        run_grid(grid_from({"grid": {"seed": [1]}}), tmp_path / "other", address="auto")
    with pytest.raises(FedauditError, match="unknown method 'fedavgg'"):  # a typo in a value: the grid's error
        grid_from({"grid": {"method": ["fedavg", "fedavgg"]}})
    with pytest.raises(FedauditError, match="--jobs is the local backend's"):
        run_grid(grid_from({"grid": {"seed": [1]}}), tmp_path / "other", backend="ray", jobs=2)
    with pytest.raises(FedauditError, match="names an option twice"):
        grid_from({"fixed": {"target-domain": "a", "target_domain": "b"}})
    with pytest.raises(FedauditError, match="unknown backend 'slurm'"):
        run_grid(grid_from({"grid": {"seed": [1]}}), tmp_path / "other", backend="slurm")


def test_every_point_has_its_own_folder():
    names = [p.name for p in grid_from({"grid": {"target_domain": ["a b", "a_b", "a/b"], "seed": [0]}}).points()]
    assert len(set(names)) == 3 and "target_domain=a_b,seed=0" in names
    assert all("/" not in n and " " not in n for n in names)
    long = grid_from({"grid": {"method_options": [{"mu": 0.1 * i, "upload": "x" * 200} for i in range(2)]}}).points()
    assert len({p.name for p in long}) == 2 and all(len(p.name) <= 130 for p in long)
    with pytest.raises(FedauditError, match="two points would share the folder 'seed=1'"):
        grid_from({"grid": {"seed": [1, "1"]}}).points()


def test_points_ask_ray_for_a_gpu_only_when_they_run_on_one():
    assert point_resources({"profile": "paper"}, 2) == {"num_cpus": 2, "num_gpus": 1}
    assert point_resources({"profile": "paper", "device": "cpu"}, 1) == {"num_cpus": 1, "num_gpus": 0}
    assert point_resources({"device": "cuda"}, 1)["num_gpus"] == 1
    assert point_resources({}, 1)["num_gpus"] == 0  # quick profile, device auto: CPU


def test_sweep_command_exit_statuses(tmp_path):
    from fedaudit.cli import app

    grid = tmp_path / "grid.toml"
    grid.write_text('[fixed]\ndataset = "digits"\nrounds = 0\n[grid]\nseed = [0]\n')
    result = CliRunner().invoke(app, ["sweep", str(grid), "--out", str(tmp_path / "s")])
    assert result.exit_code == 4, result.output  # the point failed (rounds 0), the sweep itself finished
    assert "1 of 1 point(s) failed: seed=0:" in result.output and "Traceback" not in result.output
    grid.write_text('[fixed]\nrounds = 1\n[grid]\nmethods = ["fedavg"]\n')
    result = CliRunner().invoke(app, ["sweep", str(grid), "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "unknown option in" in result.output
    assert not (tmp_path / "t").exists()  # a bad grid leaves no folder
    shown = CliRunner().invoke(app, ["sweep", "--help"], env={"COLUMNS": "200"}).output
    # not eaten as rich markup (the docstring and option help: some click versions show no argument help)
    assert all(word in shown for word in ("[fixed]", "[grid]", ".[ray]")), shown


@pytest.mark.slow
def test_points_run_side_by_side_in_worker_processes(tmp_path):
    """--jobs 2: each point in a spawned worker, the same metrics as one after another at the same threads."""
    grid = grid_from({"fixed": TINY_FIXED, "grid": {"seed": [0, 1]}})
    apart = run_grid(grid, tmp_path / "jobs", jobs=2, threads=1)
    inline = run_grid(grid, tmp_path / "inline", threads=1)
    assert apart.complete and [r["attempts"] for r in apart.index["points"]] == [1, 1]
    for a, b in zip(apart.index["points"], inline.index["points"]):
        assert metrics_of(apart.root, a)["accuracy"] == metrics_of(inline.root, b)["accuracy"]


@pytest.mark.slow
@pytest.mark.extra
def test_the_example_grid_gives_the_same_metrics_on_ray_as_locally(tmp_path):
    """examples/grid.toml (2 methods × 2 targets × 1 seed on digits, 2 rounds) on both backends at one torch
    thread per point: 4 complete runs each, sweep.json and compare.html, and every point's metrics equal."""
    pytest.importorskip("ray")
    grid = load_grid(Path(__file__).resolve().parent.parent / "examples" / "grid.toml")
    grid.fixed.update(device="cpu")
    local = run_grid(grid, tmp_path / "local", threads=1)
    ray = run_grid(grid, tmp_path / "ray", backend="ray", threads=1)
    for outcome in (local, ray):
        assert outcome.complete and len(outcome.index["points"]) == 4
        assert (outcome.root / "compare.html").is_file() and (outcome.root / "COMPLETE").is_file()
    volatile = ("provenance",)
    for a, b in zip(local.index["points"], ray.index["points"]):
        ma, mb = metrics_of(local.root, a), metrics_of(ray.root, b)
        assert {k: v for k, v in ma.items() if k not in volatile} == {k: v for k, v in mb.items() if k not in volatile}, a["name"]


def test_dp_sweep_from_the_command_line_reaches_its_points(tmp_path):
    """The CLI hands --dp-sweep evaluate's own arguments (method flags, a config file): they must reach each point
    as such, not as run options; a config file that sets dp_epsilon is refused (it would hold the ∞ point)."""
    from fedaudit.cli import app

    base = ["evaluate", "--dp-sweep", "1,inf", "--dataset", "digits", "--attack", "none", "--device", "cpu",
            "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*base, "--rounds", "0"])
    assert result.exit_code == 2 and "--rounds must be between 1" in result.output, result.output
    config = tmp_path / "run.toml"
    config.write_text("dp_epsilon = 8.0\n")
    result = CliRunner().invoke(app, [*base, "--config", str(config)])
    assert result.exit_code == 2 and "sets dp_epsilon, which --dp-sweep sets per point" in result.output
    grid_dir = tmp_path / "grid"
    run_grid(grid_from({"fixed": {**TINY_FIXED, "rounds": 0}, "grid": {"seed": [0]}}), grid_dir)
    result = CliRunner().invoke(app, ["evaluate", "--resume", str(grid_dir)])
    assert result.exit_code == 2 and "fedaudit sweep --resume" in result.output  # a grid is not a DP sweep


def test_a_crash_in_a_dp_sweep_point_exits_1_not_2(tmp_path, monkeypatch):
    """A point that fails on the user's input is exit 2; one that crashes (a bug) is not a user error: one line
    naming the point's error.txt, exit 1, the traceback kept in that file, and the sweep resumable."""
    import fedaudit.api
    from fedaudit.cli import app

    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(fedaudit.api, "evaluate", crash)
    result = CliRunner().invoke(app, ["evaluate", "--dp-sweep", "1,inf", "--dataset", "digits", "--attack", "none",
                                      "--device", "cpu", "--quiet", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 1, result.output
    assert "RuntimeError: boom" in result.output and "a bug in fedaudit" in result.output
    assert "--resume" in result.output and "Traceback" not in result.output
    (error,) = (tmp_path / "runs").glob("*/points/*/error.txt")
    assert "RuntimeError: boom" in error.read_text() and "Traceback" in error.read_text()
