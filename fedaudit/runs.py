"""The run directory: atomic writes, checkpoints, resume, completion marker.

Layout of one run (one target domain)::

    config.json     resolved configuration and its hash
    metrics.json    versioned results (written last; its presence plus
                    COMPLETE means the run finished)
    history.csv     one row per round
    wire.jsonl      the ledger, one message per line
    checkpoint/     state after the last finished round (removed when complete)
    artifacts/      safetensors of every message (with --keep-artifacts)
    COMPLETE        written after every other file is in place

A partial run never has ``COMPLETE``; ``--resume`` continues it from the last
finished round.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from torch import Tensor

from fedaudit.errors import FedauditError

SCHEMA_VERSION = 1
COMPLETE = "COMPLETE"
CHECKPOINT = "checkpoint"


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` on success.

    A crash mid-write leaves the old file (or none), never a truncated one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, obj: object) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in rows))


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    if rows:
        fields = list(rows[0].keys())
        for r in rows[1:]:
            fields += [k for k in r if k not in fields]
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    write_text(path, buf.getvalue())


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _json_default(obj: object) -> object:
    if isinstance(obj, Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def new_run_dir(out: Path, method: str, dataset: str, target: str) -> Path:
    """``out/<UTC time>-<method>-<dataset>-<target>``, made unique if it exists."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-{_slug(method)}-{_slug(dataset)}-{_slug(target)}"
    path = Path(out) / base
    n = 1
    while path.exists():
        n += 1
        path = Path(out) / f"{base}-{n}"
    path.mkdir(parents=True)
    return path


def safe_name(text: str) -> str:
    """``text`` as a file-name part: letters, digits, ``-`` and ``_`` kept, everything else ``_``."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def target_dirname(target: str) -> str:
    """The sub-directory of one unseen target in a ``--target-domain all`` run."""
    return "target-" + safe_name(target)


def _slug(text: str) -> str:
    text = text.split("/")[-1] if text.startswith("folder:") else text
    return safe_name(text)[:40] or "x"


def is_complete(run_dir: Path) -> bool:
    return (Path(run_dir) / COMPLETE).exists()


def mark_complete(run_dir: Path, required: list[str]) -> None:
    """Write the completion marker, but only if every required file is in place."""
    missing = [name for name in required if not (Path(run_dir) / name).exists()]
    if missing:
        raise RuntimeError(f"run {run_dir} is missing {', '.join(missing)}; not marking it complete")
    write_text(Path(run_dir) / COMPLETE, datetime.now(timezone.utc).isoformat() + "\n")


# -- checkpoints ------------------------------------------------------------------


def save_checkpoint(run_dir: Path, tensors: dict[str, Tensor], state: dict) -> None:
    """Tensors as safetensors, everything else as JSON; the JSON is written last
    so a checkpoint is readable only once both halves are on disk."""
    from safetensors.torch import save_file

    ckpt = Path(run_dir) / CHECKPOINT
    ckpt.mkdir(parents=True, exist_ok=True)
    flat = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    with atomic_path(ckpt / "tensors.safetensors") as tmp:
        save_file(flat, str(tmp))
    write_json(ckpt / "state.json", state)


def load_checkpoint(run_dir: Path) -> tuple[dict[str, Tensor], dict] | None:
    from safetensors.torch import load_file

    ckpt = Path(run_dir) / CHECKPOINT
    if not (ckpt / "state.json").exists() or not (ckpt / "tensors.safetensors").exists():
        return None
    return load_file(str(ckpt / "tensors.safetensors")), read_json(ckpt / "state.json")


def drop_checkpoint(run_dir: Path) -> None:
    shutil.rmtree(Path(run_dir) / CHECKPOINT, ignore_errors=True)


def has_progress(root: Path) -> bool:
    """Whether anything under ``root`` could be resumed or read: a checkpoint or a finished target."""
    root = Path(root)
    return any(root.rglob(f"{CHECKPOINT}/state.json")) or any(root.rglob(COMPLETE))


def resolve_resume(path: Path) -> Path:
    """Check that ``path`` is a run directory that can be resumed."""
    path = Path(path).expanduser()
    if not (path / "config.json").exists():
        if (path / "sweep.json").is_file():
            raise FedauditError(f"{path} is a `fedaudit sweep` folder, not a run; continue it with "
                                f"`fedaudit sweep --resume {path}`")
        raise FedauditError(f"{path} is not a fedaudit run directory (no config.json); give the folder of the run to resume")
    return path
