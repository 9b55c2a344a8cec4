"""The classic PyTorch MNIST-example ConvNet, adapted to small (8x8) images.

Same layer sequence as pytorch/examples' mnist: conv, relu, conv, relu, max-pool 2, dropout,
flatten, fc, relu, dropout, fc. The convs use padding=1 so that the spatial size survives them;
without it an 8x8 digit would shrink to 4x4 after the convs and 2x2 after the pool, leaving
almost nothing for the classifier. With padding an 8x8 image becomes 64x4x4 after the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hpctrain.models.checks import check_int, check_prob


class ConvNet(nn.Module):
    """Two 3x3 convs (padded), one 2x2 max-pool, two fully connected layers; returns logits.

    Input: [B, in_channels, image_size, image_size]. Output: logits [B, num_classes].
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        channels: Sequence[int] = (32, 64),
        hidden: int = 128,
        dropout1: float = 0.25,
        dropout2: float = 0.5,
    ) -> None:
        super().__init__()
        # Hydra hands lists over as ListConfig; a plain list keeps the module picklable.
        channels = list(channels)
        check_int("num_classes", num_classes, 2)
        check_int("in_channels", in_channels, 1)
        check_int("image_size", image_size, 2)  # The 2x2 pool needs at least 2 pixels.
        if not channels:
            raise ValueError("channels (got []) must list at least one conv width")
        for i, c in enumerate(channels):
            check_int(f"channels[{i}]", c, 1)
        check_int("hidden", hidden, 1)
        check_prob("dropout1", dropout1)
        check_prob("dropout2", dropout2)

        self.image_size = image_size
        self.in_channels = in_channels
        convs: list[nn.Module] = []
        prev = in_channels
        for c in channels:
            convs += [nn.Conv2d(prev, c, kernel_size=3, padding=1), nn.ReLU()]
            prev = c
        self.features = nn.Sequential(*convs, nn.MaxPool2d(2), nn.Dropout(dropout1))
        pooled = image_size // 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(prev * pooled * pooled, hidden),
            nn.ReLU(),
            nn.Dropout(dropout2),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expected = (self.in_channels, self.image_size, self.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"ConvNet expects input [B, {', '.join(map(str, expected))}], got {list(x.shape)}")
        return self.classifier(self.features(x))
