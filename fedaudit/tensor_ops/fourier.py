"""Fourier amplitude spectra of images and low-frequency amplitude interpolation.

One definition of "the amplitude spectrum" for the whole toolkit, so what a
method shares (ELCFS's ``AMPLITUDE_BANK``) and what an attack inverts
(phase retrieval) mean the same thing:

* the **full** 2-D DFT over the last two dimensions (``torch.fft.fft2``, not
  the half-spectrum ``rfft2``), so a spectrum has exactly its image's shape
  ``(..., C, H, W)``;
* **unshifted**: the DC term sits at ``[..., 0, 0]`` and frequency index
  ``k`` at position ``k mod H`` (``torch.fft.fftfreq`` order); nothing is
  ``fftshift``-ed;
* of images as float32 in ``[0, 1]``, before any normalisation, per channel.

Low-frequency interpolation (FedDG-ELCFS, Liu et al., CVPR 2021; FDA, Yang &
Soatto, CVPR 2020): inside a centred window of the spectrum the image's amplitude
moves toward another amplitude, ``A' = A + λ·M⊙(A_other − A)``; its phase is
kept and the image comes back through the inverse DFT.
"""

from __future__ import annotations

import torch
from torch import Tensor


def amplitude_spectrum(x: Tensor) -> Tensor:
    """``|FFT2(x)|`` over the last two dimensions, float32, same shape as ``x``
    (full spectrum, DC at ``[..., 0, 0]``)."""
    return torch.fft.fft2(x.float()).abs()


def low_frequency_mask(height: int, width: int, ratio: Tensor | float, device: torch.device | None = None) -> Tensor:
    """Boolean ``(n, 1, H, W)`` mask of the low-frequency window, per image.

    The window holds the frequencies ``(u, v)`` with ``|u| < r·min(H, W)`` and
    ``|v| < r·min(H, W)`` for the image's ratio ``r`` (``n`` = ``ratio.numel()``):
    FDA's centred square of half-size ``⌊r·min(H, W)⌋`` (they agree unless
    ``r·min(H, W)`` is an integer), except that ``r = 0`` gives an empty window
    rather than the DC term. The window is symmetric under ``(u, v) → (−u, −v)``,
    so interpolating real images' amplitudes keeps their spectra Hermitian.
    """
    ratio = torch.as_tensor(ratio, dtype=torch.float32, device=device).reshape(-1)
    u = torch.fft.fftfreq(height, d=1.0 / height, device=ratio.device).abs()  # signed integer frequencies
    v = torch.fft.fftfreq(width, d=1.0 / width, device=ratio.device).abs()
    reach = (ratio * min(height, width)).view(-1, 1, 1, 1)
    return (u.view(1, 1, -1, 1) < reach) & (v.view(1, 1, 1, -1) < reach)


def interpolate_low_frequency(x: Tensor, amplitude: Tensor, ratio: Tensor | float, lam: Tensor | float, *,
                              value_range: tuple[float, float] | None = (0.0, 1.0)) -> Tensor:
    """Images ``x`` ``(n, C, H, W)`` in [0, 1] with their low-frequency amplitude
    moved toward ``amplitude`` (same shape, e.g. another client's spectra):
    ``A' = A + λ·M_r⊙(amplitude − A)``, phase kept, real part of the inverse
    DFT, clamped to ``value_range`` (``None``: not clamped).

    ``ratio`` (window size, see :func:`low_frequency_mask`) and ``lam`` (0: the
    image's own amplitude, 1: the other's) are scalars or one value per image.
    ``ratio = 0`` or ``lam = 0`` returns ``x`` (up to float rounding).
    """
    if amplitude.shape != x.shape:
        raise ValueError(f"amplitude shape {tuple(amplitude.shape)} must match the images' {tuple(x.shape)}")
    n, _, h, w = x.shape
    spectrum = torch.fft.fft2(x.float())
    own = spectrum.abs()
    lam = torch.as_tensor(lam, dtype=torch.float32, device=x.device).reshape(-1, 1, 1, 1)
    mask = low_frequency_mask(h, w, ratio, x.device).expand(n, 1, h, w)
    mixed = own + mask * lam * (amplitude.float() - own)
    out = torch.fft.ifft2(torch.polar(mixed, spectrum.angle())).real  # Hermitian input: the imaginary part is rounding
    return out if value_range is None else out.clamp(*value_range)
