"""Folder images that stay on disk: decoded when indexed, through a bounded cache.

A folder dataset whose decoded images would exceed ``--cache-mb`` is not decoded into memory whole: each
domain's images become a :class:`DiskImages`, which reads like the uint8 tensor ``[N, 3, S, S]`` it stands
for — ``x[idx]`` (an int, a slice, an index or mask tensor, a list) decodes those records into a Tensor on
the view's device, ``x.shape``, ``len(x)``, ``x.to(device)`` — while the pixels live in the files and a
least-recently-used cache of decoded images (one per folder, ``--cache-mb`` in all). Splits and subsets
(``take``) and ``torch.cat`` of such views stay on disk; any other torch operation decodes the view whole
(said once per operation), so code that needs a real tensor still gets one. Decoding is the folder loader's
own (:func:`fedaudit.data.folder.decode`), so streamed and in-memory runs see the same pixels.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger("fedaudit")

CHUNK = 256  # images decoded per step where a whole view is walked (fingerprint, materialise)
Decoder = Callable[[Path, int], "np.ndarray | None"]


class DecodeCache:
    """Decoded images by file, least recently used first out, at most ``limit_bytes`` in all."""

    def __init__(self, limit_bytes: int, decode: Decoder, size: int):
        self.limit, self.decode, self.size = int(limit_bytes), decode, size
        self._items: OrderedDict[Path, Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.decoded = 0  # files decoded (misses), for tests and logs

    def __getstate__(self) -> dict[str, Any]:  # a copy starts empty: the lock and the decoded images stay here
        return {"limit": self.limit, "decode": self.decode, "size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limit"], state["decode"], state["size"])

    def get_many(self, files: Sequence[Path]) -> list[Tensor]:
        found: dict[Path, Tensor] = {}
        with self._lock:
            for f in files:
                hit = self._items.get(f)
                if hit is not None:
                    self._items.move_to_end(f)
                    found[f] = hit
        missing = list(dict.fromkeys(f for f in files if f not in found))
        if missing:
            workers = min(8, os.cpu_count() or 1, len(missing))
            with ThreadPoolExecutor(max_workers=workers) as pool:  # PIL releases the GIL while decoding
                arrays = list(pool.map(lambda f: self.decode(f, self.size), missing))
            for f, arr in zip(missing, arrays):
                if arr is None:  # readable when the folder was listed: the file changed under the run
                    raise OSError(f"image file {f} can no longer be decoded; it was readable when the dataset was "
                                  "loaded — restore it or rerun")
                found[f] = torch.from_numpy(np.array(arr)).permute(2, 0, 1).contiguous()  # PIL's arrays are read-only
            self.decoded += len(missing)
            with self._lock:
                for f in missing:
                    self._put(f, found[f])
        return [found[f] for f in files]

    def _put(self, f: Path, x: Tensor) -> None:
        n = x.numel()
        if n > self.limit or f in self._items:
            return
        self._items[f] = x
        self._bytes += n
        while self._bytes > self.limit:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.numel()

    @property
    def bytes(self) -> int:
        return self._bytes


class DiskImages:
    """uint8 images ``[N, 3, S, S]`` read from ``files`` when indexed (see the module docstring)."""

    dtype = torch.uint8
    ndim = 4

    def __init__(self, files: Sequence[Path], cache: DecodeCache, device: torch.device | str = "cpu"):
        self.files = list(files)
        self.cache = cache
        self.device = torch.device(device)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.files), 3, self.cache.size, self.cache.size))

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        return len(self.files)

    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())

    def __repr__(self) -> str:
        return f"DiskImages({len(self.files)} files at {self.cache.size}px, device={self.device})"

    def to(self, *args: Any, **kwargs: Any) -> DiskImages | Tensor:
        """On another device, still on disk; a dtype other than uint8 decodes the view (as Tensor.to would)."""
        device, dtype = self.device, None
        for a in [*args, kwargs.get("device"), kwargs.get("dtype")]:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, (str, torch.device)):
                device = torch.device(a)
        if dtype not in (None, torch.uint8):
            return self.materialise().to(device=device, dtype=dtype)
        return DiskImages(self.files, self.cache, device)

    def positions(self, idx: Any) -> list[int]:
        """The record positions ``idx`` selects, with a tensor's rules: in range (negative from the end), a mask
        as long as the view, an integer index (else IndexError / TypeError, as a Tensor would raise)."""
        n = len(self.files)
        if isinstance(idx, slice):
            return list(range(n))[idx]
        if isinstance(idx, Tensor):
            if idx.dtype == torch.bool:
                if idx.shape != (n,):
                    raise IndexError(f"a mask of shape {tuple(idx.shape)} does not match {n} records")
                return torch.nonzero(idx.detach().cpu(), as_tuple=False).flatten().tolist()
            if idx.is_floating_point() or idx.is_complex():
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            idx = idx.detach().cpu().reshape(-1).tolist() if idx.ndim else [int(idx)]
        elif isinstance(idx, (list, tuple)):
            idx = [operator.index(i) for i in idx]
        else:
            idx = [operator.index(idx)]  # np.int64 and friends; anything else is a TypeError
        for i in idx:
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for {n} records")
        return [i % n for i in idx]

    def take(self, idx: Any) -> DiskImages:
        """The records at ``idx``, still on disk (a split, a subset)."""
        return DiskImages([self.files[i] for i in self.positions(idx)], self.cache, self.device)

    def __getitem__(self, idx: Any) -> Tensor:
        if isinstance(idx, tuple):  # x[records, ...]: the records, then the rest on the decoded tensor
            head, rest = (idx[0], idx[1:]) if idx else (slice(None), ())
            if head is Ellipsis:
                return self.materialise()[idx]
            picked = self[head]
            return picked[rest] if picked.ndim == 3 else picked[(slice(None), *rest)]
        if not isinstance(idx, (slice, list, Tensor)) or (isinstance(idx, Tensor) and idx.ndim == 0
                                                           and idx.dtype != torch.bool):
            (i,) = self.positions(idx)  # one record: [C, S, S], as a tensor's x[i]
            return self.cache.get_many([self.files[i]])[0].to(self.device)
        return self._shaped(self._decode([self.files[i] for i in self.positions(idx)]).to(self.device), idx)

    def _shaped(self, images: Tensor, idx: Any) -> Tensor:
        """``images`` read for ``idx``, in the shape ``x[idx]`` has: an index tensor's shape, then one image's."""
        if isinstance(idx, Tensor) and idx.dtype != torch.bool and idx.ndim > 1:
            return images.reshape(*idx.shape, *self.shape[1:])
        return images

    def read_ahead(self, batches: Iterable[Any]) -> ReadAhead:
        """``(idx, self[idx])`` for each ``idx`` of ``batches``, able to decode the next batch while the
        caller trains on this one (:class:`ReadAhead`)."""
        return ReadAhead(self, batches)

    def _decode(self, files: list[Path]) -> Tensor:
        """``files`` decoded (through the cache) into one CPU tensor."""
        if not files:
            return torch.empty((0, *self.shape[1:]), dtype=torch.uint8)
        # numpy's stack: on the prefetch thread a torch op would start a second OpenMP team beside training's
        return torch.from_numpy(np.stack([x.numpy() for x in self.cache.get_many(files)]))

    def chunks(self, size: int = CHUNK) -> Iterator[Tensor]:
        for start in range(0, len(self.files), size):
            yield self[start:start + size]

    def materialise(self) -> Tensor:
        """The whole view as one Tensor (on its device)."""
        if not self.files:
            return self[:0]
        return torch.cat(list(self.chunks()))

    def __getattr__(self, name: str) -> Any:
        """A Tensor method the view does not have itself (``x.float()``): on the view decoded whole."""
        if name.startswith("__") or name in ("files", "cache", "device") or not hasattr(Tensor, name):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        _warn_whole(name)
        return getattr(self.materialise(), name)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.cat:
            parts = args[0] if args else kwargs.get("tensors")
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            views = [p for p in parts if isinstance(p, DiskImages)]
            if dim == 0 and len(views) == len(parts) and len({id(v.cache) for v in views}) == 1:
                return DiskImages([f for v in views for f in v.files], views[0].cache, views[0].device)
        _warn_whole(getattr(func, "__name__", str(func)))
        return func(*_materialised(args), **{k: _materialised([v])[0] for k, v in kwargs.items()})


_WARNED: set[str] = set()


def _warn_whole(name: str) -> None:
    if name not in _WARNED:
        _WARNED.add(name)
        log.warning("%s on images streamed from disk decodes them whole: memory is not bounded for this step", name)


def _materialised(values: Sequence[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, DiskImages):
            v = v.materialise()
        elif isinstance(v, (list, tuple)):
            v = type(v)(_materialised(v))
        out.append(v)
    return out


class ReadAhead:
    """Batches of a :class:`DiskImages`, each decoded on a worker thread — into pinned memory on CUDA, then
    copied to the device without blocking — and the next one started when the caller says so.

    Iterating gives ``(idx, images)``. :meth:`ahead` draws the next ``idx`` from ``batches`` and starts
    decoding it; the caller calls it once the current batch's own random draws are done (its
    augmentation), because batch order and augmentation may share one generator (fedaudit's
    ``index_batches`` draws each pass's permutation from the generator that augments): drawn in the order
    an in-memory run draws them, a streamed run trains on the same batches with the same augmentation.
    Without :meth:`ahead` a batch is drawn and decoded when asked for. Which records to read is settled
    on the calling thread (an index on the GPU is read there, once per batch). Use as a context manager:
    leaving it stops the worker.
    """

    def __init__(self, images: DiskImages, batches: Iterable[Any]) -> None:
        self.images = images
        self._batches = iter(batches)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedaudit-read-ahead")
        self._next: tuple[Any, Any] | None = None
        self._done = False

    def ahead(self) -> None:
        if self._next is not None or self._done:
            return
        idx = next(self._batches, None)
        if idx is None:
            self._done = True
            return
        files = [self.images.files[i] for i in self.images.positions(idx)]
        self._next = (idx, self._pool.submit(self._decode, files))

    def _decode(self, files: list[Path]) -> Tensor:
        images = self.images._decode(files)
        return images.pin_memory() if self.images.device.type == "cuda" else images

    def __iter__(self) -> Iterator[tuple[Any, Tensor]]:
        while True:
            self.ahead()  # a no-op when the caller already called it
            if self._next is None:
                return
            (idx, pending), self._next = self._next, None
            out = pending.result().to(self.images.device, non_blocking=self.images.device.type == "cuda")
            yield idx, self.images._shaped(out, idx)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def take(x: Tensor | DiskImages, idx: Tensor) -> Tensor | DiskImages:
    """``x[idx]`` that keeps streamed images on disk."""
    return x.take(idx) if isinstance(x, DiskImages) else x[idx]


__all__ = ["DecodeCache", "DiskImages", "ReadAhead", "take"]
