"""No comment or docstring names a file of this checkout that does not exist (issue 46), as the docs' link test
holds the docs: a pointer to the module ``attacks/gradinv`` after it became a folder sends a reader nowhere.

A path counts as this checkout's when it starts at one of its folders (``attacks/mia/signals.py``) or at a
folder inside ``fedaudit/`` (``audit/verdict/inversion.py``); a bare file name must be some file here.
Paths into other projects (``torchvision/models/…``) and placeholders (``RUN_DIR/report.html``) are not ours.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("fedaudit", "methods", "attacks", "reports", "examples", "scripts", "benchmarks", "tests")
PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|sh|json|toml|j2))\b")
BARE = re.compile(r"(?<![\w/.-])([\w-]+\.py)\b")


def _ours(path: str) -> bool:
    first = path.split("/")[0]
    return (ROOT / first).is_dir() and not first.startswith(".") or (ROOT / "fedaudit" / first).is_dir()


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in ``source``."""
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def dangling(source: str, where: str, existing: set[str]) -> list[str]:
    """'where:line names X' for every file of this checkout that ``source``'s prose names and that is missing."""
    problems = []
    for line, text in prose(source):
        for path in PATH.findall(text):
            if _ours(path) and not ((ROOT / path).exists() or (ROOT / "fedaudit" / path).exists()):
                problems.append(f"{where}:{line} names {path}")
        for name in BARE.findall(text):
            if name not in existing:
                problems.append(f"{where}:{line} names {name}")
    return problems


def _python_files() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def test_no_comment_or_docstring_names_a_missing_file():
    existing = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts}
    problems = [problem for path in _python_files()
                for problem in dangling(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), existing)]
    assert problems == []


def test_a_stale_pointer_is_found_in_a_comment_and_in_a_docstring():
    existing = {"engine.py", "signals.py"}
    source = ('"""The engine; ``attacks/gradinv.py`` feeds it."""\n'
              "x = 1  # see attacks/mia/signals.py and cli.py\n"
              "y = 'attacks/nowhere.py is data, not prose'\n")
    assert dangling(source, "m.py", existing) == ["m.py:2 names cli.py", "m.py:1 names attacks/gradinv.py"]
