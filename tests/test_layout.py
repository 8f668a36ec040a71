"""The layout's rules, held over the import graph (parsed from the source, nothing imported).

* The threat model: nothing under ``attacks/`` imports the federation, a method,
  the data, the auditor or an entry point — not directly and not through any
  module it imports at run time. An attack sees a wire view, the public prior
  and the access the auditor grants (``fedaudit.attack``), nothing else.
* The engine (``fedaudit/`` except the entry points) imports no method, attack
  or report: it receives them, it does not look them up.
* The statistics (``fedaudit.statistics``) import nothing but each other and the user errors; the tensor
  operations (``fedaudit.tensor_ops``), which methods, attacks and the auditor share, may use the models and
  the training mechanics but reach no federation, method, wire, run directory, auditor or entry point.
* No import cycle among modules (run-time imports, function-level ones included), and no two rooms (the folders
  under ``fedaudit/``, and ``attacks/``, ``methods/``, ``reports/``) import each other: the rooms stand in layers.
* ``docs/architecture.md`` names every room and every module in it, and every file it names exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"fedaudit": ROOT / "fedaudit", "fedaudit.attacks": ROOT / "attacks", "fedaudit.methods": ROOT / "methods",
            "fedaudit.reports": ROOT / "reports"}
PLUG_INS = ("fedaudit.attacks", "fedaudit.methods", "fedaudit.reports")
# The front door: the package root (its lazy ``evaluate``), the API (and the flow it runs per target) and CLI, the
# sweep drivers (DP sweep, grids).
ENTRY_POINTS = ("fedaudit", "fedaudit.api", "fedaudit.pipeline", "fedaudit.cli", "fedaudit.sweeps.dp_sweep",
                "fedaudit.sweeps.grid")
# What an attack may not reach: private records and who holds them, and everything above the attacks.
PRIVATE = ("fedaudit.simulation.federation", "fedaudit.simulation.method", "fedaudit.methods", "fedaudit.data", "fedaudit.audit",
           "fedaudit.audit.input_canaries", *ENTRY_POINTS[1:], "fedaudit.reports")


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = (path, path.name == "__init__.py")
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module a dotted import name lands in (``fedaudit.x.y`` → ``fedaudit.x`` when y is a name in it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, bool, int]]:
    """(imported module, only under TYPE_CHECKING, line) for every fedaudit import of ``module``."""
    path, is_package = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                 for n in ast.walk(node)}
    here = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            target = _owner(name) if name.startswith("fedaudit") else None
            if target is not None and target != module:
                out.append((target, id(node) in type_only, node.lineno))
    return out


EDGES = {m: _imports(m) for m in MODULES}
RUNTIME = {m: {t for t, type_only, _ in edges if not type_only} for m, edges in EDGES.items()}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _reachable(module: str) -> dict[str, str]:
    """Every module ``module`` imports at run time, directly or not, with one path to it."""
    paths, stack = {}, [(module, module)]
    while stack:
        current, path = stack.pop()
        for target in RUNTIME[current]:
            if target not in paths and target != module:
                paths[target] = f"{path} → {target}"
                stack.append((target, paths[target]))
    return paths


ATTACK_MODULES = sorted(m for m in MODULES if _within(m, ("fedaudit.attacks",)))
# Only these look plug-ins up in their registries (docs/architecture.md, "Import rules"); the sweep drivers go through the API.
REGISTRY_USERS = ("fedaudit.api", "fedaudit.cli")


def test_the_graph_was_read():
    assert {"fedaudit.attacks.mia", "fedaudit.attacks.deepinversion", "fedaudit.simulation.federation",
            "fedaudit.audit.membership", "fedaudit.methods.gperxan", "fedaudit.reports.render"} <= set(MODULES)
    assert "fedaudit.simulation.federation" in RUNTIME["fedaudit.api"] and "fedaudit.attack" in RUNTIME["fedaudit.attacks.mia"]


@pytest.mark.parametrize("module", ATTACK_MODULES)
def test_an_attack_cannot_reach_private_data(module):
    direct = [f"line {line}: {t}" for t, _, line in EDGES[module] if _within(t, PRIVATE)]
    assert not direct, f"{module} imports {direct}; an attack gets a wire view, the prior and its Access only"
    reached = [path for target, path in _reachable(module).items() if _within(target, PRIVATE)]
    assert not reached, f"{module} reaches private code at run time: {reached}"


def test_an_attack_is_configured_by_its_own_options_not_the_runs():
    """An attack receives an AttackSetup (its typed Options and the few run facts it may know), never the run's
    whole configuration: nothing under attacks/ imports fedaudit.run.config, even for a type hint."""
    found = [f"{module} line {line}" for module in ATTACK_MODULES for target, _, line in EDGES[module]
             if target == "fedaudit.run.config"]
    assert not found, f"attacks import fedaudit.run.config: {found}; read what they need from their AttackSetup"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _within(m, PLUG_INS) and not _within(m, REGISTRY_USERS)))
def test_only_the_api_and_the_cli_look_up_plug_ins(module):
    found = [f"line {line}: {t}" for t, _, line in EDGES[module] if _within(t, PLUG_INS)]
    assert not found, f"engine module {module} imports {found}; pass the method or attack in instead"


REGISTRIES = {"METHODS": "fedaudit.simulation.method", "ATTACKS": "fedaudit.attack"}  # where each registry is kept


def test_only_the_api_and_the_cli_read_the_registries():
    """The registries live below the plug-ins (a class joins by being made), so importing them is not importing a
    plug-in: the same rule holds for the names."""
    engine = [m for m in MODULES if not _within(m, PLUG_INS) and not _within(m, REGISTRY_USERS)]
    found = [f"{module} line {node.lineno}: {alias.name}" for module in engine
             for node in ast.walk(ast.parse(MODULES[module][0].read_text(encoding="utf-8")))
             if isinstance(node, ast.ImportFrom) for alias in node.names if alias.name in REGISTRIES]
    assert not found, f"engine modules import a registry: {found}; pass the method or attack class in instead"


def name_branches(source: str, names: set[str]) -> list[str]:
    """Where code decides by a plug-in's name: a comparison with a registered name, or a literal listing two or
    more of them (a hand-kept tuple the registry should answer)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            found = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant) and c.value in names]
            found += [e.value for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set))
                      for e in c.elts if isinstance(e, ast.Constant) and e.value in names]
            out += [f"line {node.lineno}: {ast.unparse(node)[:70]}"] if found else []
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = [e for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            out += [f"line {node.lineno}: {ast.unparse(node)[:70]}"] if len(listed) >= 2 else []
    return out


def test_no_module_outside_methods_branches_on_a_methods_name():
    """What a method needs said elsewhere (the report's advice, a refusal's list) is a property it declares."""
    from fedaudit.methods import METHODS

    found = [f"{module} {where}" for module, (path, _) in MODULES.items() if not _within(module, ("fedaudit.methods",))
             for where in name_branches(path.read_text(encoding="utf-8"), set(METHODS))]
    assert not found, f"modules that decide by a method's name: {found}; declare a property on the method instead"


def test_the_name_branch_check_can_fail():
    planted = ('if method == "gperxan" and kind == "full_model":\n    pass\n'
               'ANY_MODEL = ("fedavg", "fedprox")\nDEFAULT = "fedavg"\n')
    found = name_branches(planted, {"gperxan", "fedavg", "fedprox"})
    assert sorted(found) == ["line 1: method == 'gperxan'", "line 3: ('fedavg', 'fedprox')"], found


ABOVE_TENSOR_OPS = ("fedaudit.simulation.federation", "fedaudit.simulation.method", "fedaudit.simulation.wire",
                    "fedaudit.run", "fedaudit.audit", "fedaudit.interop", "fedaudit.sweeps", *ENTRY_POINTS[1:], *PLUG_INS)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, ("fedaudit.statistics",))))
def test_the_statistics_import_nothing_but_statistics(module):
    above = [path for target, path in _reachable(module).items()
             if not _within(target, ("fedaudit.statistics", "fedaudit.errors"))]
    assert not above, f"{module} reaches beyond the statistics at run time: {above}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, ("fedaudit.tensor_ops",))))
def test_the_tensor_operations_know_no_federation_run_or_auditor(module):
    above = [path for target, path in _reachable(module).items() if _within(target, ABOVE_TENSOR_OPS)]
    assert not above, f"{module} reaches above the tensor operations at run time: {above}"


def test_there_is_no_import_cycle():
    graph = {m: set(t for t in RUNTIME[m] if t != "fedaudit") for m in MODULES if m != "fedaudit"}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def room_of(module: str) -> str | None:
    """The room a module lives in: its folder (``fedaudit.simulation``, ``fedaudit.attacks``), or None for the front
    door's top-level modules (the package root, ``api``, ``attack``, ``errors``)."""
    parts = module.split(".")
    if len(parts) < 2 or module in PACKAGES:
        return module if module in PLUG_INS else None
    room = ".".join(parts[:2])
    return room if room in PLUG_INS or (PACKAGES["fedaudit"] / parts[1]).is_dir() else None


def test_no_two_rooms_import_each_other():
    """Each room imports only rooms below it: the models, the statistics and the data at the bottom, the tensor
    operations, the run's configuration and files, the simulation, then what uses it (methods, attacks, the auditor,
    recordings, reports, the entry points)."""
    example: dict[tuple[str, str], str] = {}
    for module, targets in RUNTIME.items():
        for target in targets:
            a, b = room_of(module), room_of(target)
            if a and b and a != b:
                example.setdefault((a, b), f"{module} → {target}")
    both = sorted(f"{a} ⇄ {b} ({example[a, b]}; {example[b, a]})" for a, b in example if (b, a) in example and a < b)
    assert not both, f"rooms that import each other: {both}"


def room_sections(page: str) -> dict[str, str]:
    """The Rooms block of docs/architecture.md as {heading word: its text}: a heading line names a room
    (``run/``) or front-door modules (``api.py``) in its left column, and its text runs to the next heading."""
    block = page.split("## Rooms", 1)[1].split("```")[1]
    sections: dict[str, str] = {}
    current: list[str] = []
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.strip() and indent <= 2:
            current = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split()  # the left column's words
        for word in current:
            sections[word] = sections.get(word, "") + line + "\n"
    return sections


def named_in_its_room(module: str, path: Path, sections: dict[str, str]) -> bool:
    """A front-door module heads a line of its own; any other is named (its stem, with or without the suffix) in its room's
    text (``fedaudit/audit/verdict/evidence.py`` under ``audit/``, ``attacks/mia/scorers.py`` under ``attacks/``)."""
    room = room_of(module)
    if room is None:
        return path.name in sections
    heading = (room.split(".")[-1] if room in PLUG_INS else module.split(".")[1]) + "/"
    return re.search(rf"\b{re.escape(path.stem)}\b", sections.get(heading, "")) is not None


def test_the_architecture_page_names_every_room_and_module_and_nothing_that_is_not_there():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    files = {p.name for base in ("fedaudit", "attacks", "methods", "reports", "tests", "scripts", "benchmarks",
                                 "examples") for p in (ROOT / base).rglob("*.py")}
    gone = sorted(name for name in set(re.findall(r"([A-Za-z_]\w*\.py)\b", page)) if name not in files)
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"
    rooms = sorted({p.name for base in PACKAGES.values() for p in base.rglob("*")
                    if p.is_dir() and p.name not in ("__pycache__", "templates")})
    unnamed_rooms = [r for r in rooms if f"{r}/" not in page]
    assert not unnamed_rooms, f"docs/architecture.md does not name these rooms: {unnamed_rooms}"
    # every module by its name, under its own room's heading (methods/ is "one module per FedDG method", named in
    # docs/methods.md)
    sections = room_sections(page)
    unnamed = sorted(str(path.relative_to(ROOT)) for module, (path, _) in MODULES.items()
                     if not _within(module, ("fedaudit.methods",)) and path.name not in ("__init__.py", "__main__.py")
                     and not named_in_its_room(module, path, sections))
    assert not unnamed, f"docs/architecture.md does not name these modules: {unnamed}"


def test_a_module_counts_as_documented_only_under_its_own_rooms_heading():
    page = ("## Rooms\n```\nfedaudit/        the front door\n  api.py         entry point\n"
            "  run/           one run: config.py and\n                 options.py\n"
            "  audit/         the auditor, beside results.py\n```\n")
    sections = room_sections(page)
    run = PACKAGES["fedaudit"] / "run"
    assert named_in_its_room("fedaudit.run.options", run / "options.py", sections)  # on a continuation line
    assert not named_in_its_room("fedaudit.run.results", run / "results.py", sections)  # named, but under audit/
    assert named_in_its_room("fedaudit.api", PACKAGES["fedaudit"] / "api.py", sections)
    assert not named_in_its_room("fedaudit.errors", PACKAGES["fedaudit"] / "errors.py", sections)


def test_the_rules_catch_a_breach(monkeypatch):
    """The checks above can fail: an attack reaching the federation through a helper, a statistic reaching a
    tensor operation, a tensor operation reaching the run's configuration, and a cycle."""
    fake = dict(RUNTIME)
    fake["fedaudit.attacks.mia"] = RUNTIME["fedaudit.attacks.mia"] | {"fedaudit.simulation.wire_views"}
    fake["fedaudit.simulation.wire_views"] = RUNTIME["fedaudit.simulation.wire_views"] | {"fedaudit.simulation.federation"}
    fake["fedaudit.simulation.federation"] = RUNTIME["fedaudit.simulation.federation"] | {"fedaudit.api"}  # api imports federation
    monkeypatch.setitem(globals(), "RUNTIME", fake)
    with pytest.raises(AssertionError, match="reaches private code"):
        test_an_attack_cannot_reach_private_data("fedaudit.attacks.mia")
    fake["fedaudit.statistics.intervals"] = RUNTIME["fedaudit.statistics.intervals"] | {"fedaudit.tensor_ops.style"}
    fake["fedaudit.tensor_ops.style"] = RUNTIME["fedaudit.tensor_ops.style"] | {"fedaudit.run.config"}
    with pytest.raises(AssertionError, match="reaches beyond the statistics"):
        test_the_statistics_import_nothing_but_statistics("fedaudit.statistics.intervals")
    with pytest.raises(AssertionError, match="reaches above the tensor operations"):
        test_the_tensor_operations_know_no_federation_run_or_auditor("fedaudit.tensor_ops.style")
    with pytest.raises(AssertionError, match="import cycles"):
        test_there_is_no_import_cycle()
    # a model reaching down for the training loop: the models room and the simulation's would import each other
    fake["fedaudit.models.cnn"] = RUNTIME["fedaudit.models.cnn"] | {"fedaudit.simulation.training"}
    with pytest.raises(AssertionError, match="rooms that import each other: .*fedaudit.models ⇄ fedaudit.simulation"):
        test_no_two_rooms_import_each_other()


# -- the verdict reads typed evidence only (issue 50) ----------------------------------------------------------

VERDICT = "fedaudit.audit.verdict"
# Not the package itself: judge() is the front door that reads a stored metrics dict into AuditedRun (once); not
# thresholds.py: it reads the user's thresholds file, not the run's evidence.
RULE_MODULES = sorted(m for m in MODULES if m.startswith(VERDICT + ".") and not m.endswith(".thresholds"))


def raw_reads(source: str) -> list[str]:
    """Where a module reads a stored dict by hand: a ``.get`` call or a subscript by a string key (other than on a
    constant table, an UPPER_CASE name), a parameter or return annotated as a mapping of strings to anything, or the
    raw metrics walk (``Leakage``, ``RunMetrics``). The verdict takes the typed entries of :mod:`fedaudit.run.entries`
    and the typed blocks of :mod:`fedaudit.run.evidence_detail`, read once at the edge."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id.isupper())):
            out.append(f"line {node.lineno}: {ast.unparse(node)[:70]}")
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                and not (isinstance(node.value, ast.Name) and node.value.id.isupper())):
            out.append(f"line {node.lineno}: {ast.unparse(node)[:70]}")
        annotations = ([a.annotation for a in (*node.args.args, *node.args.kwonlyargs)] + [node.returns]
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else [])
        out += [f"line {node.lineno}: {node.name} takes or returns {ast.unparse(a)}" for a in annotations
                if a is not None and any(f"{t}[str, Any]" in ast.unparse(a) for t in ("dict", "Mapping"))]
        if isinstance(node, ast.ImportFrom) and node.module == "fedaudit.run.results":
            out += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in ("Leakage", "RunMetrics")]
    return out


@pytest.mark.parametrize("module", RULE_MODULES)
def test_the_verdict_reads_no_raw_dict(module):
    """The rules and their wording read typed entries (fedaudit.run.entries), never metrics.json's dicts: a stored
    key renamed or an alias added is resolved in one place, at the edge."""
    found = raw_reads(MODULES[module][0].read_text(encoding="utf-8"))
    assert not found, f"{module} reads raw stored dicts: {found}"


def test_the_raw_read_check_can_fail():
    """A rule that walks metrics.json itself is caught, in each of the four ways."""
    planted = ('from fedaudit.run.results import Leakage\n'
               'def rule(metrics: dict[str, Any]) -> bool:\n'
               '    return TABLE.get("x") or TABLE["x"] or metrics.get("leakage") or e.facts["n"]\n')
    found = raw_reads(planted)
    assert len(found) == 4 and "Leakage" in found[0], found
    assert {f.split(": ", 1)[1] for f in found[1:]} >= {"metrics.get('leakage')", "e.facts['n']"}, found
