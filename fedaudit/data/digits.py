"""``digits``: real handwritten digits split into four disjoint, restyled domains.

The records are scikit-learn's bundled ``load_digits()`` set (1,797 real 8x8
handwritten digits, 10 classes), so the dataset is offline and contains real
people's handwriting rather than synthetic shapes. The records are shuffled
with the seed and dealt, class by class, into four DISJOINT partitions; each
partition is rendered as one domain:

* ``clean``    grey digit on black,
* ``colour``   coloured stroke on a coloured background (either polarity),
* ``rotated``  rotated by a random angle with magnitude 30-60 degrees,
* ``textured`` MNIST-M style: the digit inverts a random colour texture, on
  dark or light ground.

The other three domains tilt each digit by up to 15 degrees, as handwriting
slants; without that, no source taught any rotation tolerance and the
``rotated`` domain sat near chance when held out.

Why ``textured`` and not a plain photographic negative (the first design):
FedAvg averages BatchNorm running statistics, and with all-negative digits
in one client and all-positive ones in the others the averaged statistics
fit no client — the model's weights scored 0.89-0.91 on every source with
that client's own statistics and 0.20-0.53 with the averaged ones. Any
FedDG benchmark whose only polarity bridge is the held-out domain measures
that artefact rather than generalisation; with two mixed-polarity domains
(``colour`` and ``textured``) every leave-one-out split keeps a bridge.

Disjointness matters: a record must belong to exactly one client, or
membership-inference numbers mean nothing. ``source_index`` keeps each
record's sklearn row so that can be checked. Images are upsampled with
bilinear interpolation to ``image_size`` and have 3 channels. Horizontal flip
changes a digit's meaning, so ``hflip`` is False.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .base import MultiDomainDataset
from .colour import contrasting_levels, hsv, with_luma

DOMAINS: list[str] = ["clean", "colour", "rotated", "textured"]
CLASSES: list[str] = [str(d) for d in range(10)]
SLANT = 15.0  # degrees of random tilt in the non-rotated domains
ROTATION = (30.0, 60.0)  # magnitude range of the rotated domain's angles, degrees
TEXTURE_AMPLITUDE = 0.5  # how far the textured domain's ground departs from its base brightness
PAD = 2  # empty border around the 8x8 digit so rotation does not cut off its corners


def partition(labels: np.ndarray, n_parts: int, seed: int) -> np.ndarray:
    """Assign each record to one of ``n_parts`` parts, stratified by class and balanced within one."""
    rng = np.random.default_rng([seed % (1 << 64), 0xD1C175])
    part = np.empty(len(labels), dtype=np.int64)
    # shuffle within each class, then deal the records round-robin over the
    # concatenated list: every part gets each class's share to within one record
    order = np.concatenate([rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)])
    part[order] = np.arange(len(order)) % n_parts
    return part


def _rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotate a batch [N, C, H, W] about its centre, each image by its own angle."""
    rad = degrees * math.pi / 180
    cos, sin = torch.cos(rad), torch.sin(rad)
    zero = torch.zeros_like(cos)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _render(domain: str, ink: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """ink [N, 1, S, S] in [0, 1] (1 = pen) -> float RGB [N, 3, S, S] in [0, 1]."""
    n = ink.shape[0]
    if domain != "rotated" and SLANT > 0:
        # everyday slant of handwriting; the rotated domain goes well beyond it
        ink = _rotate(ink, torch.from_numpy(rng.uniform(-SLANT, SLANT, n).astype(np.float32))).clamp(0, 1)
    if domain == "clean":
        return ink.expand(-1, 3, -1, -1)
    if domain == "colour":
        # either polarity (light on dark or dark on light), always a clear brightness gap
        l_fg, l_bg = contrasting_levels(rng, n, dark=(0.0, 0.2), light=(0.7, 1.0))
        fg = with_luma(hsv(rng.random(n), rng.uniform(0.5, 1.0, n), 1.0), l_fg)
        bg = with_luma(hsv(rng.random(n), rng.uniform(0.4, 1.0, n), 1.0), l_bg)
        fg_t = torch.from_numpy(fg.astype(np.float32))[:, :, None, None]
        bg_t = torch.from_numpy(bg.astype(np.float32))[:, :, None, None]
        return bg_t * (1 - ink) + fg_t * ink
    if domain == "rotated":
        mag = rng.uniform(*ROTATION, n)
        sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        angles = torch.from_numpy((mag * sign).astype(np.float32))
        return _rotate(ink, angles).clamp(0, 1).expand(-1, 3, -1, -1)
    if domain == "textured":
        # MNIST-M's recipe: the pen inverts a colour texture, |texture - ink|. Half
        # the grounds are dark and half light, so strokes come in both polarities.
        light = rng.random(n) < 0.5
        base = np.where(light, rng.uniform(0.7, 1.0, n), rng.uniform(0.0, 0.3, n)).astype(np.float32)
        blotches = rng.random((n, 3, 4, 4)).astype(np.float32) - 0.5  # coarse colour variation
        texture = F.interpolate(torch.from_numpy(blotches), size=tuple(ink.shape[-2:]), mode="bilinear", align_corners=False)
        ground = (torch.from_numpy(base)[:, None, None, None] + TEXTURE_AMPLITUDE * texture).clamp(0, 1)
        return (ground - ink).abs()
    raise AssertionError(domain)


def load_digits_domains(image_size: int = 32, seed: int = 0) -> MultiDomainDataset:
    """Build the ``digits`` dataset: four disjoint, differently rendered partitions."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn, no download

    raw = load_digits()
    pixels = raw.images.astype(np.float32) / 16.0  # [1797, 8, 8], sklearn's 0..16 scale
    target = raw.target.astype(np.int64)
    part = partition(target, len(DOMAINS), seed)

    images: dict[str, torch.Tensor] = {}
    labels: dict[str, torch.Tensor] = {}
    source: dict[str, torch.Tensor] = {}
    for d, dom in enumerate(DOMAINS):
        rng = np.random.default_rng([seed % (1 << 64), 1000 + d])
        rows = rng.permutation(np.flatnonzero(part == d))  # shuffled order within the domain
        ink = torch.from_numpy(pixels[rows])[:, None]
        ink = F.pad(ink, (PAD, PAD, PAD, PAD))
        ink = F.interpolate(ink, size=(image_size, image_size), mode="bilinear", align_corners=False)
        img = _render(dom, ink.clamp(0, 1), rng)
        images[dom] = (img * 255).round().clamp(0, 255).to(torch.uint8).contiguous()
        labels[dom] = torch.from_numpy(target[rows])
        source[dom] = torch.from_numpy(rows.astype(np.int64))
    return MultiDomainDataset(
        name="digits",
        classes=list(CLASSES),
        domains=list(DOMAINS),
        images=images,
        labels=labels,
        hflip=False,
        source_index=source,
    )
