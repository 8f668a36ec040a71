"""``fedaudit sweep GRID.toml``: a grid of ordinary runs, on this machine or on Ray, and one compare page.

A grid file names fixed options and lists to cross, with ``fedaudit evaluate``'s option names (as in
``--config``)::

    [fixed]
    dataset = "digits"
    rounds = 2
    [grid]                       # one point per combination, in the file's order
    method = ["fedavg", "fedprox"]
    target_domain = ["colour", "textured"]
    seed = [0]

Each point is an ordinary run directory under ``<sweep>/points/<name>/`` (its name made of its grid values),
so ``fedaudit report`` and ``--resume`` work on it as on any run. A point that is already COMPLETE is
skipped, so running the same sweep again continues it; a point cut off mid-run resumes from its last round.
``sweep.json`` indexes the points (options, status, run directory relative to the sweep folder, one-line
error, attempts, seconds, torch threads) and is rewritten as each point ends; ``compare.html`` sets every finished point side by side at the end. The
sweep folder is COMPLETE only when every point is.

Backends (:data:`BACKENDS`) run the same function per point (:func:`run_point`), so a point's results do
not depend on the backend — only on its options and its torch thread count, which is recorded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.models.factory import is_factory
from fedaudit.run import run_directory

log = logging.getLogger("fedaudit")

SWEEP_FILE = "sweep.json"
COMPARE = "compare.html"
POINTS = "points"
BACKENDS = ("local", "ray")
RETRIES = 1  # a point whose worker died (killed, out of memory) is run once more; a point that raised is not
# Options a grid may not set: the sweep owns where each point goes and how it continues.
SWEEP_OWNED = ("out", "resume", "config")


@dataclass(frozen=True)
class Point:
    """One run of the grid: its name (the grid values that make it), and its ``evaluate`` options."""

    name: str
    options: dict[str, Any]


@dataclass
class Grid:
    """Fixed options and the lists to cross (``axes``, in the file's order)."""

    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    source: str = ""

    def points(self) -> list[Point]:
        keys = list(self.axes)
        out = []
        for values in itertools.product(*(self.axes[k] for k in keys)):
            chosen = dict(zip(keys, values))
            out.append(Point(point_name(chosen), {**self.fixed, **chosen}))
        names = [p.name for p in out]
        twins = sorted({n for n in names if names.count(n) > 1})
        if twins:  # e.g. seed = [1, "1"]: one folder for two points would mix their runs
            raise FedauditError(f"{self.source or 'the grid'}: two points would share the folder {twins[0]!r}; "
                                "make the [grid] values distinct as text")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"fixed": self.fixed, "grid": self.axes}


NAME_LIMIT = 120  # characters of a point's folder name before it is shortened (file systems allow 255 bytes)


def point_name(chosen: dict[str, Any]) -> str:
    """``method=fedavg,target_domain=colour``: a folder name that says which point it is. Values that are not
    plain file-name text (spaces, slashes, tables) or a name too long keep a short hash of the exact values,
    so two points never share a folder."""
    if not chosen:
        return "single"
    text = ",".join(f"{k}={json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else 'none' if v is None else v}"
                    for k, v in chosen.items())
    name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)
    if name != text or len(name) > NAME_LIMIT:
        digest = hashlib.sha1(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:8]
        name = f"{name[:NAME_LIMIT]}-{digest}"
    return name


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file: every key an ``evaluate`` option, every ``[grid]`` value a non-empty list."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FedauditError(f"grid file {path} does not exist; give a TOML file with [fixed] and [grid] tables "
                            "(see examples/grid.toml)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FedauditError(f"grid file {path} is not valid TOML ({exc})") from None
    return grid_from(data, str(path))


def grid_from(data: dict[str, Any], where: str = "the grid") -> Grid:
    extra = set(data) - {"fixed", "grid"}
    if extra:
        raise FedauditError(f"{where} has top-level key {sorted(extra)[0]!r}; put fixed options under [fixed] and "
                            "lists to cross under [grid]")
    tables = {}
    for table in ("fixed", "grid"):
        given = data.get(table) or {}
        if not isinstance(given, dict):
            raise FedauditError(f"{where}: [{table}] must be a table of option = value lines")
        tables[table] = {k.replace("-", "_"): v for k, v in given.items()}
        if len(tables[table]) != len(given):
            raise FedauditError(f"{where}: [{table}] names an option twice (dashes and underscores are the same)")
        for key, value in given.items():
            try:
                json.dumps(value)
            except TypeError:
                raise FedauditError(f"{where}: {key} = {value!r} is not a string, number, boolean, list or table") from None
    fixed, axes = tables["fixed"], tables["grid"]
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise FedauditError(f"{where}: [grid] {key} must be a non-empty list (e.g. {key} = [...]); put a single "
                                "value under [fixed]")
        if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise FedauditError(f"{where}: [grid] {key} lists a value twice")
    both = set(fixed) & set(axes)
    if both:
        raise FedauditError(f"{where}: {sorted(both)[0]!r} is both fixed and in the grid; keep one")
    check_option_names([*fixed, *axes], where)
    check_names(fixed, axes)
    factories = [m for m in axes.get("model", [fixed.get("model")]) if is_factory(m)]
    if factories:  # a file never makes fedaudit import code (README, "fedaudit imports code only when the command names it")
        raise FedauditError(f"{where} names the model factory {factories[0]}; fedaudit imports code only when the command "
                            f"names it, so a sweep cannot train it yet: run fedaudit evaluate --model {factories[0]} "
                            "per point")
    grid = Grid(fixed, axes, where)
    grid.points()  # folder names checked now: a grid error is the user's, before anything runs
    return grid


def check_option_names(names: list[str], where: str) -> None:
    from fedaudit.api import run_option_names

    known = run_option_names()
    for name in names:
        if name in SWEEP_OWNED:
            raise FedauditError(f"{where} sets {name!r}, which the sweep owns (each point is a run directory under "
                                "the sweep's folder); drop it")
        if name not in known:
            raise unknown_choice("option in " + where, name, sorted(known - set(SWEEP_OWNED)))


def check_names(fixed: dict[str, Any], axes: dict[str, list[Any]]) -> None:
    """Method and attack names, every value the grid gives them, checked against the registries now: a typo is
    the grid's error (exit 2), not one point's failure after the others trained."""
    from fedaudit.api import check_registry_names

    check_registry_names(axes.get("method", [fixed.get("method")]), axes.get("attack", [fixed.get("attack")]))


# -- one point --------------------------------------------------------------------------------------------


def started_runs(point_dir: Path) -> list[Path]:
    return sorted(d for d in point_dir.glob("*") if (d / "config.json").is_file()) if point_dir.is_dir() else []


def finished_run(point_dir: Path) -> Path | None:
    return next((d for d in started_runs(point_dir) if run_directory.is_complete(d)), None)


def run_point(point_dir: str, options: dict[str, Any], threads: int, command: str = "", **hooks: Any) -> dict[str, Any]:
    """Run (or resume, or find finished) one point; never raises for a failed run: the result says why, and a
    finished one names its run directory inside ``point_dir``.

    This is what every backend calls, in-process, in a worker process or as a Ray task; ``hooks`` (a
    ``reporter``, ``on_round_end``) reach ``evaluate`` in-process only."""
    import torch

    from fedaudit.api import evaluate

    torch.set_num_threads(threads)
    folder = Path(point_dir)
    done = finished_run(folder)
    if done is not None:
        return {"status": "complete", "run_dir": done.name, "trained": False}
    t0 = time.perf_counter()
    try:
        started = started_runs(folder)
        # a factory in the point's options was checked against the command's --model (same_grid)
        result = (evaluate(resume=started[0], model=options.get("model"), **hooks) if started else
                  evaluate(**options, out=str(folder), command=command or None, **hooks))
    except FedauditError as exc:
        return {"status": "failed", "error": str(exc), "seconds": time.perf_counter() - t0}
    except Exception as exc:  # a bug in one point must not end the sweep; its traceback is kept
        folder.mkdir(parents=True, exist_ok=True)
        run_directory.write_text(folder / "error.txt", traceback.format_exc())
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc} (traceback in {folder / 'error.txt'})",
                "crashed": True, "seconds": time.perf_counter() - t0}
    # the run's folder name only: the driver joins it to the point's folder as it sees it (on a cluster the
    # worker may see the shared storage under another path)
    return {"status": "complete", "run_dir": Path(result.run_dir).name, "trained": True,
            "seconds": time.perf_counter() - t0}


# -- the sweep ----------------------------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    root: Path
    index: dict[str, Any]
    compare: Path | None
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.failed and all(p["status"] == "complete" for p in self.index["points"])


Dispatch = Callable[[list[tuple[Point, Path]], int], Iterator[tuple[Point, dict[str, Any]]]]


def run_grid(grid: Grid | None, out: str | Path, *, backend: str = "local", jobs: int = 1, threads: int | None = None,
             address: str | None = None, resume: bool = False, compare_name: str = COMPARE,
             hooks: dict[str, Any] | None = None, stop_on_failure: bool = False, model: str | None = None) -> SweepOutcome:
    """Run every point of ``grid`` not yet COMPLETE under ``out`` (or, with ``resume``, the grid ``out`` holds),
    then write ``compare_name``; ``hooks`` go to ``evaluate`` (one point after another, in this process);
    ``stop_on_failure``: no point starts after one has failed (the rest stay pending); ``model``: the command's
    ``--model``, which a resumed sweep's model factory must be."""
    _check_dispatch(backend, jobs, address, in_process=bool(hooks) or stop_on_failure)
    root = Path(out).expanduser().resolve()
    grid = same_grid(root, grid, resume, model)
    threads = threads or default_threads(backend, jobs)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise FedauditError(f"--threads must be a positive integer, got {threads!r}")
    index, pending = _sweep_index(root, grid, backend, threads)
    rows = {row["name"]: row for row in index["points"]}
    dispatch: Dispatch = _local(jobs, hooks or {}) if backend == "local" else _ray(address)
    for point, result in dispatch(pending, threads):
        _record(rows[point.name], point, result, root, threads)
        write_index(root, index)
        if stop_on_failure and result["status"] == "failed":
            break
    return _finish(root, index, compare_name, ran=bool(pending))


def _finish(root: Path, index: dict[str, Any], compare_name: str, ran: bool) -> SweepOutcome:
    """The compare page over the finished points, and the sweep marked complete when every point is."""
    finished = [root / row["run_dir"] for row in index["points"] if row["status"] == "complete"]
    compare = root / compare_name if (root / compare_name).is_file() and not ran else None
    if finished and compare is None:  # rendered again only when a point ran: a finished sweep re-runs in seconds
        from fedaudit.api import write_comparison

        compare = write_comparison(finished, root / compare_name)
    failed = [row for row in index["points"] if row["status"] != "complete"]
    if not failed:
        run_directory.mark_complete(root, [SWEEP_FILE, compare_name])
    return SweepOutcome(root, index, compare, failed)


def _check_dispatch(backend: str, jobs: int, address: str | None, in_process: bool) -> None:
    if backend not in BACKENDS:
        raise unknown_choice("backend", backend, BACKENDS)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise FedauditError(f"--jobs must be a positive integer, got {jobs!r}")
    if address is not None and backend != "ray":
        raise FedauditError("--address names a Ray cluster; add --backend ray or drop --address")
    if in_process and (backend != "local" or jobs != 1):
        raise ValueError("hooks and stop_on_failure run in this process: backend local, one job")
    if jobs != 1 and backend != "local":
        raise FedauditError("--jobs is the local backend's; on Ray every point is a task and the cluster's CPUs "
                            "set how many run at once (drop --jobs)")


def _sweep_index(root: Path, grid: Grid, backend: str,
                 threads: int) -> tuple[dict[str, Any], list[tuple[Point, Path]]]:
    """The sweep's index (written), each point's row carried over from an earlier invocation and marked complete
    or pending by what is on disk now, and the pending points with their folders."""
    points = grid.points()
    before = {row["name"]: row for row in (run_directory.read_json(root / SWEEP_FILE)["points"]
                                           if (root / SWEEP_FILE).is_file() else [])}
    index = {"grid": grid.to_json(), "source": grid.source, "backend": backend, "threads": threads,
             "points": [{**before.get(p.name, {}), "name": p.name, "options": p.options} for p in points]}
    pending = []
    for p, row in zip(points, index["points"]):
        row.setdefault("attempts", 0)
        done = finished_run(root / POINTS / p.name)
        if done is not None:
            row.update(status="complete", run_dir=str(done.relative_to(root)), error=None)
        else:  # whatever an earlier invocation said of it, it has no finished run now
            row.update(status="pending", run_dir=None, error=row.get("error"), crashed=False)
            pending.append((p, root / POINTS / p.name))
    root.mkdir(parents=True, exist_ok=True)
    if pending:
        (root / run_directory.COMPLETE).unlink(missing_ok=True)  # a point of a finished sweep was removed: not complete now
        log.info("sweep %s: %d of %d points to run (%s backend, %d torch thread(s) each)", root, len(pending),
                 len(points), backend, threads)
    else:
        log.info("sweep %s: every point is complete; nothing to run", root)
    write_index(root, index)
    return index, pending


def _record(row: dict[str, Any], point: Point, result: dict[str, Any], root: Path, threads: int) -> None:
    """A point's result into its index row."""
    row["attempts"] += result.pop("attempts", 1)
    run_dir = result.get("run_dir")
    row.update(status=result["status"], error=result.get("error"), seconds=result.get("seconds"), threads=threads,
               run_dir=None if run_dir is None else str(Path(POINTS, point.name, run_dir)),
               crashed=result.get("crashed", False))
    if result["status"] == "failed":
        log.warning("sweep point %s failed: %s", point.name, result["error"])
    else:
        log.info("sweep point %s: %s", point.name, root / row["run_dir"])


def same_grid(root: Path, grid: Grid | None, resume: bool, model: str | None = None) -> Grid:
    """The grid to run in ``root``: a new folder takes ``grid``; a folder with a sweep must hold the same one.
    A stored model factory is imported only when the command names it (``model``, its ``--model``)."""
    stored = run_directory.read_json(root / SWEEP_FILE) if (root / SWEEP_FILE).is_file() else None
    if resume:
        if stored is None:
            raise FedauditError(f"{root} holds no sweep ({SWEEP_FILE}); give the folder a sweep wrote, or a grid file")
        fixed, axes = stored["grid"]["fixed"], stored["grid"]["grid"]
        for factory in [m for m in axes.get("model", [fixed.get("model")]) if is_factory(m) and m != model]:
            raise FedauditError(f"{root} trains the model factory {factory}; fedaudit imports code only when the "
                                f"command names it: add --model {factory} to --resume")
        # checked when it was written (a --dp-sweep's holds evaluate's own arguments, config and method flags)
        return Grid(fixed, axes, stored.get("source") or str(root / SWEEP_FILE))
    if grid is None:
        raise FedauditError("give a grid file (fedaudit sweep GRID.toml) or --resume SWEEP_DIR")
    # compared as text: the order of the [grid] keys names the points, so it counts
    if stored is not None and json.dumps(stored["grid"]) != json.dumps(grid.to_json()):
        raise FedauditError(f"{root} holds another grid's sweep; give another --out, or --resume {root} to continue "
                            "the grid it holds")
    if stored is None and root.is_dir() and any(root.iterdir()):
        raise FedauditError(f"{root} exists and is not a sweep folder; give an empty or new --out")
    return grid


def default_threads(backend: str, jobs: int) -> int:
    """Torch threads per point: the machine's cores shared among local jobs; one per Ray task (a Ray task
    asks for as many CPUs as it uses threads)."""
    return max(1, (os.cpu_count() or 1) // jobs) if backend == "local" else 1


def write_index(root: Path, index: dict[str, Any]) -> None:
    run_directory.write_json(root / SWEEP_FILE, index)


# -- backends -------------------------------------------------------------------------------------------------


def _local(jobs: int, hooks: dict[str, Any]) -> Dispatch:
    """Points one after another in this process (``jobs`` 1), or ``jobs`` at a time in worker processes."""

    def dispatch(pending: list[tuple[Point, Path]], threads: int) -> Iterator[tuple[Point, dict[str, Any]]]:
        if jobs == 1:
            for point, folder in pending:
                log.info("sweep point %s", point.name)
                yield point, run_point(str(folder), point.options, threads, **hooks)
            return
        yield from _process_pool(pending, threads, jobs)

    return dispatch


def _process_pool(pending: list[tuple[Point, Path]], threads: int, jobs: int) -> Iterator[tuple[Point, dict[str, Any]]]:
    """``jobs`` spawned workers (no forked torch state). A worker that dies breaks the whole pool and every
    unfinished point with it, so no one point can be blamed: those points then run one at a time, each in a
    pool of its own, where a death is its own — and a point that dies alone twice has failed."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("spawn")

    def run(batch: list[tuple[Point, Path]], workers: int) -> Iterator[tuple[Point, Path, dict[str, Any] | None]]:
        """(point, folder, result), result None when its pool broke before it finished."""
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(run_point, str(folder), point.options, threads): (point, folder)
                       for point, folder in batch}
            left = set(futures)
            while left:
                done, left = wait(left, return_when=FIRST_COMPLETED)
                for fut in done:
                    point, folder = futures[fut]
                    try:
                        yield point, folder, fut.result()
                    except BrokenProcessPool:
                        yield point, folder, None
                    except Exception as exc:  # e.g. a worker that could not start: this point fails, the sweep goes on
                        yield point, folder, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}

    suspects = []
    for point, folder, result in run(pending, jobs):
        if result is None:
            suspects.append((point, folder))
        else:
            yield point, {**result, "attempts": 1}
    for point, folder in suspects:  # alone now: a death is this point's own
        for attempt in range(1, RETRIES + 2):
            _, _, result = next(run([(point, folder)], 1))
            if result is not None:
                yield point, {**result, "attempts": 1 + attempt}
                break
        else:
            yield point, {"status": "failed", "attempts": 1 + RETRIES + 1,
                          "error": f"its worker process died {RETRIES + 1} times running it alone (killed, or out of memory)"}


def _ray(address: str | None) -> Dispatch:
    def dispatch(pending: list[tuple[Point, Path]], threads: int) -> Iterator[tuple[Point, dict[str, Any]]]:
        if not pending:
            return
        try:
            import ray
        except ImportError:
            raise FedauditError("--backend ray needs Ray: pip install -e \".[ray]\"; or use --backend local") from None
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # an audit runs offline
        started_here = not ray.is_initialized()
        if started_here:
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = f"the Ray cluster at {address}" if address else "a local Ray"
                raise FedauditError(f"cannot start or reach {where}: {exc}; start one with `ray start --head`, or "
                                    "use --backend local") from None
        try:
            yield from _ray_tasks(ray, pending, threads)
        finally:
            if started_here:
                ray.shutdown()

    return dispatch


def point_resources(options: dict[str, Any], threads: int) -> dict[str, float]:
    """What one point asks of Ray: a CPU per torch thread, and a GPU when it runs on one (the paper profile,
    or ``device = "cuda"``)."""
    device = str(options.get("device", "auto"))
    gpu = device.startswith("cuda") or (options.get("profile") == "paper" and device != "cpu")
    return {"num_cpus": threads, "num_gpus": 1 if gpu else 0}


def _ray_tasks(ray: Any, pending: list[tuple[Point, Path]], threads: int) -> Iterator[tuple[Point, dict[str, Any]]]:
    from ray.exceptions import RayError

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for point, _ in pending:
        need = point_resources(point.options, threads)
        # a task runs on one node: some node must hold all it asks for, or ray.wait would wait forever
        if not any(need["num_cpus"] <= r.get("CPU", 0) and need["num_gpus"] <= r.get("GPU", 0) for r in nodes):
            most = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
            raise FedauditError(f"sweep point {point.name} needs {need['num_cpus']} CPU(s) and {need['num_gpus']} "
                                f"GPU(s) on one node, and no node of the Ray cluster has them (the largest: "
                                f"{most.get('CPU', 0):g} CPUs, {most.get('GPU', 0):g} GPUs); lower --threads, set "
                                "device = \"cpu\", or add a node that has them")
    # max_retries: Ray re-runs a task whose worker died (RETRIES times); an exception inside run_point is
    # not a worker death, and run_point returns failures instead of raising them
    task = ray.remote(max_retries=RETRIES)(run_point)
    refs = {task.options(**point_resources(point.options, threads)).remote(str(folder), point.options, threads):
            point for point, folder in pending}
    left = list(refs)
    while left:
        done, left = ray.wait(left, num_returns=1)
        point = refs[done[0]]
        try:
            result = ray.get(done[0])
        except RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            result = {"status": "failed", "error": f"its Ray task failed ({type(exc).__name__}; a dead worker is retried "
                                                  f"{RETRIES} time(s)): {first}"}
        yield point, result


__all__ = ["BACKENDS", "Grid", "Point", "SweepOutcome", "grid_from", "load_grid", "point_resources", "run_grid",
           "run_point"]
