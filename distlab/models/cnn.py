"""A small convolutional classifier for 8x8 images — pure torch (no lightning, no torch.distributed).

No normalisation layers: BatchNorm's running statistics are per rank under data parallelism, so a rank-0
evaluation would see other statistics than one process would. One size knob: ``width``.

Usage::

    model = DigitsCNN(width=32)
    logits = model(images)        # images: (B, 1, 8, 8) in [0, 1] -> (B, 10)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class DigitsCNN(nn.Module):
    """conv(1->w) -> conv(w->2w) -> maxpool -> conv(2w->2w) -> mean over space -> linear(2w->classes)."""

    def __init__(self, width: int = 32, n_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))  # (B, w, 8, 8)
        x = F.relu(self.conv2(x))  # (B, 2w, 8, 8)
        x = F.max_pool2d(x, 2)  # (B, 2w, 4, 4)
        x = F.relu(self.conv3(x))  # (B, 2w, 4, 4)
        return self.head(x.mean(dim=(2, 3)))  # (B, 2w) -> (B, classes)
