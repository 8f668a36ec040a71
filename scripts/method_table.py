"""Measure the README's method table: accuracy and bytes per round of every method.

For each method and built-in dataset this runs the quick profile (default
target domain, seed 0) and reads unseen-domain and mean source-val accuracy
and the per-round bytes from the run's ledger. With ``--paper-bytes`` it also
runs ONE round of the paper profile per method (iteration counts shrunk and
32 px: the bytes per round depend on neither) to read the paper-setting sizes.

    python scripts/method_table.py --out runs/method-table [--paper-bytes] [--reuse runs/leakage-table,...]

Prints a markdown table and writes it to the page ``methods`` in docs/results/ (``--write PATH`` elsewhere) with the
command and its provenance. Runs that already finished are read back, not redone. With ``--reuse DIRS``
a finished run under those folders (e.g. the leakage or membership tables' runs) is read back when it
trained the same configuration: the options that only choose and score attacks are set aside, since
training does not read them (a canary audit changes the training split, so such runs are never reused).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedaudit.api import evaluate
from fedaudit.methods import METHODS
from fedaudit.run import run_directory
from fedaudit.run.config import parse_method_options, resolve

import results_page  # scripts/ is on sys.path when run as python scripts/method_table.py

DATASETS = ("shapes", "digits")
# Options that choose, aim or score attacks: training never reads them, so runs differing only here trained the same.
AUDIT_ONLY = {"attack", "attack_options", "attacker", "victim", "lpips_weights", "judge_steps", "out", "keep_artifacts"}
# Labelled fedaudit variants measured beside their method's default (the paper's protocol):
# row label -> (method, method options). Run when their method is in --methods.
VARIANTS = {
    "gperxan upload=partial": ("gperxan", ["upload=partial"]),  # BN side up only in the final round
}
# Shrink only iteration counts for the one-round paper-bytes run; shapes of what is sent stay the paper's.
PAPER_SHRINK = {
    "fedsb": ["budget=1"],
    "fedfd": ["local_steps=1"],
    "fedfd_a": ["local_steps=1"],
    "fedlsi": ["stage1_epochs=1", "inversion_iters=1", "translator_iters=1", "num_latents=4"],
}


def finished(out: Path, method: str, method_option: list[str] | None = None) -> Path | None:
    """A finished run under ``out`` that sent what ``method`` (with these options) declares now;
    a run from before a default changed (e.g. gperxan's upload) is not read back."""
    declared = _declared(method, method_option)
    done = [d for d in sorted(out.glob("*")) if run_directory.is_complete(d)
            and run_directory.read_json(d / "metrics.json")["communication"].get("declared") == declared] if out.exists() else []
    return done[0] if done else None


def _declared(method: str, method_option: list[str] | None) -> list[str]:
    cfg = resolve({"method": method, "method_options": parse_method_options(method_option or [])},
                  method_defaults=METHODS[method].profile_defaults)
    return sorted(f"{k.value}{'↑' if d == 'up' else '↓'}" for k, d in METHODS[method](cfg).declared_shares())


def _training(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in AUDIT_ONLY}


def trained_alike(pools: list[Path], method: str, options: dict) -> Path | None:
    """A finished single-target run under ``pools`` that trained what ``evaluate(method, **options)`` would."""
    method_option = options.get("method_option")
    wanted = resolve({"method": method, **{k: v for k, v in options.items() if k != "method_option"},
                      "method_options": parse_method_options(method_option or [])},
                     method_defaults=METHODS[method].profile_defaults).to_json()
    declared = _declared(method, method_option)
    for pool in pools:
        for config_file in sorted(pool.rglob("config.json")):
            d = config_file.parent
            if not run_directory.is_complete(d) or not (d / "metrics.json").exists():
                continue
            saved = run_directory.read_json(config_file)
            if "canary" in str(saved["config"].get("attack", "")) or len(saved.get("targets", [])) != 1:
                continue
            # the default target is resolved at run time: compare the one this run held out
            mine = {**_training(wanted), "target_domain": saved["targets"][0] if wanted["target_domain"] is None
                    else wanted["target_domain"]}
            theirs = {**_training(saved["config"]), "target_domain": saved["targets"][0]}
            if theirs == mine and run_directory.read_json(d / "metrics.json")["communication"].get("declared") == declared:
                return d
    return None


def run(out: Path, method: str, reuse: list[Path] | None = None, **options) -> Path:
    """The finished run under ``out`` (see :func:`finished`), or one under ``reuse`` that trained the same
    configuration (see :func:`trained_alike`), or a new one."""
    done = finished(out, method, options.get("method_option")) or trained_alike(reuse or [], method, options)
    return done or evaluate(method, out=str(out), attack="none", **options).run_dir


def per_round(run_dir: Path) -> str:
    """Bytes per client per round by kind and direction, from the ledger.
    Kinds sent only in some rounds (setup at round 0, a final-round upload)
    show the size per sending round and which rounds."""
    rows = [json.loads(line) for line in (run_dir / "wire.jsonl").read_text().splitlines()]
    rounds = max(r["round"] for r in rows)
    clients = len({r["sender"] for r in rows if r["direction"] == "up"})
    totals: dict[tuple[str, str], int] = {}
    seen: dict[tuple[str, str], set[int]] = {}
    for r in rows:
        key = (r["kind"], "↑" if r["direction"] == "up" else "↓")
        totals[key] = totals.get(key, 0) + r["bytes"]
        seen.setdefault(key, set()).add(r["round"])
    parts = []
    for key, b in sorted(totals.items()):
        n = len(seen[key])
        text = f"{key[0]}{key[1]} {_human(b / clients / n)}"
        if seen[key] == {0}:
            text += " once (setup)"
        elif seen[key] == {rounds} and rounds > 1:
            text += " once (final round)"
        elif n != rounds and rounds > 1:
            text += f" in {n} of rounds 0..{rounds}"
        parts.append(text)
    return ", ".join(parts)


def _human(n: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/method-table")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--paper-bytes", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--reuse", default="", help="comma-separated folders whose finished runs of the same training "
                                                "configuration are read back (e.g. runs/leakage-table)")
    ap.add_argument("--write", type=Path, default=None, help="where the table goes (default: the page methods in docs/results/)")
    args = ap.parse_args()
    reuse = [Path(p) for p in args.reuse.split(",") if p]
    out = Path(args.out)
    rows = []
    methods = args.methods.split(",")
    todo = [(m, m, []) for m in methods] + [(label, m, opts) for label, (m, opts) in VARIANTS.items() if m in methods]
    for label, method, options in todo:
        row = {"method": label}
        folder = label.replace(" ", "-")
        for ds in DATASETS:
            run_dir = run(out / "quick" / ds / folder, method, reuse, dataset=ds, device=args.device,
                          method_option=options)
            m = run_directory.read_json(run_dir / "metrics.json")
            row[ds] = (m["accuracy"]["unseen_domain"], m["accuracy"]["source_val"]["mean"], m["target_domain"])
            row.setdefault("quick_bytes", per_round(run_dir))
            row.setdefault("wall", {})[ds] = m["provenance"]["seconds"]["wall"]
        if args.paper_bytes:
            # 32 px: at or below 64 px the ResNet has the same (small-image) stem and so the same tensors as at
            # the paper profile's 64 px, and the run is four times cheaper
            run_dir = run(out / "paper-1round" / folder, method, dataset="shapes", profile="paper", rounds=1, local_epochs=1,
                    image_size=32, method_option=PAPER_SHRINK.get(method, []) + options, device=args.device)
            row["paper_bytes"] = per_round(run_dir)
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = ["| method | shapes unseen (source-val) | digits unseen (source-val) | per client per round, quick | "
             "per client per round, paper |", "|---|---|---|---|---|"]
    for r in rows:
        s, d = r["shapes"], r["digits"]
        lines.append(f"| {r['method']} | {s[0]:.3f} ({s[1]:.3f}) | {d[0]:.3f} ({d[1]:.3f}) | {r['quick_bytes']} | "
                     f"{r.get('paper_bytes', '')} |")
    results_page.write("methods", "Accuracy and bytes per round of every method", "\n".join(lines),
                       "Quick profile, default target domain, seed 0: unseen-domain accuracy with the mean source-val "
                       "accuracy in brackets, and the bytes one client sends per round, read from each run's ledger; "
                       "the paper column is one round of the paper profile (iteration counts shrunk, 32 px: the "
                       "tensors sent are the paper's).", path=args.write)


if __name__ == "__main__":
    main()
