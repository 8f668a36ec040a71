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
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, UTC
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import Tensor

from fedaudit.errors import FedauditError

log = logging.getLogger("fedaudit")

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


def json_text(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n"


def write_json(path: Path, obj: object) -> None:
    write_text(path, json_text(obj))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    write_text(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in rows))


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    if rows:
        fields = list(rows[0].keys())
        for r in rows[1:]:
            fields += [k for k in r if k not in fields]
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    write_text(path, buf.getvalue())


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object the run wrote (a file holding anything else is an error naming it)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise FedauditError(f"{path} holds no JSON object; it is not a file fedaudit wrote")
    return data


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
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
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
    write_text(Path(run_dir) / COMPLETE, datetime.now(UTC).isoformat() + "\n")


# -- checkpoints ------------------------------------------------------------------


TENSORS_FILE = "tensors"  # the state.json key naming the tensors file it goes with


def tensors_file(state: dict[str, Any]) -> str:
    """The checkpoint tensors' file name for ``state``: one per round, so a state never names a file that a
    later round's write has half replaced."""
    return f"tensors-r{int(state.get('rounds_done', 0)):06d}.safetensors"


def save_checkpoint(run_dir: Path, tensors: dict[str, Tensor], state: dict[str, Any]) -> None:
    """Tensors as safetensors in the file :func:`tensors_file` names, then ``state`` as JSON naming that
    file. A process killed at any point leaves a state.json whose tensors file is whole: the old pair, or
    the new one. Older tensors files are removed last."""
    from safetensors.torch import save_file

    ckpt = Path(run_dir) / CHECKPOINT
    ckpt.mkdir(parents=True, exist_ok=True)
    name = tensors_file(state)
    flat = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    with atomic_path(ckpt / name) as tmp:
        save_file(flat, str(tmp))
    write_json(ckpt / "state.json", {**state, TENSORS_FILE: name})
    for old in ckpt.glob("tensors*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)


SNAPSHOT_CHUNK_BYTES = 256 * 2**20  # the most extra device memory a snapshot's batched copy takes at once


class HostSnapshot:
    """Tensors copied to host memory, so training may go on changing them.

    On CUDA the tensors are grouped by dtype and flattened into buffers of at most
    :data:`SNAPSHOT_CHUNK_BYTES` (one for a small model; the bound keeps a large checkpoint from needing
    its own size again on the device), and each buffer moves with one non-blocking copy into pinned
    memory: the training thread enqueues the copies and goes on, with no synchronisation per tensor. CPU
    tensors are cloned. :meth:`tensors` (called on the writer thread) waits for the copies and returns
    every tensor as its own contiguous CPU tensor, in its own shape, in the order given.
    """

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self._shapes = {k: tuple(t.shape) for k, t in tensors.items()}
        self._ready: dict[str, Tensor] = {}
        self._groups: list[tuple[list[str], Tensor]] = []
        self._event = None
        groups: dict[torch.dtype, list[str]] = {}
        for k, t in tensors.items():
            if t.device.type == "cuda":
                groups.setdefault(t.dtype, []).append(k)
            else:
                self._ready[k] = t.detach().clone(memory_format=torch.contiguous_format)
        for dtype, keys in groups.items():
            for chunk in _chunks(keys, lambda k: tensors[k].numel() * tensors[k].element_size()):
                flat = torch.cat([tensors[k].detach().reshape(-1) for k in chunk])  # in logical order
                host = torch.empty(flat.shape, dtype=dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                self._groups.append((chunk, host))
        if self._groups:
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()  # on the stream the copies were enqueued on

    def tensors(self) -> dict[str, Tensor]:
        if self._event is not None:
            self._event.synchronize()
        out = dict(self._ready)
        for keys, flat in self._groups:
            sizes = [math.prod(self._shapes[k]) for k in keys]
            # Copies (safetensors refuses tensors that share one buffer) made by numpy: a torch op on this
            # thread would start a second OpenMP team whose spinning threads slow the training thread's.
            out.update({k: _host_copy(part, self._shapes[k])
                        for k, part in zip(keys, flat.split(sizes))})  # type: ignore[no-untyped-call]
        return {k: out[k] for k in self._shapes}


def _chunks(keys: list[str], nbytes: Callable[[str], int]) -> Iterator[list[str]]:
    """``keys`` in order, cut into runs of at most :data:`SNAPSHOT_CHUNK_BYTES` (a larger tensor alone)."""
    limit = SNAPSHOT_CHUNK_BYTES
    chunk: list[str] = []
    size = 0
    for k in keys:
        if chunk and size + nbytes(k) > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(k)
        size += nbytes(k)
    if chunk:
        yield chunk


def _host_copy(part: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A CPU tensor of its own holding ``part`` in ``shape``, copied as bytes (numpy has no bfloat16)."""
    if part.numel() == 0:
        return torch.empty(shape, dtype=part.dtype)
    return torch.from_numpy(part.view(torch.uint8).numpy().copy()).view(part.dtype).view(shape)


class ProgressWriter:
    """A run's progress after each round — ``history.csv``, ``wire.jsonl`` and the checkpoint — written off
    the training thread.

    :meth:`submit` takes a :class:`HostSnapshot` of the round's tensors (batched device-to-host copies)
    and a plain copy of the round's state, hands them to one writer thread and returns. At most one round is
    in flight: ``submit`` first waits for the previous round's files, so the disk is never more than one
    round behind, and a failed write surfaces at the next ``submit`` or at :meth:`close`. Resume is as
    before: every file is replaced atomically and ``state.json``, written last, names the round the
    tensors hold. Use as a context manager: leaving it waits for the last round's files, also when
    training failed (the rounds before the failure stay resumable).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedaudit-progress")
        self._pending: Future[None] | None = None

    def submit(self, history: list[dict[str, Any]], ledger: list[dict[str, Any]], tensors: dict[str, Tensor],
               state: dict[str, Any]) -> None:
        self.wait()
        snapshot = HostSnapshot(tensors)
        # A plain copy now (through JSON): the engine goes on appending to the history and timings it holds.
        frozen = json.loads(json_text(state))
        self._pending = self._pool.submit(self._write, list(history), ledger, snapshot, frozen)

    def _write(self, history: list[dict[str, Any]], ledger: list[dict[str, Any]], snapshot: HostSnapshot,
               state: dict[str, Any]) -> None:
        write_csv(self.run_dir / "history.csv", history)
        write_jsonl(self.run_dir / "wire.jsonl", ledger)
        save_checkpoint(self.run_dir, snapshot.tensors(), state)

    def wait(self) -> None:
        """Block until the submitted round is on disk; raise its error, if writing it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> ProgressWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.close()
        except Exception as write_error:
            if exc_type is None:
                raise
            # already failing: that error is the one to raise; the rounds written before stay resumable
            log.warning("could not write the progress of the last round (%s)", write_error)


def load_checkpoint(run_dir: Path) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """(tensors, state) of the last round written whole, or None when there is none."""
    from safetensors.torch import load_file

    ckpt = Path(run_dir) / CHECKPOINT
    if not (ckpt / "state.json").exists():
        return None
    state = read_json(ckpt / "state.json")
    name = Path(str(state.pop(TENSORS_FILE, "tensors.safetensors"))).name  # a bare name, inside the checkpoint
    if not (ckpt / name).exists():
        return None
    return load_file(str(ckpt / name)), state


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
