"""Per-batch seeds for the randomness a dataset draws in DataLoader worker processes.

A worker process starts with generators seeded once (per loader with persistent workers, per
epoch without) and serves every num_workers-th batch, so what a batch draws depends on which
worker fetched it and how many batches that worker fetched before. A resumed run breaks both.
Here each batch carries a seed derived from (seed, epoch, rank, batch number in the epoch), and
the worker reseeds torch, `random` and numpy from it before fetching the batch: what an
augmentation draws is then the same however the run was interrupted, and whether the workers
persist or not.

In the training process itself (`data.num_workers=0`) nothing is reseeded: the dataset draws from
the process's generators, which checkpoints save and restore with the rest of the state.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info


class SeededBatch(list):
    """The dataset indices of one batch, and what the seed of the batch's randomness is made of:
    the seed itself (batch_seed: a SeedSequence, about 60 us) is made only where a worker
    reseeds from it, never in the training process (data.num_workers=0 reseeds nothing)."""

    def __init__(self, indices: list[int], seed: int, epoch: int, rank: int, batch: int) -> None:
        super().__init__(indices)
        self.entropy = (seed, epoch, rank, batch)

    @property
    def seed(self) -> int:
        return batch_seed(*self.entropy)


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """A 64-bit seed per (seed, epoch, rank, batch); SeedSequence mixes the four so that
    neighbouring batches get unrelated streams (seed + batch would overlap across epochs)."""
    entropy = [seed % 2**64, epoch, rank, batch]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


def seed_generators(seed: int) -> None:
    """Reseed every generator a dataset is likely to draw from, as DataLoader does per worker."""
    # The CPU generator only: torch.manual_seed also queues a CUDA reseed, recording the Python
    # stack each time (~0.2 ms a batch), and workers cannot use CUDA anyway.
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # the legacy global generator takes 32 bits


class WorkerSeeded(Dataset):
    """Wraps the training dataset: in a worker process, a SeededBatch reseeds the worker's
    generators before its samples are fetched."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if isinstance(indices, SeededBatch) and get_worker_info() is not None:
            seed_generators(indices.seed)
        fetch_many = getattr(self.dataset, "__getitems__", None)
        if fetch_many:
            return fetch_many(list(indices))
        return [self.dataset[index] for index in indices]
