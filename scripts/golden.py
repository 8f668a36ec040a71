"""Golden runs: the numbers a refactoring must not move.

For fedavg, gperxan, fedlsi and ccst on digits (2 rounds, seed 0,
``--attack deepinversion,mia --inversion-iters 20 --reference-models 2``) this
runs ``fedaudit evaluate`` and keeps ``metrics.json``'s accuracy,
communication, leakage and verdict, without wall-clock fields. ``--write``
stores them under ``tests/golden/``; ``--check`` (the default) runs again and
lists every number that moved. A rule changed on purpose changes its golden
file in the same commit, with the reason in the message.

The golden numbers are CPU numbers (``device="cpu"`` is part of the recipe): a
GPU run takes other kernels (cuDNN's algorithms, TF32, atomics) and is not
expected to match them bit for bit, even with ``--deterministic``.

    python scripts/golden.py --write           # before a refactoring
    python scripts/golden.py --check           # after it (tests/test_golden.py, marked slow, does the same)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"
METHODS = ("fedavg", "gperxan", "fedlsi", "ccst")
OPTIONS: dict[str, Any] = dict(dataset="digits", rounds=2, seed=0, attack="deepinversion,mia", inversion_iters=20,
                               reference_models=2, device="cpu")
KEPT = ("accuracy", "communication", "leakage", "verdict")
MACHINE = GOLDEN_DIR / "machine.json"  # what wrote the files: CPU-exact numbers hold on that machine only


def machine() -> dict[str, Any]:
    """The CPU (its model and a digest of its feature flags: AVX-512 and the like choose the kernels), the torch
    build and its threads — what makes two identical runs' floats equal."""
    import hashlib
    import platform

    import torch

    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags") and key.strip() not in info:
                info[key.strip()] = value.strip()
    except OSError:
        pass
    flags = " ".join(sorted(info.get("flags", "").split()))
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
            "cpu_flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16], "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def other_machine() -> str:
    """Empty when this machine is the one that wrote the golden files; else one line saying what to do."""
    written = json.loads(MACHINE.read_text(encoding="utf-8")) if MACHINE.exists() else None
    here = machine()
    if written == here:
        return ""
    return (f"the golden files were written on {written or 'an unrecorded machine'}, this is {here}: CPU-exact "
            "numbers differ between machines, so compare like with like — write them at the base commit on this "
            "machine (a second clone at that commit, installed in its own venv: scripts/golden.py --write) and "
            "check this commit against those")


def strip_timings(value: Any) -> Any:
    """Drop wall-clock fields (``seconds``, ``seconds_*``): they differ between two identical runs."""
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items() if not k.startswith("seconds")}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def golden_metrics(method: str, out: Path) -> dict[str, Any]:
    import fedaudit

    result = fedaudit.evaluate(method, out=str(out), **OPTIONS)
    return strip_timings({k: result.metrics.get(k) for k in KEPT})


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Every place where ``actual`` differs from ``expected`` (exact, floats included)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{path}.{k}: missing" for k in expected if k not in actual]
        out += [f"{path}.{k}: new" for k in actual if k not in expected]
        for k in expected:
            if k in actual:
                out += differences(expected[k], actual[k], f"{path}.{k}")
        return out
    if _rows(expected) and _rows(actual):  # verdict rows: matched by their key, so a new row reads as one
        return differences({r["row"]: r for r in expected}, {r["row"]: r for r in actual}, path)
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in differences(e, a, f"{path}[{i}]")]
    return [] if expected == actual else [f"{path}: {expected!r} -> {actual!r}"]


def _rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) and "row" in v for v in value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="store the golden files")
    mode.add_argument("--check", action="store_true", help="compare fresh runs with them (the default)")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            got = json.loads(json.dumps(golden_metrics(method, Path(tmp))))  # the JSON round trip the file makes
            path = GOLDEN_DIR / f"{method}.json"
            if args.write:
                GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
                MACHINE.write_text(json.dumps(machine(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
                print(f"{method}: wrote {path}")
                continue
            diff = differences(json.loads(path.read_text(encoding="utf-8")), got)
            failed |= bool(diff)
            print(f"{method}: {'identical' if not diff else f'{len(diff)} difference(s)'}")
            for line in diff[:40]:
                print("  " + line)
    if failed and other_machine():
        print(other_machine())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
