"""A plain multi-layer perceptron: Linear + ReLU layers, nothing stochastic or batch-coupled.

It deliberately has NO dropout (random per rank) and NO batch norm (statistics depend on the
per-rank batch). With neither, a step over a global batch gives the same gradient however it is
sharded, which is what the check "W processes x batch B == 1 process x batch W*B" relies on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from hpctrain.models.checks import check_int


class MLP(nn.Module):
    """Flatten, then `len(hidden)` Linear+ReLU layers, then a Linear to `num_classes` logits.

    Accepts any input whose trailing dims multiply to `in_features` (e.g. [B, 1, 8, 8] or
    [B, 64]). `hidden=[]` gives a linear (multinomial logistic regression) classifier.
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden: Sequence[int] = (128, 128),
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        hidden = list(hidden)  # Hydra passes ListConfig; normalise to a plain list.
        check_int("in_features", in_features, 1)
        for i, h in enumerate(hidden):
            check_int(f"hidden[{i}]", h, 1)
        check_int("num_classes", num_classes, 2)

        self.in_features = in_features
        layers: list[nn.Module] = [nn.Flatten()]
        prev = in_features
        for h in hidden:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or math.prod(x.shape[1:]) != self.in_features:
            raise ValueError(f"MLP expects [B, ...] with {self.in_features} features per sample, got {list(x.shape)}")
        return self.net(x)
