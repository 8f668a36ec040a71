"""Models fedaudit does not ship, as a deployment would write them: imported by tests through
``--model tests.user_models:NAME`` (a factory path), never by fedaudit on its own.

``PlainCNN`` has no normalisation layer at all and its own layer names; ``Wrong*`` fail in the ways a user's
factory can."""

from __future__ import annotations

import torch
from torch import nn


class PlainCNN(nn.Module):
    """conv → ReLU → pool, twice, then a linear classifier; no BatchNorm, no running statistics."""

    def __init__(self, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.trunk = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classify = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(torch.flatten(self.trunk(self.stem(x)), 1))


def plain_cnn(num_classes: int, width: int = 8) -> nn.Module:
    return PlainCNN(num_classes, width)


def not_a_module(num_classes: int) -> str:
    return "a model"


def wrong_width(num_classes: int) -> nn.Module:
    return PlainCNN(num_classes + 1)


NOT_CALLABLE = 3

