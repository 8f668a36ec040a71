"""``folder:PATH``: a user's own multi-domain image set in DomainBed layout.

``PATH/<domain>/<class>/<image>`` is how PACS, OfficeHome, VLCS,
TerraIncognita and DomainNet unpack, so users can audit on the real
benchmarks they already have. Images are decoded with PIL, converted to RGB
and resized to ``image_size`` x ``image_size``; unreadable files are skipped,
counted in ``skipped`` and reported with one warning. Domain and class names
are folder names (sorted, hidden entries ignored) and may contain anything.

A folder whose decoded images would exceed ``cache_mb`` is streamed (:mod:`fedaudit.data.stream`): one
pass decodes every file to find the readable ones (the same that would be kept in memory), then images
stay on disk and are decoded again when a batch needs them, through a cache of ``cache_mb``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..errors import FedauditError
from .base import MultiDomainDataset
from .stream import DecodeCache, DiskImages

log = logging.getLogger("fedaudit")

LAYOUT_HINT = "give folder:PATH with PATH/<domain>/<class>/<image>"
SHOW_SKIPPED = 5  # unreadable files named in the warning (then a count)
STREAM_CHUNK = 512  # files checked per step when streaming: the first pass holds no more decoded at once


def _visible(p: Path) -> bool:
    return not p.name.startswith(".")


def _subdirs(p: Path) -> list[Path]:
    return sorted((c for c in p.iterdir() if _visible(c) and c.is_dir()), key=lambda c: c.name)


def decode(path: Path, size: int) -> np.ndarray | None:
    """Decode, RGB-convert and resize one image; None if it cannot be read."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.draft("RGB", (size, size))  # lets JPEG decode at a reduced scale: much faster for big photos
            rgb = im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except Exception:  # any decoder failure means "unreadable"; counted and reported
        return None


def load_folder(path: str, image_size: int = 32, spec: str | None = None, min_domains: int = 2,
                cache_mb: float | None = None) -> MultiDomainDataset:
    """Load ``PATH/<domain>/<class>/<image>`` into a :class:`MultiDomainDataset` (at least ``min_domains``
    domains: leave-one-domain-out needs two; an auditor's records of one unseen domain need one); streamed
    from disk when its decoded images exceed ``cache_mb`` MB (None: never)."""
    root = Path(os.path.expanduser(path))
    if path and root.is_file():
        raise FedauditError(f"dataset path {str(root)!r} is a file, not a folder; {LAYOUT_HINT}")
    if not path or not root.is_dir():
        raise FedauditError(f"dataset folder {str(root)!r} does not exist; {LAYOUT_HINT}")
    domain_dirs = _domain_folders(root, min_domains)
    classes = _common_classes(root, domain_dirs)
    images, labels, skipped = _decode(root, _image_files(root, domain_dirs, classes), image_size, cache_mb)
    empty = _report_gaps(root, classes, labels, skipped)
    return MultiDomainDataset(
        name=spec or f"folder:{path}",
        classes=classes,
        domains=[d.name for d in domain_dirs],
        images=images,
        labels=labels,
        skipped=len(skipped),
        empty_classes=empty,
    )


def _domain_folders(root: Path, min_domains: int) -> list[Path]:
    domain_dirs = _subdirs(root)
    if len(domain_dirs) < min_domains:
        found = ", ".join(repr(d.name) for d in domain_dirs) or "none"
        why = "leave-one-domain-out needs at least 2" if min_domains == 2 else f"at least {min_domains} are needed"
        raise FedauditError(
            f"dataset folder {str(root)!r} has {len(domain_dirs)} domain folder(s) ({found}); {why}; {LAYOUT_HINT}"
        )
    return domain_dirs


def _common_classes(root: Path, domain_dirs: list[Path]) -> list[str]:
    """The class folders, the same in every domain (the first domain's set is the reference)."""
    class_sets = {d.name: {c.name for c in _subdirs(d)} for d in domain_dirs}
    ref_dom = domain_dirs[0].name
    for dom, cls in class_sets.items():
        if cls != class_sets[ref_dom]:
            only_ref = sorted(class_sets[ref_dom] - cls)
            only_dom = sorted(cls - class_sets[ref_dom])
            raise FedauditError(
                f"class folders differ between domains {ref_dom!r} and {dom!r} "
                f"(only in {ref_dom!r}: {only_ref}; only in {dom!r}: {only_dom}); "
                "every domain needs the same class folders"
            )
    classes = sorted(class_sets[ref_dom])
    if not classes:
        raise FedauditError(f"domain folder {ref_dom!r} in {str(root)!r} has no class folders; {LAYOUT_HINT}")
    return classes


def _image_files(root: Path, domain_dirs: list[Path], classes: list[str]) -> dict[str, list[tuple[Path, int]]]:
    """(file, label) per domain, collected first so decoding can run in parallel."""
    files: dict[str, list[tuple[Path, int]]] = {}
    for d in domain_dirs:
        entries = []
        for label, cls in enumerate(classes):
            for f in sorted((p for p in (d / cls).iterdir() if _visible(p) and p.is_file()), key=lambda p: p.name):
                entries.append((f, label))
        if not entries:
            raise FedauditError(f"domain folder {d.name!r} in {str(root)!r} has no images; {LAYOUT_HINT}")
        files[d.name] = entries
    return files


def _decode(root: Path, files: dict[str, list[tuple[Path, int]]], image_size: int, cache_mb: float | None
            ) -> tuple[dict[str, torch.Tensor | DiskImages], dict[str, torch.Tensor], list[Path]]:
    """Every domain's images (in memory, or streamed from disk past ``cache_mb``), labels, and the files that
    did not decode."""
    images: dict[str, torch.Tensor | DiskImages] = {}
    labels: dict[str, torch.Tensor] = {}
    skipped: list[Path] = []
    decoded_bytes = sum(len(e) for e in files.values()) * 3 * image_size * image_size
    stream = cache_mb is not None and decoded_bytes > cache_mb * 2**20
    cache = DecodeCache(int((cache_mb or 0) * 2**20), decode, image_size) if stream else None
    if stream:
        log.info("folder dataset %s: %.0f MB decoded exceeds --cache-mb %g; images are streamed from disk",
                 root, decoded_bytes / 2**20, cache_mb)
    # PIL releases the GIL while decoding, so threads speed up large folders
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for dom, entries in files.items():
            keep, bad = _decode_domain(pool, entries, image_size, stream)
            skipped += bad
            if not keep:
                raise FedauditError(f"domain folder {dom!r} in {str(root)!r} has no readable images; {LAYOUT_HINT}")
            if stream:
                images[dom] = DiskImages([f for f, _ in keep], cache)
            else:
                stack = np.stack([arr for arr, _ in keep])  # [N, H, W, 3]
                images[dom] = torch.from_numpy(stack).permute(0, 3, 1, 2).contiguous()
            labels[dom] = torch.tensor([lab for _, lab in keep], dtype=torch.int64)
    return images, labels, skipped


def _decode_domain(pool: ThreadPoolExecutor, entries: list[tuple[Path, int]], image_size: int, stream: bool
                   ) -> tuple[list[tuple[np.ndarray | Path, int]], list[Path]]:
    """One domain's (pixels, label) pairs — (file, label) when streamed: only whether each file decodes is kept,
    the pixels are read again when needed — and the files that did not decode; decoded in chunks when streamed."""
    keep: list[tuple[np.ndarray | Path, int]] = []
    skipped: list[Path] = []
    chunk = STREAM_CHUNK if stream else max(1, len(entries))
    for start in range(0, len(entries), chunk):
        part = entries[start:start + chunk]
        decoded = list(pool.map(lambda e: decode(e[0], image_size), part))
        keep += [(f if stream else arr, lab) for arr, (f, lab) in zip(decoded, part) if arr is not None]
        skipped += [f for arr, (f, _) in zip(decoded, part) if arr is None]
    return keep, skipped


def _report_gaps(root: Path, classes: list[str], labels: dict[str, torch.Tensor], skipped: list[Path]) -> list[str]:
    """Warn of empty class folders and unreadable files; return the empty ones as ``domain/class``."""
    empty = [f"{dom}/{cls}" for dom in labels for c, cls in enumerate(classes) if not bool((labels[dom] == c).any())]
    if empty:  # accepted (a domain may lack a class), but said: that class has no members, val or holdout records there
        more = f" and {len(empty) - SHOW_SKIPPED} more" if len(empty) > SHOW_SKIPPED else ""
        log.warning("%d class folder(s) in %s hold no readable image: %s%s", len(empty), root,
                    ", ".join(empty[:SHOW_SKIPPED]), more)
    if skipped:
        shown = ", ".join(str(f.relative_to(root)) for f in skipped[:SHOW_SKIPPED])
        more = f" and {len(skipped) - SHOW_SKIPPED} more" if len(skipped) > SHOW_SKIPPED else ""
        log.warning("skipped %d unreadable image file(s) in %s: %s%s", len(skipped), root, shown, more)
    return empty
