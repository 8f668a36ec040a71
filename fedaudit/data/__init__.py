"""Multi-domain datasets and the leave-one-domain-out split.

``load_dataset(spec)`` builds a :class:`MultiDomainDataset` from a spec:
``shapes`` (``shapes:N`` for N images per class per domain) and ``digits``
are built in, offline and deterministic (so the main command runs on a fresh
machine with no download); ``folder:PATH`` reads a DomainBed-layout folder. ``lodo_split`` turns a dataset into source clients
(train / val / holdout) and one unseen target domain.
"""

from __future__ import annotations

from ..errors import FedauditError, unknown_choice
from .base import CanarySet, ClientData, LODOSplit, MultiDomainDataset
from .split import check_seed, lodo_split

__all__ = ["MultiDomainDataset", "CanarySet", "ClientData", "LODOSplit", "load_dataset", "lodo_split", "DATASETS"]

DATASETS: dict[str, str] = {
    "shapes": "built-in, rendered: 7 shape classes x 4 PACS-like styles (photo, painting, cartoon, sketch), ~1050 images per domain",
    "shapes:N": "shapes with N images per class per domain (10 to 1000; shapes = shapes:150); shapes:375 gives every "
                "source client 1,051 non-members at the default split, so membership TPR at 1% FPR is resolved",
    "digits": "built-in, real: sklearn's 1,797 handwritten digits, 10 classes, 4 disjoint domains (clean, colour, rotated, textured)",
    "folder:PATH": "your images in DomainBed layout PATH/<domain>/<class>/<image> (PACS, OfficeHome, VLCS, ...)",
}

MIN_SIZE, MAX_SIZE = 16, 256


def load_dataset(spec: str, image_size: int = 32, seed: int = 0, cache_mb: float | None = None) -> MultiDomainDataset:
    """Build the dataset named by ``spec`` ("shapes", "shapes:N", "digits" or "folder:PATH") at ``image_size`` px;
    a folder whose decoded images exceed ``cache_mb`` MB is streamed from disk (:mod:`fedaudit.data.stream`)."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not MIN_SIZE <= image_size <= MAX_SIZE:
        raise FedauditError(
            f"image size {image_size!r} is out of range; give an integer from {MIN_SIZE} to {MAX_SIZE} (e.g. 32 or 64)"
        )
    seed = check_seed(seed)
    if not isinstance(spec, str):
        raise unknown_choice("dataset", spec, DATASETS)
    if spec == "shapes" or spec.startswith("shapes:"):
        from .shapes import load_shapes, per_class_of

        return load_shapes(image_size=image_size, seed=seed, per_class=per_class_of(spec), name=spec)
    if spec == "digits":
        from .digits import load_digits_domains

        return load_digits_domains(image_size=image_size, seed=seed)
    if spec.startswith("folder:"):
        from .folder import load_folder

        path = spec[len("folder:") :]
        if not path.strip():
            raise FedauditError("dataset spec 'folder:' has no path; give folder:PATH with PATH/<domain>/<class>/<image>")
        return load_folder(path, image_size=image_size, spec=spec, cache_mb=cache_mb)
    raise unknown_choice("dataset", spec, DATASETS)
