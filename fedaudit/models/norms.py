"""Normalization-layer factory.

Every encoder asks this module for its norm layers, so one `--norm` option
swaps BatchNorm for InstanceNorm or GroupNorm everywhere (DP-SGD cannot train
BatchNorm: per-sample gradients are undefined when samples are mixed by batch
statistics). ``NORM_LAYERS`` is a plain dict so a later module can register a
new kind (e.g. ``NORM_LAYERS["xan"] = factory``) without editing this file.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fedaudit.errors import FedauditError, unknown_choice

NormFactory = Callable[[int, int], nn.Module]


def _batch_norm(channels: int, dims: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm1d(channels)


def _instance_norm(channels: int, dims: int) -> nn.Module:
    if dims != 2:
        # A [B, C] vector has one value per channel: instance statistics are undefined.
        raise FedauditError(
            "instance norm ('in') needs spatial feature maps, not feature vectors; use 'gn' or 'bn' there"
        )
    # No running stats: IN normalizes each image by its own statistics, train and test alike.
    return nn.InstanceNorm2d(channels, affine=True, track_running_stats=False)


def gn_groups(channels: int, max_groups: int = 32) -> int:
    """Largest group count <= ``max_groups`` that divides ``channels``."""
    return next(g for g in range(min(max_groups, channels), 0, -1) if channels % g == 0)


def _group_norm(channels: int, dims: int) -> nn.Module:
    # GroupNorm works on [B, C, H, W] and on [B, C] alike, so dims needs no branch.
    return nn.GroupNorm(gn_groups(channels), channels)


NORM_LAYERS: dict[str, NormFactory] = {
    "bn": _batch_norm,
    "in": _instance_norm,
    "gn": _group_norm,
}


def make_norm(kind: str, channels: int, dims: int = 2) -> nn.Module:
    """Build the norm layer ``kind`` for ``channels`` channels (dims 2: maps, 1: vectors)."""
    if kind not in NORM_LAYERS:
        raise unknown_choice("norm layer", kind, NORM_LAYERS)
    if dims not in (1, 2):
        raise ValueError(f"dims must be 1 (vectors) or 2 (feature maps), got {dims}")
    return NORM_LAYERS[kind](channels, dims)
