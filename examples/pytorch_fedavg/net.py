"""The clients' model: a small CNN of the deployment's own, not one of fedaudit's.

``fedaudit audit REC --model examples.pytorch_fedavg.net:Net`` rebuilds it (called with ``num_classes=``).
"""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Two conv-BatchNorm-ReLU-pool stages and a two-layer classifier (32 px RGB images)."""

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(2 * width * 8 * 8, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))
