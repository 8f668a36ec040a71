"""The report's cells: the table type every section fills, and how numbers, intervals and p-values are written."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedaudit.reports.load import Unit
from fedaudit.run.stored.reconstruction import Score


MISSING = "—"
Context = dict[str, object]  # what a section hands its Jinja template: names to what the template renders
LEVELS = (0.001, 0.01, 0.1)
RESOLVE_PER_LEVEL = 10  # non-members per unit of FPR needed to resolve a level (docs/attacks.md: 10/FPR)
@dataclass
class Table:
    columns: list[str]
    rows: list[tuple[str, list[str]]] = field(default_factory=list)


def aligned(units: Sequence[Unit], cells: Callable[[Unit], list[tuple[str, str]]]) -> Table:
    """One row per label seen in any unit (first-seen order), one column per unit; absent cells say so."""
    per_unit = [dict(cells(u)) for u in units]
    order: list[str] = []
    for d in per_unit:
        order += [k for k in d if k not in order]
    return Table([u.label for u in units], [(k, [d.get(k, MISSING) for d in per_unit]) for k in order])


def row_anchor(key: str) -> str:
    """The HTML id of a verdict row (``membership:full_model↑`` → ``verdict-membership--full_model-up``): ASCII, no
    two row keys alike."""
    spelled = key.replace("↑", "-up").replace("↓", "-down").replace(":", "--").replace("@", "-at-")
    return "verdict-" + re.sub(r"[^A-Za-z0-9_-]", lambda m: f"-u{ord(m.group()):x}-", spelled)


def is_finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def to_float(x: Any) -> float | None:
    return float(x) if is_finite(x) else None


def mb(x: Any) -> float | None:
    return float(x) / 1e6 if is_finite(x) else None


def f3(x: Any) -> str:
    return f"{x:.3f}" if is_finite(x) else MISSING if x is None else as_text(x)


def signed(x: Any) -> str:
    return f"{x:+.3f}" if is_finite(x) else MISSING if x is None else as_text(x)


def f4(x: Any) -> str:
    return f"{x:.4f}" if is_finite(x) else MISSING if x is None else as_text(x)


def size_text(x: Any) -> str:
    """Bytes for a reader: MB to three decimals with the exact byte count beside it (so parts and totals add up
    as shown), small messages in bytes (48 bytes is not "0.000 MB")."""
    if not is_finite(x):
        return MISSING
    return f"{x / 1e6:.3f} MB ({int(x):,} bytes)" if x >= 1e4 else f"{int(x)} bytes"


def p_fmt(p: Any) -> str:
    return MISSING if not is_finite(p) else (f"{p:.2g}" if p >= 0.001 else "< 0.001")


def rounds_text(rounds: Any) -> str:
    """Round numbers for a reader: a run of consecutive rounds as "1–19", with how many."""
    if not isinstance(rounds, list) or not all(isinstance(r, int) for r in rounds):
        return as_text(rounds)
    if not rounds:
        return "none"
    if rounds == list(range(rounds[0], rounds[0] + len(rounds))) and len(rounds) > 2:
        text = f"{rounds[0]}–{rounds[-1]}"
    else:
        text = ", ".join(map(str, rounds))
    return f"{text} ({len(rounds)} rounds)" if len(rounds) > 1 else text


def ci_text(ci: Any) -> str:
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(is_finite(v) for v in ci):
        return f"[{ci[0]:.3f}, {ci[1]:.3f}]"
    return "[interval missing]"


def is_interval(ci: Any) -> bool:
    return isinstance(ci, (list, tuple)) and len(ci) == 2 and all(is_finite(v) for v in ci)


def as_text(x: Any) -> str:
    return MISSING if x is None else str(x)


def config_rows(config: Mapping[str, object]) -> list[tuple[str, str]]:
    """The resolved config, one row per option: an attack's block as ``deepinversion.inversion_iters``."""
    rows = []
    for key, value in config.items():
        if key == "attack_options" and isinstance(value, dict):
            rows += [(f"{family}.{name}", value_text(v)) for family, opts in value.items() for name, v in opts.items()]
        else:
            rows.append((key, value_text(value)))
    return rows


def value_text(v: Any) -> str:
    if is_finite(v):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return as_text(v)


NULL_LABELS = (("control", "untrained control"), ("prior_only", "prior-only control"), ("twin", "holdout twin"))
def with_control(d: Score) -> str:
    """An attack's rate beside every null the file stored."""
    text = f"attack {f3(d.attack)}"
    text += "".join(f" · {name} {f3(getattr(d, key))}" for key, name in NULL_LABELS if d.has(key))
    return text + (f" · chance {f3(d.chance)}" if d.has("chance") else "")


def num_text(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else as_text(x)


