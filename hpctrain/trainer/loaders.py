"""Data loaders: a shuffled, sharded training stream and an exact, unpadded eval shard.

The training stream is exact across resumes whatever `data.num_workers` is: the sample order is a
function of (seed, epoch, world size, rank) and the randomness a dataset draws in a worker
process (augmentation) is seeded per batch from (seed, epoch, rank, batch number in the epoch).
Seeding per worker would not do: a run resumed mid-epoch hands its first batch to worker 0,
which in the uninterrupted run may have been worker 1, with another number of draws behind it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from hpctrain.config import DataConfig
from hpctrain.data.worker_seeds import SeededBatch, WorkerSeeded, batch_seed
from hpctrain.dist.context import DistContext


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


class TrainBatches(Sampler[SeededBatch]):
    """The training loader's batch sampler: this rank's full batches of one epoch from a
    position, each carrying the seed its worker draws the batch's randomness from.

    An epoch ends with its last whole optimizer step (`per_step` micro-batches each): a step
    never takes micro-batches from two epochs, so step k of an epoch trains the global batch at
    positions [k*G, (k+1)*G) of its permutation on every world size and split (trainer.elastic),
    and an epoch has floor(samples / G) steps, as an epoch-counted run's total assumes."""

    def __init__(self, sampler: TrainSampler, batch_size: int, per_step: int = 1) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.per_step = per_step
        self.first_batch = 0  # batches of this epoch already consumed (a resume starts later)

    def epoch_batches(self) -> int:
        """Micro-batches a whole epoch gives this rank: full batches, whole steps of them."""
        full = self.sampler.num_samples // self.batch_size
        return full - full % self.per_step

    def start(self, epoch: int, batch_in_epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.sampler.start_at = batch_in_epoch * self.batch_size
        self.first_batch = batch_in_epoch

    def __iter__(self) -> Iterator[SeededBatch]:
        indices = list(self.sampler)
        sampler, size = self.sampler, self.batch_size
        for k in range(len(self)):  # full batches of whole steps only, on every world size alike
            seed = batch_seed(sampler.seed, sampler.epoch, sampler.rank, self.first_batch + k)
            yield SeededBatch(indices[k * size : (k + 1) * size], seed)

    def __len__(self) -> int:
        return max(0, self.epoch_batches() - self.first_batch)


class EvalShard(Sampler[int]):
    """Rank r takes indices r, r+W, r+2W, ...: no padding, so every sample counts once."""

    def __init__(self, size: int, ctx: DistContext) -> None:
        self.indices = list(range(ctx.rank, size, ctx.world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _worker_options(data: DataConfig, ctx: DistContext) -> dict[str, Any]:
    return {
        "num_workers": data.num_workers,
        "pin_memory": data.pin_memory and ctx.device.type == "cuda",
    }


def train_loader(
    dataset: Dataset, data: DataConfig, ctx: DistContext, seed: int, micro_batch: int, grad_accum: int = 1
) -> DataLoader:
    """`micro_batch` samples per batch: data.batch_size, or less after an elastic resume
    (hpctrain.trainer.layout); `grad_accum` of them make one optimizer step."""
    batches = TrainBatches(TrainSampler(dataset, ctx, seed), micro_batch, grad_accum)
    return DataLoader(
        WorkerSeeded(dataset),
        batch_sampler=batches,
        persistent_workers=data.num_workers > 0 and data.persistent_workers,
        # Its own generator: creating an iterator must not draw from the global RNG (dropout).
        generator=torch.Generator().manual_seed(seed),
        **_worker_options(data, ctx),
    )


def eval_loader(dataset: Dataset, data: DataConfig, ctx: DistContext) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=data.eval_batch_size or data.batch_size,
        sampler=EvalShard(len(dataset), ctx),  # type: ignore[arg-type]
        generator=torch.Generator().manual_seed(0),
        **_worker_options(data, ctx),
    )


def _batches(loader: DataLoader) -> TrainBatches:
    batches = loader.batch_sampler
    if not isinstance(batches, TrainBatches):
        raise TypeError(f"not a training loader from hpctrain.trainer.loaders.train_loader: {batches!r}")
    return batches


def start_epoch(loader: DataLoader, seed: int, epoch: int, batch_in_epoch: int) -> None:
    """Point the loader at `epoch`, `batch_in_epoch` batches in; its next iterator starts there."""
    _batches(loader).start(epoch, batch_in_epoch)
    # Worker start-up seeds come from the loader's own generator; reset per epoch, a resumed run
    # draws the same ones (the batches' randomness is seeded per batch anyway).
    assert loader.generator is not None  # train_loader always gives it one
    loader.generator.manual_seed(seed * 1_000_003 + epoch)


def to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    # non_blocking only helps from pinned memory; on CPU it is a no-op.
    return tuple(t.to(device, non_blocking=True) for t in batch)
