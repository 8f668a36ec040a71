"""Every third-party package the code imports is declared in pyproject.toml (issue 46).

An AST scan, not an import: a module-level import in the package's rooms must be a core dependency (it runs
when fedaudit is imported); an import inside a function or a ``try`` (an optional feature: Flower, Ray) may
be declared by an extra instead; tests, scripts and benchmarks may use any extra. scipy arrived through
scikit-learn for months without being declared: this test names such a package.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOMS = ("fedaudit", "methods", "attacks", "reports")
OTHER_ROOMS = ("examples", "scripts", "benchmarks", "tests")
# A package module that is an extra's entry point: it imports its framework at module level, and nothing in
# the package imports it (the user does, having installed the extra).
EXTRA_MODULES = {"fedaudit/interop/flower.py": "flower", "fedaudit/interop/nvflare.py": "nvflare"}


def _name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement ("flwr[simulation]==1.41.0" → "flwr")."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def declared(pyproject: dict) -> tuple[set[str], set[str]]:
    """(core dependencies, every extra's) as normalised distribution names."""
    project = pyproject["project"]
    core = {_name(r) for r in project.get("dependencies", [])}
    extras = {_name(r) for reqs in project.get("optional-dependencies", {}).values() for r in reqs}
    return core, extras


def _local_names() -> set[str]:
    """Top-level names that are this checkout's own: its folders, and scripts importing their neighbours."""
    names = {p.name for p in ROOT.iterdir() if p.is_dir()}
    for room in OTHER_ROOMS:
        names |= {p.stem for p in (ROOT / room).rglob("*.py")}
    return names


def imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, at module level and unconditional) for every absolute import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    unconditional = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(name.split(".")[0], id(node) in unconditional) for name in names]
    return found


@functools.cache
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def _distributions(module: str) -> set[str]:
    """Distribution names that may provide ``module``: what is installed says, else the module's own name."""
    return {re.sub(r"[-_.]+", "-", d).lower() for d in [*_installed().get(module, []), module]}


def undeclared(pyproject: dict) -> list[str]:
    """'file: module' for every third-party import that pyproject.toml does not declare where it must."""
    core, extras = declared(pyproject)
    local = _local_names()
    problems = []
    for room in PACKAGE_ROOMS + OTHER_ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            for module, at_import_time in imports(path):
                if module in sys.stdlib_module_names or module in local or module == "__future__":
                    continue
                core_only = room in PACKAGE_ROOMS and at_import_time and str(path.relative_to(ROOT)) not in EXTRA_MODULES
                allowed = core if core_only else core | extras
                if not _distributions(module) & allowed:
                    where = "dependencies" if allowed is core else "dependencies or an extra"
                    problems.append(f"{path.relative_to(ROOT)}: {module} (not in pyproject.toml's {where})")
    return sorted(set(problems))


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_imported_package_is_declared(pyproject):
    assert undeclared(pyproject) == []


@pytest.mark.parametrize("dropped", ["scipy", "torch", "jsonschema", "markupsafe", "flwr", "nvflare"])
def test_dropping_a_declared_package_that_the_code_imports_names_it(pyproject, dropped):
    project = dict(pyproject["project"])
    project["dependencies"] = [r for r in project["dependencies"] if _name(r) != dropped]
    project["optional-dependencies"] = {extra: [r for r in reqs if _name(r) != dropped]
                                        for extra, reqs in project.get("optional-dependencies", {}).items()}
    problems = undeclared({"project": project})
    assert problems and all(f": {dropped} (" in p for p in problems)


def test_an_extras_module_is_imported_by_nothing_in_the_package():
    for module_path in EXTRA_MODULES:
        dotted = module_path.removesuffix(".py").replace("/", ".")
        users = [str(p.relative_to(ROOT)) for room in PACKAGE_ROOMS for p in (ROOT / room).rglob("*.py")
                 if any(node.module == dotted for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                        if isinstance(node, ast.ImportFrom))]
        assert users == [], f"{module_path} is an extra's module; {users} import it"


def test_the_python_floor_is_one_the_code_runs_on(pyproject):
    """tomllib (3.11) is imported unconditionally: the declared floor says so."""
    floor = re.search(r">=\s*3\.(\d+)", pyproject["project"]["requires-python"])
    assert floor and int(floor.group(1)) >= 11, pyproject["project"]["requires-python"]


def test_no_function_is_at_radon_d_or_worse():
    """Issue 33's and 46's bar for the package: `radon cc -n D fedaudit methods attacks reports` prints nothing."""
    worst = [f"{path.relative_to(ROOT)}: {name} {rank}" for room in PACKAGE_ROOMS
             for path in sorted((ROOT / room).rglob("*.py"))
             for name, rank in ranked_blocks(path.read_text(encoding="utf-8")) if rank >= "D"]
    assert worst == []


MODULE_LINES = 500  # issue 59: a module past this is two modules
API_LINES = 400  # the front door stays orchestration only


def test_no_module_is_longer_than_the_bar():
    lines = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
             for room in PACKAGE_ROOMS for path in (ROOT / room).rglob("*.py")}
    long = sorted(f"{name}: {n}" for name, n in lines.items() if n > MODULE_LINES)
    assert not long, f"modules over {MODULE_LINES} lines: {long}; split each along a seam a reader would name"
    assert lines["fedaudit/api.py"] <= API_LINES, f"fedaudit/api.py has {lines['fedaudit/api.py']} lines"


def ranked_blocks(source: str) -> list[tuple[str, str]]:
    """(name, radon rank) of every function and method in ``source``, as `radon cc` lists them (not closures)."""
    from radon.complexity import cc_rank, cc_visit

    def flat(blocks):
        for block in blocks:
            yield block
            yield from flat(getattr(block, "methods", []))

    return [(block.name, cc_rank(block.complexity)) for block in flat(cc_visit(source))]


def _marks_extra(node: ast.AST) -> bool:
    """Whether ``node`` holds ``pytest.mark.extra`` (a decorator, or a module's ``pytestmark``)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "extra" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(node))


def extra_examples(extra_only: set[str]) -> set[str]:
    """The examples/ folders whose code imports an extra's package: a test that runs one needs that extra."""
    return {path.parent.name for path in (ROOT / "examples").glob("*/*.py")
            if any(_distributions(name.split(".")[0]) & extra_only
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                                else []))}


def unmarked_extra_tests(source: str, extra_only: set[str], examples: set[str] = frozenset()) -> list[str]:
    """Top-level statements and test functions that need an extra's package — skip without it
    (``pytest.importorskip``), or run an example that imports it (one of ``examples``) — and are not marked
    ``extra``; and those that run such an example without skipping where the extra is not installed (they would
    fail in the README's environment, not skip)."""
    tree = ast.parse(source)
    module_marked = any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                          for t in s.targets) and _marks_extra(s) for s in tree.body)

    def skips(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "importorskip"
                   and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
                   and _distributions(n.args[0].value.split(".")[0]) & extra_only for n in ast.walk(node))

    def runs_example(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and any(e in n.value for e in examples)
                   for n in ast.walk(node))

    module_skips = any(skips(stmt) for stmt in tree.body if not isinstance(stmt, ast.FunctionDef))
    found = []
    for stmt in tree.body:
        name = stmt.name if isinstance(stmt, ast.FunctionDef) else f"line {stmt.lineno}"
        marked = module_marked or (isinstance(stmt, ast.FunctionDef) and any(map(_marks_extra, stmt.decorator_list)))
        if (skips(stmt) or runs_example(stmt)) and not marked:
            found.append(name)
        elif runs_example(stmt) and not (module_skips or skips(stmt)):
            found.append(f"{name} (runs an extra's example: importorskip its package)")
    return found


def test_every_test_that_needs_an_extra_is_marked_so_ci_runs_it(pyproject):
    """.ci/run runs the README's test command where the README installs (no extras: these tests skip), then
    `-m extra` with the extras installed (issue 70). A test that needs an extra — skips without its package, or runs an
    example that imports it — and is not marked `extra` would run nowhere: Flower's SecAgg+ example once did not
    (issue 71)."""
    core, extras = declared(pyproject)
    examples = extra_examples(extras - core)
    assert {"flower_digits", "nvflare_digits"} <= examples and "pytorch_fedavg" not in examples
    found = {str(p.relative_to(ROOT)): unmarked_extra_tests(p.read_text(encoding="utf-8"), extras - core, examples)
             for p in sorted((ROOT / "tests").glob("test_*.py")) if p.name != Path(__file__).name}  # not the rule's own
    assert {path: names for path, names in found.items() if names} == {}
    unmarked = 'import pytest\n\ndef test_x():\n    pytest.importorskip("flwr")\n'
    assert unmarked_extra_tests(unmarked, extras - core) == ["test_x"]
    assert unmarked_extra_tests("@pytest.mark.extra\n" + unmarked.split("\n\n", 1)[1], extras - core) == []
    runs = 'import pytest\n\n@pytest.mark.extra\ndef test_y():\n    run("examples/flower_digits/secagg.py")\n'
    assert unmarked_extra_tests(runs, extras - core, examples) == [
        "test_y (runs an extra's example: importorskip its package)"]
    assert unmarked_extra_tests(runs.replace("@pytest.mark.extra\n", ""), extras - core, examples) == ["test_y"]
    assert unmarked_extra_tests(runs.replace("run(", 'pytest.importorskip("flwr"); run('), extras - core,
                                examples) == []


# -- the lock (issue 70): what the README installs, pinned, and within the ranges above -------------------------


def readme_commands() -> dict[str, str]:
    """The README's two commands, by the reader .ci/run uses (scripts/readme_commands.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / "scripts" / "readme_commands.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.readme_commands()


def pins(path: Path) -> dict[str, str]:
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in
            re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", path.read_text(encoding="utf-8"), re.M)}


def lock_problems(pyproject: dict, lock: dict[str, str], extras: tuple[str, ...]) -> list[str]:
    """What a lock gets wrong for ``.[extras]``: a requirement it does not pin, or pins outside its range."""
    from packaging.requirements import Requirement

    project = pyproject["project"]
    reqs = [Requirement(r) for r in [*project["dependencies"],
                                     *(r for e in extras for r in project["optional-dependencies"][e])]]
    problems = []
    for req in reqs:
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name not in lock:
            problems.append(f"{name}: not pinned")
        elif not req.specifier.contains(lock[name], prereleases=True):
            problems.append(f"{name}=={lock[name]}: outside {req.specifier}")
    return problems


def test_the_readme_installs_with_the_lock_and_the_lock_pins_what_it_installs(pyproject):
    """The README's install line (as .ci/run reads and runs it) uses constraints.txt; each lock pins every requirement of the environment it is
    for, inside pyproject.toml's ranges (a floor raised without refreshing the lock fails here, not on a user's
    machine); and a lock that left one out, or one outside its range, is named."""
    commands = readme_commands()
    line = commands["install"]
    assert "-c constraints.txt" in line and '-e ".[test]"' in line, line
    assert commands["tests"] == "python -m pytest -q"
    base, extras = pins(ROOT / "constraints.txt"), pins(ROOT / "constraints-extras.txt")
    assert lock_problems(pyproject, base, ("test",)) == []
    assert lock_problems(pyproject, extras, ("test", "flower", "nvflare", "ray")) == []
    assert lock_problems(pyproject, {k: v for k, v in base.items() if k != "typer"}, ("test",)) == ["typer: not pinned"]
    assert lock_problems(pyproject, {**base, "typer": "0.12.0"}, ("test",)) == ["typer==0.12.0: outside >=0.12.4"]
