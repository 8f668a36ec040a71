"""On-device training mechanics shared by every method.

A client's images live on the training device as one uint8 tensor; a batch
is an index slice, normalised and augmented on the device. No DataLoader, no
worker processes, and no host syncs inside the step loop: the loss is
accumulated on the device and read once per round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.errors import FedauditError


class Preprocess:
    """uint8 images → normalised float tensors, with optional augmentation
    (random translation by up to ``shift`` pixels, horizontal flip when the
    dataset allows it)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], device: torch.device, hflip: bool, shift: int = 2,
                 channels_last: bool = False):
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)
        self.hflip = hflip
        self.shift = shift
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        x = x.float().div_(255.0)
        if generator is not None:
            x = augment(x, generator, self.shift, self.hflip)
        return ((x - self.mean) / self.std).contiguous(memory_format=self.memory_format)


def augment(x: Tensor, generator: torch.Generator, shift: int, hflip: bool) -> Tensor:
    """Per-sample random translation (reflect padding) and flips, vectorised."""
    b, c, h, w = x.shape
    dev = x.device
    if shift > 0:
        padded = F.pad(x, (shift, shift, shift, shift), mode="reflect")
        oy = torch.randint(0, 2 * shift + 1, (b,), generator=generator, device=dev)
        ox = torch.randint(0, 2 * shift + 1, (b,), generator=generator, device=dev)
        iy = torch.arange(h, device=dev)[None, :] + oy[:, None]
        ix = torch.arange(w, device=dev)[None, :] + ox[:, None]
        padded = padded.gather(2, iy[:, None, :, None].expand(b, c, h, w + 2 * shift))
        x = padded.gather(3, ix[:, None, None, :].expand(b, c, h, w))
    if hflip:
        flip = torch.rand(b, generator=generator, device=dev) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


def index_batches(n: int, batch_size: int, generator: torch.Generator, device: torch.device,
                  epochs: int | None = None, steps: int | None = None) -> Iterator[Tensor]:
    """Shuffled index batches: ``epochs`` full passes, or exactly ``steps``
    batches (cycling through fresh permutations when ``steps`` exceeds one
    pass — FedSB's per-round budget). The last short batch of a pass is
    dropped when a full batch exists, since BatchNorm needs more than one sample."""
    if (epochs is None) == (steps is None):
        raise ValueError("give exactly one of epochs or steps")
    if n < 2:
        # BatchNorm cannot train on one record, and a step budget would never be met.
        raise FedauditError(f"a client has {n} training record(s); it needs at least 2 — give more data or a larger train fraction in --split")
    bs = min(batch_size, n)
    done = 0
    passes = 0
    while True:
        perm = torch.randperm(n, generator=generator, device=device)
        for start in range(0, n, bs):
            idx = perm[start:start + bs]
            if idx.numel() < bs and start > 0:
                break
            if idx.numel() < 2:
                continue
            yield idx
            done += 1
            if steps is not None and done >= steps:
                return
        passes += 1
        if epochs is not None and passes >= epochs:
            return


class Indexed:
    """``(idx, images[idx])`` for each ``idx`` of ``batches``, iterated inside ``with``. Images that read
    ahead — a folder streamed from disk (:meth:`fedaudit.data.stream.DiskImages.read_ahead`) — decode the
    next batch once the loop calls :meth:`ahead` (after its random draws for this batch); in memory
    ``ahead`` does nothing. (Found by duck typing: the training mechanics do not import the data room.)"""

    def __init__(self, images: Tensor, batches: Iterable[Any]) -> None:
        read_ahead = getattr(images, "read_ahead", None)
        self._reader = read_ahead(batches) if read_ahead is not None else None
        self._plain = ((idx, images[idx]) for idx in batches) if self._reader is None else None

    def ahead(self) -> None:
        if self._reader is not None:
            self._reader.ahead()

    def __iter__(self) -> Iterator[tuple[Any, Tensor]]:
        return iter(self._reader if self._reader is not None else self._plain)

    def __enter__(self) -> Indexed:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.__exit__(*exc)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(params, name: str, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]


def cross_entropy_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(model(x), y)


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[Tensor], images: Tensor, labels: Tensor,
                preprocess: Preprocess, loss_fn: LossFn, generator: torch.Generator | None, precision: str,
                after_backward: Callable[[], None] | None = None) -> tuple[Tensor, int]:
    """Run SGD over ``batches``; return (summed loss on the device, steps)."""
    model.train()
    device = images.device
    total = torch.zeros((), device=device)
    steps = 0
    with Indexed(images, batches) as batched:
        for idx, batch in batched:
            if idx.numel() == 0:  # DP-SGD's Poisson sampling can draw an empty batch: a noise-only step
                batched.ahead()
                optimizer.zero_grad(set_to_none=True)
                optimizer.step()
                steps += 1
                continue
            x = preprocess(batch, generator)
            batched.ahead()  # after this batch's augmentation: streamed images decode the next one meanwhile
            y = labels[idx]
            with autocast(device, precision):
                loss = loss_fn(model, x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if after_backward is not None:
                after_backward()
            optimizer.step()
            total += loss.detach().float()
            steps += 1
    return total, steps


EVAL_BATCH = 512


def forward_chunks(forward: Callable[[Tensor], Tensor], images: Tensor, preprocess: Callable[[Tensor], Tensor],
                   precision: str, batch_size: int = EVAL_BATCH,
                   transform: Callable[[Tensor], Tensor] | None = None) -> Iterator[tuple[int, Tensor]]:
    """The one evaluation loop: ``forward`` on ``images`` in chunks, each preprocessed (then
    ``transform``-ed, e.g. flipped) and run under the precision's autocast; yields (start, outputs).
    The caller holds no_grad and the model's eval mode."""
    chunks = (slice(start, start + batch_size) for start in range(0, images.shape[0], batch_size))
    with Indexed(images, chunks) as batched:
        for part, batch in batched:
            batched.ahead()  # no random draws here: streamed images decode the next chunk during the forward pass
            x = preprocess(batch)
            if transform is not None:
                x = transform(x)
            with autocast(images.device, precision):
                out = forward(x)
            yield part.start, out


@torch.no_grad()
def accuracy(predict: Callable[[Tensor], Tensor], images: Tensor, labels: Tensor, preprocess: Preprocess,
             precision: str, batch_size: int = EVAL_BATCH) -> float:
    """Top-1 accuracy; one host sync at the end."""
    if images.shape[0] == 0:
        return float("nan")
    correct = torch.zeros((), device=images.device, dtype=torch.long)
    for start, logits in forward_chunks(predict, images, preprocess, precision, batch_size):
        correct += (logits.argmax(1) == labels[start:start + batch_size]).sum()
    return correct.item() / images.shape[0]


@torch.no_grad()
def mean_cross_entropy(predict: Callable[[Tensor], Tensor], images: Tensor, labels: Tensor, preprocess: Preprocess,
                       precision: str, batch_size: int = EVAL_BATCH) -> Tensor:
    """Mean cross-entropy on (images, labels), no augmentation, as :func:`accuracy` evaluates;
    a float32 0-d tensor on the device (no host sync)."""
    total = torch.zeros((), device=images.device, dtype=torch.float32)
    for start, logits in forward_chunks(predict, images, preprocess, precision, batch_size):
        total += F.cross_entropy(logits.float(), labels[start:start + batch_size], reduction="sum")
    return total / max(images.shape[0], 1)
