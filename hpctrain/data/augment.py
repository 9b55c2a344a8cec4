"""Augmentations drawn at fetch time, in the process that fetches (a DataLoader worker when
`data.num_workers > 0`), from torch's global generator, as torchvision's random transforms do.
hpctrain seeds that generator per batch in workers (hpctrain.data.worker_seeds), so a resumed
run draws exactly what an uninterrupted one draws."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class PixelNoise(Dataset):
    """`(input + N(0, std^2) noise, target)`: fresh noise every time a sample is fetched."""

    def __init__(self, dataset: Dataset, std: float) -> None:
        if std < 0:
            raise ValueError(f"noise_std must be >= 0 (got {std})")
        self.dataset = dataset
        self.std = std

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, target = self.dataset[index]
        return inputs + self.std * torch.randn(inputs.shape, dtype=inputs.dtype), target
