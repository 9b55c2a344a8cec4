"""A model that stops making progress at a given forward call: a stand-in for a hung step."""

import time

from torch import nn


class StuckAfter(nn.Module):
    def __init__(self, calls: int = 5, in_features: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.calls = calls
        self.seen = 0
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x):
        self.seen += 1
        if self.seen > self.calls:
            time.sleep(3600)
        return self.linear(x.flatten(1))
