"""What both reconstruction attacks (``deepinversion``, ``gradinv``) optimise with, written once:
the default budget, the image prior (TV-L2 and L2), the pixel box, the learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

# Adam steps and learning rate of an inversion, unless the run's --inversion-iters / --inversion-lr say otherwise.
DEFAULT_ITERS = 200
DEFAULT_LR = 0.1


def warmup_cosine(step: int, total: int, warmup: float) -> float:
    """Learning-rate factor: linear warm-up over ``warmup``·total steps, then cosine decay to 0."""
    w = max(1, int(round(warmup * total)))
    if step < w:
        return (step + 1) / w
    progress = (step - w) / max(1, total - w)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def image_priors(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-victim (TV-L2, L2) of ``x`` [V, n, C, H, W], averaged over images."""
    x = x.float()
    diffs = (
        x[..., :, :-1] - x[..., :, 1:],
        x[..., :-1, :] - x[..., 1:, :],
        x[..., 1:, :-1] - x[..., :-1, 1:],
        x[..., :-1, :-1] - x[..., 1:, 1:],
    )
    tv = sum(torch.linalg.vector_norm(d.flatten(2), dim=2) for d in diffs)
    l2 = torch.linalg.vector_norm(x.flatten(2), dim=2)
    return tv.mean(1), l2.mean(1)


def pixel_box(mean: Sequence[float], std: Sequence[float]) -> tuple[Tensor, Tensor]:
    """Per-channel bounds ([C] each) of what [0, 1] pixels map to in normalised space: the box constraint."""
    return (torch.tensor([(0.0 - m) / s for m, s in zip(mean, std)]),
            torch.tensor([(1.0 - m) / s for m, s in zip(mean, std)]))
