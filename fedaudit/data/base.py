"""Core data types: a multi-domain dataset and one source client's private data.

A :class:`MultiDomainDataset` holds every domain in memory as uint8 tensors
(the built-in sets are a few MB), so a client's data can live on the training
device as one tensor and batches are index slices, not DataLoader workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

import torch

from .stream import DiskImages


# eq=False: field-wise == on tensors is ambiguous; repr is short because the
# default one would print every image tensor into logs and test failures.
@dataclass(eq=False, repr=False)
class MultiDomainDataset:
    """Named domains that share one class list; images uint8 [N, 3, H, W] on CPU."""

    name: str
    classes: list[str]
    domains: list[str]  # order is meaningful: the default target is domains[-1]
    images: dict[str, torch.Tensor]  # domain -> uint8 [N, 3, H, W]
    labels: dict[str, torch.Tensor]  # domain -> int64 [N]
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # normalisation: (x/255 - mean) / std
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    hflip: bool = True  # horizontal flip preserves the label (not for digits)
    skipped: int = 0  # unreadable files skipped while loading (folder datasets)
    empty_classes: list[str] = field(default_factory=list)  # "<domain>/<class>" folders with no readable image
    # stable per-record identity (e.g. sklearn row index) so tests and audits can
    # check that a record belongs to exactly one domain; None when not meaningful
    source_index: dict[str, torch.Tensor] | None = None

    def __repr__(self) -> str:
        sizes = {d: int(self.labels[d].numel()) for d in self.domains}
        return (
            f"MultiDomainDataset(name={self.name!r}, classes={len(self.classes)}, "
            f"image_size={self.image_size}, domains={sizes}, skipped={self.skipped})"
        )

    @property
    def image_size(self) -> int:
        return int(self.images[self.domains[0]].shape[-1])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def fingerprint(self) -> str:
        """Content hash (16 hex chars) of classes, domains, images and labels, in order.

        The name is left out on purpose: the same pixels under another path or
        spec give the same fingerprint, and one changed pixel changes it.
        """
        h = hashlib.sha256()
        h.update(json.dumps({"classes": self.classes, "domains": self.domains}).encode())
        for dom in self.domains:
            images = self.images[dom]
            y = self.labels[dom].detach().to("cpu", torch.int64).contiguous()
            h.update(json.dumps([dom, list(images.shape)]).encode())  # shapes too, so no two layouts collide
            # streamed images are hashed chunk by chunk: the same bytes in the same order as a tensor's
            chunks = images.to("cpu").chunks() if isinstance(images, DiskImages) else [images.detach()]
            for x in chunks:
                h.update(x.to("cpu", torch.uint8).contiguous().numpy().tobytes())
            h.update(y.numpy().astype("<i8").tobytes())
        return h.hexdigest()[:16]


@dataclass(eq=False, repr=False)
class ClientData:
    """One source client's private data, split into members, validation and non-members."""

    domain: str
    train_x: torch.Tensor  # members: the only records trained on
    train_y: torch.Tensor
    val_x: torch.Tensor  # model selection
    val_y: torch.Tensor
    holdout_x: torch.Tensor  # non-members for membership inference, never trained on
    holdout_y: torch.Tensor
    train_idx: torch.Tensor  # int64 indices into the domain's arrays in the dataset
    val_idx: torch.Tensor
    holdout_idx: torch.Tensor
    # bool [n_train], True = an auditor's canary (fedaudit.audit.input_canaries), trained on but not one of the
    # client's own records: whoever treats ``train`` as "the members" must leave these out.
    # None = no canaries.
    train_canary: torch.Tensor | None = None

    def __repr__(self) -> str:
        canaries = "" if self.train_canary is None else f", canaries={int(self.train_canary.sum())}"
        return (
            f"ClientData(domain={self.domain!r}, train={self.train_idx.numel()}{canaries}, "
            f"val={self.val_idx.numel()}, holdout={self.holdout_idx.numel()}, device={self.train_x.device})"
        )

    def members(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) of the client's own training records: ``train`` without canaries."""
        if self.train_canary is None:
            return self.train_x, self.train_y
        own = ~self.train_canary.to(self.train_y.device)
        return self.train_x[own], self.train_y[own]

    def to(self, device: torch.device | str) -> ClientData:
        """A copy with every tensor on ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), (torch.Tensor, DiskImages))  # streamed images stay on disk
        }
        return dataclasses.replace(self, **moved)


@dataclass(eq=False, repr=False)
class CanarySet:
    """The auditor's record of the canaries it planted in one victim's ``train`` split (fedaudit.audit.input_canaries).

    All ``m`` canaries, included or not, in a random order that does not depend
    on inclusion: ``images`` uint8 [m, C, H, W], ``labels`` the (wrong) label
    each was given, ``true_labels`` its real one, ``included`` bool [m] (the
    truth the audit is scored against), ``source_idx`` its index in the
    domain's arrays (it came from the victim's holdout).
    """

    domain: str
    images: torch.Tensor
    labels: torch.Tensor
    true_labels: torch.Tensor
    included: torch.Tensor
    source_idx: torch.Tensor

    def __repr__(self) -> str:
        return f"CanarySet(domain={self.domain!r}, m={self.included.numel()}, included={int(self.included.sum())})"

    def to(self, device: torch.device | str) -> CanarySet:
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})


@dataclass(eq=False, repr=False)
class LODOSplit:
    """Leave-one-domain-out: source clients (ds.domains order) and the unseen target domain."""

    target: str
    sources: list[ClientData]
    target_x: torch.Tensor  # the whole unseen domain
    target_y: torch.Tensor
    canaries: dict[str, CanarySet] = field(default_factory=dict)  # victim domain -> the auditor's canaries

    def __repr__(self) -> str:
        return f"LODOSplit(target={self.target!r}, target_n={self.target_y.numel()}, sources={self.sources!r})"

    def to(self, device: torch.device | str) -> LODOSplit:
        """A copy with every tensor on ``device``."""
        return LODOSplit(
            target=self.target,
            sources=[c.to(device) for c in self.sources],
            target_x=self.target_x.to(device),
            target_y=self.target_y.to(device),
            canaries={d: c.to(device) for d, c in self.canaries.items()},
        )
