"""Data loaders: a shuffled, sharded training stream and an exact, unpadded eval shard."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from hpctrain.config import DataConfig
from hpctrain.dist import DistContext


class TrainSampler(DistributedSampler):
    """DistributedSampler that can start mid-epoch.

    Every rank draws the same permutation (seeded by seed + epoch) and takes every
    world_size-th index, so W ranks x batch B see exactly the samples 1 rank x batch W*B sees.
    `start_at` skips the first samples of this rank's shard, so a resumed run continues with
    the very next batch instead of replaying the epoch."""

    def __init__(self, dataset: Dataset, ctx: DistContext, seed: int) -> None:
        # drop_last: no padding with repeated samples, so a dataset that does not divide by the
        # world size still gives every world size the same global batches.
        super().__init__(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True)
        self.start_at = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start_at :])

    def __len__(self) -> int:
        return self.num_samples - self.start_at


class EvalShard(Sampler[int]):
    """Rank r takes indices r, r+W, r+2W, ...: no padding, so every sample counts once."""

    def __init__(self, size: int, ctx: DistContext) -> None:
        self.indices = list(range(ctx.rank, size, ctx.world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def train_loader(dataset: Dataset, data: DataConfig, ctx: DistContext, seed: int) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=data.batch_size,
        sampler=TrainSampler(dataset, ctx, seed),
        # Full batches only: every step then has the same global batch on any world size.
        drop_last=True,
        num_workers=data.num_workers,
        pin_memory=data.pin_memory and ctx.device.type == "cuda",
        persistent_workers=data.num_workers > 0,
        # Its own generator: creating an iterator must not draw from the global RNG (dropout).
        generator=torch.Generator().manual_seed(seed),
    )


def eval_loader(dataset: Dataset, data: DataConfig, ctx: DistContext) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=data.eval_batch_size or data.batch_size,
        sampler=EvalShard(len(dataset), ctx),  # type: ignore[arg-type]
        num_workers=data.num_workers,
        pin_memory=data.pin_memory and ctx.device.type == "cuda",
        generator=torch.Generator().manual_seed(0),
    )


def reseed(loader: DataLoader, seed: int, epoch: int) -> None:
    """Reset the loader's generator for `epoch`, wherever in the run the epoch starts."""
    assert loader.generator is not None
    loader.generator.manual_seed(seed * 1_000_003 + epoch)


def steps_per_epoch(loader: DataLoader, grad_accum: int) -> int:
    """Optimizer steps in one full epoch (the loader's length when it starts at 0)."""
    sampler = loader.sampler
    assert isinstance(sampler, TrainSampler)
    batches = sampler.num_samples // (loader.batch_size or 1)
    return batches // grad_accum


def to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    # non_blocking only helps from pinned memory; on CPU it is a no-op.
    return tuple(t.to(device, non_blocking=True) for t in batch)
