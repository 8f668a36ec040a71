"""Colour helpers shared by the procedurally rendered datasets."""

from __future__ import annotations

import numpy as np

LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # Rec. 601 brightness weights


def hsv(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised HSV -> RGB; inputs broadcastable arrays in [0, 1] (hue wraps), output [..., 3] float32."""
    h, s, v = np.broadcast_arrays(np.asarray(h, np.float32), np.asarray(s, np.float32), np.asarray(v, np.float32))
    k = (np.array([5.0, 3.0, 1.0], np.float32) + (h % 1.0)[..., None] * 6) % 6
    return (v[..., None] - v[..., None] * s[..., None] * np.clip(np.minimum(k, 4 - k), 0, 1)).astype(np.float32)


def with_luma(rgb: np.ndarray, luma: np.ndarray) -> np.ndarray:
    """Shift colours [..., 3] towards black or white until their luma equals ``luma`` [...].

    HSV value is a poor brightness measure (pure blue at V=1 is darker than
    grey 0.2); fixing luma guarantees the object/background contrast a figure
    needs to stay legible whatever the two hues are.
    """
    luma = np.asarray(luma, np.float32)
    cur = rgb @ LUMA
    darker = rgb * (luma / np.maximum(cur, 1e-6))[..., None]
    lighter = 1 - (1 - rgb) * ((1 - luma) / np.maximum(1 - cur, 1e-6))[..., None]
    return np.where((cur > luma)[..., None], darker, lighter).clip(0, 1).astype(np.float32)


def contrasting_levels(
    rng: np.random.Generator, n: int, dark: tuple[float, float], light: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Brightness pairs (figure, ground) from disjoint ranges, light-on-dark or dark-on-light at random."""
    lo = rng.uniform(*dark, n).astype(np.float32)
    hi = rng.uniform(*light, n).astype(np.float32)
    flip = rng.random(n) < 0.5
    return np.where(flip, lo, hi), np.where(flip, hi, lo)
