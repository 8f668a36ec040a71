"""SimCLR's view augmentations, batched on the training device.

Random resized crop, horizontal flip (when the dataset allows it), colour
jitter (brightness, contrast, saturation, hue) and random grayscale, as in
SimCLR (Chen et al., ICML 2020) — each drawn per sample, for a whole batch
at once, from a ``torch.Generator`` on the batch's device (no host syncs, no
per-image Python loop).

Two simplifications against torchvision's ``ColorJitter``: the four jitters
run in a fixed order (torchvision shuffles it per image), and the hue shift
is a rotation of the chroma plane in YIQ space rather than a shift in HSV,
which needs no branchy RGB↔HSV conversion. The crop's aspect ratio is
clamped into the image instead of re-drawn up to ten times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# ITU-R 601 luma, as torchvision's rgb_to_grayscale.
_LUMA = (0.299, 0.587, 0.114)
_RGB_TO_YIQ = torch.tensor(((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312)), dtype=torch.float64)
# Inverted once on the CPU: torch.linalg.inv on a CUDA tensor would sync to check for singularity.
_YIQ_TO_RGB = torch.linalg.inv(_RGB_TO_YIQ)


def _uniform(n: int, lo: float, hi: float, generator: torch.Generator, device: torch.device) -> Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=generator, device=device)


def _gray(x: Tensor) -> Tensor:
    w = torch.tensor(_LUMA, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * w).sum(dim=1, keepdim=True)


def random_resized_crop(x: Tensor, generator: torch.Generator, scale: tuple[float, float], ratio: tuple[float, float],
                        hflip: bool) -> Tensor:
    """Crop a random box (area fraction in ``scale``, aspect in ``ratio``) of each
    image and resize it back to the input size (bilinear); flip half of them
    horizontally when ``hflip``."""
    b, dev = x.shape[0], x.device
    area = _uniform(b, scale[0], scale[1], generator, dev)
    log_r = _uniform(b, math.log(ratio[0]), math.log(ratio[1]), generator, dev)
    aspect = log_r.exp()
    w = (area * aspect).sqrt().clamp(max=1.0)  # fractions of the image side
    h = (area / aspect).sqrt().clamp(max=1.0)
    # centre in [-1, 1] coordinates, chosen so the box stays inside the image
    cx = (1 - w) * (2 * torch.rand(b, generator=generator, device=dev) - 1)
    cy = (1 - h) * (2 * torch.rand(b, generator=generator, device=dev) - 1)
    sx = w
    if hflip:
        sx = torch.where(torch.rand(b, generator=generator, device=dev) < 0.5, -w, w)
    zero = torch.zeros_like(w)
    theta = torch.stack([torch.stack([sx, zero, cx], 1), torch.stack([zero, h, cy], 1)], 1)
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def color_jitter(x: Tensor, generator: torch.Generator, brightness: float, contrast: float, saturation: float,
                 hue: float, p: float) -> Tensor:
    """With probability ``p`` per image: scale brightness, contrast and saturation
    by factors in [1−s, 1+s] and rotate hue by up to ``hue`` of a turn."""
    b, dev = x.shape[0], x.device
    on = (torch.rand(b, generator=generator, device=dev) < p).to(x.dtype)

    def factor(s: float) -> Tensor:
        f = _uniform(b, max(0.0, 1 - s), 1 + s, generator, dev).to(x.dtype)
        return (1 + on * (f - 1)).view(b, 1, 1, 1)  # identity where jitter is off

    fb, fc, fs = factor(brightness), factor(contrast), factor(saturation)
    angle = (on * _uniform(b, -hue, hue, generator, dev).to(x.dtype) * 2 * math.pi).view(b, 1, 1)
    x = (x * fb).clamp(0, 1)
    mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    x = ((x - mean) * fc + mean).clamp(0, 1)
    g = _gray(x)
    x = ((x - g) * fs + g).clamp(0, 1)
    # hue: rotate the (I, Q) chroma plane, keep luma Y
    yiq = torch.einsum("ij,bjhw->bihw", _RGB_TO_YIQ.to(dev, x.dtype), x)
    cos, sin = angle.cos(), angle.sin()
    i, q = yiq[:, 1], yiq[:, 2]
    yiq = torch.stack([yiq[:, 0], cos * i - sin * q, sin * i + cos * q], 1)
    return torch.einsum("ij,bjhw->bihw", _YIQ_TO_RGB.to(dev, x.dtype), yiq).clamp(0, 1)


def random_grayscale(x: Tensor, generator: torch.Generator, p: float) -> Tensor:
    """Replace each image by its luma (on all three channels) with probability ``p``."""
    flip = torch.rand(x.shape[0], generator=generator, device=x.device) < p
    return torch.where(flip.view(-1, 1, 1, 1), _gray(x).expand_as(x), x)


@dataclass(frozen=True)
class SimCLRAugment:
    """One SimCLR view of a batch of images in [0, 1], shape [B, 3, H, W].

    Defaults are SimCLR's (crop area 8–100%, jitter 0.4/0.4/0.4/0.1 with
    p = 0.8, grayscale p = 0.2). ``hflip`` must be False for data whose
    label a mirror image changes (digits).
    """

    hflip: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)
    jitter_p: float = 0.8
    gray_p: float = 0.2

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        x = random_resized_crop(x, generator, self.crop_scale, self.crop_ratio, self.hflip)
        x = color_jitter(x, generator, *self.jitter, p=self.jitter_p)
        return random_grayscale(x, generator, self.gray_p)
